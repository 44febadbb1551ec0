// The chat-template evaluator: the tests (`is defined`, `is string`, ...) and the filters
// (`|tojson`, `|selectattr`, `|map`, `|indent`, ...).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_renderer.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

// ---- tests ----

absl::StatusOr<bool> Renderer::Test(const std::string& name, const Value& v,
                                    const std::vector<Value>& arguments, int line) {
  const Value::Kind k = v.kind;
  auto argument = [&]() -> absl::StatusOr<Value> {
    if (arguments.size() != 1) return Error(line, Cat("the test '", name, "' needs one argument"));
    return arguments[0];
  };
  if (name == "defined") return k != Value::Kind::kUndefined;
  if (name == "undefined") return k == Value::Kind::kUndefined;
  if (name == "none") return k == Value::Kind::kNone;
  if (name == "string") return k == Value::Kind::kString;
  if (name == "number") return k == Value::Kind::kInteger || k == Value::Kind::kFloat;
  if (name == "integer") return k == Value::Kind::kInteger;
  if (name == "float") return k == Value::Kind::kFloat;
  if (name == "mapping") return k == Value::Kind::kObject;
  if (name == "sequence" || name == "iterable") {
    return k == Value::Kind::kList || k == Value::Kind::kString || k == Value::Kind::kObject;
  }
  if (name == "boolean") return k == Value::Kind::kBoolean;
  if (name == "true") return k == Value::Kind::kBoolean && v.boolean;
  if (name == "false") return k == Value::Kind::kBoolean && !v.boolean;
  if (name == "truthy") return Truthy(v);
  if (name == "callable") return k == Value::Kind::kFunction;
  if (name == "equalto" || name == "eq" || name == "==" || name == "ne" || name == "!=") {
    ASSIGN_OR_RETURN(Value other, argument());
    ASSIGN_OR_RETURN(bool same, Equal(v, other, line, 0));
    return (name == "ne" || name == "!=") ? !same : same;
  }
  if (name == "in") {
    ASSIGN_OR_RETURN(Value container, argument());
    return Contains(container, v, line);
  }
  if (name == "lower" || name == "upper") {
    if (k != Value::Kind::kString) return false;
    return ChangeCase(name, v.str()) == v.str();
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (k != Value::Kind::kInteger) return Error(line, Cat("the test '", name, "' needs an integer"));
    if (name == "odd") return v.integer % 2 != 0;
    if (name == "even") return v.integer % 2 == 0;
    ASSIGN_OR_RETURN(Value divisor, argument());
    if (divisor.kind != Value::Kind::kInteger || divisor.integer == 0) {
      return Error(line, "divisibleby needs a non-zero integer");
    }
    if (divisor.integer == -1) return true;
    return v.integer % divisor.integer == 0;
  }
  return Error(line, Cat("the test '", name, "' is not supported"));
}

// ---- filters ----

absl::StatusOr<Value> Renderer::EvalFilter(const Expr& expr, Scope* scope) {
  ASSIGN_OR_RETURN(Value operand, Eval(*expr.children[0], scope));
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  RETURN_IF_ERROR(EvalArguments(expr, 1, scope, &positional, &keywords));
  return ApplyFilter(expr.text, operand, positional, keywords, expr.line);
}

absl::StatusOr<Value> Renderer::AttributePath(const Value& item, const std::string& path,
                                              int line) {
  Value current = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (current.is_list()) {
      int64_t index = 0;
      auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), index);
      if (error != std::errc() || end != part.data() + part.size()) return Value();
      ASSIGN_OR_RETURN(current, Index(current, Value::Integer(index), line));
    } else {
      current = Attribute(current, part);
    }
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

absl::StatusOr<Value> Renderer::ApplyFilter(
    const std::string& name, const Value& v, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  const std::string what = Cat("the filter '", name, "'");
  if (name == "safe") return v;
  if (name == "tojson") return TojsonFilter(v, what, positional, keywords, line);
  if (name == "default" || name == "d") {
    ASSIGN_OR_RETURN(Arguments a, Bind(what, {"default_value", "boolean"}, positional, keywords, line));
    const bool use_default = (a[1].has_value() && Truthy(*a[1])) ? !Truthy(v) : v.is_undefined();
    if (!use_default) return v;
    return a[0].has_value() ? *a[0] : Value::String("");
  }
  if (name == "string") {
    ASSIGN_OR_RETURN(std::string text, PrintToString(v, line));
    return Value::String(std::move(text));
  }
  if (name == "join") return JoinFilter(v, what, positional, keywords, line);
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    return SelectFilter(name, v, what, positional, keywords, line);
  }
  if (name == "map") {
    return MapFilter(v, what, positional, keywords, line);
  }
  if (name == "indent") return IndentFilter(v, what, positional, keywords, line);
  if (name == "replace") {
    if (!v.is_string()) return KindError(what, "a string", v, line);
    return CallMethod(v, "replace", positional, keywords, line);
  }
  if (name == "int" || name == "float") {
    return NumberFilter(name, v, what, positional, keywords, line);
  }
  if (!positional.empty() || !keywords.empty()) {
    return Error(line, Cat(what, " takes no arguments"));
  }
  return ApplyPlainFilter(name, v, what, line);
}

