// The chat-template parser, part two: expressions by precedence (ternary, or, and, not,
// comparisons, ~, + -, * / // %, **, unary), primaries, postfix subscripts and calls, filters
// and tests.
#include <memory>
#include <string>
#include <utility>

#include "base/status.h"
#include "enclave/llm/chat_template_parser.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm::chat_template_internal {

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseTuple(bool conditional) {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseExpression() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseOr() {
  ASSIGN_OR_RETURN(auto left, ParseAnd());
  while (IsName("or")) {
    const int line = Next().line;
    ASSIGN_OR_RETURN(auto right, ParseAnd());
    ASSIGN_OR_RETURN(left, Binary("or", std::move(left), std::move(right), line));
  }
  return left;
}

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseAnd() {
  ASSIGN_OR_RETURN(auto left, ParseNot());
  while (IsName("and")) {
    const int line = Next().line;
    ASSIGN_OR_RETURN(auto right, ParseNot());
    ASSIGN_OR_RETURN(left, Binary("and", std::move(left), std::move(right), line));
  }
  return left;
}

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseNot() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseCompare() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseConcat() {
  ASSIGN_OR_RETURN(auto left, ParseSum());
  while (IsOperator("~")) {
    const int line = Next().line;
    ASSIGN_OR_RETURN(auto right, ParseSum());
    ASSIGN_OR_RETURN(left, Binary("~", std::move(left), std::move(right), line));
  }
  return left;
}

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseSum() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseProduct() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParsePower() {
  ASSIGN_OR_RETURN(auto left, ParseUnary());
  while (IsOperator("**")) {
    const int line = Next().line;
    ASSIGN_OR_RETURN(auto right, ParseUnary());
    ASSIGN_OR_RETURN(left, Binary("**", std::move(left), std::move(right), line));
  }
  return left;
}

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseUnary() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseUnaryWithoutFilters() {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParsePrimary() {
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
      if (token.text == "(") return ParseParenthesized(line);
      if (token.text == "[") return ParseList(line);
      if (token.text == "{") return ParseDict(line);
      break;
    default:
      break;
  }
  return Unexpected("an expression");
}

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseParenthesized(int line) {
  RETURN_IF_ERROR(ExpectOperator("("));
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseList(int line) {
  RETURN_IF_ERROR(ExpectOperator("["));
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseDict(int line) {
  RETURN_IF_ERROR(ExpectOperator("{"));
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

absl::Status Parser::ParseArguments(Expr* call) {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParsePostfix(std::unique_ptr<Expr> node) {
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

absl::StatusOr<std::unique_ptr<Expr>> Parser::ParseFilters(std::unique_ptr<Expr> node) {
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

}  // namespace cloister::llm::chat_template_internal
