// The `cloister` command line (cli.h): generate, text from an LLM streamed through the session.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "base/status.h"
#include "sdk/cli_internal.h"
#include "sdk/client.h"

namespace cloister::sdk::cli_internal {

namespace api = ::cloister::api::v1;

namespace {

constexpr size_t kMaxChatFileSize = size_t{16} << 20;

// The messages of a --chat file: a JSON list of {"role": ..., "content": ...}.
absl::StatusOr<api::ChatPrompt> ReadChatFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, kMaxChatFileSize);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read --chat file: ", text.status().message()));
  }
  nlohmann::json root = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat file ", path, " is not valid JSON"));
  }
  const std::string shape = "a JSON list of {\"role\": ..., \"content\": ...} messages";
  if (!root.is_array() || root.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat file ", path, " must hold ", shape,
                     root.is_array() ? " (it is an empty list)" : ""));
  }
  api::ChatPrompt chat;
  for (size_t i = 0; i < root.size(); ++i) {
    const nlohmann::json& item = root[i];
    const std::string where = absl::StrCat("--chat file ", path, ": message ", i + 1);
    if (!item.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is not an object (", shape, ")"));
    }
    for (auto it = item.begin(); it != item.end(); ++it) {
      if (it.key() != "role" && it.key() != "content") {
        return absl::InvalidArgumentError(absl::StrCat(where, " has an unknown key \"", it.key(),
                                                       "\" (a message has role and content)"));
      }
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", it.key(), " is not a string"));
      }
    }
    if (!item.contains("role") || item["role"].get_ref<const std::string&>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has no role"));
    }
    if (!item.contains("content")) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has no content"));
    }
    api::ChatMessage& message = *chat.add_messages();
    message.set_role(item["role"].get_ref<const std::string&>());
    message.set_content(item["content"].get_ref<const std::string&>());
  }
  return chat;
}

absl::StatusOr<api::TokenIds> ParsePromptIds(absl::string_view list) {
  api::TokenIds ids;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int32_t id = 0;
    if (entry.empty() || !absl::SimpleAtoi(entry, &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt-ids wants token ids from 0, comma-separated (1,2,3), not '", list, "'"));
    }
    ids.add_ids(id);
  }
  return ids;
}

// A float flag in [low, high] (`low_open`: low itself excluded), when given.
absl::StatusOr<std::optional<float>> FloatFlag(const Flags& flags, const std::string& flag,
                                               double low, double high, bool low_open) {
  std::optional<std::string> text = flags.Get(flag);
  if (!text.has_value()) return std::nullopt;
  double value = 0;
  bool in_range = absl::SimpleAtod(*text, &value) && std::isfinite(value) &&
                  (low_open ? value > low : value >= low) && value <= high;
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be a number in ",
                                                   low_open ? "(" : "[", low, ", ", high,
                                                   "], not '", *text, "'"));
  }
  return static_cast<float>(value);
}

}  // namespace

absl::StatusOr<api::GenerateRequest> GenerateRequestFromFlags(const Flags& flags) {
  api::GenerateRequest request;
  std::optional<std::string> prompt = flags.Get("prompt");
  std::optional<std::string> chat = flags.Get("chat");
  std::optional<std::string> ids = flags.Get("prompt-ids");
  const int prompts = prompt.has_value() + chat.has_value() + ids.has_value();
  if (prompts == 0) {
    return absl::InvalidArgumentError(
        "`cloister generate` needs a prompt: --prompt TEXT, --chat FILE.json or --prompt-ids "
        "1,2,3");
  }
  if (prompts > 1) {
    return absl::InvalidArgumentError(
        "--prompt, --chat and --prompt-ids exclude each other: give one prompt");
  }
  if (prompt.has_value()) {
    request.set_text(*prompt);
  } else if (chat.has_value()) {
    ASSIGN_OR_RETURN(*request.mutable_chat(), ReadChatFile(*chat));
  } else {
    ASSIGN_OR_RETURN(*request.mutable_ids(), ParsePromptIds(*ids));
  }

  if (std::optional<std::string> text = flags.Get("max-tokens"); text.has_value()) {
    uint64_t max_tokens = 0;
    if (!absl::SimpleAtoi(*text, &max_tokens) || max_tokens == 0 ||
        text->find_first_not_of("0123456789") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max-tokens must be a whole number of tokens from 1, not '", *text, "'"));
    }
    request.set_max_tokens(max_tokens);
  }
  api::SamplingParameters& sampling = *request.mutable_sampling();
  ASSIGN_OR_RETURN(std::optional<float> temperature,
                   FloatFlag(flags, "temperature", 0, 2, /*low_open=*/false));
  if (temperature.has_value()) sampling.set_temperature(*temperature);
  ASSIGN_OR_RETURN(std::optional<float> top_p, FloatFlag(flags, "top-p", 0, 1, /*low_open=*/true));
  if (top_p.has_value()) sampling.set_top_p(*top_p);
  if (std::optional<std::string> text = flags.Get("top-k"); text.has_value()) {
    int32_t top_k = 0;
    if (!absl::SimpleAtoi(*text, &top_k) || top_k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--top-k must be a whole number from 0 (0: off), not '", *text, "'"));
    }
    sampling.set_top_k(top_k);
  }
  if (std::optional<std::string> text = flags.Get("seed"); text.has_value()) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(*text, &seed) ||
        text->find_first_not_of("0123456789") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--seed must be a whole number from 0 to 18446744073709551615, not '", *text, "'"));
    }
    sampling.set_seed(seed);
  }
  for (const std::string& stop : flags.All("stop")) {
    if (stop.empty()) return absl::InvalidArgumentError("--stop wants a non-empty string");
    request.add_stop(stop);
  }
  return request;
}

std::string GenerateResultJson(const GenerateResult& result) {
  return absl::StrCat(
      "{\"ids\":[", absl::StrJoin(result.ids, ","), "],\"text\":", JsonString(result.text),
      ",\"finish_reason\":", JsonString(result.finish_reason),
      ",\"usage\":{\"prompt_tokens\":", result.usage.prompt_tokens(),
      ",\"cached_tokens\":", result.usage.cached_tokens(),
      ",\"completion_tokens\":", result.usage.completion_tokens(),
      "},\"receipt\":", JsonString(absl::Base64Escape(result.receipt)),
      ",\"receipt_signature\":", JsonString(absl::Base64Escape(result.receipt_signature)), "}");
}

Result RunGenerate(const Flags& flags, CliIo& io) {
  auto name = RequiredFlag(flags, "model", "generate");
  if (!name.ok()) return Usage(name.status());
  // Every flag and the chat file are checked before connecting.
  absl::StatusOr<api::GenerateRequest> request = GenerateRequestFromFlags(flags);
  if (!request.ok()) return Usage(request.status());
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());

  const bool json = flags.Has("json");
  bool printed = false;
  GenerateChunkCallback on_chunk;
  if (!json) {
    on_chunk = [&io, &printed](const api::GenerateChunk& chunk) {
      if (chunk.text().empty()) return;
      io.out << chunk.text() << std::flush;
      printed = true;
    };
  }
  absl::StatusOr<GenerateResult> result = (*client)->Generate(*name, *request, on_chunk);
  if (!result.ok()) {
    if (printed) io.out << "\n";  // end the partial text's line; the error goes to stderr
    return RefusedForModel(result.status(), *name);
  }
  if (json) {
    io.out << GenerateResultJson(*result) << "\n";
  } else {
    io.out << "\n";
  }
  return std::nullopt;
}

}  // namespace cloister::sdk::cli_internal
