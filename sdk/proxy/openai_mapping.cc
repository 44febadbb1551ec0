#include "sdk/proxy/openai_mapping.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "nlohmann/json.hpp"
#include "proto/error_reason.h"

namespace cloister::sdk::proxy {

namespace api = ::cloister::api::v1;
using json = nlohmann::json;

absl::Status InvalidField(absl::string_view param, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  if (!param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::string ParamOf(const absl::Status& status) {
  absl::optional<absl::Cord> param = status.GetPayload(kParamPayload);
  return param.has_value() ? std::string(*param) : std::string();
}

// ---- Errors. ----

std::string ErrorBody(const ApiError& error) {
  json body = {{"error",
                {{"message", error.message},
                 {"type", error.type},
                 {"param", error.param.empty() ? json(nullptr) : json(error.param)},
                 {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError ApiErrorFromStatus(const absl::Status& status, absl::string_view model) {
  ApiError error;
  error.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      error.type = "invalid_request_error";
      error.param = ParamOf(status);
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      error.type = "invalid_request_error";
      error.param = "model";
      error.code = "model_not_found";
      error.message = absl::StrCat("The model '", model,
                                   "' does not exist: no model of that name belongs to the "
                                   "proxy's identity key or is published by the operator (",
                                   status.message(), ")");
      break;
    case absl::StatusCode::kResourceExhausted:
      // By the reason, never the words (proto/error_reason.h).
      switch (proto::ReasonOf(status)) {
        case api::TOO_LARGE:  // sent again as it is, it is refused again
          error.http_status = 400;
          error.type = "invalid_request_error";
          error.code = "request_too_large";
          break;
        case api::QUOTA_EXCEEDED:  // something must be freed first
          error.http_status = 429;
          error.type = "insufficient_quota";
          error.code = "insufficient_quota";
          break;
        default:  // OVERLOADED: back off and retry
          error.http_status = 429;
          error.type = "rate_limit_error";
          error.code = "rate_limit_exceeded";
          error.retry_after_seconds = 1;
          break;
      }
      break;
    case absl::StatusCode::kFailedPrecondition:
      // The SDK's refusal of evidence carries no reason of its own, only these words.
      if (absl::StrContains(status.message(), "attestation failed")) {
        error.http_status = 503;
        error.type = "server_error";
        error.code = "attestation_failed";
      } else {
        error.http_status = 400;
        error.type = "invalid_request_error";
      }
      break;
    case absl::StatusCode::kUnavailable:
      error.http_status = 503;
      error.type = "server_error";
      error.code = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      error.http_status = 504;
      error.type = "server_error";
      error.code = "timeout";
      break;
    case absl::StatusCode::kPermissionDenied:
      error.http_status = 403;
      error.type = "permission_error";
      error.code = "permission_denied";
      break;
    case absl::StatusCode::kUnauthenticated:
      error.http_status = 502;
      error.type = "server_error";
      error.code = "upstream_unauthenticated";
      error.message = absl::StrCat("cloisterd refused the proxy's credentials: ", status.message());
      break;
    case absl::StatusCode::kDataLoss:
      error.http_status = 502;
      error.type = "server_error";
      error.code = "stream_integrity";
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
      break;
  }
  return error;
}

namespace {

// ---- Reading fields. ----

// The field `name` of `body`, or nullptr when it is absent or null (OpenAI treats both as
// "not given").
const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// What a JSON value is, in words: "a string", "a list", "a fractional number"...
std::string TypeWords(const json& value) {
  if (value.is_object()) return "an object";
  if (value.is_array()) return "a list";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_float()) return "a fractional number";
  if (value.is_number()) return "a number";
  return "null";
}

absl::Status WrongType(absl::string_view param, absl::string_view wanted, const json& value) {
  return InvalidField(param, absl::StrCat(param, " must be ", wanted, ", not ", TypeWords(value)));
}

absl::StatusOr<std::optional<bool>> GetBool(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) return WrongType(name, "a boolean", *value);
  return value->get<bool>();
}

absl::StatusOr<std::optional<double>> GetNumber(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) return WrongType(name, "a number", *value);
  return value->get<double>();
}

// An integer (a number with no fractional part, within int64).
absl::StatusOr<int64_t> AsInteger(absl::string_view param, const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidField(param, absl::StrCat(param, " is out of range: ", u));
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return WrongType(param, "an integer", value);
}

absl::StatusOr<std::optional<int64_t>> GetInteger(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  ASSIGN_OR_RETURN(int64_t n, AsInteger(name, *value));
  return n;
}

absl::StatusOr<std::optional<std::string>> GetString(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) return WrongType(name, "a string", *value);
  return value->get<std::string>();
}

// A number in [lo, hi] (or (lo, hi] when `open_low`), else InvalidField naming it.
absl::StatusOr<std::optional<double>> GetNumberIn(const json& body, const char* name, double lo,
                                                  double hi, bool open_low = false) {
  ASSIGN_OR_RETURN(std::optional<double> value, GetNumber(body, name));
  if (!value.has_value()) return std::nullopt;
  const bool low_ok = open_low ? *value > lo : *value >= lo;
  if (!low_ok || !(*value <= hi)) {
    return InvalidField(name, absl::StrCat(name, " must be ", open_low ? "above " : "at least ", lo,
                                           " and at most ", hi, ", got ", *value));
  }
  return value;
}

// A token id: an integer in [0, 2^31).
absl::StatusOr<int32_t> TokenId(absl::string_view param, const json& value) {
  if (!value.is_number()) return WrongType(param, "a token id (an integer)", value);
  ASSIGN_OR_RETURN(int64_t id, AsInteger(param, value));
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    return InvalidField(param, absl::StrCat(param, " is not a token id: ", id));
  }
  return static_cast<int32_t>(id);
}

absl::StatusOr<json> ParseBody(absl::string_view body) {
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // nlohmann's messages start with "[json.exception.parse_error.101] ".
    absl::string_view what = e.what();
    if (size_t bracket = what.find("] "); bracket != absl::string_view::npos) {
      what.remove_prefix(bracket + 2);
    }
    return InvalidField("", absl::StrCat("the request body is not valid JSON: ", what));
  }
  if (!parsed.is_object()) {
    return InvalidField(
        "", absl::StrCat("the request body must be a JSON object, not ", TypeWords(parsed)));
  }
  return parsed;
}

absl::StatusOr<std::string> GetModel(const json& body) {
  ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(body, "model"));
  if (!model.has_value() || model->empty()) {
    return InvalidField("model", "model is missing: name the model to use (GET /v1/models)");
  }
  return *model;
}

// ---- Fields both generation endpoints share. ----

absl::Status Unsupported(const char* param, absl::string_view why) {
  return InvalidField(param, absl::StrCat(param, " is not supported: ", why));
}

absl::Status ParseSampling(const json& body, GenerationCall& call) {
  api::SamplingParameters& s = *call.request.mutable_sampling();
  ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInteger(body, "n"));
  if (n.has_value() && *n != 1) {
    return InvalidField("n", absl::StrCat("n must be 1: the proxy returns one choice per "
                                          "request, got ",
                                          *n));
  }
  ASSIGN_OR_RETURN(std::optional<double> temperature, GetNumberIn(body, "temperature", 0, 2));
  if (temperature.has_value()) s.set_temperature(static_cast<float>(*temperature));
  ASSIGN_OR_RETURN(std::optional<double> top_p, GetNumberIn(body, "top_p", 0, 1, true));
  if (top_p.has_value()) s.set_top_p(static_cast<float>(*top_p));
  ASSIGN_OR_RETURN(std::optional<double> presence, GetNumberIn(body, "presence_penalty", -2, 2));
  if (presence.has_value()) s.set_presence_penalty(static_cast<float>(*presence));
  ASSIGN_OR_RETURN(std::optional<double> frequency, GetNumberIn(body, "frequency_penalty", -2, 2));
  if (frequency.has_value()) s.set_frequency_penalty(static_cast<float>(*frequency));
  ASSIGN_OR_RETURN(std::optional<int64_t> seed, GetInteger(body, "seed"));
  if (seed.has_value()) s.set_seed(static_cast<uint64_t>(*seed));  // two's complement, as given

