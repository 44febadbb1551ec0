// Internal to attest/sim/: loading a checked simulated TEE directory with its private keys,
// shared by the root management code and the collector. Not part of the public API.
// Thread-safe: pure functions.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "attest/sim/sim_tee.h"
#include "crypto/ecdsa.h"

namespace cloister::attest::sim_internal {

struct SimSet {
  SimRootCertificates certificates;
  std::unique_ptr<crypto::EcPrivateKey> vcek_key;
  std::unique_ptr<crypto::EcPrivateKey> gpu_key;
  Bytes chip_id;     // from the VCEK's hwID extension
  uint64_t tcb = 0;  // from the VCEK's TCB extensions, Milan/Genoa layout
  Bytes fwid;        // from the GPU leaf's DICE extension
};

// Loads every file of the set and checks it (see EnsureSimRoots). NotFound when the directory
// holds none of the files; FailedPrecondition when it holds only some; DataLoss when one is
// corrupt or does not match the others.
absl::StatusOr<SimSet> LoadSimSet(const std::string& sim_dir);

std::string SimPath(const std::string& sim_dir, std::string_view file);

}  // namespace cloister::attest::sim_internal
