// `cloister-bench runtime-vs-ort`: latency of the enclave runtime's CPU executor against ONNX
// Runtime (onnxruntime-node, CPU) on the shared models, in one sitting. Both sides get the same
// input tensors (filled from a fixed seed), the same thread count and the same number of timed
// runs; their runs are interleaved in short blocks so that load on a shared machine hits both
// alike. Our side runs in this process (Model::Load, Model::Run); ORT runs in an OrtPeer child.
// Before timing, the outputs of both sides are compared (max_abs_diff) to show that both
// computed the same thing.
//
// Threading: everything here runs on the calling thread. Ownership: plain values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/ort_peer.h"
#include "enclave/runtime/tensor.h"

namespace cloister::bench {

// A shared model and the input it is benchmarked with (see models/README.md).
struct BenchModel {
  std::string name;   // short name used on the command line and in results: "cls", ...
  std::string file;   // path relative to the models folder
  std::string input;  // what one batch row is, for the human table
};
// cls, rec, vad, bert_mini, in that order.
const std::vector<BenchModel>& BenchModels();

// The named inputs of `model` for `batch` rows, filled deterministically from `seed`. Floats are
// uniform in [-1, 1); token ids uniform over the vocabulary; masks ones; the VAD state zeros and
// its sample rate 16000. NotFound for an unknown model, InvalidArgument for batch < 1.
absl::StatusOr<std::vector<std::pair<std::string, runtime::Tensor>>> MakeInputs(
    const std::string& model, int batch, uint64_t seed);

// Median and 90th percentile (nearest rank) of a set of samples.
struct Timing {
  double median_ms = 0;
  double p90_ms = 0;
  int count = 0;
};
// CHECK-fails on an empty set. An even count takes the mean of the two middle samples.
Timing Summarize(std::vector<double> samples_ms);

// The largest |a - b| over the float outputs both sides produced, matched by name. InvalidArgument
// when an output is missing on one side or the shapes differ.
absl::StatusOr<double> MaxAbsDiff(const std::vector<std::pair<std::string, runtime::Tensor>>& ours,
                                  const std::vector<std::pair<std::string, runtime::Tensor>>& ort);

struct ComparisonResult {
  std::string model;
  int batch = 0;
  int threads = 0;
  Timing ours;
  Timing ort;
  double max_abs_diff = 0;
  double ratio() const { return ours.median_ms / ort.median_ms; }
};

// The target the runtime is held to: ours_ms / ort_ms at most this much.
inline constexpr double kTargetRatio = 1.25;

// One JSON object on one line (no newline): model, batch, ours_ms, ort_ms, ratio (medians and
// their ratio) and the extras ours_p90_ms, ort_p90_ms, threads, iterations, max_abs_diff.
std::string JsonLine(const ComparisonResult& result);
// An aligned table with a header line, then one line with the verdict against kTargetRatio.
std::string FormatTable(const std::vector<ComparisonResult>& results);

struct RuntimeVsOrtOptions {
  std::string models_dir;
  std::string ort_dir;  // node_modules (or the npm project above it) holding onnxruntime-node
  std::string node = "node";
  std::string peer_script;  // ort_peer.js
  int threads = 1;
  int iterations = 20;  // timed runs per side
  int warmup = 3;       // untimed runs per side before timing
  int block = 5;        // consecutive runs of one side before switching to the other
  int pause_ms = 100;   // idle time at each switch, so the other side's spinning threads sleep
  uint64_t seed = 20261129;
  std::vector<int> batches = {1, 8};
  std::string model;  // empty: every model
  bool json = false;
  bool profile = false;  // also print our per-operator times for each case
};

// Parses the subcommand's flags (--flag VALUE or --flag=VALUE) over `defaults`. InvalidArgument
// naming the flag for an unknown flag, a missing or malformed value, or an unknown --model.
absl::StatusOr<RuntimeVsOrtOptions> ParseRuntimeVsOrtFlags(const std::vector<std::string>& args,
                                                           RuntimeVsOrtOptions defaults);
// One paragraph of usage text for the subcommand.
std::string RuntimeVsOrtUsage();

// Runs every selected model and batch on both sides. With --json writes one JSON line per case
// to `out` as each case finishes; without, a progress line per case to `log` and the table to
// `out` at the end. With --profile also our per-operator times per case to `log`. Returns the
// results, or the first error (model load, run, or peer failure), naming the model and batch.
absl::StatusOr<std::vector<ComparisonResult>> RunRuntimeVsOrt(const RuntimeVsOrtOptions& options,
                                                              OrtPeer& peer, std::FILE* out,
                                                              std::FILE* log);

}  // namespace cloister::bench
