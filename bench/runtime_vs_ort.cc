#include "bench/runtime_vs_ort.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status.h"
#include "bench/bench_support.h"
#include "enclave/runtime/model.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using runtime::DataType;
using runtime::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Deterministic 64-bit generator (splitmix64): the same inputs on every platform and library.
class SeededRandom {
 public:
  explicit SeededRandom(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1), from the top 24 bits so every value is exact in float.
  float Symmetric() { return static_cast<float>(Next() >> 40) / 8388608.0f - 1.0f; }
  // Uniform in [0, bound).
  int64_t Below(int64_t bound) {
    return static_cast<int64_t>(Next() % static_cast<uint64_t>(bound));
  }

 private:
  uint64_t state_;
};

absl::StatusOr<Tensor> RandomFloats(std::vector<int64_t> shape, SeededRandom& random) {
  ASSIGN_OR_RETURN(Tensor tensor, Tensor::Create(DataType::kFloat, std::move(shape)));
  float* data = tensor.data<float>();
  for (int64_t i = 0; i < tensor.count(); ++i) data[i] = random.Symmetric();
  return tensor;
}

absl::StatusOr<Tensor> FilledInt64(std::vector<int64_t> shape, int64_t value) {
  ASSIGN_OR_RETURN(Tensor tensor, Tensor::Create(DataType::kInt64, std::move(shape)));
  std::fill_n(tensor.data<int64_t>(), tensor.count(), value);
  return tensor;
}

// The BERT graph's vocabulary and sequence length used for the benchmark.
constexpr int64_t kBertVocabulary = 8192;
constexpr int64_t kBertSequence = 128;

// Writes each input's raw elements to DIR/input_K.bin for the peer.
absl::StatusOr<std::vector<PeerInput>> WriteInputs(const NamedTensors& inputs,
                                                   const std::string& dir) {
  std::vector<PeerInput> files;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto& [name, tensor] = inputs[k];
    PeerInput input{name, tensor.dtype(), tensor.shape(),
                    (fs::path(dir) / absl::StrCat("input_", k, ".bin")).string()};
    RETURN_IF_ERROR(WriteFileAtomic(
        input.file, std::string_view(static_cast<const char*>(tensor.raw_data()), tensor.size()),
        0600));
    files.push_back(std::move(input));
  }
  return files;
}

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Times `count` runs of our model; appends each run's ms to `samples`.
absl::Status TimeOurs(const runtime::Model& model, const NamedTensors& inputs, int count,
                      std::vector<double>* samples) {
  for (int i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto outputs = model.Run(inputs);
    const double elapsed = MillisecondsSince(start);
    RETURN_IF_ERROR(outputs.status());
    if (samples != nullptr) samples->push_back(elapsed);
  }
  return absl::OkStatus();
}

void Pause(int pause_ms) {
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
}

absl::Status PrintProfile(const runtime::Model& model, const NamedTensors& inputs,
                          const ComparisonResult& result, int runs, std::FILE* log) {
  ASSIGN_OR_RETURN(std::vector<runtime::Model::OperatorTime> times, model.Profile(inputs, runs));
  double total = 0;
  for (const auto& entry : times) total += entry.seconds;
  absl::FPrintF(log, "profile %s batch %d (ours, %d threads, %d runs): %.3f ms/run in kernels\n",
                result.model, result.batch, result.threads, runs, total * 1e3 / runs);
  for (const auto& entry : times) {
    const double share = total > 0 ? 100.0 * entry.seconds / total : 0;
    if (share < 0.5) break;
    absl::FPrintF(log, "  %-34s %6.1f%% %9.3f ms/run %5d calls/run\n", entry.op_type, share,
                  entry.seconds * 1e3 / runs, entry.calls / runs);
  }
  return absl::OkStatus();
}

