// The chat-template evaluator: expressions, attributes, subscripts and slices (code points,
// as Python counts them), calls and the binary operators with Python's arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_renderer.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

// ---- expressions ----

absl::StatusOr<Value> Renderer::Eval(const Expr& expr, Scope* scope) {
  DepthGuard guard(this);
  if (guard.exceeded()) return TooDeep(expr.line);
  RETURN_IF_ERROR(Charge(1, 0));
  const int line = expr.line;
  switch (expr.kind) {
    case Expr::Kind::kLiteral: return expr.literal;
    case Expr::Kind::kName: {
      const Value* v = scope->Find(expr.text);
      return v != nullptr ? *v : Value();
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const auto& child : expr.children) {
        ASSIGN_OR_RETURN(Value v, Eval(*child, scope));
        items.push_back(std::move(v));
      }
      return MakeList(std::move(items), line);
    }
    case Expr::Kind::kDict: {
      auto object = std::make_shared<Object>();
      for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
        ASSIGN_OR_RETURN(Value key, Eval(*expr.children[i], scope));
        if (!key.is_string()) return Error(line, "mapping keys must be strings");
        ASSIGN_OR_RETURN(Value v, Eval(*expr.children[i + 1], scope));
        object->Set(key.str(), std::move(v));
      }
      return MakeObject(std::move(object), line);
    }
    case Expr::Kind::kAttribute: {
      ASSIGN_OR_RETURN(Value object, Eval(*expr.children[0], scope));
      return Attribute(object, expr.text);
    }
    case Expr::Kind::kIndex: {
      ASSIGN_OR_RETURN(Value object, Eval(*expr.children[0], scope));
      ASSIGN_OR_RETURN(Value index, Eval(*expr.children[1], scope));
      return Index(object, index, line);
    }
    case Expr::Kind::kSlice: return EvalSlice(expr, scope);
    case Expr::Kind::kCall: return EvalCall(expr, scope);
    case Expr::Kind::kFilter: return EvalFilter(expr, scope);
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value operand, Eval(*expr.children[0], scope));
      std::vector<Value> arguments;
      for (size_t i = 1; i < expr.children.size(); ++i) {
        ASSIGN_OR_RETURN(Value v, Eval(*expr.children[i], scope));
        arguments.push_back(std::move(v));
      }
      ASSIGN_OR_RETURN(bool result, Test(expr.text, operand, arguments, line));
      return Value::Boolean(result != expr.negate);
    }
    case Expr::Kind::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*expr.children[0], scope));
      return Value::Boolean(!Truthy(v));
    }
    case Expr::Kind::kNegate:
    case Expr::Kind::kPlus: {
      ASSIGN_OR_RETURN(Value v, Eval(*expr.children[0], scope));
      const bool negate = expr.kind == Expr::Kind::kNegate;
      if (v.kind == Value::Kind::kFloat) return Value::Float(negate ? -v.number : v.number);
      if (v.kind == Value::Kind::kInteger || v.kind == Value::Kind::kBoolean) {
        const int64_t i = v.kind == Value::Kind::kBoolean ? v.boolean : v.integer;
        if (!negate) return Value::Integer(i);
        if (i == INT64_MIN) return Error(line, "integer overflow");
        return Value::Integer(-i);
      }
      return Error(line, Cat("unary '", negate ? "-" : "+", "' needs a number, not ", KindName(v.kind)));
    }
    case Expr::Kind::kTernary: {
      ASSIGN_OR_RETURN(Value condition, Eval(*expr.children[1], scope));
      if (Truthy(condition)) return Eval(*expr.children[0], scope);
      if (expr.children[2] == nullptr) return Value();
      return Eval(*expr.children[2], scope);
    }
    case Expr::Kind::kBinary: return EvalBinary(expr, scope);
  }
  return Value();
}

Value Renderer::Attribute(const Value& object, const std::string& name) {
  if (object.has_entries()) {
    const Value* v = object.object->Find(name);
    if (v != nullptr) return *v;
  }
  return Value();
}

