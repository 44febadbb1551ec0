// The chat-template engine: preprocessing (trim_blocks, lstrip_blocks), a lexer, a recursive
// descent parser to an AST and a tree-walking evaluator. Every recursive function counts its
// depth against ChatTemplateOptions::max_depth, every value records how deeply it nests, and
// every string, list, loop and evaluation step is charged to a budget, so a tenant's template
// cannot exhaust the stack, the heap or the CPU.
#include "enclave/llm/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm {
namespace {


// ---------------------------------------------------------------------------------------------
// UTF-8 helpers. Invalid bytes decode as U+FFFD one byte at a time, so any input is walkable.

// Decodes the code point at `text[*position]` and advances `*position` past it.
uint32_t DecodeNext(std::string_view text, size_t* position) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const size_t i = *position;
  const unsigned char lead = byte(i);
  auto continuation = [&](size_t k) { return i + k < text.size() && (byte(i + k) & 0xC0) == 0x80; };
  if (lead < 0x80) {
    *position = i + 1;
    return lead;
  }
  if (lead >= 0xC2 && lead <= 0xDF && continuation(1)) {
    *position = i + 2;
    return ((lead & 0x1Fu) << 6) | (byte(i + 1) & 0x3Fu);
  }
  if (lead >= 0xE0 && lead <= 0xEF && continuation(1) && continuation(2)) {
    const uint32_t cp = ((lead & 0x0Fu) << 12) | ((byte(i + 1) & 0x3Fu) << 6) | (byte(i + 2) & 0x3Fu);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      *position = i + 3;
      return cp;
    }
  }
  if (lead >= 0xF0 && lead <= 0xF4 && continuation(1) && continuation(2) && continuation(3)) {
    const uint32_t cp = ((lead & 0x07u) << 18) | ((byte(i + 1) & 0x3Fu) << 12) |
                        ((byte(i + 2) & 0x3Fu) << 6) | (byte(i + 3) & 0x3Fu);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      *position = i + 4;
      return cp;
    }
  }
  *position = i + 1;
  return 0xFFFD;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The byte offset where each code point starts, plus the end: size() - 1 code points.
std::vector<size_t> CodePointOffsets(std::string_view text) {
  std::vector<size_t> offsets;
  size_t position = 0;
  while (position < text.size()) {
    offsets.push_back(position);
    DecodeNext(text, &position);
  }
  offsets.push_back(text.size());
  return offsets;
}

size_t CodePointCount(std::string_view text) {
  size_t count = 0;
  for (size_t position = 0; position < text.size(); ++count) DecodeNext(text, &position);
  return count;
}

// Whitespace as JavaScript's \s and String.prototype.trim see it (what the reference strips).
bool IsSpace(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

// Byte length of the whitespace that starts `text`.
size_t LeadingSpaceSize(std::string_view text) {
  size_t position = 0;
  while (position < text.size()) {
    size_t next = position;
    if (!IsSpace(DecodeNext(text, &next))) break;
    position = next;
  }
  return position;
}

// Byte length of `text` without its trailing whitespace.
size_t WithoutTrailingSpaceSize(std::string_view text) {
  size_t end = 0;
  size_t position = 0;
  while (position < text.size()) {
    if (!IsSpace(DecodeNext(text, &position))) end = position;
  }
  return end;
}

char AsciiUpper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }
bool IsWordByte(char c) { return IsAsciiAlpha(c) || IsAsciiDigit(c) || c == '_'; }

// Python's str.title() restricted to ASCII letters: a letter after a letter is lowered, any
// other letter raised.
std::string TitleCase(std::string_view text) {
  std::string out(text);
  bool previous_cased = false;
  for (char& c : out) {
    if (IsAsciiAlpha(c)) {
      c = previous_cased ? AsciiLower(c) : AsciiUpper(c);
      previous_cased = true;
    } else {
      previous_cased = false;
    }
  }
  return out;
}

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

const char* KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "none";
    case Value::Kind::kBoolean: return "boolean";
    case Value::Kind::kInteger: return "integer";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "string";
    case Value::Kind::kList: return "list";
    case Value::Kind::kObject: return "mapping";
    case Value::Kind::kNamespace: return "namespace";
    case Value::Kind::kFunction: return "function";
  }
  return "value";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBoolean: return v.boolean;
    case Value::Kind::kInteger: return v.integer != 0;
    case Value::Kind::kFloat: return v.number != 0;
    case Value::Kind::kString: return !v.string->empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kObject: return !v.object->entries.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction: return true;
  }
  return false;
}

// Python's repr of a float, which is also what the reference prints for a non-integral one;
// an integral float keeps its ".0".
std::string FormatFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, d);
  std::string text(buffer, end);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

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

}  // namespace

struct ChatTemplate::Program {
  std::vector<Node> body;
};

namespace {

// ---------------------------------------------------------------------------------------------
// Preprocessing and the lexer.

struct Token {
  enum class Kind : uint8_t {
    kText, kOpenStatement, kCloseStatement, kOpenExpression, kCloseExpression, kName, kString,
    kInteger, kFloat, kOperator, kEnd
  };
  Kind kind;
  std::string text;
  int line;
  int64_t integer = 0;
  double number = 0;
};

absl::Status SyntaxError(int line, std::string_view message) {
  return absl::InvalidArgumentError(Cat("chat template line ", line, ": ", message));
}

// What the reference does to the source before lexing (one trailing newline dropped, then
// lstrip_blocks and trim_blocks as text substitutions), keeping each byte's source line.
void Preprocess(std::string_view source, std::string* text, std::vector<int>* lines) {
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  std::vector<int> source_lines(source.size());
  int line = 1;
  for (size_t i = 0; i < source.size(); ++i) {
    source_lines[i] = line;
    if (source[i] == '\n') ++line;
  }
  // lstrip_blocks: spaces and tabs from a line's start to a `{%`, `{#` (or `{-`).
  std::string stripped;
  std::vector<int> stripped_lines;
  stripped.reserve(source.size());
  stripped_lines.reserve(source.size());
  bool line_start = true;
  for (size_t i = 0; i < source.size();) {
    if (line_start) {
      size_t j = i;
      while (j < source.size() && (source[j] == ' ' || source[j] == '\t')) ++j;
      if (j + 1 < source.size() && source[j] == '{' &&
          (source[j + 1] == '%' || source[j + 1] == '#' || source[j + 1] == '-')) {
        i = j;
      }
      line_start = false;
      if (i >= source.size()) break;
    }
    stripped.push_back(source[i]);
    stripped_lines.push_back(source_lines[i]);
    if (source[i] == '\n' || source[i] == '\r') line_start = true;
    ++i;
  }
  // trim_blocks: the newline right after `%}`, `#}` (or `-}`).
  text->clear();
  lines->clear();
  text->reserve(stripped.size());
  lines->reserve(stripped.size());
  for (size_t i = 0; i < stripped.size(); ++i) {
    text->push_back(stripped[i]);
    lines->push_back(stripped_lines[i]);
    if ((stripped[i] == '%' || stripped[i] == '#' || stripped[i] == '-') &&
        i + 2 < stripped.size() && stripped[i + 1] == '}' && stripped[i + 2] == '\n') {
      text->push_back('}');
      lines->push_back(stripped_lines[i + 1]);
      i += 2;  // skip the brace (pushed) and the newline
    }
  }
}

class Lexer {
 public:
  Lexer(std::string_view source) { Preprocess(source, &text_, &lines_); }

