// The chat-template evaluator: the string and mapping methods (startswith, strip, split,
// replace, join, get, items, ...) and the argument binding the builtins share.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_renderer.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

// ---- string and mapping methods ----

absl::StatusOr<Renderer::Arguments> Renderer::Bind(
    std::string_view what, std::initializer_list<std::string_view> names,
    const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  Arguments arguments;
  arguments.values.resize(names.size());
  if (positional.size() > names.size()) {
    return Error(line, Cat(what, " takes at most ", names.size(), " arguments"));
  }
  for (size_t i = 0; i < positional.size(); ++i) arguments.values[i] = positional[i];
  for (const auto& [key, value] : keywords) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) return Error(line, Cat(what, " has no argument '", key, "'"));
    const size_t index = static_cast<size_t>(it - names.begin());
    if (arguments.values[index].has_value()) {
      return Error(line, Cat(what, " got the argument '", key, "' twice"));
    }
    arguments.values[index] = value;
  }
  return arguments;
}

absl::StatusOr<std::string> Renderer::StringArgument(const std::optional<Value>& v,
                                                     std::string_view what, int line) {
  if (!v.has_value() || !v->is_string()) return Error(line, Cat(what, " needs a string"));
  return v->str();
}

std::string Renderer::Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                            bool right) {
  std::vector<uint32_t> set;
  if (chars.has_value()) {
    size_t position = 0;
    while (position < chars->size()) set.push_back(DecodeNext(*chars, &position));
  }
  auto strip = [&](uint32_t cp) {
    return chars.has_value() ? std::find(set.begin(), set.end(), cp) != set.end() : IsSpace(cp);
  };
  const std::vector<size_t> offsets = CodePointOffsets(s);
  size_t begin = 0, end = offsets.size() - 1;
  auto code_point = [&](size_t i) {
    size_t position = offsets[i];
    return DecodeNext(s, &position);
  };
  if (left) while (begin < end && strip(code_point(begin))) ++begin;
  if (right) while (end > begin && strip(code_point(end - 1))) --end;
  return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
}

absl::StatusOr<std::string> Renderer::Replace(const std::string& s, const std::string& old_text,
                                              const std::string& new_text, int64_t count,
                                              int line) {
  std::string out;
  int64_t done = 0;
  if (old_text.empty()) {  // Python inserts between every character
    size_t position = 0;
    if (count != 0) {
      out += new_text;
      ++done;
    }
    while (position < s.size()) {
      const size_t start = position;
      DecodeNext(s, &position);
      out.append(s, start, position - start);
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      RETURN_IF_ERROR(CheckString(out.size(), line));
    }
    return out;
  }
  size_t position = 0;
  while (count < 0 || done < count) {
    const size_t found = s.find(old_text, position);
    if (found == std::string::npos) break;
    out.append(s, position, found - position);
    out += new_text;
    position = found + old_text.size();
    ++done;
    if (out.size() > options_.max_output_size) return CheckString(out.size(), line);
  }
  out.append(s, position, std::string::npos);
  RETURN_IF_ERROR(CheckString(out.size(), line));
  return out;
}

absl::StatusOr<Value> Renderer::Split(const std::string& s, const std::optional<Value>& separator,
                                      const std::optional<Value>& max_split, int line) {
  int64_t limit = -1;
  if (max_split.has_value()) {
    if (max_split->kind != Value::Kind::kInteger) return Error(line, "split() maxsplit must be an integer");
    limit = max_split->integer;
  }
  ValueList parts;
  auto add = [&](std::string part) -> absl::Status {
    if (parts.size() >= options_.max_list_count) {
      return LimitError(line, Cat("a list would exceed ", options_.max_list_count, " items"));
    }
    parts.push_back(Value::String(std::move(part)));
    return Charge(1, 0);
  };
  if (!separator.has_value() || separator->kind == Value::Kind::kNone) {
    // Runs of whitespace separate; none at the ends.
    size_t position = 0;
    int64_t splits = 0;
    while (true) {
      position += LeadingSpaceSize(std::string_view(s).substr(position));
      if (position >= s.size()) break;
      if (limit >= 0 && splits >= limit) {
        const std::string rest = s.substr(position);
        RETURN_IF_ERROR(add(rest.substr(0, WithoutTrailingSpaceSize(rest))));
        break;
      }
      size_t end = position;
      while (end < s.size()) {
        size_t next = end;
        if (IsSpace(DecodeNext(s, &next))) break;
        end = next;
      }
      RETURN_IF_ERROR(add(s.substr(position, end - position)));
      ++splits;
      position = end;
    }
  } else {
    if (!separator->is_string()) return Error(line, "split() needs a string separator");
    const std::string& sep = separator->str();
    if (sep.empty()) return Error(line, "split() separator must not be empty");
    size_t position = 0;
    int64_t splits = 0;
    while (limit < 0 || splits < limit) {
      const size_t found = s.find(sep, position);
      if (found == std::string::npos) break;
      RETURN_IF_ERROR(add(s.substr(position, found - position)));
      position = found + sep.size();
      ++splits;
    }
    RETURN_IF_ERROR(add(s.substr(position)));
  }
  return MakeList(std::move(parts), line);
}

