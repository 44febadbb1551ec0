// Test driver for `cloister-bench runtime-vs-ort --json`: runs the given command, and checks that
// its stdout is exactly one JSON object per expected model and batch with the fields model
// (string), batch (integer), ours_ms, ort_ms, ratio (positive numbers, ratio = ours_ms / ort_ms)
// and no fields beyond the documented extras.
//
//   check_runtime_vs_ort_json MODEL BATCH[,BATCH...] -- COMMAND [ARG...]
//
// Exits 0 when the output is right, 1 when it is not (with one line saying what is wrong), and
// 77 (ctest's SKIP_RETURN_CODE) when the command exits 2, which cloister-bench uses for "the ORT
// peer is not installed".
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/support/process.h"

namespace {

// ctest's own TIMEOUT is shorter; this only keeps a stray run from hanging forever.
constexpr absl::Duration kCommandTimeout = absl::Minutes(10);

constexpr int kSkip = 77;

int Fail(const std::string& message) {
  std::fprintf(stderr, "FAIL: %s\n", message.c_str());
  return 1;
}

// Runs the command (tests/support/process.h) and passes its stderr through, so that a failing
// benchmark explains itself in the test log; returns the exit code (-1 for a signal or a
// timeout) and fills `out` with stdout.
int RunCapturing(std::vector<std::string> args, std::string* out) {
  cloister::testing::RunResult run = cloister::testing::Run(args, {}, kCommandTimeout);
  std::fputs(run.err.c_str(), stderr);
  *out = std::move(run.out);
  return run.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || std::string(argv[3]) != "--") {
    std::fprintf(stderr, "usage: %s MODEL BATCH[,BATCH...] -- COMMAND [ARG...]\n", argv[0]);
    return 1;
  }
  const std::string model = argv[1];
  std::set<int> expected_batches;
  for (absl::string_view part : absl::StrSplit(argv[2], ',')) {
    int batch = 0;
    if (!absl::SimpleAtoi(part, &batch)) return Fail("bad batch list " + std::string(argv[2]));
    expected_batches.insert(batch);
  }
  std::string out;
  const int exit_code = RunCapturing(std::vector<std::string>(argv + 4, argv + argc), &out);
  if (exit_code == 2) {
    std::fprintf(stderr,
                 "skipped: the ORT peer is not installed (scripts/install-bench-deps.sh)\n");
    return kSkip;
  }
  if (exit_code != 0) return Fail("command exited with " + std::to_string(exit_code));

  const std::set<std::string> required = {"model", "batch", "ours_ms", "ort_ms", "ratio"};
  const std::set<std::string> extras = {"ours_p90_ms", "ort_p90_ms", "threads", "iterations",
                                        "max_abs_diff"};
  std::set<int> seen_batches;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const std::string text(line);
    nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!object.is_object()) return Fail("not a JSON object: " + text);
    for (const std::string& key : required) {
      if (!object.contains(key)) return Fail("no field " + key + " in " + text);
    }
    for (const auto& [key, value] : object.items()) {
      if (!required.count(key) && !extras.count(key)) return Fail("unexpected field " + key);
    }
    if (!object["model"].is_string() || object["model"].get<std::string>() != model) {
      return Fail("model is not \"" + model + "\" in " + text);
    }
    if (!object["batch"].is_number_integer()) return Fail("batch is not an integer in " + text);
    const int batch = object["batch"].get<int>();
    if (!expected_batches.count(batch)) return Fail("unexpected batch in " + text);
    if (!seen_batches.insert(batch).second) return Fail("batch repeated in " + text);
    for (const char* key : {"ours_ms", "ort_ms", "ratio"}) {
      if (!object[key].is_number() || !(object[key].get<double>() > 0)) {
        return Fail(std::string(key) + " is not a positive number in " + text);
      }
    }
    const double ratio = object["ours_ms"].get<double>() / object["ort_ms"].get<double>();
    if (std::fabs(ratio - object["ratio"].get<double>()) > 1e-3 * ratio + 1e-4) {
      return Fail("ratio is not ours_ms / ort_ms in " + text);
    }
    if (object.contains("max_abs_diff") &&
        !(object["max_abs_diff"].is_number() && object["max_abs_diff"].get<double>() < 1e-2)) {
      return Fail("our outputs and ORT's differ (max_abs_diff) in " + text);
    }
  }
  if (seen_batches != expected_batches) {
    return Fail("expected one line per batch, got " + std::to_string(seen_batches.size()) +
                " distinct batches");
  }
  std::printf("PASS: %zu lines for %s\n", seen_batches.size(), model.c_str());
  return 0;
}
