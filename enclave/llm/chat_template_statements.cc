// The chat-template evaluator: statements (output, if, for with loop.*, set, macro, call
// blocks), macro and builtin calls (namespace, raise_exception, strftime_now, range).
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "base/clock.h"
#include "base/status.h"
#include "enclave/llm/chat_template_renderer.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

// ---- statements ----

absl::StatusOr<Flow> Renderer::ExecBlock(const std::vector<Node>& body, Scope* scope,
                                         std::string* out) {
  for (const Node& node : body) {
    ASSIGN_OR_RETURN(Flow flow, Exec(node, scope, out));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Flow> Renderer::Exec(const Node& node, Scope* scope, std::string* out) {
  DepthGuard guard(this);
  if (guard.exceeded()) return TooDeep(node.line);
  RETURN_IF_ERROR(Charge(1, 0));
  switch (node.kind) {
    case Node::Kind::kText:
      RETURN_IF_ERROR(Append(out, node.text, node.line));
      return Flow::kNormal;
    case Node::Kind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[0], scope));
      std::string text;
      RETURN_IF_ERROR(Print(v, &text, node.line, 0));
      RETURN_IF_ERROR(Append(out, text, node.line));
      return Flow::kNormal;
    }
    case Node::Kind::kIf:
      for (size_t i = 0; i < node.bodies.size(); ++i) {
        if (i < node.exprs.size()) {
          ASSIGN_OR_RETURN(Value condition, Eval(*node.exprs[i], scope));
          if (!Truthy(condition)) continue;
        }
        return ExecBlock(node.bodies[i], scope, out);
      }
      return Flow::kNormal;
    case Node::Kind::kFor: return ExecFor(node, scope, out);
    case Node::Kind::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[0], scope));
      RETURN_IF_ERROR(Assign(node, std::move(v), scope));
      return Flow::kNormal;
    }
    case Node::Kind::kSetBlock: {
      std::string text;
      ASSIGN_OR_RETURN(Flow flow, ExecBlock(node.bodies[0], scope, &text));
      (void)flow;
      ASSIGN_OR_RETURN(Value v, MakeString(std::move(text), node.line));
      RETURN_IF_ERROR(Assign(node, std::move(v), scope));
      return Flow::kNormal;
    }
    case Node::Kind::kMacro: {
      Value function;
      function.kind = Value::Kind::kFunction;
      auto macro = std::make_shared<Function>();
      macro->kind = Function::Kind::kMacro;
      macro->node = &node;
      function.function = std::move(macro);
      scope->Set(node.text, std::move(function));
      return Flow::kNormal;
    }
    case Node::Kind::kCallBlock: {
      const Expr& call = *node.exprs[0];
      ASSIGN_OR_RETURN(Value callee, Eval(*call.children[0], scope));
      if (callee.kind != Value::Kind::kFunction || callee.function->kind != Function::Kind::kMacro) {
        return Error(node.line, "a call block needs a macro");
      }
      std::vector<Value> positional;
      std::vector<std::pair<std::string, Value>> keywords;
      RETURN_IF_ERROR(EvalArguments(call, 1, scope, &positional, &keywords));
      Value caller;
      caller.kind = Value::Kind::kFunction;
      auto function = std::make_shared<Function>();
      function->kind = Function::Kind::kCaller;
      function->node = &node;
      function->scope = scope;
      function->scope_id = scope->id;
      caller.function = std::move(function);
      ScopedScope with_caller(this, scope);
      with_caller.scope.Set("caller", std::move(caller));
      ASSIGN_OR_RETURN(Value result, CallMacro(*callee.function->node, positional, keywords,
                                               &with_caller.scope, node.line));
      RETURN_IF_ERROR(Append(out, result.str(), node.line));
      return Flow::kNormal;
    }
    case Node::Kind::kBreak: return Flow::kBreak;
    case Node::Kind::kContinue: return Flow::kContinue;
  }
  return Flow::kNormal;
}

absl::Status Renderer::Assign(const Node& node, Value v, Scope* scope) {
  if (!node.namespace_name.empty()) {
    const Value* target = scope->Find(node.namespace_name);
    if (target == nullptr || target->kind != Value::Kind::kNamespace) {
      return Error(node.line, Cat("cannot set an attribute of '", node.namespace_name,
                                           "', which is not a namespace()"));
    }
    ASSIGN_OR_RETURN(bool nested, HoldsNamespace(v, node.line, 0));
    if (nested) return Error(node.line, "a namespace cannot hold another namespace");
    target->object->Set(node.text, std::move(v));
    return absl::OkStatus();
  }
  if (!node.tuple_target) {
    scope->Set(node.names[0], std::move(v));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ValueList items, Iterate(v, node.line));
  if (items.size() != node.names.size()) {
    return Error(node.line, Cat("cannot unpack ", items.size(), " values into ",
                                         node.names.size(), " names"));
  }
  for (size_t i = 0; i < items.size(); ++i) scope->Set(node.names[i], std::move(items[i]));
  return absl::OkStatus();
}

