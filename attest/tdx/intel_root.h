// The Intel SGX Root CA this build trusts for TDX quotes when a policy pins none
// (TdxPolicy.root_pem replaces it). It anchors the PCK certificate chain, the root and PCK CRLs
// and the "Intel SGX TCB Signing" certificate that signs TCB info and QE identity collateral.
// Thread-safe: immutable data.
#pragma once

#include <string_view>

namespace cloister::attest {

// PEM of "CN=Intel SGX Root CA" (ECDSA P-256, valid until 2049).
std::string_view BuiltInIntelSgxRootPem();

}  // namespace cloister::attest
