// The LLM benchmarks' way into a real in-process enclave, as cloisterd drives one: tenants with
// their own sessions, each with the shared tiny model uploaded as a package, Generate calls
// sealed and sent with the host's limits, and the streamed frames opened in order on the
// benchmark's thread with the times they arrived.
//
// Threading: one benchmark thread uses it (the enclave streams from its own thread into a
// queue). Ownership: owns the enclave and the tenants.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "enclave/enclave.h"
#include "tests/support/enclave_tenant.h"

namespace cloister::bench {

// The value at fraction `p` (0..1) of `values` (nearest rank); 0 for none. For the LLM cases'
// latency figures.
double Percentile(std::vector<double> values, double p);

// A greedy request for `prompt` generating exactly `max_tokens` tokens (eos ignored), the load
// every LLM case sends.
api::v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens);

class LlmEnclaveDriver {
 public:
  // An enclave with `options` (sim TEE in a temporary folder; its measurement set here) and one
  // tenant per name, each with the tiny model of `models_dir` uploaded as "tiny", or the
  // checkpoint folder `model_dir` when given (a synthetic benchmark model, which shares the tiny
  // model's tokenizer: the prompts stay the tiny model's reference prompts).
  static absl::StatusOr<std::unique_ptr<LlmEnclaveDriver>> Create(
      const std::string& models_dir, enclave::EnclaveOptions options,
      const std::vector<std::string>& tenants, const std::string& model_dir = "");
  ~LlmEnclaveDriver();

  // The reference prompts' token ids of the tiny model.
  const std::vector<std::vector<int32_t>>& prompts() const { return prompts_; }

  // Sends a Generate call for tenant `tenant` (an index into the names) with the host's
  // `limits` (class, weight, max_tokens cap); its call id.
  absl::StatusOr<uint64_t> Send(int tenant, const api::v1::GenerateRequest& request,
                                const boundary::v1::GenerateLimits& limits = {});

  // One opened chunk of a stream.
  struct Chunk {
    uint64_t call_id;
    int tenant;
    bool final;
    absl::Time arrived;
    api::v1::GenerateChunk chunk;
  };
  // The chunks that arrived since the last call, opened, waiting up to `timeout` for one. An
  // unsealed refusal or a chunk that does not open is an error; a sealed error chunk is
  // returned as it is (chunk.code()).
  absl::StatusOr<std::vector<Chunk>> Take(absl::Duration timeout);

  enclave::Enclave& enclave() { return *enclave_; }

 private:
  class Sink;
  struct Open {
    int tenant;
    boundary::v1::ForwardedRequest item;
  };
  LlmEnclaveDriver() = default;

  std::unique_ptr<enclave::Enclave> enclave_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<testing::EnclaveTenant>> tenants_;
  std::shared_ptr<Sink> sink_;
  std::map<uint64_t, Open> open_;
  uint64_t next_call_ = 1;
  std::vector<std::vector<int32_t>> prompts_;
};

}  // namespace cloister::bench
