// The OpenAI JSON mapping of `cloister proxy` (openai_mapping.h): every field of the three
// request bodies reaches the GenerateRequest or the tensors it should, every refusal names its
// field, and the responses, stream events and error objects have OpenAI's shapes.
#include "sdk/proxy/openai_mapping.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/error_reason.h"

namespace cloister::sdk::proxy {
namespace {

namespace api = ::cloister::api::v1;
using json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kMessages[] = R"("messages": [{"role": "user", "content": "Hi"}])";

std::string Chat(const std::string& fields) {
  return std::string(R"({"model": "tiny", )") + kMessages + (fields.empty() ? "" : ", ") + fields +
         "}";
}

// ---- /v1/chat/completions. ----

TEST(OpenAiChatRequest, TheMinimalBodyGivesTheChatAndNoSamplingChoices) {
  absl::StatusOr<GenerationCall> call = ParseChatCompletionRequest(Chat(""));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->endpoint, Endpoint::kChatCompletions);
  EXPECT_EQ(call->model, "tiny");
  ASSERT_EQ(call->request.chat().messages_size(), 1);
  EXPECT_EQ(call->request.chat().messages(0).role(), "user");
  EXPECT_EQ(call->request.chat().messages(0).content(), "Hi");
  EXPECT_EQ(call->request.max_tokens(), 0u);  // up to the context
  EXPECT_FALSE(call->request.sampling().has_temperature());
  EXPECT_FALSE(call->request.sampling().has_top_p());
  EXPECT_FALSE(call->request.sampling().has_seed());
  EXPECT_FALSE(call->request.sampling().logprobs());
  EXPECT_FALSE(call->stream);
  EXPECT_FALSE(call->include_usage);
}

TEST(OpenAiChatRequest, EverySamplingFieldReachesTheRequest) {
  absl::StatusOr<GenerationCall> call = ParseChatCompletionRequest(Chat(
      R"("temperature": 0.5, "top_p": 0.9, "seed": 42, "stop": ["a", "bc"],
         "presence_penalty": 0.25, "frequency_penalty": -1, "logprobs": true, "top_logprobs": 3,
         "max_tokens": 7, "max_completion_tokens": 9, "n": 1, "stream": true,
         "stream_options": {"include_usage": true}, "top_k": 40, "min_p": 0.05,
         "repetition_penalty": 1.1, "ignore_eos": true)"));
  ASSERT_TRUE(call.ok()) << call.status();
  const api::SamplingParameters& s = call->request.sampling();
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.seed(), 42u);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -1.0f);
  EXPECT_TRUE(s.logprobs());
  EXPECT_EQ(s.top_logprobs(), 3);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_FLOAT_EQ(s.min_p(), 0.05f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_THAT(std::vector<std::string>(call->request.stop().begin(), call->request.stop().end()),
              ::testing::ElementsAre("a", "bc"));
  EXPECT_EQ(call->request.max_tokens(), 9u);  // max_completion_tokens wins
  EXPECT_TRUE(call->request.ignore_eos());
  EXPECT_TRUE(call->stream);
  EXPECT_TRUE(call->include_usage);
}

TEST(OpenAiChatRequest, StreamShapingOptionsReachTheEnclavesStreamShape) {
  absl::StatusOr<GenerationCall> call = ParseChatCompletionRequest(Chat(
      R"("stream": true, "stream_options": {"tokens_per_chunk": 8, "interval_ms": 50,
                                            "pad_to": 512})"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.shape().tokens_per_chunk(), 8u);
  EXPECT_EQ(call->request.shape().interval_ms(), 50u);
  EXPECT_EQ(call->request.shape().pad_to(), 512u);

  call = ParseCompletionRequest(
      R"({"model": "tiny", "prompt": "x", "stream": true, "stream_options": {"tokens_per_chunk": 4}})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.shape().tokens_per_chunk(), 4u);
  EXPECT_EQ(call->request.shape().interval_ms(), 0u);  // the enclave's defaults stay
  EXPECT_EQ(call->request.shape().pad_to(), 0u);
}

TEST(OpenAiChatRequest, SmallShapesOfTheFieldsAreAccepted) {
  absl::StatusOr<GenerationCall> call = ParseChatCompletionRequest(
      R"({"model": "tiny", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "one"},
                                         {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": null},
            {"role": "user", "content": "three", "name": "bob"}],
          "stop": "END", "seed": -1, "max_tokens": 16.0, "top_k": -1, "temperature": null,
          "user": "u-1", "store": false, "metadata": {"a": "b"}, "service_tier": "auto",
          "something_new": [1, 2], "tools": [], "tool_choice": "none",
          "parallel_tool_calls": false, "response_format": {"type": "text"}, "logit_bias": {},
          "modalities": ["text"], "stream": false})");
  ASSERT_TRUE(call.ok()) << call.status();
  const api::ChatPrompt& chat = call->request.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "one\ntwo");
  EXPECT_EQ(chat.messages(2).role(), "assistant");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(chat.messages(3).content(), "three");
  ASSERT_EQ(call->request.stop_size(), 1);
  EXPECT_EQ(call->request.stop(0), "END");
  EXPECT_EQ(call->request.sampling().seed(), ~uint64_t{0});  // -1 as two's complement
  EXPECT_EQ(call->request.max_tokens(), 16u);
  EXPECT_EQ(call->request.sampling().top_k(), 0);
  EXPECT_FALSE(call->request.sampling().has_temperature());
}

