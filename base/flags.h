// Command-line flag parsing shared by Cloister's programs: each program lists its flags as
// FlagSpecs that point at the fields of its options struct, and ParseFlags fills them from
// `--flag VALUE` or `--flag=VALUE` arguments (and, when asked, collects bare arguments).
//
// Threading: pure functions. Ownership: the specs borrow the fields they fill.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace cloister {

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
// A number (a decimal or exponent form such as 1e-3).
struct DoubleFlag {
  double* value;
};
// A flag that takes no value and sets the bool. With `stop`, the arguments after it are not
// read (a --help that wins over whatever follows).
struct SwitchFlag {
  bool* value;
  bool stop = false;
};
// A string flag; when `choices` is not empty the value must be one of them, and when
// `non_empty` an empty value counts as a missing one.
struct StringFlag {
  std::string* value;
  std::vector<std::string> choices;
  bool non_empty = false;
};
// A string flag whose absence stays visible: unset until given.
struct OptionalStringFlag {
  std::optional<std::string>* value;
  bool non_empty = false;
};
// A flag that may be given several times; each value is appended.
struct StringListFlag {
  std::vector<std::string>* values;
};
// A value the program checks and stores itself, once per time the flag is given; an error from
// `parse` is returned as it is.
struct CustomFlag {
  std::function<absl::Status(const std::string& value)> parse;
};

struct FlagSpec {
  std::string name;  // with the dashes: "--iterations"
  std::variant<IntFlag, IntListFlag, DoubleFlag, SwitchFlag, StringFlag, OptionalStringFlag,
               StringListFlag, CustomFlag>
      target;
};

// How a program's command line differs from the plain `--flag VALUE` form.
struct FlagSyntax {
  // Where arguments that are empty or do not start with '-' go, in order; when null they are
  // refused as unknown flags.
  std::vector<std::string>* positional = nullptr;
  // What a flag starts with: with `positional` set, other arguments (and empty ones) are bare.
  std::string flag_prefix = "-";
  // Whether `--flag=VALUE` is accepted; when false it is an unknown flag.
  bool inline_values = true;
  // The error for an argument that is no flag of `specs`; `unknown flag "ARG"` when unset.
  std::function<std::string(const std::string& arg)> unknown_flag;
  // The error for a flag given without its value; `FLAG needs a value` when unset.
  std::function<std::string(const std::string& flag)> needs_value;
  // The error for `--switch=VALUE`; `FLAG takes no value` when unset.
  std::function<std::string(const std::string& flag)> takes_no_value;
};

// Fills the targets from `args` in order, stopping at the first error. InvalidArgument naming the
// flag for an unknown flag, a missing, malformed or out-of-range value, or a value given to a
// switch; a CustomFlag's own error.
absl::Status ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs,
                        const FlagSyntax& syntax = {});

// True when `args` holds --help or -h.
bool WantsHelp(const std::vector<std::string>& args);

}  // namespace cloister
