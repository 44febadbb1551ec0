// Internals of ChatTemplate (chat_template.h) shared by its source files: UTF-8 and ASCII
// helpers, the values templates compute with, the AST the parser builds and the names of the
// supported filters, tests and methods. Not for use outside the chat-template engine.
// Thread-safe: pure functions; a parsed AST is immutable.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cloister::llm::chat_template_internal {

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers. Invalid bytes decode as U+FFFD one byte at a time, so any input is walkable.

// Decodes the code point at `text[*position]` and advances `*position` past it.
uint32_t DecodeNext(std::string_view text, size_t* position);

void AppendUtf8(uint32_t cp, std::string* out);

// The byte offset where each code point starts, plus the end: size() - 1 code points.
std::vector<size_t> CodePointOffsets(std::string_view text);

size_t CodePointCount(std::string_view text);

// Whitespace as JavaScript's \s and String.prototype.trim see it (what the reference strips).
bool IsSpace(uint32_t cp);

// Byte length of the whitespace that starts `text`.
size_t LeadingSpaceSize(std::string_view text);

// Byte length of `text` without its trailing whitespace.
size_t WithoutTrailingSpaceSize(std::string_view text);

inline char AsciiUpper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
inline char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
inline bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }
inline bool IsWordByte(char c) { return IsAsciiAlpha(c) || IsAsciiDigit(c) || c == '_'; }

// Python's str.title() restricted to ASCII letters: a letter after a letter is lowered, any
// other letter raised.
std::string TitleCase(std::string_view text);

// ---------------------------------------------------------------------------------------------
// Values.

struct Value;
struct Object;
struct Function;
using ValueList = std::vector<Value>;

struct Value {
  enum class Kind : uint8_t {
    kUndefined, kNone, kBoolean, kInteger, kFloat, kString, kList, kObject, kNamespace, kFunction
  };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::shared_ptr<const std::string> string;
  std::shared_ptr<const ValueList> list;
  std::shared_ptr<Object> object;  // kObject (never changed once built) and kNamespace
  std::shared_ptr<const Function> function;
  int depth = 0;  // containers: how deeply this value nests (scalars 0)

  static Value None() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value Boolean(bool b) {
    Value v;
    v.kind = Kind::kBoolean;
    v.boolean = b;
    return v;
  }
  static Value Integer(int64_t i) {
    Value v;
    v.kind = Kind::kInteger;
    v.integer = i;
    return v;
  }
  static Value Float(double d) {
    Value v;
    v.kind = Kind::kFloat;
    v.number = d;
    return v;
  }
  static Value String(std::string s) {
    Value v;
    v.kind = Kind::kString;
    v.string = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_object() const { return kind == Kind::kObject; }
  bool is_number() const { return kind == Kind::kInteger || kind == Kind::kFloat; }
  bool has_entries() const { return kind == Kind::kObject || kind == Kind::kNamespace; }
  const std::string& str() const { return *string; }
  double AsDouble() const {
    return kind == Kind::kFloat ? number : kind == Kind::kBoolean ? (boolean ? 1 : 0) : integer;
  }
};

// A mapping that keeps insertion order (Python dicts, ordered_json objects).
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* Find(std::string_view key) const {
    for (const auto& [name, value] : entries) {
      if (name == key) return &value;
    }
    return nullptr;
  }
  void Set(std::string key, Value value) {
    for (auto& [name, existing] : entries) {
      if (name == key) {
        existing = std::move(value);
        return;
      }
    }
    entries.emplace_back(std::move(key), std::move(value));
  }
};

const char* KindName(Value::Kind kind);

bool Truthy(const Value& v);

// Python's repr of a float, which is also what the reference prints for a non-integral one;
// an integral float keeps its ".0".
std::string FormatFloat(double d);

// ---------------------------------------------------------------------------------------------
// The AST.

struct Expr {
  enum class Kind : uint8_t {
    kLiteral, kName, kList, kTuple, kDict, kAttribute, kIndex, kSlice, kCall, kFilter, kTest,
    kNegate, kPlus, kNot, kBinary, kTernary
  };
  Kind kind;
  int line = 0;
  int depth = 1;  // height of this subtree
  std::string text;  // name, attribute, operator, filter or test name
  Value literal;
  bool negate = false;  // `is not`
  // kAttribute, kIndex, kNegate, kNot, kFilter, kTest: [0] operand. kIndex: [1] index.
  // kSlice: [0] operand, [1..3] start, stop, step (null when absent). kBinary: [0] [1].
  // kTernary: [0] value if true, [1] condition, [2] value if false (null: undefined).
  // kCall: [0] callee, then arguments. kFilter/kTest: [0] operand, then arguments.
  // kDict: key, value, key, value...
  std::vector<std::unique_ptr<Expr>> children;
  // Per argument of a call, filter or test (children after the first): its keyword or "".
  std::vector<std::string> keywords;
};

struct Node {
  enum class Kind : uint8_t {
    kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kCallBlock, kBreak, kContinue
  };
  Node(Kind node_kind, int node_line) : kind(node_kind), line(node_line) {}
  Kind kind;
  int line = 0;
  std::string text;  // kText; kMacro: the name; kSet into a namespace: the attribute
  std::vector<std::unique_ptr<Expr>> exprs;  // kIf: conditions; kFor: iterable, [condition]
  std::vector<std::vector<Node>> bodies;      // kIf: one per condition, [else]; kFor: body, else
  std::vector<std::string> names;  // kFor/kSet targets; kMacro/kCallBlock parameters
  bool tuple_target = false;       // `for a, b in` / `set a, b =`
  std::string namespace_name;      // kSet: `set ns.attr = ...`
  std::vector<std::unique_ptr<Expr>> defaults;  // kMacro/kCallBlock: per parameter, or null
};

struct Function {
  enum class Kind : uint8_t { kMacro, kCaller, kBuiltin };
  Kind kind;
  const Node* node = nullptr;  // kMacro: the macro; kCaller: the call block
  struct Scope* scope = nullptr;  // kCaller: where the call block stands
  uint64_t scope_id = 0;          // kCaller: that scope's id, to check it still exists
  std::string name;               // kBuiltin
};

// ---------------------------------------------------------------------------------------------
// What the parser accepts and the evaluator implements.

inline constexpr std::string_view kFilters[] = {
    "trim", "tojson", "length", "count", "upper", "lower", "title", "capitalize", "default", "d",
    "first", "last", "join", "replace", "items", "list", "string", "int", "float", "safe",
    "indent", "selectattr", "rejectattr", "select", "reject", "map", "reverse", "abs", "unique"};
inline constexpr std::string_view kTests[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
    "sequence", "iterable", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=", "in",
    "odd", "even", "divisibleby", "lower", "upper", "callable", "truthy"};
inline constexpr std::string_view kMethods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper", "lower", "title",
    "capitalize", "replace", "join", "get", "items", "keys", "values"};

inline bool Contains(const std::string_view* begin, const std::string_view* end,
                     std::string_view name) {
  return std::find(begin, end, name) != end;
}
template <size_t N>
bool Contains(const std::string_view (&list)[N], std::string_view name) {
  return Contains(list, list + N, name);
}

}  // namespace cloister::llm::chat_template_internal
