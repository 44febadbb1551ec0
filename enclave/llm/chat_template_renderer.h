// The chat-template evaluator: a tree walk over the AST of chat_template_internal.h with
// scopes, macros and `caller`, the builtins, methods, filters and tests. Every recursive entry
// point counts its depth against ChatTemplateOptions::max_depth, and every string, list, loop
// and evaluation step is charged to the render's budget.
// Thread-safe: a Renderer is one render's state; use it from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "enclave/llm/chat_template.h"
#include "enclave/llm/chat_template_internal.h"

namespace cloister::llm::chat_template_internal {

struct Scope {
  Scope* parent = nullptr;
  uint64_t id = 0;
  std::vector<std::pair<std::string, Value>> variables;

  const Value* Find(std::string_view name) const {
    for (const Scope* scope = this; scope != nullptr; scope = scope->parent) {
      for (const auto& [key, value] : scope->variables) {
        if (key == name) return &value;
      }
    }
    return nullptr;
  }
  void Set(std::string_view name, Value value) {
    for (auto& [key, existing] : variables) {
      if (key == name) {
        existing = std::move(value);
        return;
      }
    }
    variables.emplace_back(std::string(name), std::move(value));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const ChatTemplateOptions& options) : options_(options) {}
  absl::StatusOr<std::string> Run(const std::vector<Node>& body, Value context);

  // Converts the context, bounded by max_depth and charged to the work budget.
  template <typename Json>
  absl::StatusOr<Value> FromJson(const Json& json, int depth);

 private:
  // ---- limits (chat_template_renderer.cc) ----
  absl::Status LimitError(int line, std::string_view what) const;
  absl::Status Charge(int64_t units, size_t bytes);
  absl::Status CheckString(size_t size, int line);
  absl::StatusOr<Value> MakeString(std::string s, int line);
  absl::StatusOr<Value> MakeList(ValueList items, int line);
  absl::StatusOr<Value> MakeObject(std::shared_ptr<Object> object, int line);
  absl::Status Append(std::string* out, std::string_view text, int line);

  // Counts recursion; every recursive entry point holds one.
  class DepthGuard {
   public:
    explicit DepthGuard(Renderer* renderer) : renderer_(renderer) { ++renderer_->depth_; }
    ~DepthGuard() { --renderer_->depth_; }
    bool exceeded() const { return renderer_->depth_ > renderer_->options_.max_depth; }

   private:
    Renderer* renderer_;
  };

  absl::Status TooDeep(int line) const;
  void RegisterScope(Scope* scope);
  void UnregisterScope(Scope* scope) { live_scopes_.erase(scope->id); }

  // A scope on the C++ stack, registered so a `caller` can check that its scope still exists.
  class ScopedScope {
   public:
    ScopedScope(Renderer* renderer, Scope* parent) : renderer_(renderer) {
      scope.parent = parent;
      renderer_->RegisterScope(&scope);
    }
    ~ScopedScope() { renderer_->UnregisterScope(&scope); }
    Scope scope;

   private:
    Renderer* renderer_;
  };

  static absl::Status Error(int line, std::string_view message);

  // ---- printing and JSON (chat_template_renderer.cc) ----
  // The text `{{ value }}` writes, as the reference prints it (none and undefined as nothing,
  // lists and mappings as JSON).
  absl::Status Print(const Value& v, std::string* out, int line, int depth);
  absl::StatusOr<std::string> PrintToString(const Value& v, int line);

  struct JsonOptions {
    int indent = 0;  // 0: one line
    bool sort_keys = false;
    bool ensure_ascii = false;
    bool undefined_as_null = true;
  };

  void JsonString(std::string_view s, bool ensure_ascii, std::string* out);
  absl::Status ToJson(const Value& v, const JsonOptions& options, int level, std::string* out,
                      int line, int depth);

  // ---- comparisons (chat_template_renderer.cc) ----
  absl::StatusOr<bool> Equal(const Value& a, const Value& b, int line, int depth);

  // -1, 0 or 1 for `<` and friends: numbers with numbers, strings with strings.
  absl::StatusOr<int> Compare(const Value& a, const Value& b, int line);
  absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line);