  // vLLM's extensions, which the engine has.
  ASSIGN_OR_RETURN(std::optional<int64_t> top_k, GetInteger(body, "top_k"));
  if (top_k.has_value()) {
    if (*top_k < -1 || *top_k > std::numeric_limits<int32_t>::max()) {
      return InvalidField("top_k", absl::StrCat("top_k must be -1 or 0 (off) or a positive "
                                                "count, got ",
                                                *top_k));
    }
    s.set_top_k(*top_k < 0 ? 0 : static_cast<int32_t>(*top_k));
  }
  ASSIGN_OR_RETURN(std::optional<double> min_p, GetNumberIn(body, "min_p", 0, 1));
  if (min_p.has_value()) s.set_min_p(static_cast<float>(*min_p));
  ASSIGN_OR_RETURN(std::optional<double> repetition,
                   GetNumberIn(body, "repetition_penalty", 0, 1e9, true));
  if (repetition.has_value()) s.set_repetition_penalty(static_cast<float>(*repetition));
  ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, GetBool(body, "ignore_eos"));
  call.request.set_ignore_eos(ignore_eos.value_or(false));

  // Stop strings.
  if (const json* stop = Field(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      if (stop->get<std::string>().empty()) return InvalidField("stop", "stop is an empty string");
      call.request.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        const std::string param = absl::StrCat("stop[", i, "]");
        if (!(*stop)[i].is_string()) return WrongType(param, "a string", (*stop)[i]);
        if ((*stop)[i].get<std::string>().empty()) {
          return InvalidField(param, absl::StrCat(param, " is an empty string"));
        }
        call.request.add_stop((*stop)[i].get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or a list of strings", *stop);
    }
  }

  if (const json* bias = Field(body, "logit_bias"); bias != nullptr) {
    if (!bias->is_object()) return WrongType("logit_bias", "an object", *bias);
    if (!bias->empty()) return Unsupported("logit_bias", "the engine has no logit biases");
  }

  ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(body, "stream"));
  call.stream = stream.value_or(false);
  if (const json* options = Field(body, "stream_options"); options != nullptr) {
    if (!options->is_object()) return WrongType("stream_options", "an object", *options);
    if (!call.stream) {
      return InvalidField("stream_options", "stream_options is only allowed when stream is true");
    }
    if (const json* usage = Field(*options, "include_usage"); usage != nullptr) {
      if (!usage->is_boolean()) {
        return WrongType("stream_options.include_usage", "a boolean", *usage);
      }
      call.include_usage = usage->get<bool>();
    }
    // Cloister's own: the enclave's stream shaping (api.proto StreamShape), so that an OpenAI
    // client can ask for fewer events or a fixed cadence (chunk times that say nothing about
    // when tokens came) and a padding size.
    api::StreamShape* shape = call.request.mutable_shape();
    struct ShapeField {
      const char* key;
      const char* param;
      int64_t lo, hi;
      void (api::StreamShape::*set)(uint32_t);
    };
    for (const ShapeField& f :
         {ShapeField{"tokens_per_chunk", "stream_options.tokens_per_chunk", 1, 4096,
                     &api::StreamShape::set_tokens_per_chunk},
          ShapeField{"interval_ms", "stream_options.interval_ms", 10, 10000,
                     &api::StreamShape::set_interval_ms},
          ShapeField{"pad_to", "stream_options.pad_to", 1, 65536, &api::StreamShape::set_pad_to}}) {
      const json* value = Field(*options, f.key);
      if (value == nullptr) continue;
      ASSIGN_OR_RETURN(int64_t n, AsInteger(f.param, *value));
      if (n < f.lo || n > f.hi) {
        return InvalidField(f.param, absl::StrCat(f.param, " must be ", f.lo, " to ", f.hi,
                                                  ", got ", n));
      }
      (shape->*f.set)(static_cast<uint32_t>(n));
    }
  }
  return absl::OkStatus();
}