struct BadCase {
  std::string body;
  std::string param;
  std::string message;  // a part of the message
};

void ExpectRefused(const absl::StatusOr<GenerationCall>& call, const BadCase& bad) {
  ASSERT_FALSE(call.ok()) << bad.body;
  EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << bad.body;
  EXPECT_EQ(ParamOf(call.status()), bad.param) << bad.body;
  EXPECT_THAT(std::string(call.status().message()), HasSubstr(bad.message)) << bad.body;
  // Always one line.
  EXPECT_EQ(std::string(call.status().message()).find('\n'), std::string::npos);
}

TEST(OpenAiChatRequest, EveryBadFieldIsRefusedByName) {
  const std::vector<BadCase> cases = {
      {"not json", "", "not valid JSON"},
      {"[1, 2]", "", "must be a JSON object, not a list"},
      {R"({"messages": []})", "model", "model is missing"},
      {R"({"model": 5, "messages": []})", "model", "model must be a string, not a number"},
      {R"({"model": "tiny"})", "messages", "messages is missing"},
      {R"({"model": "tiny", "messages": "hi"})", "messages", "must be a list of messages"},
      {R"({"model": "tiny", "messages": []})", "messages", "messages is empty"},
      {R"({"model": "tiny", "messages": ["hi"]})", "messages[0]", "must be a message"},
      {R"({"model": "tiny", "messages": [{"content": "x"}]})", "messages[0].role", "missing"},
      {R"({"model": "tiny", "messages": [{"role": 3, "content": "x"}]})", "messages[0].role",
       "must be a string"},
      {R"({"model": "tiny", "messages": [{"role": "tool", "content": "x"}]})", "messages[0].role",
       "not 'tool'"},
      {R"({"model": "tiny", "messages": [{"role": "user"}]})", "messages[0].content", "missing"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "must be a string or a list of content parts"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url",
           "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0].type", "only text parts are supported, not image_url"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       "messages[0].content[0].text", "must be a string"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": ["x"]}]})",
       "messages[0].content[0]", "must be a content part"},
      {R"({"model": "tiny", "messages": [{"role": "assistant", "content": null,
           "tool_calls": [{"id": "1"}]}]})",
       "messages[0].tool_calls", "not supported"},
      {Chat(R"("n": 2)"), "n", "n must be 1"},
      {Chat(R"("n": "1")"), "n", "n must be an integer, not a string"},
      {Chat(R"("temperature": 3)"), "temperature", "at most 2, got 3"},
      {Chat(R"("temperature": -0.5)"), "temperature", "at least 0"},
      {Chat(R"("temperature": "hot")"), "temperature", "must be a number, not a string"},
      {Chat(R"("top_p": 0)"), "top_p", "above 0"},
      {Chat(R"("top_p": 1.5)"), "top_p", "at most 1"},
      {Chat(R"("presence_penalty": 2.5)"), "presence_penalty", "at most 2"},
      {Chat(R"("frequency_penalty": -3)"), "frequency_penalty", "at least -2"},
      {Chat(R"("seed": 1.5)"), "seed", "must be an integer, not a fractional number"},
      {Chat(R"("seed": 18446744073709551615)"), "seed", "out of range"},
      {Chat(R"("stop": 5)"), "stop", "a string or a list of strings"},
      {Chat(R"("stop": "")"), "stop", "empty"},
      {Chat(R"("stop": [1])"), "stop[0]", "must be a string"},
      {Chat(R"("stop": ["a", ""])"), "stop[1]", "empty"},
      {Chat(R"("logit_bias": {"50256": -100})"), "logit_bias", "not supported"},
      {Chat(R"("logit_bias": [1])"), "logit_bias", "must be an object"},
      {Chat(R"("stream": "yes")"), "stream", "must be a boolean"},
      {Chat(R"("stream_options": {"include_usage": true})"), "stream_options",
       "only allowed when stream is true"},
      {Chat(R"("stream": true, "stream_options": 1)"), "stream_options", "must be an object"},
      {Chat(R"("stream": true, "stream_options": {"include_usage": 1})"),
       "stream_options.include_usage", "must be a boolean"},
      {Chat(R"("stream": true, "stream_options": {"tokens_per_chunk": 0})"),
       "stream_options.tokens_per_chunk", "must be 1 to 4096, got 0"},
      {Chat(R"("stream": true, "stream_options": {"tokens_per_chunk": "8"})"),
       "stream_options.tokens_per_chunk", "must be an integer"},
      {Chat(R"("stream": true, "stream_options": {"interval_ms": 5})"),
       "stream_options.interval_ms", "must be 10 to 10000, got 5"},
      {Chat(R"("stream": true, "stream_options": {"pad_to": 70000})"),
       "stream_options.pad_to", "must be 1 to 65536, got 70000"},
      {Chat(R"("stream": true, "stream_options": {"interval_ms": 2.5})"),
       "stream_options.interval_ms", "must be an integer"},
      {Chat(R"("max_tokens": 0)"), "max_tokens", "at least 1"},
      {Chat(R"("max_completion_tokens": -1)"), "max_completion_tokens", "at least 1"},
      {Chat(R"("max_tokens": "5")"), "max_tokens", "must be an integer"},
      {Chat(R"("logprobs": "yes")"), "logprobs", "must be a boolean"},
      {Chat(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs", "between 0 and 20"},
      {Chat(R"("top_logprobs": 2)"), "top_logprobs", "needs logprobs to be true"},
      {Chat(R"("response_format": {"type": "json_object"})"), "response_format",
       "json_object is not supported"},
      {Chat(R"("response_format": "json")"), "response_format", "must be an object"},
      {Chat(R"("response_format": {})"), "response_format.type", "must be a string"},
      {Chat(R"("tools": [{"type": "function"}])"), "tools", "no tool calling"},
      {Chat(R"("tools": {})"), "tools", "must be a list"},
      {Chat(R"("functions": [{"name": "f"}])"), "functions", "no tool calling"},
      {Chat(R"("modalities": ["text", "audio"])"), "modalities", "only text"},
      {Chat(R"("audio": {"voice": "alloy"})"), "audio", "only text"},
      {Chat(R"("top_k": -2)"), "top_k", "got -2"},
      {Chat(R"("min_p": 1.5)"), "min_p", "at most 1"},
      {Chat(R"("repetition_penalty": 0)"), "repetition_penalty", "above 0"},
      {Chat(R"("ignore_eos": 1)"), "ignore_eos", "must be a boolean"},
  };
  for (const BadCase& bad : cases) ExpectRefused(ParseChatCompletionRequest(bad.body), bad);
}