  // ---- statements (chat_template_statements.cc) ----
  absl::StatusOr<Flow> ExecBlock(const std::vector<Node>& body, Scope* scope, std::string* out);
  absl::StatusOr<Flow> Exec(const Node& node, Scope* scope, std::string* out);
  absl::Status Assign(const Node& node, Value v, Scope* scope);
  absl::StatusOr<bool> HoldsNamespace(const Value& v, int line, int depth);

  // The items a for loop (or unpacking) walks: a list's items, a mapping's keys, a string's
  // characters; an undefined value walks nothing.
  absl::StatusOr<ValueList> Iterate(const Value& v, int line);
  absl::Status CountIteration(int line);
  absl::Status BindLoopTargets(const Node& node, const Value& item, Scope* scope);
  absl::StatusOr<Flow> ExecFor(const Node& node, Scope* scope, std::string* out);

  // ---- calls (chat_template_statements.cc) ----
  absl::Status EvalArguments(const Expr& call, size_t first, Scope* scope,
                             std::vector<Value>* positional,
                             std::vector<std::pair<std::string, Value>>* keywords);

  // Runs a macro (or a call block's body, for `caller`): parameters bound in a new scope above
  // `call_scope`, the body rendered to a string.
  absl::StatusOr<Value> CallMacro(const Node& macro, const std::vector<Value>& positional,
                                  std::vector<std::pair<std::string, Value>> keywords,
                                  Scope* call_scope, int line);
  absl::StatusOr<Value> CallFunction(const Function& function, const Expr& call, Scope* scope);
  absl::StatusOr<Value> CallBuiltin(const std::string& name, const std::vector<Value>& positional,
                                    const std::vector<std::pair<std::string, Value>>& keywords,
                                    int line);

  // Python's strftime for the common directives, in UTC.
  static std::string Strftime(std::string_view format, absl::Time now);

  // ---- expressions (chat_template_expressions.cc) ----
  absl::StatusOr<Value> Eval(const Expr& expr, Scope* scope);

  // `object.name`: a mapping's entry (a missing one, or any attribute of anything else, is
  // undefined). Methods are handled where they are called.
  static Value Attribute(const Value& object, const std::string& name);
  absl::StatusOr<Value> Index(const Value& object, const Value& index, int line);
  absl::StatusOr<Value> EvalSlice(const Expr& expr, Scope* scope);
  absl::StatusOr<Value> EvalCall(const Expr& expr, Scope* scope);

  // ---- string and mapping methods (chat_template_methods.cc) ----
  // Binds positional and keyword arguments of a builtin to parameter names.
  struct Arguments {
    std::vector<std::optional<Value>> values;
    const std::optional<Value>& operator[](size_t i) const { return values[i]; }
  };

  absl::StatusOr<Arguments> Bind(std::string_view what,
                                 std::initializer_list<std::string_view> names,
                                 const std::vector<Value>& positional,
                                 const std::vector<std::pair<std::string, Value>>& keywords,
                                 int line);
  absl::StatusOr<std::string> StringArgument(const std::optional<Value>& v, std::string_view what,
                                             int line);