// max_tokens (or max_completion_tokens, when `also_completion` and it is given): at least 1.
absl::StatusOr<std::optional<uint64_t>> GetMaxTokens(const json& body, bool also_completion) {
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (!also_completion && std::strcmp(name, "max_completion_tokens") == 0) continue;
    ASSIGN_OR_RETURN(std::optional<int64_t> value, GetInteger(body, name));
    if (!value.has_value()) continue;
    if (*value < 1)
      return InvalidField(name, absl::StrCat(name, " must be at least 1, got ", *value));
    return static_cast<uint64_t>(*value);
  }
  return std::nullopt;
}

// The text of a chat message's content: a string, or the text parts of a list joined by
// newlines (vLLM's way).
absl::StatusOr<std::string> MessageContent(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return WrongType(param, "a string or a list of content parts", content);
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string part_param = absl::StrCat(param, "[", j, "]");
    if (!part.is_object()) return WrongType(part_param, "a content part (an object)", part);
    const json* type = Field(part, "type");
    if (type == nullptr || !type->is_string()) {
      return InvalidField(part_param + ".type",
                          absl::StrCat(part_param, ".type must be a string (\"text\")"));
    }
    if (type->get<std::string>() != "text") {
      return InvalidField(part_param + ".type",
                          absl::StrCat(part_param, ": only text parts are supported, not ",
                                       type->get<std::string>()));
    }
    const json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) {
      return InvalidField(part_param + ".text", absl::StrCat(part_param, ".text must be a string"));
    }
    texts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(texts, "\n");
}