absl::Status Renderer::KindError(std::string_view what, std::string_view kind, const Value& v,
                                 int line) {
  return Error(line, Cat(what, " needs ", kind, ", not ", KindName(v.kind)));
}

absl::StatusOr<Value> Renderer::TojsonFilter(
    const Value& v, const std::string& what, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {"indent", "sort_keys", "ensure_ascii", "separators"},
                                     positional, keywords, line));
  JsonOptions json;
  if (a[0].has_value() && a[0]->kind != Value::Kind::kNone) {
    if (a[0]->kind != Value::Kind::kInteger || a[0]->integer < 0 || a[0]->integer > 64) {
      return Error(line, "tojson indent must be an integer from 0 to 64");
    }
    json.indent = static_cast<int>(a[0]->integer);
  }
  if (a[1].has_value()) json.sort_keys = Truthy(*a[1]);
  if (a[2].has_value()) json.ensure_ascii = Truthy(*a[2]);
  if (a[3].has_value() && a[3]->kind != Value::Kind::kNone) {
    return Error(line, "tojson separators are not supported");
  }
  std::string out;
  RETURN_IF_ERROR(ToJson(v, json, 0, &out, line, 0));
  return MakeString(std::move(out), line);
}

absl::StatusOr<Value> Renderer::JoinFilter(
    const Value& v, const std::string& what, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {"d", "attribute"}, positional, keywords, line));
  std::string separator;
  if (a[0].has_value()) {
    if (!a[0]->is_string()) return Error(line, "join needs a string separator");
    separator = a[0]->str();
  }
  ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
  if (a[1].has_value()) {
    if (!a[1]->is_string()) return Error(line, "join attribute must be a string");
    for (Value& item : items) {
      ASSIGN_OR_RETURN(item, AttributePath(item, a[1]->str(), line));
    }
  }
  return JoinValues(items, separator, line);
}

absl::StatusOr<Value> Renderer::IndentFilter(
    const Value& v, const std::string& what, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {"width", "first", "blank"}, positional, keywords, line));
  if (!v.is_string()) return KindError(what, "a string", v, line);
  std::string indentation = "    ";
  if (a[0].has_value()) {
    if (a[0]->is_string()) {
      indentation = a[0]->str();
    } else if (a[0]->kind == Value::Kind::kInteger && a[0]->integer >= 0 && a[0]->integer <= 1024) {
      indentation = std::string(static_cast<size_t>(a[0]->integer), ' ');
    } else {
      return Error(line, "indent width must be an integer from 0 to 1024 or a string");
    }
  }
  const bool first = a[1].has_value() && Truthy(*a[1]);
  const bool blank = a[2].has_value() && Truthy(*a[2]);
  std::string out;
  size_t start = 0;
  for (int index = 0;; ++index) {
    const size_t end = v.str().find('\n', start);
    const std::string_view text = std::string_view(v.str()).substr(
        start, end == std::string::npos ? std::string::npos : end - start);
    if (index > 0) out.push_back('\n');
    if ((index > 0 || first) && (blank || !text.empty())) out += indentation;
    out += text;
    RETURN_IF_ERROR(CheckString(out.size(), line));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return MakeString(std::move(out), line);
}

absl::StatusOr<Value> Renderer::SelectFilter(
    const std::string& name, const Value& v, const std::string& what,
    const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool keep_matches = name == "selectattr" || name == "select";
  if (!keywords.empty()) return Error(line, Cat(what, " takes no keyword arguments"));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (positional.empty() || !positional[0].is_string()) {
      return Error(line, Cat(what, " needs an attribute name"));
    }
    attribute = positional[0].str();
    next = 1;
  }
  std::string test = "truthy";
  if (positional.size() > next) {
    if (!positional[next].is_string()) return Error(line, Cat(what, " needs a test name"));
    test = positional[next].str();
    if (!chat_template_internal::Contains(kTests, test)) {
      return Error(line, Cat("the test '", test, "' is not supported"));
    }
    ++next;
  }
  std::vector<Value> test_arguments(positional.begin() + std::min(next, positional.size()), positional.end());
  ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
  ValueList kept;
  for (Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      ASSIGN_OR_RETURN(subject, AttributePath(item, attribute, line));
    }
    ASSIGN_OR_RETURN(bool result, Test(test, subject, test_arguments, line));
    if (result == keep_matches) kept.push_back(std::move(item));
  }
  return MakeList(std::move(kept), line);
}