  // Python's str.strip family: `chars` none means whitespace.
  static std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                           bool right);
  absl::StatusOr<std::string> Replace(const std::string& s, const std::string& old_text,
                                      const std::string& new_text, int64_t count, int line);
  absl::StatusOr<Value> Split(const std::string& s, const std::optional<Value>& separator,
                              const std::optional<Value>& max_split, int line);
  absl::StatusOr<Value> ItemsOf(const Value& object, int line);
  // get, items, keys and values on a mapping.
  absl::StatusOr<Value> MappingMethod(const Value& object, const std::string& name,
                                      const std::string& what, const std::vector<Value>& positional,
                                      const std::vector<std::pair<std::string, Value>>& keywords,
                                      int line);
  // startswith and endswith on `s`: one string or a list of them.
  absl::StatusOr<Value> AffixMethod(const std::string& s, const std::string& name,
                                    const std::string& what, const std::vector<Value>& positional,
                                    const std::vector<std::pair<std::string, Value>>& keywords,
                                    int line);
  absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name,
                                   const std::vector<Value>& positional,
                                   const std::vector<std::pair<std::string, Value>>& keywords,
                                   int line);
  static std::string ChangeCase(const std::string& how, const std::string& s);
  absl::StatusOr<Value> JoinValues(const ValueList& items, const std::string& separator, int line);

  // ---- tests (chat_template_filters.cc) ----
  absl::StatusOr<bool> Test(const std::string& name, const Value& v,
                            const std::vector<Value>& arguments, int line);

  // ---- filters (chat_template_filters.cc) ----
  absl::StatusOr<Value> EvalFilter(const Expr& expr, Scope* scope);

  // The value at a dotted attribute path ("function.name", "items.0").
  absl::StatusOr<Value> AttributePath(const Value& item, const std::string& path, int line);
  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v,
                                    const std::vector<Value>& positional,
                                    const std::vector<std::pair<std::string, Value>>& keywords,
                                    int line);
  // "the filter 'trim' needs a string, not list" (`what` names the filter).
  static absl::Status KindError(std::string_view what, std::string_view kind, const Value& v,
                                int line);
  // tojson(indent, sort_keys, ensure_ascii); separators only as none.
  absl::StatusOr<Value> TojsonFilter(const Value& v, const std::string& what,
                                     const std::vector<Value>& positional,
                                     const std::vector<std::pair<std::string, Value>>& keywords,
                                     int line);
  // join(d, attribute).
  absl::StatusOr<Value> JoinFilter(const Value& v, const std::string& what,
                                   const std::vector<Value>& positional,
                                   const std::vector<std::pair<std::string, Value>>& keywords,
                                   int line);
  // indent(width, first, blank): width as a count of spaces or a string.
  absl::StatusOr<Value> IndentFilter(const Value& v, const std::string& what,
                                     const std::vector<Value>& positional,
                                     const std::vector<std::pair<std::string, Value>>& keywords,
                                     int line);
  // selectattr, rejectattr, select and reject.
  absl::StatusOr<Value> SelectFilter(const std::string& name, const Value& v,
                                     const std::string& what, const std::vector<Value>& positional,
                                     const std::vector<std::pair<std::string, Value>>& keywords,
                                     int line);
  absl::StatusOr<Value> MapFilter(const Value& v, const std::string& what,
                                  const std::vector<Value>& positional,
                                  const std::vector<std::pair<std::string, Value>>& keywords,
                                  int line);
  // int and float.
  absl::StatusOr<Value> NumberFilter(const std::string& name, const Value& v,
                                     const std::string& what, const std::vector<Value>& positional,
                                     const std::vector<std::pair<std::string, Value>>& keywords,
                                     int line);
  // The filters that take no arguments (trim, length, upper, first, items, reverse, abs, ...).
  absl::StatusOr<Value> ApplyPlainFilter(const std::string& name, const Value& v,
                                         const std::string& what, int line);

  // ---- operators (chat_template_expressions.cc) ----
  absl::StatusOr<Value> EvalBinary(const Expr& expr, Scope* scope);
  // + - * / // % ** (and + and * on strings and lists), after both operands are evaluated.
  absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& left, const Value& right,
                                   int line);
  // "cannot apply '-' to string and integer".
  static absl::Status OperandMismatch(const std::string& op, const Value& left, const Value& right,
                                      int line);
  // `sequence` (a string or a list) `n` times over, within the output and list limits.
  absl::StatusOr<Value> Repeat(const Value& sequence, int64_t n, int line);
  // The operators on numbers and booleans, with Python's floored division and modulo.
  static absl::StatusOr<Value> NumberArithmetic(const std::string& op, const Value& left,
                                                const Value& right, int line);
  // `**`: exact on integers with a non-negative exponent (`a`, `b`), else on doubles (`x`, `y`).
  static absl::StatusOr<Value> Power(bool integers, int64_t a, int64_t b, double x, double y,
                                     int line);

  const ChatTemplateOptions& options_;
  int64_t work_ = 0;
  int64_t iterations_ = 0;
  int depth_ = 0;
  uint64_t next_scope_id_ = 0;
  std::unordered_map<uint64_t, Scope*> live_scopes_;
};

}  // namespace cloister::llm::chat_template_internal
