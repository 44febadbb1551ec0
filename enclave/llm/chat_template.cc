// The chat-template engine: preprocessing (trim_blocks, lstrip_blocks), a lexer, a recursive
// descent parser to an AST and a tree-walking evaluator. Every recursive function counts its
// depth against ChatTemplateOptions::max_depth, every value records how deeply it nests, and
// every string, list, loop and evaluation step is charged to a budget, so a tenant's template
// cannot exhaust the stack, the heap or the CPU.
//
// The pieces: chat_template_values.cc (UTF-8 and value helpers), chat_template_lexer.cc,
// chat_template_parser.cc and chat_template_expr_parser.cc (to the AST), and the evaluator in
// chat_template_renderer.cc, _statements.cc, _expressions.cc, _methods.cc and _filters.cc.
#include "enclave/llm/chat_template.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "enclave/llm/chat_template_internal.h"
#include "enclave/llm/chat_template_parser.h"
#include "enclave/llm/chat_template_renderer.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm {
namespace chat_template_internal {

// Defined here, where its only callers instantiate it (nlohmann::json and ordered_json).
template <typename Json>
absl::StatusOr<Value> Renderer::FromJson(const Json& json, int depth) {
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

}  // namespace chat_template_internal

using chat_template_internal::Lexer;
using chat_template_internal::Node;
using chat_template_internal::Parser;
using chat_template_internal::Renderer;
using chat_template_internal::Token;
using chat_template_internal::Value;

struct ChatTemplate::Program {
  std::vector<Node> body;
};

namespace {

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
