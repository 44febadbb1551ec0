// libFuzzer target: tokenizer.json from a tenant. Load must fail cleanly or succeed; a loaded
// tokenizer must encode, decode and stream-decode without crashing, hanging or huge allocations.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "enclave/llm/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto tokenizer = cloister::llm::Tokenizer::Load(input, "");
  if (!tokenizer.ok()) return 0;
  const cloister::llm::Tokenizer& loaded = **tokenizer;
  const std::string texts[] = {
      "", "Hello, world! It's 2024 <s> </s> <|endoftext|>  \t\n x",
      "caf\xC3\xA9 cafe\xCC\x81 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 1234567",
      std::string(input.substr(0, 512))};
  for (const std::string& text : texts) {
    for (bool special : {false, true}) {
      auto ids = loaded.Encode(text, special);
      if (!ids.ok()) continue;
      (void)loaded.Decode(*ids, false);
      cloister::llm::StreamDecoder stream(loaded, true);
      for (int32_t id : *ids) (void)stream.Push(id);
      (void)stream.Finish();
    }
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < loaded.vocab_size() && id < 300; ++id) {
    if (loaded.IdToToken(id).has_value()) all.push_back(id);
  }
  (void)loaded.Decode(all, true);
  cloister::llm::StreamDecoder stream(loaded, false);
  for (auto it = all.rbegin(); it != all.rend(); ++it) (void)stream.Push(*it);
  (void)stream.Finish();
  return 0;
}