// ---- /v1/completions. ----

TEST(OpenAiCompletionRequest, EachShapeOfPromptMapsToTextOrIds) {
  absl::StatusOr<GenerationCall> text =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": "The meaning of life is"})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->endpoint, Endpoint::kCompletions);
  EXPECT_EQ(text->request.text(), "The meaning of life is");
  EXPECT_EQ(text->request.max_tokens(), 16u);  // OpenAI's default

  absl::StatusOr<GenerationCall> ids =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": [2043, 316], "max_tokens": 48})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(
      std::vector<int32_t>(ids->request.ids().ids().begin(), ids->request.ids().ids().end()),
      ::testing::ElementsAre(2043, 316));
  EXPECT_EQ(ids->request.max_tokens(), 48u);

  absl::StatusOr<GenerationCall> one_text =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": ["Hello"]})");
  ASSERT_TRUE(one_text.ok()) << one_text.status();
  EXPECT_EQ(one_text->request.text(), "Hello");
  absl::StatusOr<GenerationCall> one_ids =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": [[1, 2, 3]]})");
  ASSERT_TRUE(one_ids.ok()) << one_ids.status();
  EXPECT_EQ(one_ids->request.ids().ids_size(), 3);
}

TEST(OpenAiCompletionRequest, LogprobsIsTheNumberOfAlternatives) {
  absl::StatusOr<GenerationCall> three =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "logprobs": 3, "echo": false,
                                 "suffix": null, "best_of": 1, "user": "u"})");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_TRUE(three->request.sampling().logprobs());
  EXPECT_EQ(three->request.sampling().top_logprobs(), 3);
  absl::StatusOr<GenerationCall> zero =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "logprobs": 0})");
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->request.sampling().logprobs());
  EXPECT_EQ(zero->request.sampling().top_logprobs(), 0);
}