absl::StatusOr<Value> Renderer::MapFilter(
    const Value& v, const std::string& what, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
  ValueList mapped;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, value] : keywords) {
    if (key == "attribute") attribute = &value;
    else if (key == "default") fallback = &value;
    else return Error(line, Cat(what, " has no argument '", key, "'"));
  }
  if (attribute != nullptr) {
    if (!attribute->is_string() || !positional.empty()) return Error(line, "map(attribute=) needs a string");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value picked, AttributePath(item, attribute->str(), line));
      mapped.push_back(picked.is_undefined() && fallback != nullptr ? *fallback : picked);
    }
    return MakeList(std::move(mapped), line);
  }
  if (positional.empty() || !positional[0].is_string()) {
    return Error(line, "map needs attribute= or a filter name");
  }
  const std::string filter = positional[0].str();
  if (!chat_template_internal::Contains(kFilters, filter) || filter == "map") {
    return Error(line, Cat("the filter '", filter, "' is not supported in map"));
  }
  const std::vector<Value> rest(positional.begin() + 1, positional.end());
  for (const Value& item : items) {
    DepthGuard guard(this);
    if (guard.exceeded()) return TooDeep(line);
    ASSIGN_OR_RETURN(Value out, ApplyFilter(filter, item, rest, {}, line));
    mapped.push_back(std::move(out));
  }
  return MakeList(std::move(mapped), line);
}

absl::StatusOr<Value> Renderer::NumberFilter(
    const std::string& name, const Value& v, const std::string& what,
    const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {"default"}, positional, keywords, line));
  const Value fallback = a[0].has_value() ? *a[0] : (name == "int" ? Value::Integer(0) : Value::Float(0));
  double d = 0;
  bool ok = true;
  switch (v.kind) {
    case Value::Kind::kInteger:
      if (name == "int") return v;
      return Value::Float(static_cast<double>(v.integer));
    case Value::Kind::kBoolean: d = v.boolean; break;
    case Value::Kind::kFloat: d = v.number; break;
    case Value::Kind::kString: {
      const std::string text = Strip(v.str(), std::nullopt, true, true);
      if (name == "int") {
        int64_t i = 0;
        auto [end, error] = std::from_chars(text.data() + (!text.empty() && text[0] == '+'),
                                            text.data() + text.size(), i);
        if (error == std::errc() && end == text.data() + text.size() && !text.empty()) {
          return Value::Integer(i);
        }
      }
      char* end = nullptr;
      d = std::strtod(text.c_str(), &end);
      ok = !text.empty() && end == text.c_str() + text.size();
      break;
    }
    default: ok = false;
  }
  if (!ok) return fallback;
  if (name == "float") return Value::Float(d);
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
  return Value::Integer(static_cast<int64_t>(d));  // truncates toward zero, like Python
}

absl::StatusOr<Value> Renderer::ApplyPlainFilter(const std::string& name, const Value& v,
                                                 const std::string& what, int line) {
  auto needs = [&](std::string_view kind) { return KindError(what, kind, v, line); };
  if (name == "trim") {
    if (!v.is_string()) return needs("a string");
    return Value::String(Strip(v.str(), std::nullopt, true, true));
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::Integer(static_cast<int64_t>(CodePointCount(v.str())));
    if (v.is_list()) return Value::Integer(static_cast<int64_t>(v.list->size()));
    if (v.has_entries()) return Value::Integer(static_cast<int64_t>(v.object->entries.size()));
    if (v.is_undefined()) return Value::Integer(0);
    return needs("a string, list or mapping");
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    if (!v.is_string()) return needs("a string");
    return Value::String(ChangeCase(name, v.str()));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "items") {
    if (v.is_undefined()) return MakeList({}, line);
    if (!v.is_object()) return needs("a mapping");
    return ItemsOf(v, line);
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
    return MakeList(std::move(items), line);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      ASSIGN_OR_RETURN(ValueList characters, Iterate(v, line));
      std::string out;
      for (auto it = characters.rbegin(); it != characters.rend(); ++it) out += it->str();
      return Value::String(std::move(out));
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
    std::reverse(items.begin(), items.end());
    return MakeList(std::move(items), line);
  }
  if (name == "unique") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v, line));
    ValueList kept;
    for (Value& item : items) {
      bool seen = false;
      for (const Value& other : kept) {
        ASSIGN_OR_RETURN(seen, Equal(item, other, line, 0));
        if (seen) break;
      }
      if (!seen) kept.push_back(std::move(item));
    }
    return MakeList(std::move(kept), line);
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kInteger) {
      if (v.integer == INT64_MIN) return Error(line, "integer overflow");
      return Value::Integer(v.integer < 0 ? -v.integer : v.integer);
    }
    if (v.kind == Value::Kind::kFloat) return Value::Float(std::fabs(v.number));
    return needs("a number");
  }
  return Error(line, Cat(what, " is not supported"));
}

}  // namespace cloister::llm::chat_template_internal
