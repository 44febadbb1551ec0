// The OpenAI HTTP API's JSON, mapped to and from Cloister's messages, for `cloister proxy`
// (docs/OPENAI.md): request bodies of /v1/chat/completions, /v1/completions and /v1/embeddings
// become a GenerateRequest or the tensors of an encoder model, and the generation's chunks,
// result and errors become OpenAI's response objects, stream events (server-sent events) and
// error objects. No HTTP here (proxy_server.h has the wiring), so every case is unit-tested.
//
// What the engine cannot do is refused, never dropped: a request asking for more than one
// choice, logit biases, tools, structured output, echo or a suffix gets InvalidArgument naming
// the field, as does a field of the wrong type or out of range. Fields OpenAI clients commonly
// send and that change nothing here (user, store, metadata, service_tier...) and unknown
// fields are ignored. vLLM's extensions top_k, min_p, repetition_penalty and ignore_eos are
// honoured, since the engine has them.
//
// Errors: InvalidArgument whose payload kParamPayload holds the name of the offending field
// (ParamOf reads it back; "messages[1].content", "stop[0]", "input[2][5]"), or none when the
// body as a whole is wrong.
// Threading: pure functions and a StreamEncoder that belongs to one stream; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cloister/api/v1/api.pb.h"
#include "sdk/generate_stream.h"