TEST(OpenAiCompletionRequest, EveryBadFieldIsRefusedByName) {
  const std::vector<BadCase> cases = {
      {R"({"model": "tiny"})", "prompt", "prompt is missing"},
      {R"({"model": "tiny", "prompt": 5})", "prompt", "a string or a list of token ids"},
      {R"({"model": "tiny", "prompt": []})", "prompt", "empty list"},
      {R"({"model": "tiny", "prompt": ["a", "b"]})", "prompt", "holds 2 prompts"},
      {R"({"model": "tiny", "prompt": [1, "a"]})", "prompt[1]", "must be a token id"},
      {R"({"model": "tiny", "prompt": [-1]})", "prompt[0]", "not a token id"},
      {R"({"model": "tiny", "prompt": [4294967296]})", "prompt[0]", "not a token id"},
      {R"({"model": "tiny", "prompt": [[]]})", "prompt[0]", "empty list"},
      {R"({"model": "tiny", "prompt": [[1, 2.5]]})", "prompt[0][1]", "fractional"},
      {R"({"model": "tiny", "prompt": "x", "logprobs": 21})", "logprobs", "between 0 and 20"},
      {R"({"model": "tiny", "prompt": "x", "logprobs": true})", "logprobs",
       "must be an integer, not a boolean"},
      {R"({"model": "tiny", "prompt": "x", "echo": true})", "echo", "not supported"},
      {R"({"model": "tiny", "prompt": "x", "suffix": "end"})", "suffix", "not supported"},
      {R"({"model": "tiny", "prompt": "x", "best_of": 2})", "best_of", "best_of must be 1"},
      {R"({"model": "tiny", "prompt": "x", "n": 3})", "n", "n must be 1"},
      {R"({"model": "tiny", "prompt": "x", "max_tokens": 0})", "max_tokens", "at least 1"},
      {R"({"model": "tiny", "prompt": "x", "temperature": 2.5})", "temperature", "at most 2"},
  };
  for (const BadCase& bad : cases) ExpectRefused(ParseCompletionRequest(bad.body), bad);
}

// ---- /v1/embeddings. ----

TEST(OpenAiEmbeddingRequest, TokenIdsMakeRows) {
  absl::StatusOr<EmbeddingCall> one =
      ParseEmbeddingRequest(R"({"model": "bert", "input": [5, 6, 7]})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->model, "bert");
  ASSERT_EQ(one->rows.size(), 1u);
  EXPECT_THAT(one->rows[0], ::testing::ElementsAre(5, 6, 7));
  EXPECT_FALSE(one->base64);
  absl::StatusOr<EmbeddingCall> two = ParseEmbeddingRequest(
      R"({"model": "bert", "input": [[1, 2], [3]], "encoding_format": "base64", "user": "x"})");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->rows.size(), 2u);
  EXPECT_THAT(two->rows[1], ::testing::ElementsAre(3));
  EXPECT_TRUE(two->base64);
}

TEST(OpenAiEmbeddingRequest, EveryBadFieldIsRefusedByName) {
  const std::vector<BadCase> cases = {
      {R"({"model": "bert"})", "input", "input is missing"},
      {R"({"input": [1]})", "model", "model is missing"},
      {R"({"model": "bert", "input": "some text"})", "input", "has no tokenizer"},
      {R"({"model": "bert", "input": ["a", "b"]})", "input[0]", "has no tokenizer"},
      {R"({"model": "bert", "input": 5})", "input", "must be a list of token ids"},
      {R"({"model": "bert", "input": []})", "input", "empty list"},
      {R"({"model": "bert", "input": [[]]})", "input[0]", "empty list"},
      {R"({"model": "bert", "input": [[1, 2], {"a": 1}]})", "input[1]",
       "must be a list of token ids"},
      {R"({"model": "bert", "input": [[1, "x"]]})", "input[0][1]", "must be a token id"},
      {R"({"model": "bert", "input": [1.5]})", "input[0]", "fractional"},
      {R"({"model": "bert", "input": [1, [2]]})", "input[1]", "must be a token id"},
      {R"({"model": "bert", "input": [1], "encoding_format": "int8"})", "encoding_format",
       "\"float\" or \"base64\""},
      {R"({"model": "bert", "input": [1], "dimensions": 64})", "dimensions", "not supported"},
  };
  for (const BadCase& bad : cases) {
    absl::StatusOr<EmbeddingCall> call = ParseEmbeddingRequest(bad.body);
    ASSERT_FALSE(call.ok()) << bad.body;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ParamOf(call.status()), bad.param) << bad.body;
    EXPECT_THAT(std::string(call.status().message()), HasSubstr(bad.message)) << bad.body;
  }
}