absl::StatusOr<Value> Renderer::ItemsOf(const Value& object, int line) {
  ValueList items;
  for (const auto& [key, value] : object.object->entries) {
    ASSIGN_OR_RETURN(Value pair, MakeList({Value::String(key), value}, line));
    items.push_back(std::move(pair));
  }
  return MakeList(std::move(items), line);
}

absl::StatusOr<Value> Renderer::MappingMethod(
    const Value& object, const std::string& name, const std::string& what,
    const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  if (name == "get") {
    ASSIGN_OR_RETURN(Arguments a, Bind(what, {"key", "default"}, positional, keywords, line));
    if (!a[0].has_value()) return Error(line, "get() needs a key");
    if (a[0]->is_string()) {
      const Value* v = object.object->Find(a[0]->str());
      if (v != nullptr) return *v;
    }
    return a[1].has_value() ? *a[1] : Value::None();
  }
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {}, positional, keywords, line));
  if (name == "items") return ItemsOf(object, line);
  if (name == "keys" || name == "values") {
    ValueList items;
    for (const auto& [key, value] : object.object->entries) {
      items.push_back(name == "keys" ? Value::String(key) : value);
    }
    return MakeList(std::move(items), line);
  }
  return Error(line, Cat("a mapping has no method '", name, "'"));
}

absl::StatusOr<Value> Renderer::AffixMethod(
    const std::string& s, const std::string& name, const std::string& what,
    const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {"prefix"}, positional, keywords, line));
  std::vector<std::string> candidates;
  if (a[0].has_value() && a[0]->is_string()) {
    candidates.push_back(a[0]->str());
  } else if (a[0].has_value() && a[0]->is_list()) {
    for (const Value& v : *a[0]->list) {
      if (!v.is_string()) return Error(line, Cat(what, " needs strings"));
      candidates.push_back(v.str());
    }
  } else {
    return Error(line, Cat(what, " needs a string or a tuple of strings"));
  }
  for (const std::string& c : candidates) {
    const bool match = name == "startswith"
                           ? std::string_view(s).substr(0, c.size()) == c
                           : s.size() >= c.size() && std::string_view(s).substr(s.size() - c.size()) == c;
    if (match) return Value::Boolean(true);
  }
  return Value::Boolean(false);
}

absl::StatusOr<Value> Renderer::CallMethod(
    const Value& object, const std::string& name, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  const std::string what = Cat(name, "()");
  if (object.is_object()) return MappingMethod(object, name, what, positional, keywords, line);
  const std::string& s = object.str();
  RETURN_IF_ERROR(Charge(1, s.size()));
  if (name == "startswith" || name == "endswith") {
    return AffixMethod(s, name, what, positional, keywords, line);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ASSIGN_OR_RETURN(Arguments a, Bind(what, {"chars"}, positional, keywords, line));
    std::optional<std::string> chars;
    if (a[0].has_value() && a[0]->kind != Value::Kind::kNone) {
      if (!a[0]->is_string()) return Error(line, Cat(what, " needs a string"));
      chars = a[0]->str();
    }
    return Value::String(Strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    ASSIGN_OR_RETURN(Arguments a, Bind(what, {"sep", "maxsplit"}, positional, keywords, line));
    return Split(s, a[0], a[1], line);
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(Arguments a, Bind(what, {"old", "new", "count"}, positional, keywords, line));
    ASSIGN_OR_RETURN(std::string old_text, StringArgument(a[0], what, line));
    ASSIGN_OR_RETURN(std::string new_text, StringArgument(a[1], what, line));
    int64_t count = -1;
    if (a[2].has_value()) {
      if (a[2]->kind != Value::Kind::kInteger) return Error(line, "replace() count must be an integer");
      count = a[2]->integer;
    }
    ASSIGN_OR_RETURN(std::string out, Replace(s, old_text, new_text, count, line));
    return Value::String(std::move(out));
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(Arguments a, Bind(what, {"iterable"}, positional, keywords, line));
    if (!a[0].has_value()) return Error(line, "join() needs a list");
    ASSIGN_OR_RETURN(ValueList items, Iterate(*a[0], line));
    return JoinValues(items, s, line);
  }
  ASSIGN_OR_RETURN(Arguments a, Bind(what, {}, positional, keywords, line));
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return Value::String(ChangeCase(name, s));
  }
  return Error(line, Cat("a string has no method '", name, "'"));
}

std::string Renderer::ChangeCase(const std::string& how, const std::string& s) {
  std::string out = s;
  if (how == "upper") {
    for (char& c : out) c = AsciiUpper(c);
  } else if (how == "lower") {
    for (char& c : out) c = AsciiLower(c);
  } else if (how == "title") {
    out = TitleCase(s);
  } else {  // capitalize: the first character raised, the rest lowered
    for (char& c : out) c = AsciiLower(c);
    if (!out.empty()) out[0] = AsciiUpper(out[0]);
  }
  return out;
}

absl::StatusOr<Value> Renderer::JoinValues(const ValueList& items, const std::string& separator,
                                           int line) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    RETURN_IF_ERROR(Print(items[i], &out, line, 0));
    RETURN_IF_ERROR(CheckString(out.size(), line));
  }
  return MakeString(std::move(out), line);
}

}  // namespace cloister::llm::chat_template_internal
