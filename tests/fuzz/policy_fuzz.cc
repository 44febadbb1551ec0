// Fuzz target for the attestation policy loader (attest/policy.h): policies are YAML that
// tenants and auditors write, so any text must give a policy or an error naming the problem.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "attest/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto policy = cloister::attest::ParsePolicyYaml(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  (void)policy;
  return 0;
}
