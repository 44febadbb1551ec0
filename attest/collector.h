// EvidenceCollector: how the enclave gathers attestation evidence over a nonce (DESIGN.md
// section 4). Implementations: the simulated TEE and GPU (attest/sim/sim_tee.h) and, later, the
// hardware collectors (configfs-tsm for the CVM report, NVML for the GPUs). Each bundle binds
// the nonce and both enclave public keys into the CVM report (attest/binding.h).
// Thread-safety: implementations say; the simulated one is safe to call from several threads.
#pragma once

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "cloister/attest/v1/evidence.pb.h"

namespace cloister::attest {

class EvidenceCollector {
 public:
  virtual ~EvidenceCollector() = default;

  // Collects a bundle over `nonce` (32 bytes) for the enclave's X25519 HPKE key and Ed25519
  // signing key (32 bytes each). InvalidArgument for wrong sizes; Unavailable or Internal when
  // the TEE or a GPU cannot produce evidence.
  virtual absl::StatusOr<cloister::attest::v1::EvidenceBundle> Collect(
      ByteSpan nonce, ByteSpan hpke_public_key, ByteSpan signing_public_key) = 0;
};

}  // namespace cloister::attest
