// libFuzzer target: a chat template from a tenant. Parse must fail cleanly or succeed; a parsed
// template must render a few conversations (with tools, null content, non-ASCII text and an
// empty list) without crashing, hanging or allocating without bound. The limits are small so
// that each input stays fast; the engine enforces the same kinds of limits at any size.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/clock.h"
#include "enclave/llm/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const cloister::FakeClock clock;
  static const nlohmann::ordered_json* const contexts = [] {
    auto* list = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"([
      {"messages": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi \u00e9 \ud83d\ude00"},
                    {"role": "assistant", "content": null, "tool_calls": [
                      {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null]}}}]},
                    {"role": "tool", "content": "{\"ok\": 1}"},
                    {"role": "user", "content": ""}],
       "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
       "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"},
      {"messages": [], "add_generation_prompt": false},
      {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    ])"));
    return list;
  }();
  cloister::llm::ChatTemplateOptions options;
  options.clock = &clock;
  options.max_output_size = 1 << 16;
  options.max_list_count = 1 << 12;
  options.max_loop_iterations = 10'000;
  options.max_work = 200'000;
  options.max_depth = 64;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto parsed = cloister::llm::ChatTemplate::Parse(source, options);
  if (!parsed.ok()) return 0;
  for (const auto& context : *contexts) (void)(*parsed)->Render(context);
  return 0;
}