// Benchmarks one model at one batch size on both sides.
absl::StatusOr<ComparisonResult> RunCase(const RuntimeVsOrtOptions& options,
                                         const BenchModel& bench_model, int batch, OrtPeer& peer,
                                         std::FILE* log) {
  const std::string model_path = (fs::path(options.models_dir) / bench_model.file).string();
  ASSIGN_OR_RETURN(std::string model_bytes, ReadFile(model_path));
  ASSIGN_OR_RETURN(NamedTensors inputs, MakeInputs(bench_model.name, batch, options.seed));
  ASSIGN_OR_RETURN(const std::string dir, MakeScratchDir("cloister-bench"));
  ASSIGN_OR_RETURN(std::vector<PeerInput> input_files, WriteInputs(inputs, dir));

  runtime::LoadOptions load_options;
  load_options.threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model,
                   runtime::Model::Load(AsBytes(model_bytes), load_options));
  RETURN_IF_ERROR(peer.Load(model_path, options.threads, input_files).status());

  ComparisonResult result;
  result.model = bench_model.name;
  result.batch = batch;
  result.threads = options.threads;

  // Same inputs, same answers: compare one run of each before timing anything.
  ASSIGN_OR_RETURN(NamedTensors our_outputs, model->Run(inputs));
  ASSIGN_OR_RETURN(NamedTensors ort_outputs, peer.Outputs(dir));
  ASSIGN_OR_RETURN(result.max_abs_diff, MaxAbsDiff(our_outputs, ort_outputs));
  our_outputs.clear();
  ort_outputs.clear();

  RETURN_IF_ERROR(TimeOurs(*model, inputs, options.warmup, nullptr));
  Pause(options.pause_ms);
  RETURN_IF_ERROR(peer.Time(options.warmup).status());
  Pause(options.pause_ms);

  std::vector<double> ours, ort;
  while (static_cast<int>(ours.size()) < options.iterations ||
         static_cast<int>(ort.size()) < options.iterations) {
    const int ours_now =
        std::min(options.block, options.iterations - static_cast<int>(ours.size()));
    if (ours_now > 0) {
      RETURN_IF_ERROR(TimeOurs(*model, inputs, ours_now, &ours));
      Pause(options.pause_ms);
    }
    const int ort_now = std::min(options.block, options.iterations - static_cast<int>(ort.size()));
    if (ort_now > 0) {
      ASSIGN_OR_RETURN(std::vector<double> times, peer.Time(ort_now));
      ort.insert(ort.end(), times.begin(), times.end());
      Pause(options.pause_ms);
    }
  }
  result.ours = Summarize(std::move(ours));
  result.ort = Summarize(std::move(ort));
  if (options.profile) {
    RETURN_IF_ERROR(PrintProfile(*model, inputs, result, options.iterations, log));
  }
  return result;
}

}  // namespace

const std::vector<BenchModel>& BenchModels() {
  static const auto* models = new std::vector<BenchModel>{
      {"cls", "ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx", "3x48x192"},
      {"rec", "ocr/ch_PP-OCRv4_rec_infer.onnx", "3x48x320"},
      {"vad", "vad/silero_vad_op18_ifless.onnx", "576 samples"},
      {"bert_mini", "bert_mini/bert_mini_l4_h256.onnx", "seq 128"},
  };
  return *models;
}

absl::StatusOr<NamedTensors> MakeInputs(const std::string& model, int batch, uint64_t seed) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch ", batch, " is below 1"));
  SeededRandom random(seed);
  const int64_t rows = batch;
  NamedTensors inputs;
  if (model == "cls" || model == "rec") {
    ASSIGN_OR_RETURN(Tensor x, RandomFloats({rows, 3, 48, model == "cls" ? 192 : 320}, random));
    inputs.emplace_back("x", std::move(x));
  } else if (model == "vad") {
    ASSIGN_OR_RETURN(Tensor samples, RandomFloats({rows, 576}, random));
    ASSIGN_OR_RETURN(Tensor sample_rate, FilledInt64({}, 16000));
    ASSIGN_OR_RETURN(Tensor state, Tensor::Create(DataType::kFloat, {2, rows, 128}));
    inputs.emplace_back("input", std::move(samples));
    inputs.emplace_back("state", std::move(state));
    inputs.emplace_back("sr", std::move(sample_rate));
  } else if (model == "bert_mini") {
    ASSIGN_OR_RETURN(Tensor ids, FilledInt64({rows, kBertSequence}, 0));
    int64_t* id_data = ids.data<int64_t>();
    for (int64_t i = 0; i < ids.count(); ++i) id_data[i] = random.Below(kBertVocabulary);
    ASSIGN_OR_RETURN(Tensor mask, FilledInt64({rows, kBertSequence}, 1));
    ASSIGN_OR_RETURN(Tensor token_types, FilledInt64({rows, kBertSequence}, 0));
    inputs.emplace_back("input_ids", std::move(ids));
    inputs.emplace_back("attention_mask", std::move(mask));
    inputs.emplace_back("token_type_ids", std::move(token_types));
  } else {
    return absl::NotFoundError(absl::StrCat("no benchmark model named ", model));
  }
  return inputs;
}