absl::StatusOr<Value> Renderer::Index(const Value& object, const Value& index, int line) {
  if (object.has_entries()) {
    if (!index.is_string()) return Value();
    RETURN_IF_ERROR(Charge(static_cast<int64_t>(object.object->entries.size()) / 8, 0));
    const Value* v = object.object->Find(index.str());
    return v != nullptr ? *v : Value();
  }
  if (object.is_list() || object.is_string()) {
    if (index.kind != Value::Kind::kInteger) {
      if (index.is_string()) return Value();
      return Error(line, Cat("a ", KindName(object.kind), " index must be an integer, not ",
                                      KindName(index.kind)));
    }
    if (object.is_list()) {
      int64_t i = index.integer;
      const int64_t size = static_cast<int64_t>(object.list->size());
      if (i < 0) i += size;
      if (i < 0 || i >= size) return Value();
      return (*object.list)[i];
    }
    const std::string& s = object.str();
    RETURN_IF_ERROR(Charge(0, s.size()));
    const std::vector<size_t> offsets = CodePointOffsets(s);
    const int64_t size = static_cast<int64_t>(offsets.size()) - 1;
    int64_t i = index.integer;
    if (i < 0) i += size;
    if (i < 0 || i >= size) return Value();
    return Value::String(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  return Value();
}

absl::StatusOr<Value> Renderer::EvalSlice(const Expr& expr, Scope* scope) {
  const int line = expr.line;
  ASSIGN_OR_RETURN(Value object, Eval(*expr.children[0], scope));
  std::optional<int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (expr.children[i + 1] == nullptr) continue;
    ASSIGN_OR_RETURN(Value v, Eval(*expr.children[i + 1], scope));
    if (v.kind == Value::Kind::kNone || v.is_undefined()) continue;
    if (v.kind != Value::Kind::kInteger) return Error(line, "slice bounds must be integers");
    bounds[i] = v.integer;
  }
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return Error(line, "a slice step must not be zero");
  std::vector<size_t> offsets;
  int64_t size = 0;
  if (object.is_list()) {
    size = static_cast<int64_t>(object.list->size());
  } else if (object.is_string()) {
    RETURN_IF_ERROR(Charge(0, object.str().size()));
    offsets = CodePointOffsets(object.str());
    size = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    return Error(line, Cat("cannot slice a ", KindName(object.kind)));
  }
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> bound, int64_t fallback) {
    if (!bound.has_value()) return fallback;
    int64_t b = *bound;
    if (b < 0) {
      b = b < -size ? (step < 0 ? -1 : 0) : b + size;
    } else if (b >= size) {
      b = step < 0 ? size - 1 : size;
    }
    return b;
  };
  const int64_t start = clamp(bounds[0], step < 0 ? size - 1 : 0);
  const int64_t stop = clamp(bounds[1], step < 0 ? -1 : size);
  std::vector<int64_t> picked;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) picked.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) picked.push_back(i);
  }
  if (object.is_list()) {
    ValueList items;
    items.reserve(picked.size());
    for (int64_t i : picked) items.push_back((*object.list)[i]);
    return MakeList(std::move(items), line);
  }
  std::string out;
  for (int64_t i : picked) out.append(object.str(), offsets[i], offsets[i + 1] - offsets[i]);
  return MakeString(std::move(out), line);
}

absl::StatusOr<Value> Renderer::EvalCall(const Expr& expr, Scope* scope) {
  const Expr& callee = *expr.children[0];
  if (callee.kind == Expr::Kind::kAttribute) {
    ASSIGN_OR_RETURN(Value object, Eval(*callee.children[0], scope));
    if (object.is_string() || object.is_object()) {
      std::vector<Value> positional;
      std::vector<std::pair<std::string, Value>> keywords;
      RETURN_IF_ERROR(EvalArguments(expr, 1, scope, &positional, &keywords));
      return CallMethod(object, callee.text, positional, keywords, expr.line);
    }
    Value function = Attribute(object, callee.text);
    if (function.kind != Value::Kind::kFunction) {
      return Error(expr.line, Cat("a ", KindName(object.kind), " has no method '", callee.text, "'"));
    }
    return CallFunction(*function.function, expr, scope);
  }
  ASSIGN_OR_RETURN(Value function, Eval(callee, scope));
  if (function.kind != Value::Kind::kFunction) {
    if (callee.kind == Expr::Kind::kName) {
      return Error(expr.line, Cat("'", callee.text, "' is not a function"));
    }
    return Error(expr.line, Cat("a ", KindName(function.kind), " is not callable"));
  }
  return CallFunction(*function.function, expr, scope);
}

// ---- operators ----

absl::StatusOr<Value> Renderer::EvalBinary(const Expr& expr, Scope* scope) {
  const std::string& op = expr.text;
  const int line = expr.line;
  ASSIGN_OR_RETURN(Value left, Eval(*expr.children[0], scope));
  if (op == "and") return Truthy(left) ? Eval(*expr.children[1], scope) : absl::StatusOr<Value>(left);
  if (op == "or") return Truthy(left) ? absl::StatusOr<Value>(left) : Eval(*expr.children[1], scope);
  ASSIGN_OR_RETURN(Value right, Eval(*expr.children[1], scope));
  if (op == "==" || op == "!=") {
    ASSIGN_OR_RETURN(bool same, Equal(left, right, line, 0));
    return Value::Boolean(same == (op == "=="));
  }
  if (op == "in" || op == "not in") {
    ASSIGN_OR_RETURN(bool found, Contains(right, left, line));
    return Value::Boolean(found == (op == "in"));
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    ASSIGN_OR_RETURN(int c, Compare(left, right, line));
    if (op == "<") return Value::Boolean(c < 0);
    if (op == ">") return Value::Boolean(c > 0);
    if (op == "<=") return Value::Boolean(c <= 0);
    return Value::Boolean(c >= 0);
  }
  if (op == "~") {
    std::string out;
    RETURN_IF_ERROR(Print(left, &out, line, 0));
    RETURN_IF_ERROR(CheckString(out.size(), line));
    RETURN_IF_ERROR(Print(right, &out, line, 0));
    return MakeString(std::move(out), line);
  }
  return Arithmetic(op, left, right, line);
}

