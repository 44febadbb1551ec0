// `cloister-bench llm-vs-llamacpp`: the enclave's LLM engine (enclave/llm: Model + Generator)
// against llama.cpp (npm node-llama-cpp 3.21.1, its prebuilt CPU build, driven by
// bench/llama_peer.mjs in a child node process) on the same weights, at the same precision and
// thread count, greedy decoding, in one sitting.
//
// Models: "tiny" (the shared tiny-llama checkpoint; llama.cpp reads its shipped F32 model.gguf or
// a BF16 GGUF written beside the cache) and "synthetic" (a 105.6 M-parameter LlamaForCausalLM
// with random weights from a fixed seed). bench/make_synthetic_llama.py writes the synthetic
// model and the BF16 GGUFs into the cache folder at first use (and does nothing when its stamp
// matches). Precisions: "f32" (our weights upcast to float32 at load, llama.cpp's F32 GGUF) and
// "bf16" (ours kept as stored, llama.cpp's BF16 GGUF); every file holds the same BF16-rounded
// values. Both sides keep the KV cache in float32.
//
// For each model, precision, thread count and number of concurrent sequences N, both sides
// decode the same N prompts (prompt_tokens ids each from a fixed seed, the first the model's bos
// id; sequence i gets prompt i) for decode_tokens greedy tokens each, eos ignored, after warm-up
// passes, and report medians over the timed passes of
//   prefill tokens/s: N * prompt_tokens over the time until every sequence has its first token;
//   decode tokens/s: the tokens produced after that instant over the time they took.
// The peer separates the phases exactly (its generators stay suspended after the first token);
// our Generator runs continuous batching, so a sequence whose prefill ended in an earlier step
// may decode during the prefill phase: those tokens count to the prefill phase. Both sides put at
// most step_tokens tokens into one forward pass (llama.cpp's batch size, our per-step token
// budget). Outputs are compared before timings are read: outputs_match says whether every
// sequence's greedy ids are equal.
//
// bandwidth_fraction = weight bytes read per decode step * steps per second / the machine's
// memory read bandwidth (all hardware threads summing a buffer, measured in the same run): how
// close decode comes to being bound by reading the weights. One step reads the weights once for
// all N sequences, so steps per second = decode tokens/s / N.
//
// Threading: runs on the calling thread (the engine and the bandwidth probe use their own
// threads). Ownership: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/read_bandwidth.h"

namespace cloister::llm {
class Generator;
}  // namespace cloister::llm

namespace cloister::bench {

struct LlmVsLlamaCppOptions {
  std::string models_dir;     // the shared models folder (llm/tiny-llama inside)
  std::string cache_dir;      // where the synthetic model and the BF16 GGUFs are written
  std::string llama_dir;      // node_modules holding node-llama-cpp, or the npm folder above
  std::string node = "node";  // program name (searched on PATH) or path
  std::string peer_script;    // bench/llama_peer.mjs
  std::string python = "/usr/bin/python3";
  std::string generator_script;  // bench/make_synthetic_llama.py
  std::vector<std::string> models = {"tiny", "synthetic"};
  std::vector<std::string> precisions = {"f32", "bf16"};
  std::vector<int> threads = {1, 2};
  std::vector<int> sequences = {1, 16};
  int prompt_tokens = 128;  // per sequence
  int decode_tokens = 64;   // per sequence, the first one sampled after the prompt included
  int warmup = 1;           // untimed passes per side and case
  int repeats = 3;          // timed passes per side and case
  int step_tokens = 512;    // most tokens in one forward pass, both sides
  std::string flash_attention = "off";  // llama.cpp's setting: off, on, auto
  int bandwidth_mib = 1024;             // the bandwidth probe's buffer
  int bandwidth_passes = 5;
  uint64_t seed = 20261201;
  bool json = false;
};

// One side's figures for one case.
struct LlmSideFigures {
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  // Greedy ids per sequence (decode_tokens each), from the first timed pass.
  std::vector<std::vector<int32_t>> generated_ids;
  bool ids_stable = true;          // every pass gave the same ids
  int64_t kv_bytes_per_token = 0;  // keys and values over all layers
  int64_t peak_rss_bytes = 0;      // the process's peak resident set during the case
};

// Our side's measurement, shared with llm-cuda: `prompts` through `generator` (idle, with room
// for all of them at once), greedy, eos ignored, decode_tokens each, `warmup` untimed passes then
// `repeats` timed ones (medians). Internal when a sequence ends early or is cancelled.
absl::StatusOr<LlmSideFigures> MeasureGenerator(llm::Generator& generator,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                int decode_tokens, int warmup, int repeats);

// Runs bench/make_synthetic_llama.py (`script`, with `python` found on PATH) to write the
// benchmark models into `cache_dir` unless their stamps match: `models` as its --models list
// (empty: the script's default, what llm-vs-llamacpp needs). FailedPrecondition when the script
// is missing or fails, with its last line of stderr.
absl::Status RunLlmModelGenerator(const std::string& python, const std::string& script,
                                  const std::string& models_dir, const std::string& cache_dir,
                                  uint64_t seed, const std::vector<std::string>& models,
                                  std::FILE* log);

// How two sides' greedy ids agree, sequence by sequence.
struct IdComparison {
  bool match = false;           // same number of sequences, every one identical
  int64_t matching_tokens = 0;  // summed over sequences: the length of the common prefix
  int64_t compared_tokens = 0;  // summed over sequences: the longer of the two
  int first_mismatch_sequence = -1;
  int first_mismatch_step = -1;  // in that sequence; -1 when all match
};
IdComparison CompareGeneratedIds(const std::vector<std::vector<int32_t>>& ours,
                                 const std::vector<std::vector<int32_t>>& theirs);

struct LlmVsLlamaCppLine {
  std::string model;      // tiny, synthetic
  std::string precision;  // f32, bf16
  int threads = 0;
  int sequences = 0;
  int prompt_tokens = 0;  // per sequence
  int decode_tokens = 0;  // per sequence
  LlmSideFigures ours;
  LlmSideFigures llama;
  IdComparison outputs;
  int64_t weight_bytes = 0;            // ours: the bytes one decode step reads
  int64_t llama_model_file_bytes = 0;  // the GGUF file
  double bandwidth_bytes_per_s = 0;    // the machine's, all hardware threads