absl::Status ParseMessages(const json& body, api::ChatPrompt& chat) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr) return InvalidField("messages", "messages is missing");
  if (!messages->is_array()) return WrongType("messages", "a list of messages", *messages);
  if (messages->empty()) return InvalidField("messages", "messages is empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return WrongType(param, "a message (an object)", message);
    const json* role = Field(message, "role");
    if (role == nullptr) return InvalidField(param + ".role", param + ".role is missing");
    if (!role->is_string()) return WrongType(param + ".role", "a string", *role);
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";  // OpenAI's newer name for system messages
    if (name != "system" && name != "user" && name != "assistant") {
      return InvalidField(param + ".role",
                          absl::StrCat(param,
                                       ".role must be system, developer, user or "
                                       "assistant (tool calling is not supported), not '",
                                       role->get<std::string>(), "'"));
    }
    for (const char* calls : {"tool_calls", "function_call"}) {
      const json* value = Field(message, calls);
      if (value != nullptr && !(value->is_array() && value->empty())) {
        return InvalidField(absl::StrCat(param, ".", calls),
                            absl::StrCat(param, ".", calls,
                                         " is not supported: the proxy has "
                                         "no tool calling"));
      }
    }
    api::ChatMessage& out = *chat.add_messages();
    out.set_role(name);
    const json* content = Field(message, "content");
    if (content == nullptr) {
      if (name != "assistant") {
        return InvalidField(param + ".content", param + ".content is missing");
      }
      continue;  // an assistant turn with no text
    }
    ASSIGN_OR_RETURN(*out.mutable_content(), MessageContent(*content, param + ".content"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerationCall> ParseChatCompletionRequest(absl::string_view text) {
  ASSIGN_OR_RETURN(json body, ParseBody(text));
  GenerationCall call;
  call.endpoint = Endpoint::kChatCompletions;
  ASSIGN_OR_RETURN(call.model, GetModel(body));
  RETURN_IF_ERROR(ParseMessages(body, *call.request.mutable_chat()));
  ASSIGN_OR_RETURN(std::optional<uint64_t> max_tokens, GetMaxTokens(body, true));
  call.request.set_max_tokens(max_tokens.value_or(0));  // 0: up to the model's context
  RETURN_IF_ERROR(ParseSampling(body, call));

  api::SamplingParameters& s = *call.request.mutable_sampling();
  ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(body, "logprobs"));
  s.set_logprobs(logprobs.value_or(false));
  ASSIGN_OR_RETURN(std::optional<int64_t> top, GetInteger(body, "top_logprobs"));
  if (top.has_value()) {
    if (*top < 0 || *top > 20) {
      return InvalidField("top_logprobs",
                          absl::StrCat("top_logprobs must be between 0 and 20, got ", *top));
    }
    if (*top > 0 && !s.logprobs()) {
      return InvalidField("top_logprobs", "top_logprobs needs logprobs to be true");
    }
    s.set_top_logprobs(static_cast<int32_t>(*top));
  }

  if (const json* format = Field(body, "response_format"); format != nullptr) {
    if (!format->is_object()) return WrongType("response_format", "an object", *format);
    const json* type = Field(*format, "type");
    if (type == nullptr || !type->is_string()) {
      return InvalidField("response_format.type", "response_format.type must be a string");
    }
    if (type->get<std::string>() != "text") {
      return InvalidField("response_format",
                          absl::StrCat("response_format ", type->get<std::string>(),
                                       " is not supported: the engine has no structured output "
                                       "(only \"text\")"));
    }
  }
  for (const char* tools : {"tools", "functions"}) {
    const json* value = Field(body, tools);
    if (value == nullptr) continue;
    if (!value->is_array()) return WrongType(tools, "a list", *value);
    if (!value->empty()) return Unsupported(tools, "the proxy has no tool calling");
  }
  if (const json* modalities = Field(body, "modalities"); modalities != nullptr) {
    if (!modalities->is_array()) return WrongType("modalities", "a list", *modalities);
    for (const json& modality : *modalities) {
      if (modality != "text") return Unsupported("modalities", "only text");
    }
  }
  if (Field(body, "audio") != nullptr) return Unsupported("audio", "only text");
  return call;
}

absl::StatusOr<GenerationCall> ParseCompletionRequest(absl::string_view text) {
  ASSIGN_OR_RETURN(json body, ParseBody(text));
  GenerationCall call;
  call.endpoint = Endpoint::kCompletions;
  ASSIGN_OR_RETURN(call.model, GetModel(body));

  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return InvalidField("prompt", "prompt is missing");
  // One prompt: a string, token ids, or a list holding exactly one of either.
  const json* one = prompt;
  std::string param = "prompt";
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    if (prompt->size() != 1) {
      return InvalidField("prompt", absl::StrCat("prompt holds ", prompt->size(),
                                                 " prompts: send one per request"));
    }
    one = &(*prompt)[0];
    param = "prompt[0]";
  }
  if (one->is_string()) {
    call.request.set_text(one->get<std::string>());
  } else if (one->is_array()) {
    if (one->empty()) return InvalidField(param, absl::StrCat(param, " is an empty list"));
    api::TokenIds& ids = *call.request.mutable_ids();
    for (size_t i = 0; i < one->size(); ++i) {
      ASSIGN_OR_RETURN(int32_t id, TokenId(absl::StrCat(param, "[", i, "]"), (*one)[i]));
      ids.add_ids(id);
    }
  } else {
    return WrongType(param, "a string or a list of token ids", *one);
  }

  ASSIGN_OR_RETURN(std::optional<uint64_t> max_tokens, GetMaxTokens(body, false));
  call.request.set_max_tokens(max_tokens.value_or(16));  // OpenAI's default for completions
  RETURN_IF_ERROR(ParseSampling(body, call));

  ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, GetInteger(body, "logprobs"));
  if (logprobs.has_value()) {
    if (*logprobs < 0 || *logprobs > 20) {
      return InvalidField("logprobs",
                          absl::StrCat("logprobs must be between 0 and 20, got ", *logprobs));
    }
    call.request.mutable_sampling()->set_logprobs(true);
    call.request.mutable_sampling()->set_top_logprobs(static_cast<int32_t>(*logprobs));
  }
  ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(body, "echo"));
  if (echo.value_or(false)) return Unsupported("echo", "the prompt is not sent back");
  ASSIGN_OR_RETURN(std::optional<std::string> suffix, GetString(body, "suffix"));
  if (suffix.has_value() && !suffix->empty()) {
    return Unsupported("suffix", "the engine has no fill-in-the-middle");
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> best_of, GetInteger(body, "best_of"));
  if (best_of.has_value() && *best_of != 1) {
    return InvalidField("best_of", absl::StrCat("best_of must be 1: the proxy generates one "
                                                "choice per request, got ",
                                                *best_of));
  }
  return call;
}

