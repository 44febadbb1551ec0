// Shared by the enclave fuzz targets: one simulated enclave per fuzzing process (its state
// carries from one input to the next, as in a long-running worker), its development policy,
// and a tiny model (y = -x, z = x + w over float[1, 4]) that loads in microseconds. The
// enclave's temporary folder is removed at exit. Not thread-safe: libFuzzer and the corpus
// replayer call targets from one thread.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "attest/policy.h"
#include "base/bytes.h"
#include "enclave/enclave.h"
#include "onnx/onnx_pb.h"
#include "tests/support/neg_add_model.h"
#include "tests/support/temp_dir.h"

namespace cloister::fuzzing {

struct FuzzEnclave {
  std::string dir;
  std::unique_ptr<enclave::Enclave> enclave;
  attest::v1::Policy policy;
};

// The process's enclave, made on first use; aborts if it cannot be made (a broken harness
// must not look like a clean fuzzing run).
inline FuzzEnclave& TheFuzzEnclave() {
  static FuzzEnclave* made = [] {
    auto* fuzz = new FuzzEnclave();
    fuzz->dir = testing::MakeTempDir("cloister-enclave-fuzz");
    if (fuzz->dir.empty()) std::abort();
    enclave::EnclaveOptions options;
    options.sim_dir = fuzz->dir + "/sim";
    options.dev_policy_out = fuzz->dir + "/dev-policy.yaml";
    options.measurement = Bytes(48, 0x42);
    options.load_options.threads = 1;
    // Batches split into groups on run threads, as cloister-enclave runs them on the CPU.
    options.run_threads = 2;
    // Every input may open a session; the fuzzer must not run into the session limit.
    options.session_limits.max_sessions = size_t{1} << 22;
    auto created = enclave::Enclave::Create(std::move(options));
    if (!created.ok()) std::abort();
    fuzz->enclave = *std::move(created);
    auto policy = attest::LoadPolicyFile(fuzz->dir + "/dev-policy.yaml");
    if (!policy.ok()) std::abort();
    fuzz->policy = *std::move(policy);
    return fuzz;
  }();
  return *made;
}

// The serialized tiny model (tests/support/neg_add_model.h, weights 1 2 3 4); the same bytes
// every time.
inline std::string TinyModel() {
  onnx::ModelProto model = testing::NegAndAddModel({1.0f, 2.0f, 3.0f, 4.0f});
  model.mutable_graph()->set_name("tiny");
  return model.SerializeAsString();
}

}  // namespace cloister::fuzzing