Timing Summarize(std::vector<double> samples_ms) {
  CLOISTER_CHECK(!samples_ms.empty());
  std::sort(samples_ms.begin(), samples_ms.end());
  const size_t count = samples_ms.size();
  Timing timing;
  timing.count = static_cast<int>(count);
  timing.median_ms = count % 2 == 1 ? samples_ms[count / 2]
                                    : (samples_ms[count / 2 - 1] + samples_ms[count / 2]) / 2;
  // Nearest rank: the smallest sample with at least 90% of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(count)));
  timing.p90_ms = samples_ms[std::max<size_t>(rank, 1) - 1];
  return timing;
}

absl::StatusOr<double> MaxAbsDiff(const NamedTensors& ours, const NamedTensors& ort) {
  double max_diff = 0;
  if (ours.size() != ort.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ours gave ", ours.size(), " outputs, ORT ", ort.size()));
  }
  for (const auto& [name, tensor] : ours) {
    auto match = std::find_if(ort.begin(), ort.end(),
                              [&name = name](const auto& entry) { return entry.first == name; });
    if (match == ort.end()) {
      return absl::InvalidArgumentError(absl::StrCat("ORT gave no output named ", name));
    }
    const Tensor& other = match->second;
    if (tensor.shape() != other.shape() || tensor.dtype() != other.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output ", name, ": ours ", runtime::TypeName(tensor.dtype()),
                       runtime::ShapeToString(tensor.shape()), ", ORT ",
                       runtime::TypeName(other.dtype()), runtime::ShapeToString(other.shape())));
    }
    if (tensor.dtype() != DataType::kFloat) continue;
    const float* a = tensor.data<float>();
    const float* b = other.data<float>();
    for (int64_t i = 0; i < tensor.count(); ++i) {
      const double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      // NaN on either side must show, not vanish in std::max.
      if (std::isnan(diff)) return std::numeric_limits<double>::quiet_NaN();
      max_diff = std::max(max_diff, diff);
    }
  }
  return max_diff;
}

std::string JsonLine(const ComparisonResult& result) {
  // Model names are plain identifiers (BenchModels), so they need no escaping.
  return absl::StrFormat(
      "{\"model\":\"%s\",\"batch\":%d,\"ours_ms\":%.4f,\"ort_ms\":%.4f,\"ratio\":%.4f,"
      "\"ours_p90_ms\":%.4f,\"ort_p90_ms\":%.4f,\"threads\":%d,\"iterations\":%d,"
      "\"max_abs_diff\":%.3g}",
      result.model, result.batch, result.ours.median_ms, result.ort.median_ms, result.ratio(),
      result.ours.p90_ms, result.ort.p90_ms, result.threads, result.ours.count,
      std::isnan(result.max_abs_diff) ? -1.0 : result.max_abs_diff);
}

std::string FormatTable(const std::vector<ComparisonResult>& results) {
  std::string table =
      absl::StrFormat("%-10s %5s %7s %10s %10s %10s %10s %7s %10s\n", "model", "batch", "threads",
                      "ours ms", "ours p90", "ort ms", "ort p90", "ratio", "max|diff|");
  std::vector<std::string> slower;
  for (const ComparisonResult& result : results) {
    absl::StrAppendFormat(&table, "%-10s %5d %7d %10.3f %10.3f %10.3f %10.3f %7.2f %10.2g\n",
                          result.model, result.batch, result.threads, result.ours.median_ms,
                          result.ours.p90_ms, result.ort.median_ms, result.ort.p90_ms,
                          result.ratio(), result.max_abs_diff);
    if (!(result.ratio() <= kTargetRatio)) {
      slower.push_back(
          absl::StrFormat("%s b%d (%.2f)", result.model, result.batch, result.ratio()));
    }
  }
  absl::StrAppendFormat(&table, "%d of %d within ratio %.2f", results.size() - slower.size(),
                        results.size(), kTargetRatio);
  if (!slower.empty()) absl::StrAppend(&table, "; slower: ", absl::StrJoin(slower, ", "));
  table += "\n";
  return table;
}

std::string RuntimeVsOrtUsage() {
  return "usage: cloister-bench runtime-vs-ort [--json] [--model cls|rec|vad|bert_mini]\n"
         "    [--threads N] [--iterations N] [--warmup N] [--batches 1,8] [--block N]\n"
         "    [--pause-ms N] [--seed N] [--profile] [--models-dir DIR] [--ort-dir DIR]\n"
         "    [--node PROGRAM] [--peer-script FILE]\n"
         "Median latency of the runtime's CPU executor against onnxruntime-node on the shared\n"
         "models, same inputs and thread count, runs interleaved. --ort-dir is the node_modules\n"
         "folder holding onnxruntime-node (scripts/install-bench-deps.sh installs it).\n";
}