absl::StatusOr<EmbeddingCall> ParseEmbeddingRequest(absl::string_view text) {
  ASSIGN_OR_RETURN(json body, ParseBody(text));
  EmbeddingCall call;
  ASSIGN_OR_RETURN(call.model, GetModel(body));
  const std::string no_tokenizer = absl::StrCat(
      "the encoder model ", call.model,
      " has no tokenizer: send token ids (a list of integers, or a list of such lists)");
  const json* input = Field(body, "input");
  if (input == nullptr) return InvalidField("input", "input is missing");
  if (input->is_string())
    return InvalidField("input", absl::StrCat("input is text, but ", no_tokenizer));
  if (!input->is_array()) return WrongType("input", "a list of token ids", *input);
  if (input->empty()) return InvalidField("input", "input is an empty list");
  constexpr size_t kMaxRows = 2048;  // OpenAI's limit
  if ((*input)[0].is_number()) {
    std::vector<int64_t>& row = call.rows.emplace_back();
    for (size_t i = 0; i < input->size(); ++i) {
      ASSIGN_OR_RETURN(int32_t id, TokenId(absl::StrCat("input[", i, "]"), (*input)[i]));
      row.push_back(id);
    }
  } else {
    if (input->size() > kMaxRows) {
      return InvalidField("input", absl::StrCat("input holds ", input->size(),
                                                " rows, over the limit of ", kMaxRows));
    }
    for (size_t r = 0; r < input->size(); ++r) {
      const json& row_json = (*input)[r];
      const std::string param = absl::StrCat("input[", r, "]");
      if (row_json.is_string()) {
        return InvalidField(param, absl::StrCat(param, " is text, but ", no_tokenizer));
      }
      if (!row_json.is_array()) return WrongType(param, "a list of token ids", row_json);
      if (row_json.empty()) return InvalidField(param, absl::StrCat(param, " is an empty list"));
      std::vector<int64_t>& row = call.rows.emplace_back();
      for (size_t i = 0; i < row_json.size(); ++i) {
        ASSIGN_OR_RETURN(int32_t id, TokenId(absl::StrCat(param, "[", i, "]"), row_json[i]));
        row.push_back(id);
      }
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> format, GetString(body, "encoding_format"));
  if (format.has_value() && *format != "float" && *format != "base64") {
    return InvalidField("encoding_format", absl::StrCat("encoding_format must be \"float\" or "
                                                        "\"base64\", not \"",
                                                        *format, "\""));
  }
  call.base64 = format.value_or("float") == "base64";
  if (Field(body, "dimensions") != nullptr) {
    return Unsupported("dimensions", "the embedding size is the model's");
  }
  return call;
}

// ---- Models. ----

bool IsEmbeddingModel(const api::ModelInfo& model) {
  if (model.kind() != api::MODEL_KIND_ONNX) return false;
  bool ids = false;
  for (const api::TensorInfo& input : model.inputs()) {
    if (input.name() == "input_ids") {
      ids = input.datatype() == "INT64";
    } else if (input.name() != "attention_mask" && input.name() != "token_type_ids") {
      return false;
    }
  }
  bool embedding = false;
  for (const api::TensorInfo& output : model.outputs()) {
    embedding |= output.name() == "sentence_embedding";
  }
  return ids && embedding;
}

namespace {

json ModelObject(const api::ModelInfo& model, absl::string_view tenant,
                 absl::string_view measurement) {
  json endpoints = json::array();
  if (model.kind() == api::MODEL_KIND_LLM) {
    endpoints = json::array({"/v1/chat/completions", "/v1/completions"});
  } else if (IsEmbeddingModel(model)) {
    endpoints = json::array({"/v1/embeddings"});
  }
  return {{"id", model.name()},
          {"object", "model"},
          {"created", 0},  // the appliance keeps no upload times
          {"owned_by", model.published() ? std::string("operator") : std::string(tenant)},
          {"cloister",
           {{"digest", model.digest()},
            {"kind", model.kind() == api::MODEL_KIND_LLM ? "llm" : "onnx"},
            {"published", model.published()},
            {"measurement", measurement},
            {"endpoints", std::move(endpoints)}}}};
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string ModelListJson(const std::vector<api::ModelInfo>& models, absl::string_view tenant,
                          absl::string_view measurement) {
  json data = json::array();
  for (const api::ModelInfo& model : models) {
    data.push_back(ModelObject(model, tenant, measurement));
  }
  return Dump({{"object", "list"}, {"data", std::move(data)}});
}

std::string ModelJson(const api::ModelInfo& model, absl::string_view tenant,
                      absl::string_view measurement) {
  return Dump(ModelObject(model, tenant, measurement));
}

// ---- Embeddings. ----

absl::StatusOr<std::vector<api::Tensor>> EmbeddingInputs(
    const api::ModelInfo& model, const std::vector<std::vector<int64_t>>& rows) {
  size_t longest = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].empty()) {
      return InvalidField("input", absl::StrCat("input[", r, "] is an empty list"));
    }
    longest = std::max(longest, rows[r].size());
  }
  if (rows.empty()) return InvalidField("input", "input is an empty list");
  std::vector<api::Tensor> inputs;
  for (const api::TensorInfo& info : model.inputs()) {
    api::Tensor& tensor = inputs.emplace_back();
    tensor.set_name(info.name());
    tensor.set_datatype("INT64");
    tensor.add_shape(static_cast<int64_t>(rows.size()));
    tensor.add_shape(static_cast<int64_t>(longest));
    std::vector<int64_t> values(rows.size() * longest, 0);
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t i = 0; i < rows[r].size(); ++i) {
        int64_t& value = values[r * longest + i];
        if (info.name() == "input_ids") {
          value = rows[r][i];
        } else if (info.name() == "attention_mask") {
          value = 1;
        }  // token_type_ids: 0
      }
    }
    // Little-endian, as the wire format says (and as this x86-64/aarch64 machine is).
    tensor.set_raw(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
  }
  return inputs;
}

