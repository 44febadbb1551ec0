// onnx-conformance: runs ONNX backend-style test folders through the enclave runtime.
//
//   onnx-conformance [--executor cpu|cuda|auto] [--atol X] [--rtol X] [--failures-only] DIR...
//   onnx-conformance [--executor cpu|cuda|auto] --model FILE DIR...
//
// --repeat N times N further runs of each set and prints the median latency; with --profile
// also the time per operator type. With --repeat, a set without output files is only timed.
//
// Each DIR holds model.onnx (unless --model is given) and test_data_set_*/ folders with
// input_K.pb and output_K.pb (serialized onnx.TensorProto). Prints "PASS name" or
// "FAIL name: reason" per test set and "N passed, M failed" at the end; exits 1 if any failed,
// 2 on bad usage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/flags.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/onnx_tensor.h"

namespace cloister::runtime {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string executor = "cpu";
  std::string model;
  double atol = 1e-3;
  double rtol = 1e-3;
  bool failures_only = false;
  int repeat = 0;  // extra timed runs per passing set
  bool profile = false;
  std::vector<std::string> dirs;
};

// Files named PREFIX_<n>.pb in numeric order.
std::vector<fs::path> NumberedFiles(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<int, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix + "_", 0) != 0 || entry.path().extension() != ".pb") continue;
    const std::string number = name.substr(prefix.size() + 1, name.size() - prefix.size() - 4);
    char* end = nullptr;
    const long n = std::strtol(number.c_str(), &end, 10);
    if (end == number.c_str() || *end != '\0') continue;
    found.emplace_back(static_cast<int>(n), entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> paths;
  for (auto& [n, path] : found) paths.push_back(path);
  return paths;
}

absl::StatusOr<std::pair<std::string, Tensor>> ReadTensor(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path.string()));
  onnx::TensorProto proto;
  if (!proto.ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.filename().string(), " is not a TensorProto"));
  }
  ASSIGN_OR_RETURN(Tensor tensor, TensorFromProto(proto));
  return std::make_pair(proto.name(), std::move(tensor));
}

// Compares one output; an empty string means it matches.
std::string Compare(const Tensor& got, const Tensor& want, double atol, double rtol) {
  if (got.dtype() != want.dtype()) {
    return absl::StrCat("type ", TypeName(got.dtype()), ", expected ", TypeName(want.dtype()));
  }
  if (got.shape() != want.shape()) {
    return absl::StrCat("shape ", ShapeToString(got.shape()), ", expected ",
                        ShapeToString(want.shape()));
  }
  std::string mismatch;
  int64_t bad = 0;
  double worst = 0;
  auto check = [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(got.raw_data());
    const T* w = static_cast<const T*>(want.raw_data());
    for (int64_t i = 0; i < got.count(); ++i) {
      bool ok;
      double a, b;
      if constexpr (std::is_same_v<T, Float16Bits>) {
        a = HalfToFloat(g[i].bits);
        b = HalfToFloat(w[i].bits);
      } else {
        a = static_cast<double>(g[i]);
        b = static_cast<double>(w[i]);
      }
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Float16Bits>) {
        ok = (std::isnan(a) && std::isnan(b)) || a == b ||
             std::fabs(a - b) <= atol + rtol * std::fabs(b);
      } else {
        ok = a == b;
      }
      if (!ok) {
        if (bad == 0) {
          mismatch = absl::StrCat("element ", i, " is ", a, ", expected ", b);
        }
        worst = std::max(worst, std::fabs(a - b));
        ++bad;
      }
    }
  };
  TensorTypes::Dispatch(got.dtype(), check);
  if (bad == 0) return "";
  return absl::StrCat(mismatch, " (", bad, " of ", got.count(), " elements differ, max |diff| ",
                      worst, ")");
}

// Runs one test set; returns "" on success or the failure reason.
std::string RunSet(const Model& model, const fs::path& set, const Options& options) {
  std::vector<std::pair<std::string, Tensor>> inputs;
  std::vector<fs::path> input_files = NumberedFiles(set, "input");
  if (input_files.size() > model.inputs().size()) {
    return absl::StrCat(input_files.size(), " input files for ", model.inputs().size(),
                        " model inputs");
  }
  for (size_t i = 0; i < input_files.size(); ++i) {
    auto tensor = ReadTensor(input_files[i]);
    if (!tensor.ok()) return std::string(tensor.status().message());
    std::string name = tensor->first.empty() ? model.inputs()[i].name : tensor->first;
    inputs.emplace_back(std::move(name), std::move(tensor->second));
  }
  std::vector<fs::path> output_files = NumberedFiles(set, "output");
  // Benchmark folders may hold inputs only; a conformance run needs expected outputs.
  if (output_files.empty() && options.repeat == 0) return "no output_*.pb files";
  auto outputs = model.Run(inputs);
  if (!outputs.ok()) return std::string(outputs.status().message());
  if (options.repeat > 0) {
    std::vector<double> times;
    for (int r = 0; r < options.repeat; ++r) {
      const auto start = std::chrono::steady_clock::now();
      auto again = model.Run(inputs);
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      if (!again.ok()) return std::string(again.status().message());
    }
    std::sort(times.begin(), times.end());
    std::printf("TIME %s: median %.3f ms, min %.3f ms over %d runs\n", set.string().c_str(),
                times[times.size() / 2], times.front(), options.repeat);
    if (options.profile) {
      auto profile = model.Profile(inputs, options.repeat);
      if (!profile.ok()) return std::string(profile.status().message());
      for (const Model::OperatorTime& entry : *profile) {
        std::printf("  %-20s %9.3f ms/run  %5d calls/run\n", entry.op_type.c_str(),
                    1e3 * entry.seconds / options.repeat, entry.calls / options.repeat);
      }
    }
  }
  for (size_t i = 0; i < output_files.size(); ++i) {
    auto want = ReadTensor(output_files[i]);
    if (!want.ok()) return std::string(want.status().message());
    const Tensor* got = nullptr;
    std::string name = want->first;
    if (!name.empty()) {
      for (const auto& [output_name, tensor] : *outputs) {
        if (output_name == name) got = &tensor;
      }
    } else if (i < outputs->size()) {
      got = &(*outputs)[i].second;
      name = (*outputs)[i].first;
    }
    if (got == nullptr) return absl::StrCat("the model has no output '", name, "'");
    std::string difference = Compare(*got, want->second, options.atol, options.rtol);
    if (!difference.empty()) return absl::StrCat("output '", name, "': ", difference);
  }
  return "";
}

