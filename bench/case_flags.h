// Flag parsing shared by the cloister-bench cases added after runtime-vs-ort (coalescing, cc-tax,
// broker-efficiency, scheduler-overhead): each case lists its flags as FlagSpecs that point at
// the fields of its options struct, and ParseCaseFlags fills them from `--flag VALUE` or
// `--flag=VALUE` arguments.
//
// Threading: pure functions. Ownership: the specs borrow the fields they fill.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace cloister::bench {

// An integer flag with its smallest accepted value.
struct IntFlag {
  int* value;
  int minimum = 0;
};
// A comma-separated list of integers, each at least `minimum`; at least one element.
struct IntListFlag {
  std::vector<int>* values;
  int minimum = 1;
};
// A flag that takes no value and sets the bool.
struct SwitchFlag {
  bool* value;
};
// A string flag; when `choices` is not empty the value must be one of them.
struct StringFlag {
  std::string* value;
  std::vector<std::string> choices;
};

struct FlagSpec {
  std::string name;  // with the dashes: "--iterations"
  std::variant<IntFlag, IntListFlag, SwitchFlag, StringFlag> target;
};

// Fills the targets from `args`. InvalidArgument naming the flag for an unknown flag, a missing,
// malformed or out-of-range value, or a value given to a switch.
absl::Status ParseCaseFlags(const std::vector<std::string>& args,
                            const std::vector<FlagSpec>& specs);

// True when `args` holds --help or -h.
bool WantsHelp(const std::vector<std::string>& args);

}  // namespace cloister::bench
