// `cloister-bench llm-cc-tax`: the cost of the confidential CPU-GPU path on generation. Two real
// in-process enclaves, one with its PCIe path `off` (plain copies) and one `emulated` (AES-256-GCM
// both ways), serve the same stream of greedy requests (the tiny model's reference prompts, eos
// ignored) at each concurrency, in alternating rounds. Each step's token ids cross to the
// executor and its results back in one transfer each (enclave/step_transfer.h); the weights and
// the KV cache never cross. Per concurrency it reports, plaintext latency over encrypted latency
// (1.0: no tax, lower is worse):
//   ttft_p50_ratio      time from sending to the first chunk;
//   itl_p50_ratio, itl_p99_ratio   time between a stream's chunks;
// and tokens_per_s_ratio, encrypted throughput over plaintext. Target: 0.98 or more for
// throughput and ITL at concurrency 8 and above.
//
// Threading: runs on the calling thread. Ownership: plain values.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct LlmCcTaxOptions {
  std::string models_dir;
  std::string model_dir;  // a checkpoint folder instead of the shared tiny model
  std::string same_mode;  // "off" or "emulated": both sides in that mode (a control)
  std::vector<int> concurrency = {1, 8, 32};
  int requests_per_stream = 4;  // requests each concurrent stream sends, one after another
  int max_tokens = 64;
  int rounds = 3;               // per mode, alternating
  int threads = 1;
  bool json = false;
};

struct LlmCcTaxLine {
  int concurrency = 0;
  double ttft_p50_ms[2] = {0, 0};  // off, emulated
  double itl_p50_ms[2] = {0, 0};
  double itl_p99_ms[2] = {0, 0};
  double tokens_per_s[2] = {0, 0};
  // The receipts' execution time (each request's share of its steps) per token: the time inside
  // the steps, transfers included, apart from the time spent delivering chunks.
  double step_us_per_token[2] = {0, 0};
  double ttft_p50_ratio = 0, itl_p50_ratio = 0, itl_p99_ratio = 0, tokens_per_s_ratio = 0;
};

absl::StatusOr<LlmCcTaxOptions> ParseLlmCcTaxFlags(const std::vector<std::string>& args,
                                                   LlmCcTaxOptions defaults);
std::string LlmCcTaxUsage();
absl::StatusOr<std::vector<LlmCcTaxLine>> RunLlmCcTax(const LlmCcTaxOptions& options,
                                                      std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
