// `cloister-bench llm-noisy-neighbour`: a realtime chat tenant sending requests at a steady rate
// (the tiny model's chat prompts, 32 tokens each), first alone, then beside a best-effort
// tenant that keeps `backlog` streams of long prompts (about 400 tokens) and long generations
// (96 tokens, eos ignored) open; and the best-effort tenant alone for its baseline. Real
// in-process enclave (bench/llm_enclave_driver.h), the classes passed as cloisterd passes the
// operator's TenantLimits. Reports
//   itl_p99_inflation   the realtime tenant's p99 time between chunks, shared over alone;
//   ttft_p99_inflation  its p99 time to the first chunk, shared over alone;
//   be_tokens_share     the best-effort tenant's generated tokens/s shared over alone.
// Targets: inflation at most 1.10, best effort keeping at least 0.7 of its throughput.
//
// Threading: runs on the calling thread. Ownership: plain values.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct LlmNoisyNeighbourOptions {
  std::string models_dir;
  int rate = 20;            // realtime requests per second
  int duration_ms = 4000;   // per phase
  int backlog = 8;          // best-effort streams kept open
  int threads = 1;
  bool json = false;
};

struct LlmNoisyNeighbourResult {
  double rt_ttft_p50_ms[2] = {0, 0}, rt_ttft_p99_ms[2] = {0, 0};  // alone, shared
  double rt_itl_p50_ms[2] = {0, 0}, rt_itl_p99_ms[2] = {0, 0};
  double be_tokens_per_s[2] = {0, 0};                             // alone, shared
  double itl_p99_inflation = 0, ttft_p99_inflation = 0, be_tokens_share = 0;
};

absl::StatusOr<LlmNoisyNeighbourOptions> ParseLlmNoisyNeighbourFlags(
    const std::vector<std::string>& args, LlmNoisyNeighbourOptions defaults);
std::string LlmNoisyNeighbourUsage();
absl::StatusOr<LlmNoisyNeighbourResult> RunLlmNoisyNeighbour(
    const LlmNoisyNeighbourOptions& options, std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
