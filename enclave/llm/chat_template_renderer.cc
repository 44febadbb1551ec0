// The chat-template evaluator's core: a render's entry, its limits and budget, scopes,
// printing values (and tojson), equality, ordering and `in`.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_renderer.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

absl::StatusOr<std::string> Renderer::Run(const std::vector<Node>& body, Value context) {
  Scope globals;
  RegisterScope(&globals);
  for (std::string_view name : {"raise_exception", "range", "strftime_now", "namespace"}) {
    Value function;
    function.kind = Value::Kind::kFunction;
    auto builtin = std::make_shared<Function>();
    builtin->kind = Function::Kind::kBuiltin;
    builtin->name = std::string(name);
    function.function = std::move(builtin);
    globals.Set(name, std::move(function));
  }
  Scope top;
  top.parent = &globals;
  RegisterScope(&top);
  if (context.kind == Value::Kind::kObject) {
    for (auto& [key, value] : context.object->entries) top.Set(key, value);
  }
  std::string output;
  absl::Status status = ExecBlock(body, &top, &output).status();
  UnregisterScope(&top);
  UnregisterScope(&globals);
  RETURN_IF_ERROR(status);
  return output;
}

absl::Status Renderer::LimitError(int line, std::string_view what) const {
  return absl::ResourceExhaustedError(Cat("chat template line ", line, ": ", what));
}

absl::Status Renderer::Charge(int64_t units, size_t bytes) {
  work_ += units + static_cast<int64_t>(bytes / 32);
  if (work_ > options_.max_work) {
    return absl::ResourceExhaustedError(Cat(
        "chat template: rendering needs more than ", options_.max_work, " units of work"));
  }
  return absl::OkStatus();
}

absl::Status Renderer::CheckString(size_t size, int line) {
  if (size > options_.max_output_size) {
    return LimitError(line, Cat("a string would exceed ", options_.max_output_size, " bytes"));
  }
  return Charge(0, size);
}

absl::StatusOr<Value> Renderer::MakeString(std::string s, int line) {
  RETURN_IF_ERROR(CheckString(s.size(), line));
  return Value::String(std::move(s));
}

absl::StatusOr<Value> Renderer::MakeList(ValueList items, int line) {
  if (items.size() > options_.max_list_count) {
    return LimitError(line, Cat("a list would exceed ", options_.max_list_count, " items"));
  }
  RETURN_IF_ERROR(Charge(static_cast<int64_t>(items.size()), 0));
  int depth = 1;
  for (const Value& item : items) depth = std::max(depth, item.depth + 1);
  if (depth > options_.max_depth + 1) {
    return LimitError(line, Cat("a value nests deeper than ", options_.max_depth, " levels"));
  }
  Value v;
  v.kind = Value::Kind::kList;
  v.depth = depth;
  v.list = std::make_shared<const ValueList>(std::move(items));
  return v;
}

absl::StatusOr<Value> Renderer::MakeObject(std::shared_ptr<Object> object, int line) {
  if (object->entries.size() > options_.max_list_count) {
    return LimitError(line, Cat("a mapping would exceed ", options_.max_list_count, " items"));
  }
  RETURN_IF_ERROR(Charge(static_cast<int64_t>(object->entries.size()), 0));
  int depth = 1;
  for (const auto& [key, item] : object->entries) depth = std::max(depth, item.depth + 1);
  if (depth > options_.max_depth + 1) {
    return LimitError(line, Cat("a value nests deeper than ", options_.max_depth, " levels"));
  }
  Value v;
  v.kind = Value::Kind::kObject;
  v.depth = depth;
  v.object = std::move(object);
  return v;
}

absl::Status Renderer::Append(std::string* out, std::string_view text, int line) {
  if (out->size() + text.size() > options_.max_output_size) {
    return LimitError(line, Cat("the rendered text would exceed ", options_.max_output_size, " bytes"));
  }
  RETURN_IF_ERROR(Charge(1, text.size()));
  out->append(text);
  return absl::OkStatus();
}

absl::Status Renderer::TooDeep(int line) const {
  return LimitError(line, Cat("rendering nests deeper than ", options_.max_depth, " levels"));
}

void Renderer::RegisterScope(Scope* scope) {
  scope->id = ++next_scope_id_;
  live_scopes_[scope->id] = scope;
}

absl::Status Renderer::Error(int line, std::string_view message) {
  return absl::InvalidArgumentError(Cat("chat template line ", line, ": ", message));
}

// ---- printing and JSON ----

absl::Status Renderer::Print(const Value& v, std::string* out, int line, int depth) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return absl::OkStatus();
    case Value::Kind::kBoolean: out->append(v.boolean ? "true" : "false"); return absl::OkStatus();
    case Value::Kind::kInteger: out->append(std::to_string(v.integer)); return absl::OkStatus();
    case Value::Kind::kFloat: out->append(FormatFloat(v.number)); return absl::OkStatus();
    case Value::Kind::kString: out->append(v.str()); return absl::OkStatus();
    case Value::Kind::kFunction: out->append("<function>"); return absl::OkStatus();
    default: {
      JsonOptions json;
      json.undefined_as_null = false;
      return ToJson(v, json, 0, out, line, depth);
    }
  }
}

absl::StatusOr<std::string> Renderer::PrintToString(const Value& v, int line) {
  std::string out;
  RETURN_IF_ERROR(Print(v, &out, line, 0));
  RETURN_IF_ERROR(CheckString(out.size(), line));
  return out;
}

