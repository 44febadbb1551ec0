// The AMD SEV-SNP root keys (ARK) this build trusts when a policy pins none: one self-signed
// certificate each for Milan, Genoa and Turin, as AMD publishes them. A policy that lists its
// own ARKs (SnpPolicy.ark_pems) replaces these entirely. VLEK chains end in the same ARKs.
// Thread-safe: immutable data.
#pragma once

#include <string>
#include <vector>

namespace cloister::attest {

// PEM of ARK-Milan, ARK-Genoa and ARK-Turin, in that order.
const std::vector<std::string>& BuiltInAmdArkPems();

}  // namespace cloister::attest
