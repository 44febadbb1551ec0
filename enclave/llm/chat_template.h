// ChatTemplate: renders a Hugging Face chat template (the Jinja2 text in tokenizer_config.json's
// `chat_template`) into the prompt text a model expects. It is a small Jinja subset of our own:
// a lexer, a parser to an AST and an evaluator over values converted from nlohmann::json. The
// subset covers the templates of the Llama 2/3/3.1/3.2, Mistral/Mixtral, Qwen2/2.5, SmolLM and
// Zephyr/TinyLlama families; anything outside it fails Parse with the construct and its line.
//
// The template comes from a tenant, so rendering is bounded: output and string size, loop
// iterations, total work and nesting depth (ChatTemplateOptions). No input crashes or hangs.
//
// Semantics follow @huggingface/jinja (what transformers.js uses), including its whitespace
// handling (trim_blocks and lstrip_blocks on, one trailing newline of the template dropped),
// except where that library shows a JavaScript artefact; there the Python Jinja2 behaviour is
// taken: string lengths, indexes and slices count code points, not UTF-16 units; `==` is not
// JavaScript's loose equality (no "1" == 1) and compares lists and dicts by value; `+` needs two
// strings, two numbers or two lists; a loop over an undefined value or a string works; output
// written before a `{% break %}` is kept; upper/lower/title/capitalize change ASCII letters only;
// tojson(sort_keys=true) sorts by code point.
//
// Threading: Parse is thread-safe; a parsed ChatTemplate is immutable, so Render may be called
// from several threads at once. The clock in the options must outlive the template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {

struct ChatTemplateOptions {
  // Source of strftime_now(); nullptr means Clock::Real(). Dates are formatted in UTC.
  const Clock* clock = nullptr;
  // Largest template source accepted by Parse.
  size_t max_source_size = size_t{1} << 20;
  // Largest rendered text, and largest string any expression may build.
  size_t max_output_size = size_t{8} << 20;
  // Largest list an expression may build (range(), list concatenation).
  size_t max_list_count = size_t{1} << 20;
  // Loop iterations over the whole render.
  int64_t max_loop_iterations = 1'000'000;
  // Evaluation work over the whole render: one unit per node evaluated, per list element copied
  // and per 32 bytes of string built.
  int64_t max_work = 50'000'000;
  // Nesting of statements, expressions and macro calls while rendering, and of the context.
  int max_depth = 200;
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument names the line and what is wrong or unsupported, e.g.
  // "chat template line 3: the filter 'wordwrap' is not supported".
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source);
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source,
                                                              const ChatTemplateOptions& options);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // Renders with `context` as the template's variables, e.g. {"messages": [...],
  // "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": [...]}.
  // A raise_exception(msg) in the template gives InvalidArgument ending in msg; an evaluation
  // error InvalidArgument with the line; a limit ResourceExhausted. nlohmann::json keeps object
  // keys sorted, so tojson of a tool schema prints them sorted; pass an ordered_json to keep the
  // order the client sent (as Python and transformers.js do).
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  struct Program;  // The parsed template (defined in chat_template.cc).

 private:
  ChatTemplate(std::unique_ptr<Program> program, const ChatTemplateOptions& options);

  std::unique_ptr<Program> program_;
  ChatTemplateOptions options_;
};

// Picks the template from a parsed tokenizer_config.json: `chat_template` when it is a string
// (only for `name` "" or "default"), or from a list of {"name", "template"} the entry named
// `name` ("" means "default"). NotFound when there is none; InvalidArgument when the field has
// the wrong shape.
absl::StatusOr<std::string> SelectChatTemplate(const nlohmann::json& tokenizer_config,
                                               std::string_view name);

}  // namespace cloister::llm