absl::StatusOr<bool> Renderer::HoldsNamespace(const Value& v, int line, int depth) {
  if (depth > options_.max_depth + 2) return TooDeep(line);
  RETURN_IF_ERROR(Charge(1, 0));
  if (v.kind == Value::Kind::kNamespace) return true;
  if (v.kind == Value::Kind::kList) {
    for (const Value& item : *v.list) {
      ASSIGN_OR_RETURN(bool holds, HoldsNamespace(item, line, depth + 1));
      if (holds) return true;
    }
  }
  if (v.kind == Value::Kind::kObject) {
    for (const auto& [key, item] : v.object->entries) {
      ASSIGN_OR_RETURN(bool holds, HoldsNamespace(item, line, depth + 1));
      if (holds) return true;
    }
  }
  return false;
}

absl::StatusOr<ValueList> Renderer::Iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return ValueList();
    case Value::Kind::kList:
      RETURN_IF_ERROR(Charge(static_cast<int64_t>(v.list->size()), 0));
      return *v.list;
    case Value::Kind::kObject: {
      ValueList keys;
      for (const auto& [key, value] : v.object->entries) keys.push_back(Value::String(key));
      RETURN_IF_ERROR(Charge(static_cast<int64_t>(keys.size()), 0));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList characters;
      size_t position = 0;
      while (position < v.str().size()) {
        const size_t start = position;
        DecodeNext(v.str(), &position);
        characters.push_back(Value::String(v.str().substr(start, position - start)));
      }
      RETURN_IF_ERROR(Charge(static_cast<int64_t>(characters.size()) * 2, 0));
      return characters;
    }
    default:
      return Error(line, Cat("cannot iterate over a ", KindName(v.kind)));
  }
}

absl::Status Renderer::CountIteration(int line) {
  if (++iterations_ > options_.max_loop_iterations) {
    return LimitError(line, Cat("more than ", options_.max_loop_iterations, " loop iterations"));
  }
  return absl::OkStatus();
}

absl::Status Renderer::BindLoopTargets(const Node& node, const Value& item, Scope* scope) {
  if (!node.tuple_target) {
    scope->Set(node.names[0], item);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ValueList parts, Iterate(item, node.line));
  if (parts.size() != node.names.size()) {
    return Error(node.line, Cat("cannot unpack ", parts.size(), " values into ",
                                         node.names.size(), " loop variables"));
  }
  for (size_t i = 0; i < parts.size(); ++i) scope->Set(node.names[i], std::move(parts[i]));
  return absl::OkStatus();
}

