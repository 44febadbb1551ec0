// The binding between a client's nonce, the GPU evidence and the enclave's public keys
// (DESIGN.md section 4). The enclave computes these values when it collects evidence and the
// verifier recomputes them; both sides must agree byte for byte, so every variable-length
// input is length-prefixed (4-byte big-endian length) and every hash starts with a domain
// label. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/bytes.h"

namespace cloister::attest {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kReportDataSize = 64;
inline constexpr size_t kGpuNonceSize = 32;
inline constexpr size_t kEvidenceDigestSize = 32;

// The 64-byte CVM REPORT_DATA:
//   SHA-512("cloister/v1 report data" || LP(nonce) || SHA-384(LP(r_0) || ... || LP(r_n-1))
//           || LP(hpke_public_key) || LP(signing_public_key))
// where r_i are the GPU SPDM reports in bundle order and LP is the 4-byte length prefix.
Bytes ReportData(ByteSpan nonce, const std::vector<Bytes>& gpu_reports, ByteSpan hpke_public_key,
                 ByteSpan signing_public_key);

// The 32-byte SPDM requester nonce of GPU `gpu_index`:
//   SHA-256("cloister/v1 gpu nonce" || nonce || hpke_public_key || be32(gpu_index)).
// Both inputs have fixed sizes (32 bytes each) where this is used; the verifier checks those
// sizes before it calls this.
Bytes GpuRequesterNonce(ByteSpan nonce, ByteSpan hpke_public_key, uint32_t gpu_index);

// SHA-256 of a serialized EvidenceBundle exactly as it was sent: the digest the enclave signs
// for cached evidence and both sides put in the session transcript.
Bytes EvidenceDigest(const std::string& serialized_bundle);

// The message the enclave signs with its Ed25519 key to answer a challenge with cached
// evidence: "cloister/v1 evidence challenge" || digest || client_nonce.
Bytes ChallengeMessage(ByteSpan evidence_digest, ByteSpan client_nonce);

// The message the enclave signs over its operator-published models (the serialized
// PublishedModels of a ChallengeResponse), for the evidence and the client's nonce:
//   "cloister/v1 published models" || LP(evidence_digest) || LP(client_nonce)
//   || SHA-256(published_models)
Bytes PublishedModelsMessage(ByteSpan evidence_digest, ByteSpan client_nonce,
                             ByteSpan published_models);

}  // namespace cloister::attest
