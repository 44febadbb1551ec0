// The chat-template lexer: the reference's preprocessing (trim_blocks, lstrip_blocks), then
// text, `{{ }}` and `{% %}` with the names, strings, numbers and operators inside them.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_parser.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

absl::Status SyntaxError(int line, std::string_view message) {
  return absl::InvalidArgumentError(Cat("chat template line ", line, ": ", message));
}

namespace {

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

}  // namespace

Lexer::Lexer(std::string_view source) { Preprocess(source, &text_, &lines_); }

absl::StatusOr<std::vector<Token>> Lexer::Run() {
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

int Lexer::LineAt(size_t position) const {
  if (lines_.empty()) return 1;
  return lines_[std::min(position, lines_.size() - 1)];
}

void Lexer::StripPreviousText() {
  if (!tokens_.empty() && tokens_.back().kind == Token::Kind::kText) {
    std::string& previous = tokens_.back().text;
    previous.resize(WithoutTrailingSpaceSize(previous));
    if (previous.empty()) tokens_.pop_back();
  }
}

void Lexer::SkipFollowingSpace() {
  position_ += LeadingSpaceSize(std::string_view(text_).substr(position_));
}

absl::Status Lexer::LexText() {
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

absl::Status Lexer::LexInside() {
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

int Lexer::HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool Lexer::ReadHex(int count, uint32_t* value) {
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

absl::Status Lexer::LexString(char quote, int line) {
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

absl::Status Lexer::LexNumber(int line) {
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

}  // namespace cloister::llm::chat_template_internal
