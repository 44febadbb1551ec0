// NVIDIA's serialized GPU evidence (shared/specs/attestation-formats.md section 2): the JSON
// that NVIDIA's attestation SDK (nvattest) writes and its samples ship,
//   [{"arch": "HOPPER", "nonce": "<64 hex>", "evidence": "<base64 report>",
//     "certificate": "<base64 of the PEM chain text>"}, ...]
// and, accepted too, the body of an NRAS request,
//   {"arch": ..., "nonce": ..., "evidence_list": [{"evidence": ..., "certificate": ...}, ...]}
// whose items inherit arch and nonce from the top level. Parsing is strict (no unknown
// members except NRAS's "claims_version", exact types, canonical base64, 32-byte nonces); it
// does not verify anything: feed the items to VerifyNvidiaGpu.
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr size_t kMaxEvidenceJsonSize = size_t{16} << 20;
inline constexpr size_t kMaxEvidenceItems = 64;

struct NvidiaEvidenceItem {
  std::string arch;            // "HOPPER", "BLACKWELL" (upper case as given)
  Bytes nonce;                 // 32 bytes: the nonce the collector asked for
  Bytes report;                // the SPDM attestation report
  std::string cert_chain_pem;  // PEM chain text, leaf first

  bool operator==(const NvidiaEvidenceItem&) const = default;
};

// Parses either form above. InvalidArgument naming the item and member on any deviation.
absl::StatusOr<std::vector<NvidiaEvidenceItem>> ParseNvidiaEvidenceJson(std::string_view json);

// Writes the list form, which ParseNvidiaEvidenceJson reads back equal.
std::string NvidiaEvidenceToJson(const std::vector<NvidiaEvidenceItem>& items);

}  // namespace cloister::attest
