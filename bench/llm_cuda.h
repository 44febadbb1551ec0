// `cloister-bench llm-cuda`: the LLM engine on a device engine (the CUDA one) against the
// device's physical limit, in one sitting. For each model, precision and number of concurrent
// sequences N it decodes N prompts (MakeBenchPrompts) greedily through one Generator on the
// engine (MeasureGenerator, as llm-vs-llamacpp measures our side) and prints prefill and decode
// tokens/s and
//   bandwidth_fraction = weight bytes * (decode tokens/s / N) / the device's read bandwidth,
// the bandwidth measured in the same run by a read kernel (EngineReadBandwidth). Decode at N = 1
// is bound by reading the weights once per step, so 1.0 is the limit.
//
// Models: "synthetic-1b" (about 1 B parameters, random BF16 weights from a fixed seed, written by
// bench/make_synthetic_llama.py into the cache at first use), "synthetic" (the 110 M model of
// llm-vs-llamacpp) and "tiny" (the shared tiny-llama). Without a device the case fails with
// FailedPrecondition naming why (cloister-bench exits 2, as for a missing peer; also when this
// build has no CUDA engine).
//
// Threading: runs on the calling thread. Ownership: plain values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct LlmCudaOptions {
  std::string models_dir;  // the shared models folder (llm/tiny-llama inside)
  std::string cache_dir;   // where the synthetic models are written
  std::string python = "/usr/bin/python3";
  std::string generator_script;  // bench/make_synthetic_llama.py
  std::string executor = "cuda";
  std::vector<std::string> models = {"synthetic-1b"};
  std::vector<std::string> precisions = {"bf16", "f32"};
  std::vector<int> sequences = {1, 32};
  int prompt_tokens = 128;
  int decode_tokens = 64;
  int warmup = 1;
  int repeats = 3;
  int step_tokens = 2048;
  uint64_t seed = 20261201;
  bool json = false;
};

struct LlmCudaLine {
  std::string model;
  std::string precision;
  int sequences = 0;
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  double read_bandwidth_bytes_per_s = 0;
  bool ids_stable = true;
  double bandwidth_fraction() const {
    return weight_bytes * (decode_tokens_per_s / sequences) / read_bandwidth_bytes_per_s;
  }
};

absl::StatusOr<LlmCudaOptions> ParseLlmCudaFlags(const std::vector<std::string>& args,
                                                 LlmCudaOptions defaults);
std::string LlmCudaUsage();
// One JSON object per line ({"case": "llm-cuda", ...}).
std::string LlmCudaJsonLine(const LlmCudaLine& line);

// Runs every case, printing a line per case to `out` as it finishes (JSON with --json) and
// progress to `log`.
absl::StatusOr<std::vector<LlmCudaLine>> RunLlmCuda(const LlmCudaOptions& options,
                                                    std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
