// The chat-template front end: the lexer (after the reference's preprocessing: one trailing
// newline dropped, lstrip_blocks and trim_blocks) and the recursive descent parser to the AST
// of chat_template_internal.h. Parse errors are InvalidArgument naming the line.
// Thread-safe: a Lexer or Parser is one parse's state; use each from one thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "enclave/llm/chat_template_internal.h"

namespace cloister::llm::chat_template_internal {

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

absl::Status SyntaxError(int line, std::string_view message);

class Lexer {
 public:
  explicit Lexer(std::string_view source);
  absl::StatusOr<std::vector<Token>> Run();

 private:
  int LineAt(size_t position) const;
  bool At(std::string_view s) const { return std::string_view(text_).substr(position_, s.size()) == s; }
  void StripPreviousText();
  void SkipFollowingSpace();
  absl::Status LexText();
  absl::Status LexInside();
  static bool IsSpaceByte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
  static int HexDigit(char c);

  // Reads `count` hex digits at position_, or returns false.
  bool ReadHex(int count, uint32_t* value);
  absl::Status LexString(char quote, int line);
  absl::Status LexNumber(int line);

  std::string text_;
  std::vector<int> lines_;
  size_t position_ = 0;
  bool inside_ = false;
  bool inside_expression_ = false;
  int brace_depth_ = 0;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth) : tokens_(std::move(tokens)), max_depth_(max_depth) {}
  absl::StatusOr<std::vector<Node>> Run();

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
  static std::string Describe(const Token& token);
  absl::Status Unexpected(std::string_view wanted) const;
  absl::Status ExpectOperator(std::string_view op);
  absl::Status ExpectName(std::string* name);
  absl::Status ExpectCloseStatement();

  // Counts nesting while parsing; a RAII guard so every return path undoes it.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* parser) : parser_(parser) { ++parser_->depth_; }
    ~DepthGuard() { --parser_->depth_; }
    bool exceeded() const { return parser_->depth_ > parser_->max_depth_; }

   private:
    Parser* parser_;
  };

  absl::Status TooDeep() const;
  std::unique_ptr<Expr> Make(Expr::Kind kind, int line);
  absl::Status Add(Expr* parent, std::unique_ptr<Expr> child);
  absl::StatusOr<std::unique_ptr<Expr>> Binary(std::string op, std::unique_ptr<Expr> left,
                                               std::unique_ptr<Expr> right, int line);

  // Parses nodes until a statement whose keyword is in `ends` (consumed up to its name, which
  // goes to *end); at the top level (`ends` empty) until the end of the template.
  absl::Status ParseBlock(std::vector<Node>* body, std::initializer_list<std::string_view> ends,
                          std::string* end, int opening_line = 0);
  absl::Status ParseStatement(std::vector<Node>* body);
  absl::Status ParseIf(std::vector<Node>* body, int line);

  // Names for `for` and `set`: `a`, `a, b` or `(a, b)`.
  absl::Status ParseTargets(Node* node);
  absl::Status ParseFor(std::vector<Node>* body, int line);
  absl::Status ParseSet(std::vector<Node>* body, int line);

  // `(a, b=1, ...)` for macros and call blocks.
  absl::Status ParseParameters(Node* node);
  absl::Status ParseMacro(std::vector<Node>* body, int line);
  absl::Status ParseCallBlock(std::vector<Node>* body, int line);

  // An expression, or several separated by commas (a tuple), as after `in` and `=`.
  absl::StatusOr<std::unique_ptr<Expr>> ParseTuple(bool conditional);
  absl::StatusOr<std::unique_ptr<Expr>> ParseExpression();
  absl::StatusOr<std::unique_ptr<Expr>> ParseOr();
  absl::StatusOr<std::unique_ptr<Expr>> ParseAnd();
  absl::StatusOr<std::unique_ptr<Expr>> ParseNot();
  absl::StatusOr<std::unique_ptr<Expr>> ParseCompare();
  absl::StatusOr<std::unique_ptr<Expr>> ParseConcat();
  absl::StatusOr<std::unique_ptr<Expr>> ParseSum();
  absl::StatusOr<std::unique_ptr<Expr>> ParseProduct();
  absl::StatusOr<std::unique_ptr<Expr>> ParsePower();
  absl::StatusOr<std::unique_ptr<Expr>> ParseUnary();
  absl::StatusOr<std::unique_ptr<Expr>> ParseUnaryWithoutFilters();
  absl::StatusOr<std::unique_ptr<Expr>> ParsePrimary();
  // `(...)`: a parenthesized expression or a tuple; `[...]` a list; `{k: v, ...}` a mapping.
  // Each starts at its opening bracket; ParsePrimary's depth guard covers them.
  absl::StatusOr<std::unique_ptr<Expr>> ParseParenthesized(int line);
  absl::StatusOr<std::unique_ptr<Expr>> ParseList(int line);
  absl::StatusOr<std::unique_ptr<Expr>> ParseDict(int line);

  // `(args)` after a callee, filter or test: positional and `name=value` arguments.
  absl::Status ParseArguments(Expr* call);
  absl::StatusOr<std::unique_ptr<Expr>> ParsePostfix(std::unique_ptr<Expr> node);
  absl::StatusOr<std::unique_ptr<Expr>> ParseFilters(std::unique_ptr<Expr> node);

  std::vector<Token> tokens_;
  size_t index_ = 0;
  int max_depth_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace cloister::llm::chat_template_internal
