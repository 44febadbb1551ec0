// `cloister-bench llm-broker-efficiency`: generation throughput through the whole appliance
// against the engine driven directly, on the same model and the same requests. The broker side
// spawns a real `cloisterd` (which spawns the real cloister-enclave) with the model published
// by its config (published_models: the checkpoint folder and its digest), and `concurrency`
// SDK clients, each on its own session, stream one greedy generation each per round
// (Client::Generate, eos ignored, max_tokens each), all at once. The direct side loads the same
// checkpoint in this process and steps an llm::Generator with the enclave's settings (its CPU
// engine, as many threads as the enclave's default, 16 sequences at once) over the same
// requests, added at once. The sides alternate for `rounds` rounds; throughput is completion
// tokens per second over all rounds of a side, and ratio = broker / direct (target 0.95 at
// concurrency 16). Before timing, every broker stream's ids are compared with the direct ones.
//
// Threading: the client threads are this module's own, joined before each round ends.
// Ownership: the cloisterd child process and its data dir live for one call.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct LlmBrokerEfficiencyOptions {
  std::string models_dir;  // holds llm/tiny-llama
  std::string cloisterd;   // the cloisterd binary (cloister-enclave beside it)
  // The checkpoint folder; empty: models_dir/llm/tiny-llama.
  std::string model_dir;
  int concurrency = 16;
  int max_tokens = 64;
  int rounds = 3;
  bool json = false;
};

struct LlmBrokerEfficiencyResult {
  std::string model;  // the folder's name
  int concurrency = 0;
  int max_tokens = 0;
  int rounds = 0;
  int threads = 0;  // the engine's, on both sides
  double broker_tokens = 0, broker_seconds = 0;
  double direct_tokens = 0, direct_seconds = 0;
  bool ids_match = false;  // the broker's greedy ids equal the direct ones, stream by stream
  double broker_tokens_per_s() const { return broker_tokens / broker_seconds; }
  double direct_tokens_per_s() const { return direct_tokens / direct_seconds; }
  double ratio() const { return broker_tokens_per_s() / direct_tokens_per_s(); }
};

absl::StatusOr<LlmBrokerEfficiencyOptions> ParseLlmBrokerEfficiencyFlags(
    const std::vector<std::string>& args, LlmBrokerEfficiencyOptions options);
std::string LlmBrokerEfficiencyUsage();
std::string LlmBrokerEfficiencyJsonLine(const LlmBrokerEfficiencyResult& result);

// Runs the case; progress on `log`, the figures on `out` (one JSON line with options.json).
absl::StatusOr<LlmBrokerEfficiencyResult> RunLlmBrokerEfficiency(
    const LlmBrokerEfficiencyOptions& options, std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
