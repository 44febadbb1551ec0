// The chat-template parser, part one: token helpers and the statements (if, for, set, macro,
// call blocks, break and continue). Every nesting level is counted against max_depth.
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_parser.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

absl::StatusOr<std::vector<Node>> Parser::Run() {
  std::vector<Node> body;
  std::string end;
  RETURN_IF_ERROR(ParseBlock(&body, {}, &end));
  return body;
}

std::string Parser::Describe(const Token& token) {
  switch (token.kind) {
    case Token::Kind::kEnd: return "the end of the template";
    case Token::Kind::kText: return "text";
    case Token::Kind::kString: return "a string";
    case Token::Kind::kInteger:
    case Token::Kind::kFloat: return Cat("the number ", token.text);
    default: return Cat("'", token.text, "'");
  }
}

absl::Status Parser::Unexpected(std::string_view wanted) const {
  return SyntaxError(Peek().line, Cat("expected ", wanted, " but found ", Describe(Peek())));
}

absl::Status Parser::ExpectOperator(std::string_view op) {
  if (!IsOperator(op)) return Unexpected(Cat("'", op, "'"));
  Next();
  return absl::OkStatus();
}

absl::Status Parser::ExpectName(std::string* name) {
  if (Peek().kind != Token::Kind::kName) return Unexpected("a name");
  *name = Next().text;
  return absl::OkStatus();
}

absl::Status Parser::ExpectCloseStatement() {
  if (Peek().kind != Token::Kind::kCloseStatement) return Unexpected("'%}'");
  Next();
  return absl::OkStatus();
}

absl::Status Parser::TooDeep() const {
  return SyntaxError(Peek().line, Cat("the template nests deeper than ", max_depth_, " levels"));
}

std::unique_ptr<Expr> Parser::Make(Expr::Kind kind, int line) {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->line = line;
  return expr;
}

absl::Status Parser::Add(Expr* parent, std::unique_ptr<Expr> child) {
  if (child != nullptr) {
    parent->depth = std::max(parent->depth, child->depth + 1);
    if (parent->depth > max_depth_) {
      return SyntaxError(parent->line, Cat("an expression nests deeper than ", max_depth_, " levels"));
    }
  }
  parent->children.push_back(std::move(child));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Expr>> Parser::Binary(std::string op, std::unique_ptr<Expr> left,
                                                     std::unique_ptr<Expr> right, int line) {
  auto expr = Make(Expr::Kind::kBinary, line);
  expr->text = std::move(op);
  RETURN_IF_ERROR(Add(expr.get(), std::move(left)));
  RETURN_IF_ERROR(Add(expr.get(), std::move(right)));
  return expr;
}

absl::Status Parser::ParseBlock(std::vector<Node>* body,
                                std::initializer_list<std::string_view> ends, std::string* end,
                                int opening_line) {
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

absl::Status Parser::ParseStatement(std::vector<Node>* body) {
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

absl::Status Parser::ParseIf(std::vector<Node>* body, int line) {
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

absl::Status Parser::ParseTargets(Node* node) {
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

absl::Status Parser::ParseFor(std::vector<Node>* body, int line) {
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

absl::Status Parser::ParseSet(std::vector<Node>* body, int line) {
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

absl::Status Parser::ParseParameters(Node* node) {
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

absl::Status Parser::ParseMacro(std::vector<Node>* body, int line) {
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

absl::Status Parser::ParseCallBlock(std::vector<Node>* body, int line) {
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

}  // namespace cloister::llm::chat_template_internal