absl::StatusOr<std::string> EmbeddingResponseJson(const EmbeddingCall& call,
                                                  const std::vector<api::Tensor>& outputs) {
  const api::Tensor* embedding = nullptr;
  for (const api::Tensor& output : outputs) {
    if (output.name() == "sentence_embedding") embedding = &output;
  }
  const size_t rows = call.rows.size();
  if (embedding == nullptr || embedding->datatype() != "FP32" || embedding->shape_size() != 2 ||
      embedding->shape(0) != static_cast<int64_t>(rows) || embedding->shape(1) <= 0 ||
      embedding->raw().size() != rows * static_cast<size_t>(embedding->shape(1)) * sizeof(float)) {
    return absl::InternalError(absl::StrCat("model ", call.model,
                                            " gave no FP32 sentence_embedding of shape [", rows,
                                            ", dimensions]"));
  }
  const size_t dimensions = static_cast<size_t>(embedding->shape(1));
  const std::string& raw = embedding->raw();
  json data = json::array();
  uint64_t tokens = 0;
  for (size_t r = 0; r < rows; ++r) {
    tokens += call.rows[r].size();
    const char* begin = raw.data() + r * dimensions * sizeof(float);
    json vector;
    if (call.base64) {
      vector = absl::Base64Escape(absl::string_view(begin, dimensions * sizeof(float)));
    } else {
      vector = json::array();
      for (size_t d = 0; d < dimensions; ++d) {
        float value;
        std::memcpy(&value, begin + d * sizeof(float), sizeof(float));
        vector.push_back(value);
      }
    }
    data.push_back({{"object", "embedding"}, {"index", r}, {"embedding", std::move(vector)}});
  }
  return Dump({{"object", "list"},
               {"data", std::move(data)},
               {"model", call.model},
               {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
}

// ---- Generation responses. ----

std::string TokenName(int32_t id) { return absl::StrCat("token_id:", id); }

namespace {

json UsageJson(const api::GenerateUsage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens()},
          {"completion_tokens", usage.completion_tokens()},
          {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens()}}}};
}

