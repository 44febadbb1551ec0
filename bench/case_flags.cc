#include "bench/case_flags.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace cloister::bench {
namespace {

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& text, int minimum) {
  int number = 0;
  if (!absl::SimpleAtoi(text, &number) || number < minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " needs an integer >= ", minimum, ", got \"", text, "\""));
  }
  return number;
}

}  // namespace

absl::Status ParseCaseFlags(const std::vector<std::string>& args,
                            const std::vector<FlagSpec>& specs) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inline_value;
    if (const size_t equals = flag.find('='); flag.rfind("--", 0) == 0 && equals != flag.npos) {
      inline_value = flag.substr(equals + 1);
      flag = flag.substr(0, equals);
    }
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& candidate) {
      return candidate.name == flag;
    });
    if (spec == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"", flag, "\""));
    }
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(flag + " needs a value");
      return args[++i];
    };
    if (const auto* target = std::get_if<SwitchFlag>(&spec->target)) {
      if (inline_value) return absl::InvalidArgumentError(flag + " takes no value");
      *target->value = true;
    } else if (const auto* target = std::get_if<IntFlag>(&spec->target)) {
      ASSIGN_OR_RETURN(std::string text, value());
      ASSIGN_OR_RETURN(*target->value, ParseInt(flag, text, target->minimum));
    } else if (const auto* target = std::get_if<IntListFlag>(&spec->target)) {
      ASSIGN_OR_RETURN(std::string text, value());
      std::vector<int> numbers;
      for (absl::string_view part : absl::StrSplit(text, ',')) {
        ASSIGN_OR_RETURN(int number, ParseInt(flag, std::string(part), target->minimum));
        numbers.push_back(number);
      }
      *target->values = std::move(numbers);
    } else if (const auto* target = std::get_if<StringFlag>(&spec->target)) {
      ASSIGN_OR_RETURN(std::string text, value());
      if (!target->choices.empty() && std::find(target->choices.begin(), target->choices.end(),
                                                text) == target->choices.end()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " must be one of ",
                                                       absl::StrJoin(target->choices, ", "),
                                                       ", not \"", text, "\""));
      }
      *target->value = text;
    }
  }
  return absl::OkStatus();
}

bool WantsHelp(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& arg) { return arg == "--help" || arg == "-h"; });
}

}  // namespace cloister::bench
