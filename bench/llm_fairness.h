// `cloister-bench llm-fairness`: two tenants keep one enclave worker's generation engine
// backlogged, each with its own copy of an LLM (the shared tiny model by default), with weights
// 1 and 3 (GenerateLimits.weight, as cloisterd passes the operator's TenantLimits). The real
// in-process enclave does everything a request meets behind cloisterd: sessions, sealed
// requests, the one stepping thread over both models' generators, sealed chunks. The case reads
// each tenant's token service from the chunks as they stream (prompt tokens at 1, generated
// tokens at 2, the engine's default prices) and reports
//   share_ratio: the heavier tenant's service over the lighter one's while both are backlogged
//                (target: the weight ratio, 3, within 10 %);
//   max_gap:     the largest difference between the two tenants' service over their weights
//                seen at any chunk, against
//   vtc_bound:   what the virtual token counter scheme guarantees for these requests: twice
//                the cost of the largest request (prompt and max_tokens at their prices) for
//                each of the sequences one step runs, over the smaller weight.
//
// Threading: runs on the calling thread; the enclave has its own. Ownership: plain values.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct LlmFairnessOptions {
  std::string models_dir;  // the shared models folder (llm/tiny-llama inside)
  int light_weight = 1;
  int heavy_weight = 3;
  int backlog = 32;        // streams each tenant keeps open
  int max_tokens = 32;     // per stream (eos ignored)
  int duration_ms = 5000;  // measured, after the first chunk of both tenants
  int threads = 1;         // the engine's CPU threads
  bool json = false;
};

struct LlmFairnessResult {
  std::string model;
  int light_weight = 0, heavy_weight = 0;
  double light_service = 0, heavy_service = 0;  // prompt and generated tokens at their prices
  double light_tokens = 0, heavy_tokens = 0;    // generated tokens
  double share_ratio = 0;
  double max_gap = 0;
  double vtc_bound = 0;
  double seconds = 0;
};

absl::StatusOr<LlmFairnessOptions> ParseLlmFairnessFlags(const std::vector<std::string>& args,
                                                         LlmFairnessOptions defaults);
std::string LlmFairnessUsage();
absl::StatusOr<LlmFairnessResult> RunLlmFairness(const LlmFairnessOptions& options,
                                                 std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