api::ModelInfo Encoder() {
  api::ModelInfo model;
  model.set_name("bert");
  model.set_kind(api::MODEL_KIND_ONNX);
  model.set_digest("ab12");
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids"}) {
    api::TensorInfo& input = *model.add_inputs();
    input.set_name(name);
    input.set_datatype("INT64");
  }
  model.add_outputs()->set_name("last_hidden_state");
  model.add_outputs()->set_name("sentence_embedding");
  return model;
}

std::vector<int64_t> Int64s(const api::Tensor& tensor) {
  std::vector<int64_t> values(tensor.raw().size() / sizeof(int64_t));
  std::memcpy(values.data(), tensor.raw().data(), values.size() * sizeof(int64_t));
  return values;
}

TEST(OpenAiEmbeddings, OnlyTokenIdEncodersWithASentenceEmbeddingServe) {
  EXPECT_TRUE(IsEmbeddingModel(Encoder()));
  api::ModelInfo llm;
  llm.set_kind(api::MODEL_KIND_LLM);
  EXPECT_FALSE(IsEmbeddingModel(llm));
  api::ModelInfo extra_input = Encoder();
  extra_input.add_inputs()->set_name("pixel_values");
  EXPECT_FALSE(IsEmbeddingModel(extra_input));
  api::ModelInfo no_embedding = Encoder();
  no_embedding.mutable_outputs()->RemoveLast();
  EXPECT_FALSE(IsEmbeddingModel(no_embedding));
  api::ModelInfo float_ids = Encoder();
  float_ids.mutable_inputs(0)->set_datatype("FP32");
  EXPECT_FALSE(IsEmbeddingModel(float_ids));
}

TEST(OpenAiEmbeddings, RowsArePaddedWithAMaskAndZeroTypeIds) {
  absl::StatusOr<std::vector<api::Tensor>> inputs = EmbeddingInputs(Encoder(), {{7, 8, 9}, {4}});
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->size(), 3u);
  for (const api::Tensor& t : *inputs) {
    EXPECT_EQ(t.datatype(), "INT64");
    EXPECT_THAT(std::vector<int64_t>(t.shape().begin(), t.shape().end()),
                ::testing::ElementsAre(2, 3));
  }
  EXPECT_EQ((*inputs)[0].name(), "input_ids");
  EXPECT_THAT(Int64s((*inputs)[0]), ::testing::ElementsAre(7, 8, 9, 4, 0, 0));
  EXPECT_THAT(Int64s((*inputs)[1]), ::testing::ElementsAre(1, 1, 1, 1, 0, 0));
  EXPECT_THAT(Int64s((*inputs)[2]), ::testing::ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_FALSE(EmbeddingInputs(Encoder(), {{1}, {}}).ok());
}