void Renderer::JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t position = 0;
  while (position < s.size()) {
    const uint32_t cp = DecodeNext(s, &position);
    switch (cp) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          auto hex = [&](uint32_t unit) {
            char buffer[8];
            snprintf(buffer, sizeof buffer, "\\u%04x", unit);
            out->append(buffer);
          };
          if (cp >= 0x10000) {
            hex(0xD800 + ((cp - 0x10000) >> 10));
            hex(0xDC00 + ((cp - 0x10000) & 0x3FF));
          } else {
            hex(cp);
          }
        } else {
          AppendUtf8(cp, out);
        }
    }
  }
  out->push_back('"');
}

absl::Status Renderer::ToJson(const Value& v, const JsonOptions& options, int level,
                              std::string* out, int line, int depth) {
  if (depth > options_.max_depth + 2) return TooDeep(line);
  if (out->size() > options_.max_output_size) {
    return LimitError(line, Cat("a string would exceed ", options_.max_output_size, " bytes"));
  }
  RETURN_IF_ERROR(Charge(1, 0));
  const std::string item_separator = options.indent > 0 ? "," : ", ";
  auto newline = [&](int at) {
    out->push_back('\n');
    out->append(static_cast<size_t>(options.indent) * at, ' ');
  };
  switch (v.kind) {
    case Value::Kind::kUndefined:
      out->append(options.undefined_as_null ? "null" : "undefined");
      return absl::OkStatus();
    case Value::Kind::kNone: out->append("null"); return absl::OkStatus();
    case Value::Kind::kBoolean: out->append(v.boolean ? "true" : "false"); return absl::OkStatus();
    case Value::Kind::kInteger: out->append(std::to_string(v.integer)); return absl::OkStatus();
    case Value::Kind::kFloat: out->append(FormatFloat(v.number)); return absl::OkStatus();
    case Value::Kind::kString: JsonString(v.str(), options.ensure_ascii, out); return absl::OkStatus();
    case Value::Kind::kFunction: return Error(line, "a function cannot be converted to JSON");
    case Value::Kind::kList: {
      out->push_back('[');
      bool first = true;
      for (const Value& item : *v.list) {
        if (!first) out->append(item_separator);
        first = false;
        if (options.indent > 0) newline(level + 1);
        RETURN_IF_ERROR(ToJson(item, options, level + 1, out, line, depth + 1));
      }
      if (options.indent > 0 && !v.list->empty()) newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.object->entries) entries.push_back(&entry);
      if (options.sort_keys) {
        // UTF-8 byte order is code point order.
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto* entry : entries) {
        if (!first) out->append(item_separator);
        first = false;
        if (options.indent > 0) newline(level + 1);
        JsonString(entry->first, options.ensure_ascii, out);
        out->append(": ");
        RETURN_IF_ERROR(ToJson(entry->second, options, level + 1, out, line, depth + 1));
      }
      if (options.indent > 0 && !entries.empty()) newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// ---- comparisons ----

absl::StatusOr<bool> Renderer::Equal(const Value& a, const Value& b, int line, int depth) {
  if (depth > options_.max_depth + 2) return TooDeep(line);
  RETURN_IF_ERROR(Charge(1, 0));
  const bool a_numeric = a.is_number() || a.kind == Value::Kind::kBoolean;
  const bool b_numeric = b.is_number() || b.kind == Value::Kind::kBoolean;
  if (a_numeric && b_numeric) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      const int64_t x = a.kind == Value::Kind::kBoolean ? a.boolean : a.integer;
      const int64_t y = b.kind == Value::Kind::kBoolean ? b.boolean : b.integer;
      return x == y;
    }
    return a.AsDouble() == b.AsDouble();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        ASSIGN_OR_RETURN(bool same, Equal((*a.list)[i], (*b.list)[i], line, depth + 1));
        if (!same) return false;
      }
      return true;
    }
    case Value::Kind::kObject: {
      if (a.object->entries.size() != b.object->entries.size()) return false;
      for (const auto& [key, value] : a.object->entries) {
        const Value* other = b.object->Find(key);
        if (other == nullptr) return false;
        ASSIGN_OR_RETURN(bool same, Equal(value, *other, line, depth + 1));
        if (!same) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return a.object == b.object;
    case Value::Kind::kFunction: return a.function == b.function;
    default: return false;
  }
}

absl::StatusOr<int> Renderer::Compare(const Value& a, const Value& b, int line) {
  const bool a_numeric = a.is_number() || a.kind == Value::Kind::kBoolean;
  const bool b_numeric = b.is_number() || b.kind == Value::Kind::kBoolean;
  if (a_numeric && b_numeric) {
    if (a.kind == Value::Kind::kInteger && b.kind == Value::Kind::kInteger) {
      return a.integer < b.integer ? -1 : a.integer > b.integer ? 1 : 0;
    }
    const double x = a.AsDouble(), y = b.AsDouble();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  return Error(line, Cat("cannot compare ", KindName(a.kind), " with ", KindName(b.kind)));
}

absl::StatusOr<bool> Renderer::Contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return Error(line, Cat("'in <string>' needs a string, not ", KindName(item.kind)));
      }
      RETURN_IF_ERROR(Charge(1, container.str().size()));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& element : *container.list) {
        ASSIGN_OR_RETURN(bool same, Equal(element, item, line, 0));
        if (same) return true;
      }
      return false;
    case Value::Kind::kObject:
    case Value::Kind::kNamespace:
      if (!item.is_string()) return false;
      RETURN_IF_ERROR(Charge(static_cast<int64_t>(container.object->entries.size()), 0));
      return container.object->Find(item.str()) != nullptr;
    default:
      return Error(line, Cat("'in' needs a string, list or mapping on its right, not ",
                                      KindName(container.kind)));
  }
}

}  // namespace cloister::llm::chat_template_internal