absl::StatusOr<Value> Renderer::Arithmetic(const std::string& op, const Value& left,
                                           const Value& right, int line) {
  if (op == "+") {
    if (left.is_string() && right.is_string()) {
      RETURN_IF_ERROR(CheckString(left.str().size() + right.str().size(), line));
      return Value::String(left.str() + right.str());
    }
    if (left.is_list() && right.is_list()) {
      ValueList items = *left.list;
      items.insert(items.end(), right.list->begin(), right.list->end());
      return MakeList(std::move(items), line);
    }
  }
  if (op == "*") {  // repetition, as in Python: "=" * 10
    const Value* sequence = left.is_string() || left.is_list() ? &left : right.is_string() || right.is_list() ? &right : nullptr;
    const Value* times = sequence == &left ? &right : &left;
    if (sequence != nullptr && times->kind == Value::Kind::kInteger) {
      return Repeat(*sequence, std::max<int64_t>(0, times->integer), line);
    }
  }
  const bool left_numeric = left.is_number() || left.kind == Value::Kind::kBoolean;
  const bool right_numeric = right.is_number() || right.kind == Value::Kind::kBoolean;
  if (!left_numeric || !right_numeric) return OperandMismatch(op, left, right, line);
  return NumberArithmetic(op, left, right, line);
}

absl::Status Renderer::OperandMismatch(const std::string& op, const Value& left,
                                       const Value& right, int line) {
  return Error(line, Cat("cannot apply '", op, "' to ", KindName(left.kind), " and ",
                         KindName(right.kind)));
}

absl::StatusOr<Value> Renderer::Repeat(const Value& sequence, int64_t n, int line) {
  if (sequence.is_string()) {
    const size_t size = sequence.str().size();
    if (size > 0 && static_cast<uint64_t>(n) > options_.max_output_size / size) {
      return CheckString(options_.max_output_size + 1, line);
    }
    std::string out;
    out.reserve(size * n);
    for (int64_t i = 0; i < n; ++i) out += sequence.str();
    return MakeString(std::move(out), line);
  }
  const size_t size = sequence.list->size();
  if (size > 0 && static_cast<uint64_t>(n) > options_.max_list_count / size) {
    return LimitError(line, Cat("a list would exceed ", options_.max_list_count, " items"));
  }
  ValueList items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), sequence.list->begin(), sequence.list->end());
  return MakeList(std::move(items), line);
}

absl::StatusOr<Value> Renderer::NumberArithmetic(const std::string& op, const Value& left,
                                                 const Value& right, int line) {
  const bool integers = left.kind != Value::Kind::kFloat && right.kind != Value::Kind::kFloat;
  const int64_t a = left.kind == Value::Kind::kBoolean ? left.boolean : left.integer;
  const int64_t b = right.kind == Value::Kind::kBoolean ? right.boolean : right.integer;
  const double x = left.AsDouble(), y = right.AsDouble();
  int64_t result = 0;
  if (op == "+" || op == "-" || op == "*") {
    if (integers) {
      const bool overflow = op == "+" ? __builtin_add_overflow(a, b, &result)
                            : op == "-" ? __builtin_sub_overflow(a, b, &result)
                                        : __builtin_mul_overflow(a, b, &result);
      if (overflow) return Error(line, "integer overflow");
      return Value::Integer(result);
    }
    return Value::Float(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }
  if (op == "/") {
    if (y == 0) return Error(line, "division by zero");
    return Value::Float(x / y);
  }
  if (op == "//" || op == "%") {
    if (integers) {
      if (b == 0) return Error(line, "division by zero");
      if (a == INT64_MIN && b == -1) {
        if (op == "%") return Value::Integer(0);
        return Error(line, "integer overflow");
      }
      int64_t quotient = a / b, remainder = a % b;
      if (remainder != 0 && ((remainder < 0) != (b < 0))) {  // Python floors
        --quotient;
        remainder += b;
      }
      return Value::Integer(op == "//" ? quotient : remainder);
    }
    if (y == 0) return Error(line, "division by zero");
    if (op == "//") return Value::Float(std::floor(x / y));
    double remainder = std::fmod(x, y);
    if (remainder != 0 && ((remainder < 0) != (y < 0))) remainder += y;
    return Value::Float(remainder);
  }
  if (op == "**") return Power(integers, a, b, x, y, line);
  return OperandMismatch(op, left, right, line);
}

absl::StatusOr<Value> Renderer::Power(bool integers, int64_t a, int64_t b, double x, double y,
                                      int line) {
  if (integers && b >= 0) {
    int64_t power = 1, base = a, exponent = b;
    while (exponent > 0) {
      if (exponent & 1) {
        if (__builtin_mul_overflow(power, base, &power)) return Error(line, "integer overflow");
      }
      exponent >>= 1;
      if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) return Error(line, "integer overflow");
    }
    return Value::Integer(power);
  }
  if (x == 0 && y < 0) return Error(line, "zero cannot be raised to a negative power");
  const double p = std::pow(x, y);
  if (!std::isfinite(p)) return Error(line, "the power is not a finite real number");
  return Value::Float(p);
}

}  // namespace cloister::llm::chat_template_internal