  double prefill_ratio() const { return ours.prefill_tokens_per_s / llama.prefill_tokens_per_s; }
  double decode_ratio() const { return ours.decode_tokens_per_s / llama.decode_tokens_per_s; }
  // weight bytes * (decode tokens/s / sequences) / bandwidth; the peer's with its file size.
  double bandwidth_fraction() const;
  double llama_bandwidth_fraction() const;
};

// What the peer reported about itself and the run settings, for the document's header.
struct LlamaPeerInfo {
  std::string version;            // node-llama-cpp's
  std::string llama_cpp_release;  // of its prebuilt binary
  std::string system_info;        // llama.cpp's CPU feature line
};

struct LlmVsLlamaCppReport {
  LlamaPeerInfo peer;
  double bandwidth_bytes_per_s = 0;  // all hardware threads
  int bandwidth_threads = 0;
  std::map<int, double> bandwidth_by_threads;  // at each thread count of the cases
  std::vector<LlmVsLlamaCppLine> lines;
};

// InvalidArgument naming the flag for an unknown flag, a bad value, an unknown model or
// precision, or a prompt and decode length that does not fit the smallest model's context.
absl::StatusOr<LlmVsLlamaCppOptions> ParseLlmVsLlamaCppFlags(const std::vector<std::string>& args,
                                                             LlmVsLlamaCppOptions defaults);
std::string LlmVsLlamaCppUsage();

// `count` prompts of `tokens` ids from `seed`: the first `bos_id` (when there is one), the rest
// uniform over [0, vocab_size) minus `excluded` (eos ids, bos). Prompt i depends only on seed and
// i, so the first prompts are the same whatever `count` is.
std::vector<std::vector<int32_t>> MakeBenchPrompts(int count, int tokens, int64_t vocab_size,
                                                   std::optional<int32_t> bos_id,
                                                   const std::vector<int32_t>& excluded,
                                                   uint64_t seed);

// Parses the peer's JSON document (bench/llama_peer.mjs) into one LlmSideFigures per run, in
// run order, checking each run has `sequences[i]` sequences of `decode_tokens` ids. `info` gets
// the peer's description; `model_file_bytes` the GGUF's size. Internal with what was wrong.
absl::StatusOr<std::vector<LlmSideFigures>> ParseLlamaPeerDocument(
    std::string_view document, const std::vector<int>& sequences, int decode_tokens,
    LlamaPeerInfo* info, int64_t* model_file_bytes);

// One JSON object per line of the report in "lines", with the settings, the peer and the
// bandwidth in the document's other fields (see bench/README.md).
std::string LlmVsLlamaCppJsonDocument(const LlmVsLlamaCppOptions& options,
                                      const LlmVsLlamaCppReport& report);
// An aligned table, one row per line.
std::string LlmVsLlamaCppTable(const LlmVsLlamaCppReport& report);

// Runs every case. Prints the JSON document (--json) or the table to `out` at the end, progress
// to `log`. FailedPrecondition when node, node-llama-cpp or the model generator cannot be run
// (the peer is not installed); other errors name the model, precision and case.
absl::StatusOr<LlmVsLlamaCppReport> RunLlmVsLlamaCpp(const LlmVsLlamaCppOptions& options,
                                                     std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