api::Tensor SentenceEmbedding(const std::vector<float>& values, int64_t rows) {
  api::Tensor tensor;
  tensor.set_name("sentence_embedding");
  tensor.set_datatype("FP32");
  tensor.add_shape(rows);
  tensor.add_shape(static_cast<int64_t>(values.size()) / rows);
  tensor.set_raw(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return tensor;
}

TEST(OpenAiEmbeddings, TheResponseHasOpenAIsShapeInFloatsOrBase64) {
  EmbeddingCall call;
  call.model = "bert";
  call.rows = {{1, 2, 3}, {4}};
  const std::vector<float> values = {0.5f, -1.0f, 0.25f, 2.0f};
  absl::StatusOr<std::string> body = EmbeddingResponseJson(call, {SentenceEmbedding(values, 2)});
  ASSERT_TRUE(body.ok()) << body.status();
  json doc = json::parse(*body);
  EXPECT_EQ(doc["object"], "list");
  EXPECT_EQ(doc["model"], "bert");
  ASSERT_EQ(doc["data"].size(), 2u);
  EXPECT_EQ(doc["data"][1]["object"], "embedding");
  EXPECT_EQ(doc["data"][1]["index"], 1);
  EXPECT_EQ(doc["data"][0]["embedding"].get<std::vector<float>>(),
            (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(doc["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(doc["usage"]["total_tokens"], 4);

  call.base64 = true;
  body = EmbeddingResponseJson(call, {SentenceEmbedding(values, 2)});
  ASSERT_TRUE(body.ok());
  doc = json::parse(*body);
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(doc["data"][1]["embedding"].get<std::string>(), &bytes));
  ASSERT_EQ(bytes.size(), 2 * sizeof(float));
  float second[2];
  std::memcpy(second, bytes.data(), bytes.size());
  EXPECT_EQ(second[0], 0.25f);
  EXPECT_EQ(second[1], 2.0f);

  // The wrong number of rows is the appliance's fault, not the caller's.
  absl::StatusOr<std::string> wrong = EmbeddingResponseJson(call, {SentenceEmbedding(values, 1)});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(EmbeddingResponseJson(call, {}).status().code(), absl::StatusCode::kInternal);
}

// ---- /v1/models. ----

TEST(OpenAiModels, TheListHasOpenAIsShapeAndCloistersFacts) {
  api::ModelInfo llm;
  llm.set_name("tiny");
  llm.set_kind(api::MODEL_KIND_LLM);
  llm.set_digest("cd34");
  api::ModelInfo published = llm;
  published.set_name("shared");
  published.set_published(true);
  api::ModelInfo other;
  other.set_name("cls");
  other.set_kind(api::MODEL_KIND_ONNX);
  json doc = json::parse(ModelListJson({llm, Encoder(), published, other}, "acme", "99ff"));
  EXPECT_EQ(doc["object"], "list");
  ASSERT_EQ(doc["data"].size(), 4u);
  const json& first = doc["data"][0];
  EXPECT_EQ(first["id"], "tiny");
  EXPECT_EQ(first["object"], "model");
  EXPECT_TRUE(first["created"].is_number_integer());
  EXPECT_EQ(first["owned_by"], "acme");
  EXPECT_EQ(first["cloister"]["digest"], "cd34");
  EXPECT_EQ(first["cloister"]["kind"], "llm");
  EXPECT_EQ(first["cloister"]["published"], false);
  EXPECT_EQ(first["cloister"]["measurement"], "99ff");
  EXPECT_EQ(first["cloister"]["endpoints"],
            json::array({"/v1/chat/completions", "/v1/completions"}));
  EXPECT_EQ(doc["data"][1]["cloister"]["kind"], "onnx");
  EXPECT_EQ(doc["data"][1]["cloister"]["endpoints"], json::array({"/v1/embeddings"}));
  EXPECT_EQ(doc["data"][2]["owned_by"], "operator");
  EXPECT_EQ(doc["data"][2]["cloister"]["published"], true);
  EXPECT_TRUE(doc["data"][3]["cloister"]["endpoints"].empty());
  EXPECT_EQ(json::parse(ModelJson(llm, "acme", "99ff")), first);
}

// ---- Errors. ----

TEST(OpenAiErrors, TheBodyIsOpenAIsErrorObject) {
  ApiError error;
  error.http_status = 400;
  error.type = "invalid_request_error";
  error.message = "temperature must be ...";
  json doc = json::parse(ErrorBody(error));
  ASSERT_TRUE(doc.contains("error"));
  EXPECT_EQ(doc["error"]["message"], "temperature must be ...");
  EXPECT_EQ(doc["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(doc["error"]["param"].is_null());
  EXPECT_TRUE(doc["error"]["code"].is_null());
  error.param = "temperature";
  error.code = "x";
  doc = json::parse(ErrorBody(error));
  EXPECT_EQ(doc["error"]["param"], "temperature");
  EXPECT_EQ(doc["error"]["code"], "x");
}

TEST(OpenAiErrors, EachStatusHasItsHttpAnswer) {
  struct Case {
    absl::Status status;
    int http;
    std::string code;
  };
  const std::vector<Case> cases = {
      {InvalidField("top_p", "top_p must be ..."), 400, ""},
      {absl::OutOfRangeError("prompt past the context"), 400, ""},
      {absl::NotFoundError("model not found"), 404, "model_not_found"},
      {absl::ResourceExhaustedError("at its limit"), 429, "rate_limit_exceeded"},
      {proto::WithReason(absl::ResourceExhaustedError("queue full"), api::OVERLOADED), 429,
       "rate_limit_exceeded"},
      {proto::WithReason(absl::ResourceExhaustedError("over the quota"), api::QUOTA_EXCEEDED), 429,
       "insufficient_quota"},
      {proto::WithReason(absl::ResourceExhaustedError("over the burst"), api::TOO_LARGE), 400,
       "request_too_large"},
      {absl::FailedPreconditionError("attestation failed: cvm.measurement: differs"), 503,
       "attestation_failed"},
      {absl::FailedPreconditionError("the model is not an LLM"), 400, ""},
      {absl::UnavailableError("cloisterd is down"), 503, "service_unavailable"},
      {absl::DeadlineExceededError("too slow"), 504, "timeout"},
      {absl::PermissionDeniedError("not yours"), 403, "permission_denied"},
      {absl::UnauthenticatedError("bad token"), 502, "upstream_unauthenticated"},
      {absl::DataLossError("a chunk did not open"), 502, "stream_integrity"},
      {absl::InternalError("oops"), 500, ""},
  };
  for (const Case& c : cases) {
    ApiError error = ApiErrorFromStatus(c.status, "tiny");
    EXPECT_EQ(error.http_status, c.http) << c.status;
    EXPECT_EQ(error.code, c.code) << c.status;
    EXPECT_EQ(error.retry_after_seconds, c.code == "rate_limit_exceeded" ? 1 : 0) << c.status;
    EXPECT_FALSE(error.message.empty());
  }
  EXPECT_EQ(ApiErrorFromStatus(InvalidField("top_p", "x"), "").param, "top_p");
  ApiError not_found = ApiErrorFromStatus(absl::NotFoundError("model not found"), "tiny");
  EXPECT_THAT(not_found.message, HasSubstr("'tiny' does not exist"));
  EXPECT_EQ(not_found.param, "model");
  ApiError attestation = ApiErrorFromStatus(
      absl::FailedPreconditionError("attestation failed: cvm.measurement: differs"), "tiny");
  EXPECT_THAT(attestation.message, HasSubstr("cvm.measurement: differs"));
}

// ---- Generation responses. ----

GenerateResult Result() {
  GenerateResult result;
  result.ids = {5, 6};
  result.text = "Hello";
  result.finish_reason = "length";
  result.usage.set_prompt_tokens(10);
  result.usage.set_cached_tokens(4);
  result.usage.set_completion_tokens(2);
  result.receipt = "receipt-bytes";
  result.receipt_signature = "signature-bytes";
  return result;
}

std::vector<api::SampledTokenInfo> Tokens() {
  std::vector<api::SampledTokenInfo> tokens(2);
  tokens[0].set_id(5);
  tokens[0].set_logprob(-0.5f);
  api::TokenLogprob* alt = tokens[0].add_top();
  alt->set_id(9);
  alt->set_logprob(-1.5f);
  tokens[1].set_id(6);
  tokens[1].set_logprob(-0.25f);
  return tokens;
}

TEST(OpenAiResponses, AChatCompletionHasItsMessageUsageAndReceipt) {
  absl::StatusOr<GenerationCall> call = ParseChatCompletionRequest(Chat(""));
  ASSERT_TRUE(call.ok());
  json doc = json::parse(
      CompletionResponseJson(*call, {"chatcmpl-1", 1700000000, "tiny"}, Result(), Tokens()));
  EXPECT_EQ(doc["id"], "chatcmpl-1");
  EXPECT_EQ(doc["object"], "chat.completion");
  EXPECT_EQ(doc["created"], 1700000000);
  EXPECT_EQ(doc["model"], "tiny");
  ASSERT_EQ(doc["choices"].size(), 1u);
  EXPECT_EQ(doc["choices"][0]["index"], 0);
  EXPECT_EQ(doc["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(doc["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(doc["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(doc["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(doc["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(doc["usage"]["completion_tokens"], 2);
  EXPECT_EQ(doc["usage"]["total_tokens"], 12);
  EXPECT_EQ(doc["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(doc["cloister"]["receipt"], absl::Base64Escape("receipt-bytes"));
  EXPECT_EQ(doc["cloister"]["receipt_signature"], absl::Base64Escape("signature-bytes"));
}

TEST(OpenAiResponses, LogprobsNameTokensByTheirIds) {
  absl::StatusOr<GenerationCall> chat =
      ParseChatCompletionRequest(Chat(R"("logprobs": true, "top_logprobs": 1)"));
  ASSERT_TRUE(chat.ok());
  json doc = json::parse(CompletionResponseJson(*chat, {"c", 1, "tiny"}, Result(), Tokens()));
  const json& content = doc["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "token_id:5");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.5f);
  EXPECT_TRUE(content[0]["bytes"].is_null());
  ASSERT_EQ(content[0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "token_id:9");

  absl::StatusOr<GenerationCall> completion =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "logprobs": 1})");
  ASSERT_TRUE(completion.ok());
  doc = json::parse(CompletionResponseJson(*completion, {"c", 1, "tiny"}, Result(), Tokens()));
  EXPECT_EQ(doc["object"], "text_completion");
  EXPECT_EQ(doc["choices"][0]["text"], "Hello");
  const json& logprobs = doc["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["tokens"], json::array({"token_id:5", "token_id:6"}));
  EXPECT_FLOAT_EQ(logprobs["token_logprobs"][1].get<float>(), -0.25f);
  EXPECT_FLOAT_EQ(logprobs["top_logprobs"][0]["token_id:9"].get<float>(), -1.5f);
}

// The events of one stream, parsed (the "[DONE]" marker as the string "[DONE]").
std::vector<json> Events(const std::string& text) {
  std::vector<json> events;
  size_t at = 0;
  while (at < text.size()) {
    EXPECT_EQ(text.compare(at, 6, "data: "), 0) << text.substr(at);
    const size_t end = text.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    const std::string data = text.substr(at + 6, end - at - 6);
    events.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    at = end + 2;
  }
  return events;
}

api::GenerateChunk TextChunk(const std::string& text, int32_t id) {
  api::GenerateChunk chunk;
  chunk.set_text(text);
  chunk.add_tokens()->set_id(id);
  return chunk;
}

api::GenerateChunk FinalChunk() {
  api::GenerateChunk chunk;
  chunk.set_finish_reason("stop");
  chunk.mutable_usage()->set_prompt_tokens(3);
  chunk.mutable_usage()->set_completion_tokens(2);
  chunk.set_receipt("r");
  chunk.set_receipt_signature("s");
  return chunk;
}

TEST(OpenAiStream, AChatStreamOpensWithTheRoleAndEndsWithUsageAndDone) {
  absl::StatusOr<GenerationCall> call = ParseChatCompletionRequest(
      Chat(R"("stream": true, "stream_options": {"include_usage": true})"));
  ASSERT_TRUE(call.ok());
  StreamEncoder encoder(*call, {"chatcmpl-9", 5, "tiny"});
  std::string text = encoder.OnChunk(TextChunk("He", 1));
  text += encoder.OnChunk(TextChunk("", 2));  // a token with no whole character yet: no event
  text += encoder.OnChunk(TextChunk("llo", 3));
  text += encoder.OnChunk(FinalChunk());
  std::vector<json> events = Events(text);
  ASSERT_EQ(events.size(), 6u) << text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["id"], "chatcmpl-9");
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(events[i]["created"], 5);
    EXPECT_EQ(events[i]["model"], "tiny");
  }
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(events[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "llo");
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(events[3]["choices"][0]["delta"].empty());
  EXPECT_FALSE(events[3].contains("cloister"));
  EXPECT_TRUE(events[4]["choices"].empty());
  EXPECT_EQ(events[4]["usage"]["total_tokens"], 5);
  EXPECT_EQ(events[4]["cloister"]["receipt"], absl::Base64Escape("r"));
  EXPECT_EQ(events[4]["cloister"]["receipt_signature"], absl::Base64Escape("s"));
  EXPECT_EQ(events[5], "[DONE]");
}

TEST(OpenAiStream, WithoutUsageTheFinishEventCarriesTheReceipt) {
  absl::StatusOr<GenerationCall> call =
      ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "stream": true, "logprobs": 0})");
  ASSERT_TRUE(call.ok());
  StreamEncoder encoder(*call, {"cmpl-1", 5, "tiny"});
  api::GenerateChunk last = FinalChunk();
  last.set_text("!");
  last.add_tokens()->set_id(7);
  std::vector<json> events = Events(encoder.OnChunk(TextChunk("", 4)) + encoder.OnChunk(last));
  // With logprobs a token without text still has its event.
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0]["object"], "text_completion");
  EXPECT_EQ(events[0]["choices"][0]["text"], "");
  EXPECT_EQ(events[0]["choices"][0]["logprobs"]["tokens"], json::array({"token_id:4"}));
  EXPECT_EQ(events[1]["choices"][0]["text"], "!");
  EXPECT_EQ(events[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[2]["cloister"]["receipt"], absl::Base64Escape("r"));
  EXPECT_EQ(events[3], "[DONE]");
}

TEST(OpenAiStream, AnErrorAfterTheStartIsAnErrorEvent) {
  ApiError error = ApiErrorFromStatus(absl::DataLossError("chunk 3 did not open"), "tiny");
  std::vector<json> events = Events(StreamEncoder::OnError(error));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["error"]["message"], "chunk 3 did not open");
  EXPECT_EQ(events[0]["error"]["code"], "stream_integrity");
}

}  // namespace
}  // namespace cloister::sdk::proxy