json ReceiptJson(const std::string& receipt, const std::string& signature) {
  return {{"receipt", absl::Base64Escape(receipt)},
          {"receipt_signature", absl::Base64Escape(signature)}};
}

// The logprobs of `tokens`: chat's {"content": [{"token", "logprob", "bytes", "top_logprobs"}],
// "refusal": null}, or completions' {"tokens", "token_logprobs", "top_logprobs"}.
json LogprobsJson(Endpoint endpoint, const std::vector<const api::SampledTokenInfo*>& tokens) {
  if (endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const api::SampledTokenInfo* token : tokens) {
      json top = json::array();
      for (const api::TokenLogprob& alt : token->top()) {
        top.push_back(
            {{"token", TokenName(alt.id())}, {"logprob", alt.logprob()}, {"bytes", nullptr}});
      }
      content.push_back({{"token", TokenName(token->id())},
                         {"logprob", token->logprob()},
                         {"bytes", nullptr},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json names = json::array(), logprobs = json::array(), tops = json::array();
  for (const api::SampledTokenInfo* token : tokens) {
    names.push_back(TokenName(token->id()));
    logprobs.push_back(token->logprob());
    json top = json::object();
    for (const api::TokenLogprob& alt : token->top()) top[TokenName(alt.id())] = alt.logprob();
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(names)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)}};
}

std::string FinishReason(const std::string& reason) {
  // The engine's "cancelled" has no OpenAI word; the client that cancelled has gone anyway.
  return reason.empty() ? "stop" : reason;
}

}  // namespace