absl::StatusOr<RuntimeVsOrtOptions> ParseRuntimeVsOrtFlags(const std::vector<std::string>& args,
                                                           RuntimeVsOrtOptions options) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inline_value;
    if (const size_t equals = flag.find('='); flag.rfind("--", 0) == 0 && equals != flag.npos) {
      inline_value = flag.substr(equals + 1);
      flag = flag.substr(0, equals);
    }
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(flag + " needs a value");
      return args[++i];
    };
    auto positive = [&](int minimum) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(std::string text, value());
      int number = 0;
      if (!absl::SimpleAtoi(text, &number) || number < minimum) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " needs an integer >= ", minimum, ", got \"", text, "\""));
      }
      return number;
    };
    auto no_value = [&]() -> absl::Status {
      if (inline_value) return absl::InvalidArgumentError(flag + " takes no value");
      return absl::OkStatus();
    };
    if (flag == "--json") {
      RETURN_IF_ERROR(no_value());
      options.json = true;
    } else if (flag == "--profile") {
      RETURN_IF_ERROR(no_value());
      options.profile = true;
    } else if (flag == "--model") {
      ASSIGN_OR_RETURN(options.model, value());
      const auto& models = BenchModels();
      if (std::none_of(models.begin(), models.end(),
                       [&](const BenchModel& model) { return model.name == options.model; })) {
        return absl::InvalidArgumentError(absl::StrCat("--model: no model named \"", options.model,
                                                       "\" (cls, rec, vad, bert_mini)"));
      }
    } else if (flag == "--threads") {
      ASSIGN_OR_RETURN(options.threads, positive(1));
    } else if (flag == "--iterations") {
      ASSIGN_OR_RETURN(options.iterations, positive(1));
    } else if (flag == "--warmup") {
      ASSIGN_OR_RETURN(options.warmup, positive(0));
    } else if (flag == "--block") {
      ASSIGN_OR_RETURN(options.block, positive(1));
    } else if (flag == "--pause-ms") {
      ASSIGN_OR_RETURN(options.pause_ms, positive(0));
    } else if (flag == "--seed") {
      ASSIGN_OR_RETURN(std::string text, value());
      if (!absl::SimpleAtoi(text, &options.seed)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--seed needs an unsigned integer, got \"", text, "\""));
      }
    } else if (flag == "--batches") {
      ASSIGN_OR_RETURN(std::string text, value());
      options.batches.clear();
      for (absl::string_view part : absl::StrSplit(text, ',')) {
        int batch = 0;
        if (!absl::SimpleAtoi(part, &batch) || batch < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--batches needs a comma-separated list of batch sizes >= 1, got \"", text, "\""));
        }
        options.batches.push_back(batch);
      }
    } else if (flag == "--models-dir") {
      ASSIGN_OR_RETURN(options.models_dir, value());
    } else if (flag == "--ort-dir") {
      ASSIGN_OR_RETURN(options.ort_dir, value());
    } else if (flag == "--node") {
      ASSIGN_OR_RETURN(options.node, value());
    } else if (flag == "--peer-script") {
      ASSIGN_OR_RETURN(options.peer_script, value());
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
  }
  return options;
}

absl::StatusOr<std::vector<ComparisonResult>> RunRuntimeVsOrt(const RuntimeVsOrtOptions& options,
                                                              OrtPeer& peer, std::FILE* out,
                                                              std::FILE* log) {
  std::vector<ComparisonResult> results;
  for (const BenchModel& model : BenchModels()) {
    if (!options.model.empty() && model.name != options.model) continue;
    for (int batch : options.batches) {
      auto result = RunCase(options, model, batch, peer, log);
      if (!result.ok()) {
        return absl::Status(result.status().code(), absl::StrCat(model.name, " batch ", batch, ": ",
                                                                 result.status().message()));
      }
      if (options.json) {
        absl::FPrintF(out, "%s\n", JsonLine(*result));
        std::fflush(out);
      } else {
        absl::FPrintF(log, "%s (%s) batch %d: ours %.3f ms, ort %.3f ms, ratio %.2f\n", model.name,
                      model.input, batch, result->ours.median_ms, result->ort.median_ms,
                      result->ratio());
      }
      results.push_back(*std::move(result));
    }
  }
  if (!options.json) absl::FPrintF(out, "%s", FormatTable(results));
  return results;
}

}  // namespace cloister::bench