  absl::StatusOr<std::vector<Token>> Run() {
    while (position_ < text_.size()) {
      if (!inside_) {
        RETURN_IF_ERROR(LexText());
      } else {
        RETURN_IF_ERROR(LexInside());
      }
    }
    if (inside_) {
      return SyntaxError(LineAt(text_.size()), inside_expression_
                                                   ? "unexpected end of template: '}}' is missing"
                                                   : "unexpected end of template: '%}' is missing");
    }
    tokens_.push_back({Token::Kind::kEnd, "", LineAt(text_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t position) const {
    if (lines_.empty()) return 1;
    return lines_[std::min(position, lines_.size() - 1)];
  }
  bool At(std::string_view s) const { return std::string_view(text_).substr(position_, s.size()) == s; }

  void StripPreviousText() {
    if (!tokens_.empty() && tokens_.back().kind == Token::Kind::kText) {
      std::string& previous = tokens_.back().text;
      previous.resize(WithoutTrailingSpaceSize(previous));
      if (previous.empty()) tokens_.pop_back();
    }
  }
  void SkipFollowingSpace() {
    position_ += LeadingSpaceSize(std::string_view(text_).substr(position_));
  }

  absl::Status LexText() {
    size_t start = position_;
    while (position_ < text_.size() &&
           !(text_[position_] == '{' && position_ + 1 < text_.size() &&
             (text_[position_ + 1] == '{' || text_[position_ + 1] == '%' ||
              text_[position_ + 1] == '#'))) {
      ++position_;
    }
    if (position_ > start) {
      tokens_.push_back({Token::Kind::kText, text_.substr(start, position_ - start), LineAt(start)});
      return absl::OkStatus();
    }
    const int line = LineAt(position_);
    const char second = text_[position_ + 1];
    position_ += 2;
    const bool strip_before = position_ < text_.size() && text_[position_] == '-';
    if (strip_before) {
      ++position_;
      StripPreviousText();
    }
    if (second == '#') {
      const size_t end = text_.find("#}", position_);
      if (end == std::string::npos) return SyntaxError(line, "a comment '{#' is never closed");
      const bool strip_after = end > position_ && text_[end - 1] == '-';
      position_ = end + 2;
      if (strip_after) SkipFollowingSpace();
      // A comment ends any text token, as in the reference: text on both sides stays apart,
      // which matters for a later `{%-` that strips only the text right before it.
      tokens_.push_back({Token::Kind::kText, "", line});
      return absl::OkStatus();
    }
    inside_ = true;
    inside_expression_ = second == '{';
    brace_depth_ = 0;
    tokens_.push_back({inside_expression_ ? Token::Kind::kOpenExpression
                                          : Token::Kind::kOpenStatement,
                       inside_expression_ ? "{{" : "{%", line});
    return absl::OkStatus();
  }

  absl::Status LexInside() {
    while (position_ < text_.size() && IsSpaceByte(text_[position_])) ++position_;
    if (position_ >= text_.size()) return absl::OkStatus();
    const int line = LineAt(position_);
    const std::string_view close = inside_expression_ ? "}}" : "%}";
    if ((At("-") && std::string_view(text_).substr(position_ + 1, 2) == close) ||
        (At(close) && (!inside_expression_ || brace_depth_ == 0))) {
      const bool strip_after = text_[position_] == '-';
      position_ += strip_after ? 3 : 2;
      tokens_.push_back({inside_expression_ ? Token::Kind::kCloseExpression
                                            : Token::Kind::kCloseStatement,
                         std::string(close), line});
      inside_ = false;
      if (strip_after) SkipFollowingSpace();
      return absl::OkStatus();
    }
    const char c = text_[position_];
    if (c == '\'' || c == '"') return LexString(c, line);
    if (IsAsciiDigit(c)) return LexNumber(line);
    if (IsWordByte(c)) {
      size_t start = position_;
      while (position_ < text_.size() && IsWordByte(text_[position_])) ++position_;
      tokens_.push_back({Token::Kind::kName, text_.substr(start, position_ - start), line});
      return absl::OkStatus();
    }
    static constexpr std::string_view kOperators[] = {
        "**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(",
        ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (std::string_view op : kOperators) {
      if (At(op)) {
        if (op == "{") ++brace_depth_;
        if (op == "}") --brace_depth_;
        tokens_.push_back({Token::Kind::kOperator, std::string(op), line});
        position_ += op.size();
        return absl::OkStatus();
      }
    }
    size_t next = position_;
    std::string character;
    AppendUtf8(DecodeNext(text_, &next), &character);
    return SyntaxError(line, Cat("unexpected character '", character, "'"));
  }

  static bool IsSpaceByte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Reads `count` hex digits at position_, or returns false.
  bool ReadHex(int count, uint32_t* value) {
    if (position_ + count > text_.size()) return false;
    uint32_t v = 0;
    for (int i = 0; i < count; ++i) {
      const int digit = HexDigit(text_[position_ + i]);
      if (digit < 0) return false;
      v = v * 16 + digit;
    }
    position_ += count;
    *value = v;
    return true;
  }

  absl::Status LexString(char quote, int line) {
    ++position_;
    std::string value;
    while (true) {
      if (position_ >= text_.size()) return SyntaxError(line, "a string literal is never closed");
      const char c = text_[position_];
      if (c == quote) {
        ++position_;
        break;
      }
      if (c != '\\') {
        value.push_back(c);
        ++position_;
        continue;
      }
      if (position_ + 1 >= text_.size()) return SyntaxError(line, "a string literal is never closed");
      const char escaped = text_[position_ + 1];
      position_ += 2;
      switch (escaped) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case '0': value.push_back('\0'); break;
        case '\'': case '"': case '\\': value.push_back(escaped); break;
        case '\n': break;  // a line continuation
        case 'x': case 'u': case 'U': {
          uint32_t cp = 0;
          if (!ReadHex(escaped == 'x' ? 2 : escaped == 'u' ? 4 : 8, &cp)) {
            return SyntaxError(line, Cat("a '\\", std::string(1, escaped),
                                                  "' escape needs hexadecimal digits"));
          }
          if (escaped == 'u' && cp >= 0xD800 && cp <= 0xDBFF && At("\\u")) {
            const size_t saved = position_;
            position_ += 2;
            uint32_t low = 0;
            if (ReadHex(4, &low) && low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              position_ = saved;
            }
          }
          AppendUtf8(cp, &value);
          break;
        }
        default:  // Python keeps an unknown escape as written
          value.push_back('\\');
          value.push_back(escaped);
      }
    }
    tokens_.push_back({Token::Kind::kString, std::move(value), line});
    return absl::OkStatus();
  }

  absl::Status LexNumber(int line) {
    const size_t start = position_;
    while (position_ < text_.size() && (IsAsciiDigit(text_[position_]) || text_[position_] == '_')) ++position_;
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator &&
                           tokens_.back().text == ".";
    if (!after_dot && position_ + 1 < text_.size() && text_[position_] == '.' &&
        IsAsciiDigit(text_[position_ + 1])) {
      is_float = true;
      ++position_;
      while (position_ < text_.size() && IsAsciiDigit(text_[position_])) ++position_;
    }
    if (!after_dot && position_ < text_.size() && (text_[position_] == 'e' || text_[position_] == 'E')) {
      size_t p = position_ + 1;
      if (p < text_.size() && (text_[p] == '+' || text_[p] == '-')) ++p;
      if (p < text_.size() && IsAsciiDigit(text_[p])) {
        is_float = true;
        position_ = p;
        while (position_ < text_.size() && IsAsciiDigit(text_[position_])) ++position_;
      }
    }
    std::string digits;
    for (size_t i = start; i < position_; ++i) {
      if (text_[i] != '_') digits.push_back(text_[i]);
    }
    Token token{is_float ? Token::Kind::kFloat : Token::Kind::kInteger, digits, line};
    if (is_float) {
      token.number = std::strtod(digits.c_str(), nullptr);
    } else {
      auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), token.integer);
      if (error != std::errc()) return SyntaxError(line, Cat("the integer ", digits, " is too large"));
    }
    tokens_.push_back(std::move(token));
    return absl::OkStatus();
  }

  std::string text_;
  std::vector<int> lines_;
  size_t position_ = 0;
  bool inside_ = false;
  bool inside_expression_ = false;
  int brace_depth_ = 0;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------
// The parser.

constexpr std::string_view kFilters[] = {
    "trim", "tojson", "length", "count", "upper", "lower", "title", "capitalize", "default", "d",
    "first", "last", "join", "replace", "items", "list", "string", "int", "float", "safe",
    "indent", "selectattr", "rejectattr", "select", "reject", "map", "reverse", "abs", "unique"};
constexpr std::string_view kTests[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
    "sequence", "iterable", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=", "in",
    "odd", "even", "divisibleby", "lower", "upper", "callable", "truthy"};
constexpr std::string_view kMethods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper", "lower", "title",
    "capitalize", "replace", "join", "get", "items", "keys", "values"};

bool Contains(const std::string_view* begin, const std::string_view* end, std::string_view name) {
  return std::find(begin, end, name) != end;
}
template <size_t N>
bool Contains(const std::string_view (&list)[N], std::string_view name) {
  return Contains(list, list + N, name);
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth) : tokens_(std::move(tokens)), max_depth_(max_depth) {}