// Parses the command line into `options`; returns the exit code when the program should stop
// there (after the help text, or on bad usage).
std::optional<int> ParseOptions(int argc, char** argv, Options& options) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (WantsHelp(args)) {
    std::printf(
        "usage: onnx-conformance [--executor cpu|cuda|auto] [--model FILE] [--atol X] [--rtol X] "
        "[--failures-only] [--repeat N [--profile]] DIR...\n");
    return 0;
  }
  const absl::Status parsed = ParseFlags(
      args,
      {{"--executor", StringFlag{&options.executor, {}}},
       {"--model", StringFlag{&options.model, {}}},
       {"--atol", DoubleFlag{&options.atol}},
       {"--rtol", DoubleFlag{&options.rtol}},
       {"--repeat", IntFlag{&options.repeat, 0}},
       {"--profile", SwitchFlag{&options.profile}},
       {"--failures-only", SwitchFlag{&options.failures_only}}},
      {.positional = &options.dirs,
       .inline_values = false,
       .unknown_flag = [](const std::string& arg) { return "unknown option " + arg; }});
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  if (options.dirs.empty()) {
    std::fprintf(stderr,
                 "usage: onnx-conformance [--executor cpu|cuda|auto] [--model FILE] DIR...\n");
    return 2;
  }
  return std::nullopt;
}

// Counts the results and prints one line per test set.
class Reporter {
 public:
  explicit Reporter(bool failures_only) : failures_only_(failures_only) {}

  // Records a pass when `failure` is empty, a failure with that reason otherwise.
  void Report(const std::string& name, const std::string& failure) {
    if (failure.empty()) {
      ++passed_;
      if (!failures_only_) std::printf("PASS %s\n", name.c_str());
    } else {
      ++failed_;
      std::printf("FAIL %s: %s\n", name.c_str(), failure.c_str());
    }
    std::fflush(stdout);
  }
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  const bool failures_only_;
  int passed_ = 0;
  int failed_ = 0;
};

// Loads the model of one test folder and runs each of its test_data_set_* folders.
void RunFolder(const std::string& dir_name, const Options& options, const LoadOptions& load_options,
               Reporter& reporter) {
  const fs::path dir(dir_name);
  const std::string label =
      dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  std::vector<fs::path> sets;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0) {
      sets.push_back(entry.path());
    }
  }
  if (error) {
    reporter.Report(label, absl::StrCat("cannot read folder: ", error.message()));
    return;
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) {
    reporter.Report(label, "no test_data_set_* folders");
    return;
  }
  const std::string model_path =
      options.model.empty() ? (dir / "model.onnx").string() : options.model;
  auto bytes = ReadFile(model_path);
  absl::StatusOr<std::unique_ptr<Model>> model =
      bytes.ok() ? Model::Load(AsBytes(*bytes), load_options)
                 : absl::StatusOr<std::unique_ptr<Model>>(bytes.status());
  for (const fs::path& set : sets) {
    const std::string name = absl::StrCat(label, "/", set.filename().string());
    if (!model.ok()) {
      reporter.Report(name, absl::StrCat("load: ", model.status().message()));
      continue;
    }
    reporter.Report(name, RunSet(**model, set, options));
  }
}

int Main(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseOptions(argc, argv, options)) return *exit_code;
  auto executor = FindExecutor(options.executor);
  if (!executor.ok()) {
    std::fprintf(stderr, "%s\n", std::string(executor.status().message()).c_str());
    return 2;
  }
  LoadOptions load_options;
  load_options.executor = *executor;
  Reporter reporter(options.failures_only);
  for (const std::string& dir_name : options.dirs) {
    RunFolder(dir_name, options, load_options, reporter);
  }
  std::printf("%d passed, %d failed\n", reporter.passed(), reporter.failed());
  return reporter.failed() > 0 ? 1 : 0;
}

}  // namespace
}  // namespace cloister::runtime

int main(int argc, char** argv) { return cloister::runtime::Main(argc, argv); }