namespace cloister::sdk::proxy {

// The absl::Status payload under which a refused request names its field.
inline constexpr char kParamPayload[] = "type.cloister.dev/openai.param";

// InvalidArgument("<message>") naming `param` in its payload.
absl::Status InvalidField(absl::string_view param, absl::string_view message);
// The field an InvalidField status names, or "" when none.
std::string ParamOf(const absl::Status& status);

// ---- Errors. ----

// An error as the OpenAI API answers it: an HTTP status and {"error": {"message", "type",
// "param", "code"}}.
struct ApiError {
  int http_status = 500;
  std::string type = "server_error";
  std::string message;
  std::string param;            // "" is sent as null
  std::string code;             // "" is sent as null
  int retry_after_seconds = 0;  // above 0: sent as Retry-After
};

// {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(const ApiError& error);

// The answer to a failed call for model `model`: InvalidArgument and OutOfRange 400
// (invalid_request_error, with the param the status names); NotFound 404 with code
// model_not_found; ResourceExhausted 429 (rate_limit_exceeded, Retry-After 1), or 429
// insufficient_quota for reason QUOTA_EXCEEDED, or 400 request_too_large for TOO_LARGE; a failed
// attestation 503 with code attestation_failed and the failed checks in the message;
// Unavailable 503; DeadlineExceeded 504; PermissionDenied 403; Unauthenticated 502 (cloisterd
// refused the proxy's own credentials); DataLoss 502 (the stream from the host failed its
// checks); anything else 500.
ApiError ApiErrorFromStatus(const absl::Status& status, absl::string_view model);

// ---- Requests. ----

enum class Endpoint { kChatCompletions, kCompletions };

// A generation that a /v1/chat/completions or /v1/completions body asks for.
struct GenerationCall {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;
  cloister::api::v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// The body of POST /v1/chat/completions: `model`, `messages` (roles system, developer (sent as
// system), user and assistant; content a string, null for an assistant, or a list of text
// parts), `max_completion_tokens` (preferred) or `max_tokens`, `temperature`, `top_p`, `n`
// (1 only), `stop`, `seed`, `logprobs`, `top_logprobs`, `presence_penalty`,
// `frequency_penalty`, `stream`, `stream_options`, vLLM's `top_k`, `min_p`,
// `repetition_penalty`, `ignore_eos`. Errors as the header says.
absl::StatusOr<GenerationCall> ParseChatCompletionRequest(absl::string_view body);

// The body of POST /v1/completions: `model`, `prompt` (a string, a list of token ids, or a
// list holding one of either), `max_tokens` (default 16, as OpenAI's), `logprobs` (an integer:
// that many alternatives, 0 to 20), `echo` (false only), `suffix` (none), `best_of` (1 only)
// and the sampling fields of ParseChatCompletionRequest.
absl::StatusOr<GenerationCall> ParseCompletionRequest(absl::string_view body);

// What POST /v1/embeddings asks for: the rows of token ids to encode.
struct EmbeddingCall {
  std::string model;
  std::vector<std::vector<int64_t>> rows;
  bool base64 = false;  // encoding_format "base64" (little-endian float32), else "float"
};

// The body of POST /v1/embeddings: `model`, `input` (a list of token ids, or a list of such
// lists: the encoder models have no tokenizer, so text is refused saying so),
// `encoding_format` ("float" or "base64"); `dimensions` is refused (the size is the model's).
absl::StatusOr<EmbeddingCall> ParseEmbeddingRequest(absl::string_view body);

// ---- Models. ----

// Whether `model` serves /v1/embeddings: an ONNX model with an INT64 input `input_ids`, no
// inputs besides input_ids, attention_mask and token_type_ids, and an output
// `sentence_embedding`.
bool IsEmbeddingModel(const cloister::api::v1::ModelInfo& model);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created": 0,
// "owned_by", "cloister": {"digest", "kind" ("llm" or "onnx"), "published", "measurement",
// "endpoints"}}]}: owned_by is `tenant` for the tenant's models and "operator" for published
// ones; endpoints lists the /v1 paths the model serves (none for other ONNX models);
// measurement is the attested enclave's (`measurement`, hex).
std::string ModelListJson(const std::vector<cloister::api::v1::ModelInfo>& models,
                          absl::string_view tenant, absl::string_view measurement);
// One entry of that list, for GET /v1/models/{id}.
std::string ModelJson(const cloister::api::v1::ModelInfo& model, absl::string_view tenant,
                      absl::string_view measurement);

// ---- Embeddings. ----

// The inputs of `model` (IsEmbeddingModel) for `rows`: input_ids padded with 0 to the longest
// row, attention_mask 1 over each row's ids and 0 over the padding, token_type_ids 0, each
// INT64 [rows, longest]. InvalidArgument (param "input") for an empty row.
absl::StatusOr<std::vector<cloister::api::v1::Tensor>> EmbeddingInputs(
    const cloister::api::v1::ModelInfo& model, const std::vector<std::vector<int64_t>>& rows);

// The response of /v1/embeddings from the model's outputs: {"object": "list", "data":
// [{"object": "embedding", "index", "embedding"}], "model", "usage": {"prompt_tokens",
// "total_tokens"}}. Internal when `outputs` lacks a FP32 sentence_embedding of shape
// [rows, dimensions].
absl::StatusOr<std::string> EmbeddingResponseJson(
    const EmbeddingCall& call, const std::vector<cloister::api::v1::Tensor>& outputs);

// ---- Generation responses. ----

// What every object of one response repeats.
struct ResponseContext {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The token OpenAI's logprobs name for id `id`: "token_id:<id>" (vLLM's form when it returns
// tokens as ids), since the proxy holds no tokenizer: the model is the enclave's.
std::string TokenName(int32_t id);

// The non-streamed response: a chat.completion or text_completion object with one choice
// (the text, finish_reason, and logprobs of `tokens` when the request asked for them), usage
// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
// {"cached_tokens"}} and "cloister": {"receipt", "receipt_signature"} (base64).
std::string CompletionResponseJson(const GenerationCall& call, const ResponseContext& context,
                                   const GenerateResult& result,
                                   const std::vector<cloister::api::v1::SampledTokenInfo>& tokens);

// Turns the chunks of one generation into server-sent events: for chat, a first
// chat.completion.chunk with the assistant role, one per chunk that carries text (or tokens,
// when logprobs were asked for), one with the finish_reason; then, with include_usage, one with
// no choices and the usage; the last of them carries "cloister": {"receipt",
// "receipt_signature"}; then "data: [DONE]". Completions the same with text_completion objects.
class StreamEncoder {
 public:
  StreamEncoder(const GenerationCall& call, ResponseContext context);

  // The events for one accepted chunk (the final one ends the stream with [DONE]).
  std::string OnChunk(const cloister::api::v1::GenerateChunk& chunk);
  // The event for an error after the stream began: {"error": {...}} (no [DONE] follows: the
  // answer is incomplete).
  static std::string OnError(const ApiError& error);

 private:
  const Endpoint endpoint_;
  const bool logprobs_;
  const bool include_usage_;
  const ResponseContext context_;
  bool started_ = false;
};

}  // namespace cloister::sdk::proxy