  absl::StatusOr<std::vector<Node>> Run() {
    std::vector<Node> body;
    std::string end;
    RETURN_IF_ERROR(ParseBlock(&body, {}, &end));
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() {
    const Token& token = Peek();
    if (index_ < tokens_.size() - 1) ++index_;
    return token;
  }
  bool IsOperator(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kOperator && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == name;
  }
  static std::string Describe(const Token& token) {
    switch (token.kind) {
      case Token::Kind::kEnd: return "the end of the template";
      case Token::Kind::kText: return "text";
      case Token::Kind::kString: return "a string";
      case Token::Kind::kInteger:
      case Token::Kind::kFloat: return Cat("the number ", token.text);
      default: return Cat("'", token.text, "'");
    }
  }
  absl::Status Unexpected(std::string_view wanted) const {
    return SyntaxError(Peek().line, Cat("expected ", wanted, " but found ", Describe(Peek())));
  }
  absl::Status ExpectOperator(std::string_view op) {
    if (!IsOperator(op)) return Unexpected(Cat("'", op, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectName(std::string* name) {
    if (Peek().kind != Token::Kind::kName) return Unexpected("a name");
    *name = Next().text;
    return absl::OkStatus();
  }
  absl::Status ExpectCloseStatement() {
    if (Peek().kind != Token::Kind::kCloseStatement) return Unexpected("'%}'");
    Next();
    return absl::OkStatus();
  }

  // Counts nesting while parsing; a RAII guard so every return path undoes it.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* parser) : parser_(parser) { ++parser_->depth_; }
    ~DepthGuard() { --parser_->depth_; }
    bool exceeded() const { return parser_->depth_ > parser_->max_depth_; }

   private:
    Parser* parser_;
  };
  absl::Status TooDeep() const {
    return SyntaxError(Peek().line, Cat("the template nests deeper than ", max_depth_, " levels"));
  }

  std::unique_ptr<Expr> Make(Expr::Kind kind, int line) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = line;
    return expr;
  }
  absl::Status Add(Expr* parent, std::unique_ptr<Expr> child) {
    if (child != nullptr) {
      parent->depth = std::max(parent->depth, child->depth + 1);
      if (parent->depth > max_depth_) {
        return SyntaxError(parent->line, Cat("an expression nests deeper than ", max_depth_, " levels"));
      }
    }
    parent->children.push_back(std::move(child));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Expr>> Binary(std::string op, std::unique_ptr<Expr> left,
                                               std::unique_ptr<Expr> right, int line) {
    auto expr = Make(Expr::Kind::kBinary, line);
    expr->text = std::move(op);
    RETURN_IF_ERROR(Add(expr.get(), std::move(left)));
    RETURN_IF_ERROR(Add(expr.get(), std::move(right)));
    return expr;
  }

  // Parses nodes until a statement whose keyword is in `ends` (consumed up to its name, which
  // goes to *end); at the top level (`ends` empty) until the end of the template.
  absl::Status ParseBlock(std::vector<Node>* body, std::initializer_list<std::string_view> ends,
                          std::string* end, int opening_line = 0) {
    DepthGuard guard(this);
    if (guard.exceeded()) return TooDeep();
    while (true) {
      const Token& token = Peek();
      switch (token.kind) {
        case Token::Kind::kEnd:
          if (ends.size() == 0) return absl::OkStatus();
          return SyntaxError(token.line, Cat("unexpected end of template: the block opened on line ",
                                                      opening_line, " needs '{% ", *(ends.end() - 1), " %}'"));
        case Token::Kind::kText: {
          Node node{Node::Kind::kText, token.line};
          node.text = Next().text;
          if (!node.text.empty()) body->push_back(std::move(node));
          break;
        }
        case Token::Kind::kOpenExpression: {
          Next();
          Node node{Node::Kind::kOutput, token.line};
          ASSIGN_OR_RETURN(auto expr, ParseExpression());
          node.exprs.push_back(std::move(expr));
          if (Peek().kind != Token::Kind::kCloseExpression) return Unexpected("'}}'");
          Next();
          body->push_back(std::move(node));
          break;
        }
        case Token::Kind::kOpenStatement: {
          Next();
          if (Peek().kind != Token::Kind::kName) return Unexpected("a statement name");
          const std::string keyword = Peek().text;
          if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
            Next();
            *end = keyword;
            return absl::OkStatus();
          }
          RETURN_IF_ERROR(ParseStatement(body));
          break;
        }
        default:
          return Unexpected("text, '{{' or '{%'");
      }
    }
  }

  absl::Status ParseStatement(std::vector<Node>* body) {
    const Token keyword = Next();
    const int line = keyword.line;
    const std::string& name = keyword.text;
    if (name == "if") return ParseIf(body, line);
    if (name == "for") return ParseFor(body, line);
    if (name == "set") return ParseSet(body, line);
    if (name == "macro") return ParseMacro(body, line);
    if (name == "call") return ParseCallBlock(body, line);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, Cat("'", name, "' outside a for loop"));
      RETURN_IF_ERROR(ExpectCloseStatement());
      body->push_back(Node{name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line});
      return absl::OkStatus();
    }
    if (name == "generation" || name == "endgeneration") {  // transformers' marker: no output
      return ExpectCloseStatement();
    }
    static constexpr std::string_view kClosers[] = {"elif", "else", "endif", "endfor", "endset",
                                                    "endmacro", "endcall"};
    if (Contains(kClosers, name)) {
      return SyntaxError(line, Cat("'", name, "' without a block to close"));
    }
    return SyntaxError(line, Cat("the statement '", name, "' is not supported"));
  }

