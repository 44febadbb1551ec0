// Fuzz target for evidence bundles and challenge responses as a client receives them from an
// untrusted host: the bytes are parsed as a ChallengeResponse and as an EvidenceBundle and run
// through VerifyChallenge / VerifyBundle with policies of the bundle's own TEE and GPU types, so
// every CVM and GPU verifier (simulated, SEV-SNP, TDX, NVIDIA) sees fuzzed input. Any input must
// give a verdict or an error, never a crash; and since no policy here trusts any key the fuzzer
// could hold (the simulated roots are empty, the vendor roots are the real ones, the
// measurements accepted are all zero), no verdict may pass.
#include <cstddef>
#include <cstdint>
#include <string>

#include "attest/binding.h"
#include "attest/nvidia/bundle_verifier.h"
#include "attest/verifier.h"
#include "base/status.h"

namespace {

using namespace cloister;
using namespace cloister::attest;

Policy PolicyFor(v1::TeeType tee, v1::GpuType gpu) {
  Policy policy;
  policy.set_name("fuzz");
  policy.set_tee(tee);
  policy.set_gpu(gpu);
  policy.add_enclave_measurements(std::string(96, '0'));
  policy.set_max_evidence_age_seconds(3600);
  if (gpu == v1::GPU_TYPE_NVIDIA_CC) policy.mutable_nvidia()->set_rim_dir("/nonexistent");
  return policy;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  EnableNvidiaGpuVerification();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const absl::Time at = absl::FromUnixSeconds(1717200000);  // 2024-06-01, inside test validity
  const Bytes nonce(kNonceSize, 0x42);

  ChallengeResponse response;
  if (response.ParseFromString(bytes)) {
    v1::EvidenceBundle inner;
    if (inner.ParseFromString(response.bundle())) {
      auto verdict =
          VerifyChallenge(response, nonce, PolicyFor(inner.tee_type(), inner.gpu_type()), at);
      CLOISTER_CHECK(!verdict.ok() || !verdict->pass);
    }
  }
  v1::EvidenceBundle bundle;
  if (bundle.ParseFromString(bytes)) {
    Policy policy = PolicyFor(bundle.tee_type(), bundle.gpu_type());
    Verdict verdict = VerifyBundle(bundle, AsBytes(bundle.nonce()), policy, at);
    CLOISTER_CHECK(!verdict.pass);
    CLOISTER_CHECK(!verdict.checks.empty());
  }
  return 0;
}
