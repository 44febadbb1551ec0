// Attestation policies as YAML files: the operator's and tenant's reference values, mapped
// field by field onto cloister.attest.v1.Policy (proto/cloister/attest/v1/policy.proto; YAML
// keys are the proto field names, enums are written in lower case with dashes: `tee: sev-snp`,
// `gpu: nvidia-cc`). Loading is strict: unknown or repeated keys, wrong types, bad hex and
// missing required fields are errors of the form "FILE:LINE: field 'PATH': what is wrong".
// Thread-safe: pure functions (yaml-cpp exceptions are caught here and never escape).
#pragma once

#include <vector>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "cloister/attest/v1/policy.pb.h"

namespace cloister::attest {

using Policy = ::cloister::attest::v1::Policy;

inline constexpr size_t kMeasurementSize = 48;  // SHA-384
inline constexpr int64_t kDevPolicyMaxEvidenceAgeSeconds = 86400;

// Parses one YAML document into a checked policy. `source_name` (usually the path) prefixes
// every error message. Beyond the schema it checks: name, tee, gpu and at least one enclave
// measurement are present; measurements are 96 hex digits (stored lower case); the simulated
// roots are present exactly when tee or gpu is `sim` and each holds one PEM certificate; a
// simulated GPU only with a simulated CVM; version lists only when a GPU is expected, with
// VBIOS versions like 96.00.9F.00.01 (stored upper case); the maximum age is not negative; the
// `nvidia` section only with gpu nvidia-cc, its roots (when set) one CA certificate each.
absl::StatusOr<Policy> ParsePolicyYaml(std::string_view text, std::string_view source_name);

// Reads (at most 1 MiB) and parses a policy file; errors name the path. Relative directories
// in the policy (nvidia.rim_dir, nvidia.ocsp_dir) are resolved against the file's directory.
absl::StatusOr<Policy> LoadPolicyFile(const std::string& path);

// Decodes an allow-list of hex values of `size` bytes each from a policy section; the
// InvalidArgument error names `field` (e.g. "snp.host_data") and the index.
absl::StatusOr<std::vector<Bytes>> DecodeHexAllowList(
    const google::protobuf::RepeatedPtrField<std::string>& list, size_t size,
    std::string_view field);
// True when `value` equals an entry of `list` (constant-time per entry).
bool AllowListContains(const std::vector<Bytes>& list, ByteSpan value);

// Writes a policy as YAML that ParsePolicyYaml reads back to an equal message (PEM text as
// literal blocks, unset sections left out).
std::string PolicyToYaml(const Policy& policy);

// The development policy for a simulated TEE: trusts exactly the simulated roots in `sim_dir`
// (which EnsureSimRoots must have created) and exactly `measurement` (48 bytes), no debug,
// cached evidence up to a day old.
absl::StatusOr<Policy> MakeDevPolicy(const std::string& sim_dir, ByteSpan measurement);
// Writes MakeDevPolicy's result to `path` (mode 0644, atomically), headed by a comment saying
// it is for development only.
absl::Status WriteDevPolicy(const std::string& path, const std::string& sim_dir,
                            ByteSpan measurement);

}  // namespace cloister::attest