  absl::Status ParseIf(std::vector<Node>* body, int line) {
    Node node{Node::Kind::kIf, line};
    while (true) {
      ASSIGN_OR_RETURN(auto condition, ParseExpression());
      RETURN_IF_ERROR(ExpectCloseStatement());
      node.exprs.push_back(std::move(condition));
      node.bodies.emplace_back();
      std::string end;
      RETURN_IF_ERROR(ParseBlock(&node.bodies.back(), {"elif", "else", "endif"}, &end, line));
      if (end == "elif") continue;
      if (end == "else") {
        RETURN_IF_ERROR(ExpectCloseStatement());
        node.bodies.emplace_back();
        RETURN_IF_ERROR(ParseBlock(&node.bodies.back(), {"endif"}, &end, line));
      }
      break;
    }
    RETURN_IF_ERROR(ExpectCloseStatement());
    body->push_back(std::move(node));
    return absl::OkStatus();
  }

  // Names for `for` and `set`: `a`, `a, b` or `(a, b)`.
  absl::Status ParseTargets(Node* node) {
    const bool parenthesized = IsOperator("(");
    if (parenthesized) Next();
    while (true) {
      std::string name;
      RETURN_IF_ERROR(ExpectName(&name));
      node->names.push_back(std::move(name));
      if (!IsOperator(",")) break;
      Next();
      node->tuple_target = true;
      if (parenthesized && IsOperator(")")) break;
    }
    if (parenthesized) {
      node->tuple_target = true;
      RETURN_IF_ERROR(ExpectOperator(")"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseFor(std::vector<Node>* body, int line) {
    Node node{Node::Kind::kFor, line};
    RETURN_IF_ERROR(ParseTargets(&node));
    if (!IsName("in")) return Unexpected("'in'");
    Next();
    ASSIGN_OR_RETURN(auto iterable, ParseTuple(/*conditional=*/false));
    node.exprs.push_back(std::move(iterable));
    if (IsName("if")) {
      Next();
      ASSIGN_OR_RETURN(auto condition, ParseExpression());
      node.exprs.push_back(std::move(condition));
    }
    if (IsName("recursive")) return SyntaxError(line, "recursive for loops are not supported");
    RETURN_IF_ERROR(ExpectCloseStatement());
    node.bodies.resize(2);
    std::string end;
    ++loop_depth_;
    absl::Status status = ParseBlock(&node.bodies[0], {"else", "endfor"}, &end, line);
    --loop_depth_;
    RETURN_IF_ERROR(status);
    if (end == "else") {
      RETURN_IF_ERROR(ExpectCloseStatement());
      RETURN_IF_ERROR(ParseBlock(&node.bodies[1], {"endfor"}, &end, line));
    }
    RETURN_IF_ERROR(ExpectCloseStatement());
    body->push_back(std::move(node));
    return absl::OkStatus();
  }

  absl::Status ParseSet(std::vector<Node>* body, int line) {
    Node node{Node::Kind::kSet, line};
    if (Peek().kind == Token::Kind::kName && IsOperator(".", 1)) {
      node.namespace_name = Next().text;
      Next();
      RETURN_IF_ERROR(ExpectName(&node.text));
    } else {
      RETURN_IF_ERROR(ParseTargets(&node));
    }
    if (IsOperator("=")) {
      Next();
      ASSIGN_OR_RETURN(auto value, ParseTuple(/*conditional=*/true));
      node.exprs.push_back(std::move(value));
      RETURN_IF_ERROR(ExpectCloseStatement());
    } else {
      if (node.tuple_target) return Unexpected("'='");
      if (IsOperator("|")) return SyntaxError(line, "a filter on a set block is not supported");
      RETURN_IF_ERROR(ExpectCloseStatement());
      node.kind = Node::Kind::kSetBlock;
      node.bodies.emplace_back();
      std::string end;
      RETURN_IF_ERROR(ParseBlock(&node.bodies[0], {"endset"}, &end, line));
      RETURN_IF_ERROR(ExpectCloseStatement());
    }
    body->push_back(std::move(node));
    return absl::OkStatus();
  }

  // `(a, b=1, ...)` for macros and call blocks.
  absl::Status ParseParameters(Node* node) {
    RETURN_IF_ERROR(ExpectOperator("("));
    while (!IsOperator(")")) {
      std::string name;
      RETURN_IF_ERROR(ExpectName(&name));
      node->names.push_back(std::move(name));
      std::unique_ptr<Expr> default_value;
      if (IsOperator("=")) {
        Next();
        ASSIGN_OR_RETURN(default_value, ParseExpression());
      }
      node->defaults.push_back(std::move(default_value));
      if (!IsOperator(",")) break;
      Next();
    }
    return ExpectOperator(")");
  }

  absl::Status ParseMacro(std::vector<Node>* body, int line) {
    Node node{Node::Kind::kMacro, line};
    RETURN_IF_ERROR(ExpectName(&node.text));
    RETURN_IF_ERROR(ParseParameters(&node));
    RETURN_IF_ERROR(ExpectCloseStatement());
    node.bodies.emplace_back();
    std::string end;
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // a loop around the definition does not reach into the body
    absl::Status status = ParseBlock(&node.bodies[0], {"endmacro"}, &end, line);
    loop_depth_ = saved_loop_depth;
    RETURN_IF_ERROR(status);
    if (Peek().kind == Token::Kind::kName) Next();  // `{% endmacro name %}`
    RETURN_IF_ERROR(ExpectCloseStatement());
    body->push_back(std::move(node));
    return absl::OkStatus();
  }

  absl::Status ParseCallBlock(std::vector<Node>* body, int line) {
    Node node{Node::Kind::kCallBlock, line};
    if (IsOperator("(")) RETURN_IF_ERROR(ParseParameters(&node));
    ASSIGN_OR_RETURN(auto call, ParseExpression());
    if (call->kind != Expr::Kind::kCall) return SyntaxError(line, "a call block needs a macro call");
    node.exprs.push_back(std::move(call));
    RETURN_IF_ERROR(ExpectCloseStatement());
    node.bodies.emplace_back();
    std::string end;
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    absl::Status status = ParseBlock(&node.bodies[0], {"endcall"}, &end, line);
    loop_depth_ = saved_loop_depth;
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(ExpectCloseStatement());
    body->push_back(std::move(node));
    return absl::OkStatus();
  }

  // An expression, or several separated by commas (a tuple), as after `in` and `=`.
  absl::StatusOr<std::unique_ptr<Expr>> ParseTuple(bool conditional) {
    const int line = Peek().line;
    ASSIGN_OR_RETURN(auto first, conditional ? ParseExpression() : ParseOr());
    if (!IsOperator(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple, line);
    RETURN_IF_ERROR(Add(tuple.get(), std::move(first)));
    while (IsOperator(",")) {
      Next();
      if (Peek().kind == Token::Kind::kCloseStatement) break;
      ASSIGN_OR_RETURN(auto item, conditional ? ParseExpression() : ParseOr());
      RETURN_IF_ERROR(Add(tuple.get(), std::move(item)));
    }
    return tuple;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseExpression() {
    DepthGuard guard(this);
    if (guard.exceeded()) return TooDeep();
    ASSIGN_OR_RETURN(auto value, ParseOr());
    while (IsName("if")) {
      const int line = Next().line;
      auto ternary = Make(Expr::Kind::kTernary, line);
      ASSIGN_OR_RETURN(auto condition, ParseOr());
      std::unique_ptr<Expr> otherwise;
      if (IsName("else")) {
        Next();
        ASSIGN_OR_RETURN(otherwise, ParseExpression());
      }
      RETURN_IF_ERROR(Add(ternary.get(), std::move(value)));
      RETURN_IF_ERROR(Add(ternary.get(), std::move(condition)));
      RETURN_IF_ERROR(Add(ternary.get(), std::move(otherwise)));
      value = std::move(ternary);
    }
    return value;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseOr() {
    ASSIGN_OR_RETURN(auto left, ParseAnd());
    while (IsName("or")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(auto right, ParseAnd());
      ASSIGN_OR_RETURN(left, Binary("or", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseAnd() {
    ASSIGN_OR_RETURN(auto left, ParseNot());
    while (IsName("and")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(auto right, ParseNot());
      ASSIGN_OR_RETURN(left, Binary("and", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      if (guard.exceeded()) return TooDeep();
      const int line = Next().line;
      ASSIGN_OR_RETURN(auto operand, ParseNot());
      auto expr = Make(Expr::Kind::kNot, line);
      RETURN_IF_ERROR(Add(expr.get(), std::move(operand)));
      return expr;
    }
    return ParseCompare();
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseCompare() {
    ASSIGN_OR_RETURN(auto left, ParseConcat());
    while (true) {
      std::string op;
      const int line = Peek().line;
      if (Peek().kind == Token::Kind::kOperator &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == ">" || Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return left;
      }
      ASSIGN_OR_RETURN(auto right, ParseConcat());
      ASSIGN_OR_RETURN(left, Binary(op, std::move(left), std::move(right), line));
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseConcat() {
    ASSIGN_OR_RETURN(auto left, ParseSum());
    while (IsOperator("~")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(auto right, ParseSum());
      ASSIGN_OR_RETURN(left, Binary("~", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseSum() {
    ASSIGN_OR_RETURN(auto left, ParseProduct());
    while (IsOperator("+") || IsOperator("-")) {
      const Token& op = Next();
      const std::string text = op.text;
      const int line = op.line;
      ASSIGN_OR_RETURN(auto right, ParseProduct());
      ASSIGN_OR_RETURN(left, Binary(text, std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseProduct() {
    ASSIGN_OR_RETURN(auto left, ParsePower());
    while (IsOperator("*") || IsOperator("/") || IsOperator("//") || IsOperator("%")) {
      const Token& op = Next();
      const std::string text = op.text;
      const int line = op.line;
      ASSIGN_OR_RETURN(auto right, ParsePower());
      ASSIGN_OR_RETURN(left, Binary(text, std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParsePower() {
    ASSIGN_OR_RETURN(auto left, ParseUnary());
    while (IsOperator("**")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(auto right, ParseUnary());
      ASSIGN_OR_RETURN(left, Binary("**", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseUnary() {
    DepthGuard guard(this);
    if (guard.exceeded()) return TooDeep();
    std::unique_ptr<Expr> node;
    if (IsOperator("-") || IsOperator("+")) {
      const Token& op = Next();
      node = Make(op.text == "-" ? Expr::Kind::kNegate : Expr::Kind::kPlus, op.line);
      ASSIGN_OR_RETURN(auto operand, ParseUnaryWithoutFilters());
      RETURN_IF_ERROR(Add(node.get(), std::move(operand)));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
      ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    }
    return ParseFilters(std::move(node));
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseUnaryWithoutFilters() {
    DepthGuard guard(this);
    if (guard.exceeded()) return TooDeep();
    if (IsOperator("-") || IsOperator("+")) {
      const Token& op = Next();
      auto node = Make(op.text == "-" ? Expr::Kind::kNegate : Expr::Kind::kPlus, op.line);
      ASSIGN_OR_RETURN(auto operand, ParseUnaryWithoutFilters());
      RETURN_IF_ERROR(Add(node.get(), std::move(operand)));
      return node;
    }
    ASSIGN_OR_RETURN(auto node, ParsePrimary());
    return ParsePostfix(std::move(node));
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParsePrimary() {
    DepthGuard guard(this);
    if (guard.exceeded()) return TooDeep();
    const Token& token = Peek();
    const int line = token.line;
    switch (token.kind) {
      case Token::Kind::kName: {
        const std::string name = Next().text;
        auto expr = Make(Expr::Kind::kLiteral, line);
        if (name == "true" || name == "True") {
          expr->literal = Value::Boolean(true);
        } else if (name == "false" || name == "False") {
          expr->literal = Value::Boolean(false);
        } else if (name == "none" || name == "None") {
          expr->literal = Value::None();
        } else {
          expr->kind = Expr::Kind::kName;
          expr->text = name;
        }
        return expr;
      }
      case Token::Kind::kString: {
        std::string text = Next().text;
        while (Peek().kind == Token::Kind::kString) text += Next().text;  // 'a' 'b' is 'ab'
        auto expr = Make(Expr::Kind::kLiteral, line);
        expr->literal = Value::String(std::move(text));
        return expr;
      }
      case Token::Kind::kInteger: {
        auto expr = Make(Expr::Kind::kLiteral, line);
        expr->literal = Value::Integer(Next().integer);
        return expr;
      }
      case Token::Kind::kFloat: {
        auto expr = Make(Expr::Kind::kLiteral, line);
        expr->literal = Value::Float(Next().number);
        return expr;
      }
      case Token::Kind::kOperator:
        if (token.text == "(") {
          Next();
          if (IsOperator(")")) {
            Next();
            return Make(Expr::Kind::kTuple, line);
          }
          ASSIGN_OR_RETURN(auto first, ParseExpression());
          if (IsOperator(")")) {
            Next();
            return first;
          }
          auto tuple = Make(Expr::Kind::kTuple, line);
          RETURN_IF_ERROR(Add(tuple.get(), std::move(first)));
          while (IsOperator(",")) {
            Next();
            if (IsOperator(")")) break;
            ASSIGN_OR_RETURN(auto item, ParseExpression());
            RETURN_IF_ERROR(Add(tuple.get(), std::move(item)));
          }
          RETURN_IF_ERROR(ExpectOperator(")"));
          return tuple;
        }
        if (token.text == "[") {
          Next();
          auto list = Make(Expr::Kind::kList, line);
          while (!IsOperator("]")) {
            ASSIGN_OR_RETURN(auto item, ParseExpression());
            RETURN_IF_ERROR(Add(list.get(), std::move(item)));
            if (!IsOperator(",")) break;
            Next();
          }
          RETURN_IF_ERROR(ExpectOperator("]"));
          return list;
        }
        if (token.text == "{") {
          Next();
          auto dict = Make(Expr::Kind::kDict, line);
          while (!IsOperator("}")) {
            ASSIGN_OR_RETURN(auto key, ParseExpression());
            RETURN_IF_ERROR(ExpectOperator(":"));
            ASSIGN_OR_RETURN(auto value, ParseExpression());
            RETURN_IF_ERROR(Add(dict.get(), std::move(key)));
            RETURN_IF_ERROR(Add(dict.get(), std::move(value)));
            if (!IsOperator(",")) break;
            Next();
          }
          RETURN_IF_ERROR(ExpectOperator("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  // `(args)` after a callee, filter or test: positional and `name=value` arguments.
  absl::Status ParseArguments(Expr* call) {
    RETURN_IF_ERROR(ExpectOperator("("));
    while (!IsOperator(")")) {
      if (IsOperator("*") || IsOperator("**")) {
        return SyntaxError(Peek().line, "argument unpacking with '*' is not supported");
      }
      std::string keyword;
      if (Peek().kind == Token::Kind::kName && IsOperator("=", 1)) {
        keyword = Next().text;
        Next();
      }
      ASSIGN_OR_RETURN(auto argument, ParseExpression());
      RETURN_IF_ERROR(Add(call, std::move(argument)));
      call->keywords.push_back(std::move(keyword));
      if (!IsOperator(",")) break;
      Next();
    }
    return ExpectOperator(")");
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParsePostfix(std::unique_ptr<Expr> node) {
    while (true) {
      const int line = Peek().line;
      if (IsOperator(".")) {
        Next();
        auto attribute = Make(Expr::Kind::kAttribute, line);
        if (Peek().kind == Token::Kind::kName) {
          attribute->text = Next().text;
        } else if (Peek().kind == Token::Kind::kInteger) {  // `items.0`
          attribute->kind = Expr::Kind::kIndex;
          RETURN_IF_ERROR(Add(attribute.get(), std::move(node)));
          auto index = Make(Expr::Kind::kLiteral, line);
          index->literal = Value::Integer(Next().integer);
          RETURN_IF_ERROR(Add(attribute.get(), std::move(index)));
          node = std::move(attribute);
          continue;
        } else {
          return Unexpected("an attribute name");
        }
        RETURN_IF_ERROR(Add(attribute.get(), std::move(node)));
        node = std::move(attribute);
      } else if (IsOperator("[")) {
        Next();
        std::unique_ptr<Expr> parts[3];
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          if (!IsOperator(":") && !IsOperator("]")) {
            ASSIGN_OR_RETURN(parts[part], ParseExpression());
          }
          if (!IsOperator(":")) break;
          Next();
          slice = true;
          if (part == 2) return Unexpected("']'");
        }
        RETURN_IF_ERROR(ExpectOperator("]"));
        if (!slice && parts[0] == nullptr) return SyntaxError(line, "an empty subscript '[]'");
        auto index = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kIndex, line);
        RETURN_IF_ERROR(Add(index.get(), std::move(node)));
        RETURN_IF_ERROR(Add(index.get(), std::move(parts[0])));
        if (slice) {
          RETURN_IF_ERROR(Add(index.get(), std::move(parts[1])));
          RETURN_IF_ERROR(Add(index.get(), std::move(parts[2])));
        }
        node = std::move(index);
      } else if (IsOperator("(")) {
        if (node->kind == Expr::Kind::kAttribute && !Contains(kMethods, node->text)) {
          return SyntaxError(line, Cat("the method '", node->text, "' is not supported"));
        }
        auto call = Make(Expr::Kind::kCall, line);
        RETURN_IF_ERROR(Add(call.get(), std::move(node)));
        RETURN_IF_ERROR(ParseArguments(call.get()));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseFilters(std::unique_ptr<Expr> node) {
    while (true) {
      const int line = Peek().line;
      if (IsOperator("|")) {
        Next();
        std::string name;
        RETURN_IF_ERROR(ExpectName(&name));
        if (!Contains(kFilters, name)) {
          return SyntaxError(line, Cat("the filter '", name, "' is not supported"));
        }
        auto filter = Make(Expr::Kind::kFilter, line);
        filter->text = std::move(name);
        RETURN_IF_ERROR(Add(filter.get(), std::move(node)));
        if (IsOperator("(")) RETURN_IF_ERROR(ParseArguments(filter.get()));
        node = std::move(filter);
      } else if (IsName("is")) {
        Next();
        auto test = Make(Expr::Kind::kTest, line);
        if (IsName("not")) {
          Next();
          test->negate = true;
        }
        if (Peek().kind == Token::Kind::kName) {
          test->text = Next().text;
        } else if (IsOperator("==") || IsOperator("!=")) {
          test->text = Next().text;
        } else {
          return Unexpected("a test name");
        }
        if (!Contains(kTests, test->text)) {
          return SyntaxError(line, Cat("the test '", test->text, "' is not supported"));
        }
        RETURN_IF_ERROR(Add(test.get(), std::move(node)));
        if (IsOperator("(")) {
          RETURN_IF_ERROR(ParseArguments(test.get()));
        } else if ((Peek().kind == Token::Kind::kName &&
                    !(IsName("and") || IsName("or") || IsName("else") || IsName("if") ||
                      IsName("in") || IsName("not") || IsName("is"))) ||
                   Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInteger ||
                   Peek().kind == Token::Kind::kFloat || IsOperator("[") || IsOperator("{")) {
          ASSIGN_OR_RETURN(auto argument, ParsePrimary());
          ASSIGN_OR_RETURN(argument, ParsePostfix(std::move(argument)));
          RETURN_IF_ERROR(Add(test.get(), std::move(argument)));
          test->keywords.emplace_back();
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t index_ = 0;
  int max_depth_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The evaluator.

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

  absl::StatusOr<std::string> Run(const std::vector<Node>& body, Value context) {
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

  // Converts the context, bounded by max_depth and charged to the work budget.
  template <typename Json>
  absl::StatusOr<Value> FromJson(const Json& json, int depth) {
    if (depth > options_.max_depth) {
      return absl::ResourceExhaustedError(Cat(
          "chat template: the context nests deeper than ", options_.max_depth, " levels"));
    }
    RETURN_IF_ERROR(Charge(1, 0));
    switch (json.type()) {
      case nlohmann::json::value_t::null: return Value::None();
      case nlohmann::json::value_t::boolean: return Value::Boolean(json.template get<bool>());
      case nlohmann::json::value_t::number_integer: return Value::Integer(json.template get<int64_t>());
      case nlohmann::json::value_t::number_unsigned: {
        const uint64_t u = json.template get<uint64_t>();
        if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
        return Value::Integer(static_cast<int64_t>(u));
      }
      case nlohmann::json::value_t::number_float: return Value::Float(json.template get<double>());
      case nlohmann::json::value_t::string: {
        const auto& s = json.template get_ref<const std::string&>();
        RETURN_IF_ERROR(Charge(0, s.size()));
        return Value::String(s);
      }
      case nlohmann::json::value_t::array: {
        ValueList items;
        items.reserve(json.size());
        for (const auto& item : json) {
          ASSIGN_OR_RETURN(Value v, FromJson(item, depth + 1));
          items.push_back(std::move(v));
        }
        return MakeList(std::move(items), 0);
      }
      case nlohmann::json::value_t::object: {
        auto object = std::make_shared<Object>();
        for (auto it = json.begin(); it != json.end(); ++it) {
          ASSIGN_OR_RETURN(Value v, FromJson(it.value(), depth + 1));
          object->entries.emplace_back(it.key(), std::move(v));
        }
        return MakeObject(std::move(object), 0);
      }
      default:
        return absl::InvalidArgumentError("chat template: the context holds binary data");
    }
  }

 private:
  // ---- limits ----
  absl::Status LimitError(int line, std::string_view what) const {
    return absl::ResourceExhaustedError(Cat("chat template line ", line, ": ", what));
  }
  absl::Status Charge(int64_t units, size_t bytes) {
    work_ += units + static_cast<int64_t>(bytes / 32);
    if (work_ > options_.max_work) {
      return absl::ResourceExhaustedError(Cat(
          "chat template: rendering needs more than ", options_.max_work, " units of work"));
    }
    return absl::OkStatus();
  }
  absl::Status CheckString(size_t size, int line) {
    if (size > options_.max_output_size) {
      return LimitError(line, Cat("a string would exceed ", options_.max_output_size, " bytes"));
    }
    return Charge(0, size);
  }
  absl::StatusOr<Value> MakeString(std::string s, int line) {
    RETURN_IF_ERROR(CheckString(s.size(), line));
    return Value::String(std::move(s));
  }
  absl::StatusOr<Value> MakeList(ValueList items, int line) {
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
  absl::StatusOr<Value> MakeObject(std::shared_ptr<Object> object, int line) {
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
  absl::Status Append(std::string* out, std::string_view text, int line) {
    if (out->size() + text.size() > options_.max_output_size) {
      return LimitError(line, Cat("the rendered text would exceed ", options_.max_output_size, " bytes"));
    }
    RETURN_IF_ERROR(Charge(1, text.size()));
    out->append(text);
    return absl::OkStatus();
  }

  // Counts recursion; every recursive entry point holds one.
  class DepthGuard {
   public:
    explicit DepthGuard(Renderer* renderer) : renderer_(renderer) { ++renderer_->depth_; }
    ~DepthGuard() { --renderer_->depth_; }
    bool exceeded() const { return renderer_->depth_ > renderer_->options_.max_depth; }

   private:
    Renderer* renderer_;
  };
  absl::Status TooDeep(int line) const {
    return LimitError(line, Cat("rendering nests deeper than ", options_.max_depth, " levels"));
  }

  void RegisterScope(Scope* scope) {
    scope->id = ++next_scope_id_;
    live_scopes_[scope->id] = scope;
  }
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

  static absl::Status Error(int line, std::string_view message) {
    return absl::InvalidArgumentError(Cat("chat template line ", line, ": ", message));
  }

  // ---- printing and JSON ----

  // The text `{{ value }}` writes, as the reference prints it (none and undefined as nothing,
  // lists and mappings as JSON).
  absl::Status Print(const Value& v, std::string* out, int line, int depth) {
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
  absl::StatusOr<std::string> PrintToString(const Value& v, int line) {
    std::string out;
    RETURN_IF_ERROR(Print(v, &out, line, 0));
    RETURN_IF_ERROR(CheckString(out.size(), line));
    return out;
  }

  struct JsonOptions {
    int indent = 0;  // 0: one line
    bool sort_keys = false;
    bool ensure_ascii = false;
    bool undefined_as_null = true;
  };

  void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
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

  absl::Status ToJson(const Value& v, const JsonOptions& options, int level, std::string* out,
                      int line, int depth) {
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

  absl::StatusOr<bool> Equal(const Value& a, const Value& b, int line, int depth) {
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

  // -1, 0 or 1 for `<` and friends: numbers with numbers, strings with strings.
  absl::StatusOr<int> Compare(const Value& a, const Value& b, int line) {
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

  absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
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

  // ---- statements ----

  absl::StatusOr<Flow> ExecBlock(const std::vector<Node>& body, Scope* scope, std::string* out) {
    for (const Node& node : body) {
      ASSIGN_OR_RETURN(Flow flow, Exec(node, scope, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> Exec(const Node& node, Scope* scope, std::string* out) {
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

  absl::Status Assign(const Node& node, Value v, Scope* scope) {
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

  absl::StatusOr<bool> HoldsNamespace(const Value& v, int line, int depth) {
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

  // The items a for loop (or unpacking) walks: a list's items, a mapping's keys, a string's
  // characters; an undefined value walks nothing.
  absl::StatusOr<ValueList> Iterate(const Value& v, int line) {
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

  absl::Status CountIteration(int line) {
    if (++iterations_ > options_.max_loop_iterations) {
      return LimitError(line, Cat("more than ", options_.max_loop_iterations, " loop iterations"));
    }
    return absl::OkStatus();
  }

  absl::Status BindLoopTargets(const Node& node, const Value& item, Scope* scope) {
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

  absl::StatusOr<Flow> ExecFor(const Node& node, Scope* scope, std::string* out) {
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

  absl::Status EvalArguments(const Expr& call, size_t first, Scope* scope,
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

  // Runs a macro (or a call block's body, for `caller`): parameters bound in a new scope above
  // `call_scope`, the body rendered to a string.
  absl::StatusOr<Value> CallMacro(const Node& macro, const std::vector<Value>& positional,
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

  absl::StatusOr<Value> CallFunction(const Function& function, const Expr& call, Scope* scope) {
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

  absl::StatusOr<Value> CallBuiltin(const std::string& name, const std::vector<Value>& positional,
                                    const std::vector<std::pair<std::string, Value>>& keywords,
                                    int line) {
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

  // Python's strftime for the common directives, in UTC.
  static std::string Strftime(std::string_view format, absl::Time now) {
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

  // ---- expressions ----

  absl::StatusOr<Value> Eval(const Expr& expr, Scope* scope) {
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

  // `object.name`: a mapping's entry (a missing one, or any attribute of anything else, is
  // undefined). Methods are handled where they are called.
  static Value Attribute(const Value& object, const std::string& name) {
    if (object.has_entries()) {
      const Value* v = object.object->Find(name);
      if (v != nullptr) return *v;
    }
    return Value();
  }

  absl::StatusOr<Value> Index(const Value& object, const Value& index, int line) {
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

  absl::StatusOr<Value> EvalSlice(const Expr& expr, Scope* scope) {
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

  absl::StatusOr<Value> EvalCall(const Expr& expr, Scope* scope) {
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

  // Binds positional and keyword arguments of a builtin to parameter names.
  struct Arguments {
    std::vector<std::optional<Value>> values;
    const std::optional<Value>& operator[](size_t i) const { return values[i]; }
  };
  absl::StatusOr<Arguments> Bind(std::string_view what, std::initializer_list<std::string_view> names,
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

  absl::StatusOr<std::string> StringArgument(const std::optional<Value>& v, std::string_view what,
                                             int line) {
    if (!v.has_value() || !v->is_string()) return Error(line, Cat(what, " needs a string"));
    return v->str();
  }

  // Python's str.strip family: `chars` none means whitespace.
  static std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
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

  absl::StatusOr<std::string> Replace(const std::string& s, const std::string& old_text,
                                      const std::string& new_text, int64_t count, int line) {
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

  absl::StatusOr<Value> Split(const std::string& s, const std::optional<Value>& separator,
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

  absl::StatusOr<Value> ItemsOf(const Value& object, int line) {
    ValueList items;
    for (const auto& [key, value] : object.object->entries) {
      ASSIGN_OR_RETURN(Value pair, MakeList({Value::String(key), value}, line));
      items.push_back(std::move(pair));
    }
    return MakeList(std::move(items), line);
  }

  absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name,
                                   const std::vector<Value>& positional,
                                   const std::vector<std::pair<std::string, Value>>& keywords,
                                   int line) {
    const std::string what = Cat(name, "()");
    if (object.is_object()) {
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
    const std::string& s = object.str();
    RETURN_IF_ERROR(Charge(1, s.size()));
    if (name == "startswith" || name == "endswith") {
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

  static std::string ChangeCase(const std::string& how, const std::string& s) {
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

  absl::StatusOr<Value> JoinValues(const ValueList& items, const std::string& separator, int line) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += separator;
      RETURN_IF_ERROR(Print(items[i], &out, line, 0));
      RETURN_IF_ERROR(CheckString(out.size(), line));
    }
    return MakeString(std::move(out), line);
  }

  // ---- tests ----

  absl::StatusOr<bool> Test(const std::string& name, const Value& v, const std::vector<Value>& arguments,
                            int line) {
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

  absl::StatusOr<Value> EvalFilter(const Expr& expr, Scope* scope) {
    ASSIGN_OR_RETURN(Value operand, Eval(*expr.children[0], scope));
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keywords;
    RETURN_IF_ERROR(EvalArguments(expr, 1, scope, &positional, &keywords));
    return ApplyFilter(expr.text, operand, positional, keywords, expr.line);
  }

  // The value at a dotted attribute path ("function.name", "items.0").
  absl::StatusOr<Value> AttributePath(const Value& item, const std::string& path, int line) {
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

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v,
                                    const std::vector<Value>& positional,
                                    const std::vector<std::pair<std::string, Value>>& keywords,
                                    int line) {
    const std::string what = Cat("the filter '", name, "'");
    auto needs = [&](std::string_view kind) {
      return Error(line, Cat(what, " needs ", kind, ", not ", KindName(v.kind)));
    };
    if (name == "safe") return v;
    if (name == "tojson") {
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
    if (name == "join") {
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
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
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
        if (!::cloister::llm::Contains(kTests, test)) {
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
    if (name == "map") {
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
      if (!::cloister::llm::Contains(kFilters, filter) || filter == "map") {
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
    if (name == "indent") {
      ASSIGN_OR_RETURN(Arguments a, Bind(what, {"width", "first", "blank"}, positional, keywords, line));
      if (!v.is_string()) return needs("a string");
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
    if (name == "replace") {
      if (!v.is_string()) return needs("a string");
      return CallMethod(v, "replace", positional, keywords, line);
    }
    if (name == "int" || name == "float") {
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
    if (!positional.empty() || !keywords.empty()) {
      return Error(line, Cat(what, " takes no arguments"));
    }
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

  // ---- operators ----

  absl::StatusOr<Value> EvalBinary(const Expr& expr, Scope* scope) {
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
    auto mismatch = [&]() {
      return Error(line, Cat("cannot apply '", op, "' to ", KindName(left.kind), " and ",
                                      KindName(right.kind)));
    };
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
        const int64_t n = std::max<int64_t>(0, times->integer);
        if (sequence->is_string()) {
          const size_t size = sequence->str().size();
          if (size > 0 && static_cast<uint64_t>(n) > options_.max_output_size / size) {
            return CheckString(options_.max_output_size + 1, line);
          }
          std::string out;
          out.reserve(size * n);
          for (int64_t i = 0; i < n; ++i) out += sequence->str();
          return MakeString(std::move(out), line);
        }
        const size_t size = sequence->list->size();
        if (size > 0 && static_cast<uint64_t>(n) > options_.max_list_count / size) {
          return LimitError(line, Cat("a list would exceed ", options_.max_list_count, " items"));
        }
        ValueList items;
        for (int64_t i = 0; i < n; ++i) items.insert(items.end(), sequence->list->begin(), sequence->list->end());
        return MakeList(std::move(items), line);
      }
    }
    const bool left_numeric = left.is_number() || left.kind == Value::Kind::kBoolean;
    const bool right_numeric = right.is_number() || right.kind == Value::Kind::kBoolean;
    if (!left_numeric || !right_numeric) return mismatch();
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
    if (op == "**") {
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
    return mismatch();
  }

  const ChatTemplateOptions& options_;
  int64_t work_ = 0;
  int64_t iterations_ = 0;
  int depth_ = 0;
  uint64_t next_scope_id_ = 0;
  std::unordered_map<uint64_t, Scope*> live_scopes_;
};

template <typename Json>
absl::StatusOr<std::string> RenderJson(const ChatTemplate::Program& program,
                                       const ChatTemplateOptions& options, const Json& context) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("chat template: the context must be a JSON object");
  }
  Renderer renderer(options);
  ASSIGN_OR_RETURN(Value converted, renderer.FromJson(context, 0));
  return renderer.Run(program.body, std::move(converted));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source) {
  return Parse(source, ChatTemplateOptions());
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source,
                                                                  const ChatTemplateOptions& options) {
  if (source.size() > options.max_source_size) {
    return absl::InvalidArgumentError(Cat("chat template: the source is ", source.size(),
                                                   " bytes, more than the ", options.max_source_size,
                                                   "-byte limit"));
  }
  Lexer lexer(source);
  ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens), options.max_depth);
  auto program = std::make_unique<Program>();
  ASSIGN_OR_RETURN(program->body, parser.Run());
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(program), options));
}

ChatTemplate::ChatTemplate(std::unique_ptr<Program> program, const ChatTemplateOptions& options)
    : program_(std::move(program)), options_(options) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context) const {
  return RenderJson(*program_, options_, context);
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  return RenderJson(*program_, options_, context);
}

absl::StatusOr<std::string> SelectChatTemplate(const nlohmann::json& tokenizer_config,
                                               std::string_view name) {
  if (!tokenizer_config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
  }
  const std::string wanted = name.empty() ? "default" : std::string(name);
  auto it = tokenizer_config.find("chat_template");
  if (it == tokenizer_config.end() || it->is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  if (it->is_string()) {
    if (wanted != "default") {
      return absl::NotFoundError(Cat("tokenizer_config.json has no chat template named '",
                                              wanted, "'"));
    }
    return it->get<std::string>();
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
  }
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: each chat_template entry needs a string name and template");
    }
    if (entry["name"].get<std::string>() == wanted) return entry["template"].get<std::string>();
  }
  return absl::NotFoundError(Cat("tokenizer_config.json has no chat template named '",
                                          wanted, "'"));
}

}  // namespace cloister::llm