std::string CompletionResponseJson(const GenerationCall& call, const ResponseContext& context,
                                   const GenerateResult& result,
                                   const std::vector<api::SampledTokenInfo>& tokens) {
  const bool chat = call.endpoint == Endpoint::kChatCompletions;
  json choice = {{"index", 0}, {"finish_reason", FinishReason(result.finish_reason)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", result.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = result.text;
  }
  if (call.request.sampling().logprobs()) {
    std::vector<const api::SampledTokenInfo*> all;
    for (const api::SampledTokenInfo& token : tokens) all.push_back(&token);
    choice["logprobs"] = LogprobsJson(call.endpoint, all);
  } else {
    choice["logprobs"] = nullptr;
  }
  return Dump({{"id", context.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", context.created},
               {"model", context.model},
               {"choices", json::array({std::move(choice)})},
               {"usage", UsageJson(result.usage)},
               {"system_fingerprint", nullptr},
               {"cloister", ReceiptJson(result.receipt, result.receipt_signature)}});
}

StreamEncoder::StreamEncoder(const GenerationCall& call, ResponseContext context)
    : endpoint_(call.endpoint),
      logprobs_(call.request.sampling().logprobs()),
      include_usage_(call.include_usage),
      context_(std::move(context)) {}

namespace {

std::string Event(const json& value) { return absl::StrCat("data: ", Dump(value), "\n\n"); }

}  // namespace

std::string StreamEncoder::OnChunk(const api::GenerateChunk& chunk) {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  const json base = {{"id", context_.id},
                     {"object", chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", context_.created},
                     {"model", context_.model},
                     {"system_fingerprint", nullptr}};
  auto with_choice = [&](json choice) {
    json event = base;
    event["choices"] = json::array({std::move(choice)});
    return event;
  };
  std::vector<json> events;
  if (!started_ && chat) {
    events.push_back(with_choice({{"index", 0},
                                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}}));
  }
  started_ = true;
  const bool has_tokens = logprobs_ && chunk.tokens_size() > 0;
  if (!chunk.text().empty() || has_tokens) {
    json choice = {{"index", 0}, {"finish_reason", nullptr}};
    if (chat) {
      choice["delta"] = {{"content", chunk.text()}};
    } else {
      choice["text"] = chunk.text();
    }
    if (has_tokens) {
      std::vector<const api::SampledTokenInfo*> tokens;
      for (const api::SampledTokenInfo& token : chunk.tokens()) tokens.push_back(&token);
      choice["logprobs"] = LogprobsJson(endpoint_, tokens);
    } else {
      choice["logprobs"] = nullptr;
    }
    events.push_back(with_choice(std::move(choice)));
  }
  if (!chunk.finish_reason().empty()) {
    json choice = {{"index", 0},
                   {"logprobs", nullptr},
                   {"finish_reason", FinishReason(chunk.finish_reason())}};
    if (chat) {
      choice["delta"] = json::object();
    } else {
      choice["text"] = "";
    }
    events.push_back(with_choice(std::move(choice)));
    if (include_usage_) {
      json usage = base;
      usage["choices"] = json::array();
      usage["usage"] = UsageJson(chunk.usage());
      events.push_back(std::move(usage));
    }
    events.back()["cloister"] = ReceiptJson(chunk.receipt(), chunk.receipt_signature());
  }
  std::string out;
  for (const json& event : events) absl::StrAppend(&out, Event(event));
  if (!chunk.finish_reason().empty()) absl::StrAppend(&out, "data: [DONE]\n\n");
  return out;
}

std::string StreamEncoder::OnError(const ApiError& error) {
  return absl::StrCat("data: ", ErrorBody(error), "\n\n");
}

}  // namespace cloister::sdk::proxy