absl::StatusOr<Flow> Renderer::ExecFor(const Node& node, Scope* scope, std::string* out) {
  ScopedScope loop_scope(this, scope);
  Scope* inner = &loop_scope.scope;
  ASSIGN_OR_RETURN(Value iterable, Eval(*node.exprs[0], inner));
  ASSIGN_OR_RETURN(ValueList items, Iterate(iterable, node.line));
  if (node.exprs.size() > 1) {  // `for x in xs if condition`: filter first
    ValueList kept;
    for (Value& item : items) {
      RETURN_IF_ERROR(CountIteration(node.line));
      ScopedScope test_scope(this, inner);
      RETURN_IF_ERROR(BindLoopTargets(node, item, &test_scope.scope));
      ASSIGN_OR_RETURN(Value keep, Eval(*node.exprs[1], &test_scope.scope));
      if (Truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  bool iterated = false;
  const int64_t count = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < count; ++i) {
    RETURN_IF_ERROR(CountIteration(node.line));
    auto loop = std::make_shared<Object>();
    loop->entries = {
        {"index", Value::Integer(i + 1)},
        {"index0", Value::Integer(i)},
        {"revindex", Value::Integer(count - i)},
        {"revindex0", Value::Integer(count - i - 1)},
        {"first", Value::Boolean(i == 0)},
        {"last", Value::Boolean(i == count - 1)},
        {"length", Value::Integer(count)},
        {"previtem", i > 0 ? items[i - 1] : Value()},
        {"nextitem", i + 1 < count ? items[i + 1] : Value()},
    };
    ASSIGN_OR_RETURN(Value loop_value, MakeObject(std::move(loop), node.line));
    inner->Set("loop", std::move(loop_value));
    RETURN_IF_ERROR(BindLoopTargets(node, items[i], inner));
    iterated = true;
    ASSIGN_OR_RETURN(Flow flow, ExecBlock(node.bodies[0], inner, out));
    if (flow == Flow::kBreak) break;
  }
  if (!iterated) {
    ASSIGN_OR_RETURN(Flow flow, ExecBlock(node.bodies[1], inner, out));
    (void)flow;
  }
  return Flow::kNormal;
}

// ---- calls ----

absl::Status Renderer::EvalArguments(const Expr& call, size_t first, Scope* scope,
                                     std::vector<Value>* positional,
                                     std::vector<std::pair<std::string, Value>>* keywords) {
  for (size_t i = first; i < call.children.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*call.children[i], scope));
    const std::string& keyword = call.keywords[i - first];
    if (keyword.empty()) {
      if (!keywords->empty()) return Error(call.line, "a positional argument follows a keyword argument");
      positional->push_back(std::move(v));
    } else {
      for (const auto& [name, existing] : *keywords) {
        if (name == keyword) return Error(call.line, Cat("the argument '", keyword, "' is given twice"));
      }
      keywords->emplace_back(keyword, std::move(v));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::CallMacro(const Node& macro, const std::vector<Value>& positional,
                                          std::vector<std::pair<std::string, Value>> keywords,
                                          Scope* call_scope, int line) {
  DepthGuard guard(this);
  if (guard.exceeded()) return TooDeep(line);
  const std::string display = macro.kind == Node::Kind::kMacro ? Cat("macro '", macro.text, "'") : "caller()";
  if (positional.size() > macro.names.size()) {
    return Error(line, Cat(display, " takes at most ", macro.names.size(), " arguments"));
  }
  ScopedScope macro_scope(this, call_scope);
  Scope* inner = &macro_scope.scope;
  std::vector<size_t> pending;
  for (size_t i = 0; i < macro.names.size(); ++i) {
    Value v;
    bool given = false;
    if (i < positional.size()) {
      v = positional[i];
      given = true;
    } else {
      for (auto it = keywords.begin(); it != keywords.end(); ++it) {
        if (it->first == macro.names[i]) {
          v = std::move(it->second);
          keywords.erase(it);
          given = true;
          break;
        }
      }
    }
    if (!given && macro.defaults[i] != nullptr) pending.push_back(i);
    inner->Set(macro.names[i], std::move(v));
  }
  if (!keywords.empty()) {
    return Error(line, Cat(display, " has no parameter '", keywords[0].first, "'"));
  }
  for (size_t i : pending) {
    ASSIGN_OR_RETURN(Value v, Eval(*macro.defaults[i], inner));
    inner->Set(macro.names[i], std::move(v));
  }
  std::string text;
  ASSIGN_OR_RETURN(Flow flow, ExecBlock(macro.bodies[0], inner, &text));
  (void)flow;
  return MakeString(std::move(text), line);
}

absl::StatusOr<Value> Renderer::CallFunction(const Function& function, const Expr& call,
                                             Scope* scope) {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  RETURN_IF_ERROR(EvalArguments(call, 1, scope, &positional, &keywords));
  const int line = call.line;
  switch (function.kind) {
    case Function::Kind::kMacro:
      return CallMacro(*function.node, positional, std::move(keywords), scope, line);
    case Function::Kind::kCaller: {
      if (live_scopes_.find(function.scope_id) == live_scopes_.end()) {
        return Error(line, "caller() is used after its call block ended");
      }
      return CallMacro(*function.node, positional, std::move(keywords), function.scope, line);
    }
    case Function::Kind::kBuiltin:
      return CallBuiltin(function.name, positional, keywords, line);
  }
  return Value();
}

absl::StatusOr<Value> Renderer::CallBuiltin(
    const std::string& name, const std::vector<Value>& positional,
    const std::vector<std::pair<std::string, Value>>& keywords, int line) {
  if (name == "namespace") {
    if (!positional.empty()) return Error(line, "namespace() takes keyword arguments only");
    auto object = std::make_shared<Object>();
    for (const auto& [key, value] : keywords) {
      ASSIGN_OR_RETURN(bool nested, HoldsNamespace(value, line, 0));
      if (nested) return Error(line, "a namespace cannot hold another namespace");
      object->Set(key, value);
    }
    ASSIGN_OR_RETURN(Value v, MakeObject(std::move(object), line));
    v.kind = Value::Kind::kNamespace;
    return v;
  }
  if (!keywords.empty()) {
    return Error(line, Cat(name, "() takes no keyword arguments"));
  }
  if (name == "raise_exception") {
    std::string message;
    if (!positional.empty()) {
      ASSIGN_OR_RETURN(message, PrintToString(positional[0], line));
    }
    return Error(line, Cat("raise_exception: ", message));
  }
  if (name == "strftime_now") {
    if (positional.size() != 1 || !positional[0].is_string()) {
      return Error(line, "strftime_now() needs one format string");
    }
    const Clock* clock = options_.clock != nullptr ? options_.clock : Clock::Real();
    return MakeString(Strftime(positional[0].str(), clock->Now()), line);
  }
  if (name == "range") {
    if (positional.empty() || positional.size() > 3) return Error(line, "range() takes 1 to 3 integers");
    for (const Value& v : positional) {
      if (v.kind != Value::Kind::kInteger) return Error(line, "range() takes integers");
    }
    int64_t start = 0, stop = 0, step = 1;
    if (positional.size() == 1) {
      stop = positional[0].integer;
    } else {
      start = positional[0].integer;
      stop = positional[1].integer;
      if (positional.size() == 3) step = positional[2].integer;
    }
    if (step == 0) return Error(line, "range() step must not be zero");
    // The count in 128 bits so that extreme bounds cannot overflow.
    __int128 count = 0;
    if (step > 0 && stop > start) count = ((__int128)stop - start + step - 1) / step;
    if (step < 0 && stop < start) count = ((__int128)start - stop + (-(__int128)step) - 1) / (-(__int128)step);
    if (count > static_cast<__int128>(options_.max_list_count)) {
      return LimitError(line, Cat("a list would exceed ", options_.max_list_count, " items"));
    }
    ValueList items;
    items.reserve(static_cast<size_t>(count));
    for (__int128 i = 0; i < count; ++i) items.push_back(Value::Integer(static_cast<int64_t>(start + i * step)));
    return MakeList(std::move(items), line);
  }
  return Error(line, Cat("unknown function '", name, "'"));
}

std::string Renderer::Strftime(std::string_view format, absl::Time now) {
  const absl::TimeZone utc = absl::UTCTimeZone();
  const absl::CivilSecond civil = absl::ToCivilSecond(now, utc);
  static constexpr const char* kMonths[] = {"January", "February", "March", "April", "May", "June",
                                            "July", "August", "September", "October", "November", "December"};
  static constexpr const char* kDays[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
                                          "Saturday", "Sunday"};
  const int month = civil.month() - 1;
  const int weekday = static_cast<int>(absl::GetWeekday(civil));  // Monday is 0
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    char directive = format[++i];
    bool pad = true;
    if (directive == '-' && i + 1 < format.size()) {
      pad = false;
      directive = format[++i];
    }
    auto number = [&](int64_t n, int width) {
      std::string digits = std::to_string(n);
      if (pad && static_cast<int>(digits.size()) < width) digits.insert(0, width - digits.size(), '0');
      out += digits;
    };
    switch (directive) {
      case 'Y': number(civil.year(), 4); break;
      case 'y': number(civil.year() % 100, 2); break;
      case 'm': number(civil.month(), 2); break;
      case 'd': number(civil.day(), 2); break;
      case 'e': {
        std::string day = std::to_string(civil.day());
        out += day.size() < 2 && pad ? " " + day : day;
        break;
      }
      case 'H': number(civil.hour(), 2); break;
      case 'I': number(civil.hour() % 12 == 0 ? 12 : civil.hour() % 12, 2); break;
      case 'M': number(civil.minute(), 2); break;
      case 'S': number(civil.second(), 2); break;
      case 'p': out += civil.hour() < 12 ? "AM" : "PM"; break;
      case 'j': number(absl::GetYearDay(absl::CivilDay(civil)), 3); break;
      case 'B': out += kMonths[month]; break;
      case 'b': case 'h': out += std::string(kMonths[month]).substr(0, 3); break;
      case 'A': out += kDays[weekday]; break;
      case 'a': out += std::string(kDays[weekday]).substr(0, 3); break;
      case '%': out += '%'; break;
      default:
        out += '%';
        if (!pad) out += '-';
        out += directive;
    }
  }
  return out;
}

}  // namespace cloister::llm::chat_template_internal
