// Test driver for the JSON output of cloister-bench's cases: runs the given command and checks
// that its stdout is exactly LINES JSON objects, one per line, each holding every listed field;
// a field written NAME:s must be a non-empty string, any other a positive finite number (an
// integer when written NAME:i). Each QUOTIENT=A/B check requires that field QUOTIENT equals
// A / B within 0.1 %.
//
//   check_bench_json LINES FIELD[,FIELD...] [QUOTIENT=A/B ...] -- COMMAND [ARG...]
//
// Exits 0 when the output is right, 1 when it is not (with one line saying what is wrong).
#include <cmath>
#include <cstdio>
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

struct Field {
  std::string name;
  char kind;  // 's' string, 'i' positive integer, 'n' positive number
};

struct Quotient {
  std::string result, numerator, denominator;
};

}  // namespace

int main(int argc, char** argv) {
  int separator = 1;
  while (separator < argc && std::string(argv[separator]) != "--") ++separator;
  int expected_lines = 0;
  if (separator < 3 || separator + 1 >= argc || !absl::SimpleAtoi(argv[1], &expected_lines)) {
    std::fprintf(stderr,
                 "usage: %s LINES FIELD[,FIELD...] [QUOTIENT=A/B ...] -- COMMAND [ARG...]\n",
                 argv[0]);
    return 1;
  }
  std::vector<Field> fields;
  for (absl::string_view part : absl::StrSplit(argv[2], ',')) {
    std::vector<std::string> name_kind = absl::StrSplit(part, ':');
    fields.push_back({name_kind[0], name_kind.size() > 1 ? name_kind[1][0] : 'n'});
  }
  std::vector<Quotient> quotients;
  for (int i = 3; i < separator; ++i) {
    std::vector<std::string> sides = absl::StrSplit(argv[i], absl::ByAnyChar("=/"));
    if (sides.size() != 3) return Fail(std::string("bad quotient ") + argv[i]);
    quotients.push_back({sides[0], sides[1], sides[2]});
  }

  std::string out;
  const int exit_code =
      RunCapturing(std::vector<std::string>(argv + separator + 1, argv + argc), &out);
  if (exit_code != 0) return Fail("command exited with " + std::to_string(exit_code));

  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    ++lines;
    const std::string text(line);
    nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!object.is_object()) return Fail("not a JSON object: " + text);
    for (const Field& field : fields) {
      if (!object.contains(field.name)) return Fail("no field " + field.name + " in " + text);
      const nlohmann::json& value = object[field.name];
      if (field.kind == 's') {
        if (!value.is_string() || value.get<std::string>().empty()) {
          return Fail(field.name + " is not a non-empty string in " + text);
        }
        continue;
      }
      if (field.kind == 'i' && !value.is_number_integer()) {
        return Fail(field.name + " is not an integer in " + text);
      }
      if (!value.is_number() || !(value.get<double>() > 0) || !std::isfinite(value.get<double>())) {
        return Fail(field.name + " is not a positive number in " + text);
      }
    }
    for (const Quotient& quotient : quotients) {
      for (const std::string* name :
           {&quotient.result, &quotient.numerator, &quotient.denominator}) {
        if (!object.contains(*name) || !object[*name].is_number()) {
          return Fail("no number " + *name + " in " + text);
        }
      }
      const double expected =
          object[quotient.numerator].get<double>() / object[quotient.denominator].get<double>();
      if (std::fabs(expected - object[quotient.result].get<double>()) > 1e-3 * expected) {
        return Fail(quotient.result + " is not " + quotient.numerator + " / " +
                    quotient.denominator + " in " + text);
      }
    }
  }
  if (lines != expected_lines) {
    return Fail("expected " + std::to_string(expected_lines) + " lines, got " +
                std::to_string(lines));
  }
  std::printf("PASS: %d lines\n", lines);
  return 0;
}
