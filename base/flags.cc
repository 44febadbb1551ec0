#include "base/flags.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace cloister {
namespace {

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& text, int minimum) {
  int number = 0;
  if (!absl::SimpleAtoi(text, &number) || number < minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " needs an integer >= ", minimum, ", got \"", text, "\""));
  }
  return number;
}

absl::Status MissingValue(const std::string& flag, const FlagSyntax& syntax) {
  return absl::InvalidArgumentError(syntax.needs_value ? syntax.needs_value(flag)
                                                       : flag + " needs a value");
}

// Stores `text`, given to `flag`, in the target of `spec` (any kind but a switch).
absl::Status StoreValue(const FlagSpec& spec, const std::string& flag, std::string text,
                        const FlagSyntax& syntax) {
  if (const auto* target = std::get_if<IntFlag>(&spec.target)) {
    ASSIGN_OR_RETURN(*target->value, ParseInt(flag, text, target->minimum));
  } else if (const auto* target = std::get_if<IntListFlag>(&spec.target)) {
    std::vector<int> numbers;
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      ASSIGN_OR_RETURN(int number, ParseInt(flag, std::string(part), target->minimum));
      numbers.push_back(number);
    }
    *target->values = std::move(numbers);
  } else if (const auto* target = std::get_if<DoubleFlag>(&spec.target)) {
    if (!absl::SimpleAtod(text, target->value)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs a number, got \"", text, "\""));
    }
  } else if (const auto* target = std::get_if<StringFlag>(&spec.target)) {
    if (!target->choices.empty() &&
        std::find(target->choices.begin(), target->choices.end(), text) == target->choices.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " must be one of ", absl::StrJoin(target->choices, ", "), ", not \"", text, "\""));
    }
    if (target->non_empty && text.empty()) return MissingValue(flag, syntax);
    *target->value = std::move(text);
  } else if (const auto* target = std::get_if<OptionalStringFlag>(&spec.target)) {
    if (target->non_empty && text.empty()) return MissingValue(flag, syntax);
    *target->value = std::move(text);
  } else if (const auto* target = std::get_if<StringListFlag>(&spec.target)) {
    target->values->push_back(std::move(text));
  } else if (const auto* target = std::get_if<CustomFlag>(&spec.target)) {
    return target->parse(text);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs,
                        const FlagSyntax& syntax) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (syntax.positional != nullptr && !absl::StartsWith(args[i], syntax.flag_prefix)) {
      syntax.positional->push_back(args[i]);
      continue;
    }
    std::string flag = args[i];
    std::optional<std::string> inline_value;
    if (const size_t equals = flag.find('=');
        syntax.inline_values && flag.rfind("--", 0) == 0 && equals != flag.npos) {
      inline_value = flag.substr(equals + 1);
      flag = flag.substr(0, equals);
    }
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& candidate) {
      return candidate.name == flag;
    });
    if (spec == specs.end()) {
      return absl::InvalidArgumentError(syntax.unknown_flag
                                            ? syntax.unknown_flag(flag)
                                            : absl::StrCat("unknown flag \"", flag, "\""));
    }
    if (const auto* target = std::get_if<SwitchFlag>(&spec->target)) {
      if (inline_value) {
        return absl::InvalidArgumentError(syntax.takes_no_value ? syntax.takes_no_value(flag)
                                                                : flag + " takes no value");
      }
      *target->value = true;
      if (target->stop) break;
      continue;
    }
    if (!inline_value && i + 1 >= args.size()) return MissingValue(flag, syntax);
    RETURN_IF_ERROR(
        StoreValue(*spec, flag, inline_value ? *std::move(inline_value) : args[++i], syntax));
  }
  return absl::OkStatus();
}

bool WantsHelp(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& arg) { return arg == "--help" || arg == "-h"; });
}

}  // namespace cloister
