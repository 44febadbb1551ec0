// `cloister proxy` against the real appliance (cloisterd + cloister-enclave from the build),
// as tenants' OpenAI apps use it. Each test starts the appliance with three tenants (acme; solo,
// whose cloisterd limit is one generation at once; metered, with a token bucket of 60) and the
// shared tiny LLM published by the operator as "shared-tiny", uploads the same model ("tiny")
// for each tenant and the BERT encoder ("bert") for acme with the `cloister` CLI, and starts one
// proxy per tenant on port 0 with an API key. Then:
// - the official `openai` npm package (openai_client_test.mjs; skipped when
//   install-openai.sh has not installed it) lists models, gets every reference generation of the
//   tiny model at temperature 0, streamed and not, chat and plain, computes embeddings equal to
//   the BERT reference, meets every error, runs eight streams at once, and drops streams midway;
// - curl (Debian's) does the same core with raw HTTP and checks the error objects, overload
//   (429 with Retry-After) included;
// - a caller that drops its connection mid-stream cancels the generation: the slot frees at
//   once and the enclave's signed receipt counts fewer tokens than were asked for;
// - a canary string sent in prompts appears in no log of the proxy or the appliance and in no
//   file of the data dir;
// - a policy the appliance fails stops the proxy at start (exit 1, naming the failed check);
//   an appliance gone is 503; SIGTERM and SIGINT stop the proxy with exit status 0.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/bytes.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "gtest/gtest.h"
#include "host/tenants/tenant_registry.h"
#include "nlohmann/json.hpp"
#include "sdk/model_dir.h"
#include "tests/support/appliance.h"
#include "tests/support/http.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tensor_files.h"

namespace cloister::testing {
namespace {

using json = nlohmann::json;

const std::string kShared = CLOISTER_SHARED_DIR;
const std::string kTinyLlama = kShared + "/models/llm/tiny-llama";
const std::string kBert = kShared + "/models/bert_mini/bert_mini_l4_h256.onnx";
const std::string kBertData = kShared + "/models/testdata/bert_mini_l4_h256/test_data_set_0";
constexpr char kApiKey[] = "sk-cloister-proxy-test";
constexpr char kCanary[] = "CANARY-7f3a9c2e-PROXY-PROMPT";

// acme uses the appliance freely; solo may run one generation at once; metered has a token
// bucket of 60 refilled at 0.5 a second.
const std::vector<std::string> kTenants = {"acme", "solo", "metered"};

std::string TokenOf(const std::string& tenant) { return "token-of-" + tenant; }

struct Http {
  int status = 0;
  std::string headers;
  std::string body;
  json doc;  // the body parsed, when it is JSON
};

// A running `cloister proxy`.
struct Proxy {
  std::unique_ptr<Process> process;
  std::string base_url;   // http://127.0.0.1:PORT/v1
  std::string host_port;  // 127.0.0.1:PORT
};

class OpenAiProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-openai-proxy");
    const std::string config = work_ + "/cloisterd.yaml";
    {
      std::ofstream out(config);
      // The operator publishes the tiny model too, for every tenant, as "shared-tiny".
      auto package = sdk::PackModelDir(kTinyLlama, uint64_t{256} << 20);
      ASSERT_TRUE(package.ok()) << package.status();
      out << "operator:\n  listen: 127.0.0.1:0\n";
      out << "published_models:\n  - name: shared-tiny\n    file: " << kTinyLlama
          << "\n    digest: " << HexEncode(crypto::Sha256(*package)) << "\n";
      out << "tenants:\n";
      for (const std::string& tenant : kTenants) {
        out << "  - id: " << tenant
            << "\n    token_sha256: " << HexEncode(host::TokenHash(TokenOf(tenant))) << "\n";
        if (tenant == "solo") out << "    max_generations: 1\n";
        if (tenant == "metered") out << "    tokens_per_second: 0.5\n    token_burst: 60\n";
        std::ofstream(work_ + "/" + tenant + ".token") << TokenOf(tenant) << "\n";
      }
    }
    std::ofstream(work_ + "/api.key") << kApiKey << "\n";
    appliance_ = std::make_unique<Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                             std::vector<std::string>{"--config", config});
    ASSERT_TRUE(appliance_->Start().ok());
    auto text = ReadFile(kTinyLlama + "/reference.json", 16 << 20);
    ASSERT_TRUE(text.ok()) << text.status();
    references_ = json::parse(*text);

    for (const std::string& tenant : kTenants) {
      ASSERT_EQ(Cli(tenant, {"keygen"}).exit_code, 0);
      RunResult tiny = Cli(tenant, {"upload", "--model", kTinyLlama, "--name", "tiny"});
      ASSERT_EQ(tiny.exit_code, 0) << tiny.err;
    }
    RunResult bert = Cli("acme", {"upload", "--model", kBert, "--name", "bert"});
    ASSERT_EQ(bert.exit_code, 0) << bert.err;
    for (const std::string& tenant : kTenants) {
      ASSERT_NO_FATAL_FAILURE(StartProxy(tenant, proxies_[tenant]));
    }
  }

  void TearDown() override {
    for (auto& [tenant, proxy] : proxies_) {
      if (proxy.process) proxy.process->Stop(SIGTERM);
    }
  }

  std::map<std::string, std::string> Env(const std::string& tenant,
                                         const std::string& policy = "") const {
    return {
        {"CLOISTER_SERVER", appliance_->address()},
        {"CLOISTER_POLICY", policy.empty() ? appliance_->data_dir() + "/dev-policy.yaml" : policy},
        {"CLOISTER_TENANT", tenant},
        {"CLOISTER_TOKEN_FILE", work_ + "/" + tenant + ".token"},
        {"CLOISTER_KEY", work_ + "/" + tenant + ".key"}};
  }

  RunResult Cli(const std::string& tenant, std::vector<std::string> args) {
    args.insert(args.begin(), CLOISTER_CLI_BINARY);
    return testing::Run(args, Env(tenant), absl::Seconds(120));
  }

  void StartProxy(const std::string& tenant, Proxy& proxy, const std::string& policy = "") {
    proxy.process = std::make_unique<Process>(
        std::vector<std::string>{CLOISTER_CLI_BINARY, "proxy", "--listen", "127.0.0.1:0",
                                 "--api-key-file", work_ + "/api.key"},
        MakeTempDir("cloister-proxy-log"), Env(tenant, policy));
    const std::string line =
        proxy.process->WaitForStdout("cloister proxy listening on ", absl::Seconds(60));
    ASSERT_FALSE(line.empty()) << proxy.process->Stderr();
    proxy.base_url = line.substr(line.rfind(' ') + 1);
    ASSERT_TRUE(absl::StartsWith(proxy.base_url, "http://127.0.0.1:")) << line;
    ASSERT_TRUE(absl::EndsWith(proxy.base_url, "/v1")) << line;
    proxy.host_port = proxy.base_url.substr(7, proxy.base_url.size() - 7 - 3);
    EXPECT_NE(proxy.host_port, "127.0.0.1:0");  // the real port
  }

  // One HTTP request with curl; `key` empty sends no Authorization header.
  Http Request(const std::string& method, const std::string& path, const std::string& body = "",
               const std::string& tenant = "acme", const std::string& key = kApiKey) {
    const std::string headers = work_ + "/headers.txt";
    const std::string out = work_ + "/body.txt";
    std::vector<std::string> argv = {CURL_BINARY, "-sS", "-X", method, "-D",
                                     headers,     "-o",  out,  "-w",   "%{http_code}"};
    if (!key.empty()) argv.insert(argv.end(), {"-H", absl::StrCat("Authorization: Bearer ", key)});
    if (!body.empty()) {
      argv.insert(argv.end(), {"-H", "Content-Type: application/json", "--data-binary", body});
    }
    argv.push_back(absl::StrCat("http://", proxies_[tenant].host_port, path));
    RunResult ran = testing::Run(argv, {}, absl::Seconds(120));
    Http http;
    EXPECT_EQ(ran.exit_code, 0) << ran.err;
    http.status = std::atoi(ran.out.c_str());
    http.headers = ReadWholeFile(headers);
    http.body = ReadWholeFile(out);
    http.doc = json::parse(http.body, nullptr, false);
    return http;
  }

  // Expects an OpenAI error object with this status, type-independent code and param.
  void ExpectError(const Http& http, int status, const std::string& code,
                   const std::string& param = "") {
    EXPECT_EQ(http.status, status) << http.body;
    ASSERT_TRUE(http.doc.is_object() && http.doc.contains("error")) << http.body;
    const json& error = http.doc["error"];
    EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
    EXPECT_TRUE(error["type"].is_string());
    ASSERT_TRUE(error.contains("param") && error.contains("code")) << http.body;
    if (code.empty()) {
      EXPECT_TRUE(error["code"].is_null()) << http.body;
    } else {
      EXPECT_EQ(error["code"], code) << http.body;
    }
    if (param.empty()) {
      EXPECT_TRUE(error["param"].is_null()) << http.body;
    } else {
      EXPECT_EQ(error["param"], param) << http.body;
    }
  }

  // The first reference prompt of `kind` ("chat" or "plain").
  const json& FirstOfKind(const std::string& kind) const {
    for (const json& prompt : references_["prompts"]) {
      if (prompt["kind"] == kind) return prompt;
    }
    ADD_FAILURE() << "no " << kind << " prompt";
    return references_;
  }

  // The signed receipts the host logged for `tenant`: each one's decoded completion tokens.
  std::vector<uint64_t> CompletionTokensOf(const std::string& tenant) const {
    std::vector<uint64_t> tokens;
    const std::string log = ReadWholeFile(appliance_->data_dir() + "/receipts/receipts.jsonl");
    for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
      json entry = json::parse(line, nullptr, false);
      if (entry.is_discarded() || entry["decoded"]["tenant_id"] != tenant) continue;
      const json& batch = entry["decoded"]["batch"];
      if (!batch.contains("sequences")) continue;  // not a generation
      tokens.push_back(batch.contains("completion_tokens")
                           ? std::stoull(batch["completion_tokens"].get<std::string>())
                           : 0);
    }
    return tokens;
  }

  // Solo's generations were one stream of 400 tokens, dropped by its caller, and short ones of
  // one token: the enclave's signed receipts show that the long one stopped early (the host
  // logs a receipt just after the slot frees: wait for it).
  void ExpectStreamCutShort() const {
    std::vector<uint64_t> tokens;
    int cut = 0;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(100))) {
      tokens = CompletionTokensOf("solo");
      cut = 0;
      for (uint64_t count : tokens) cut += count >= 2 ? 1 : 0;
      if (cut >= 1) break;
    }
    EXPECT_EQ(cut, 1) << tokens.size() << " receipts";
    for (uint64_t count : tokens) EXPECT_LT(count, 400u);
  }

  std::string work_;
  std::unique_ptr<Appliance> appliance_;
  json references_;
  std::map<std::string, Proxy> proxies_;
};

bool Installed(const std::string& path) { return std::filesystem::exists(path); }

TEST_F(OpenAiProxyTest, TheOpenAiNpmPackageDrivesTheProxy) {
  const std::string package = std::string(OPENAI_NODE_DIR) + "/node_modules/openai/package.json";
  if (std::string(NODE_BINARY).empty() || !Installed(package)) {
    GTEST_SKIP() << "the openai npm package is not installed: run " << OPENAI_INSTALL_SCRIPT << " "
                 << OPENAI_NODE_DIR;
  }
  // The BERT reference: rows of token ids (the attention mask says how long each is) and the
  // sentence embeddings the reference computed for them.
  std::string name;
  auto ids = ReadTensorProtoFile(kBertData + "/input_0.pb", &name);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(name, "input_ids");
  auto mask = ReadTensorProtoFile(kBertData + "/input_1.pb", &name);
  ASSERT_TRUE(mask.ok()) << mask.status();
  ASSERT_EQ(name, "attention_mask");
  auto expected = ReadTensorProtoFile(kBertData + "/output_1.pb", &name);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(name, "sentence_embedding");
  ASSERT_EQ(ids->shape.size(), 2u);
  const int64_t rows = ids->shape[0], columns = ids->shape[1];
  const int64_t dimensions = expected->shape[1];
  json cases = {{"rows", json::array()}, {"expected", json::array()}};
  for (int64_t r = 0; r < rows; ++r) {
    json row = json::array();
    for (int64_t c = 0; c < columns; ++c) {
      int64_t id, on;
      std::memcpy(&id, ids->data.data() + (r * columns + c) * 8, 8);
      std::memcpy(&on, mask->data.data() + (r * columns + c) * 8, 8);
      if (on != 0) row.push_back(id);
    }
    cases["rows"].push_back(row);
    json embedding = json::array();
    for (int64_t d = 0; d < dimensions; ++d) {
      float value;
      std::memcpy(&value, expected->data.data() + (r * dimensions + d) * 4, 4);
      embedding.push_back(value);
    }
    cases["expected"].push_back(embedding);
  }
  // The rows differ in length, so the proxy pads (and masks) the batch itself.
  ASSERT_NE(cases["rows"][0].size(), cases["rows"][1].size());
  std::ofstream(work_ + "/embeddings.json") << cases.dump();

  RunResult node = testing::Run({NODE_BINARY, OPENAI_TEST_SCRIPT},
                                {{"OPENAI_NODE_DIR", OPENAI_NODE_DIR},
                                 {"PROXY_URL", proxies_["acme"].base_url},
                                 {"SOLO_PROXY_URL", proxies_["solo"].base_url},
                                 {"METERED_PROXY_URL", proxies_["metered"].base_url},
                                 {"PROXY_KEY", kApiKey},
                                 {"REFERENCE_JSON", kTinyLlama + "/reference.json"},
                                 {"EMBEDDING_CASES", work_ + "/embeddings.json"},
                                 {"CANARY", kCanary},
                                 {"PATH", "/usr/bin:/bin"}},
                                absl::Seconds(600));
  std::cout << node.out;  // one line per check
  EXPECT_EQ(node.exit_code, 0) << node.out << node.err;
  EXPECT_NE(node.out.find("all checks passed"), std::string::npos) << node.out << node.err;

  // The stream the script dropped was cut short.
  ExpectStreamCutShort();
  // The canary went through the proxy; neither it nor the appliance logged it.
  EXPECT_EQ(proxies_["acme"].process->Stdout().find(kCanary), std::string::npos);
  EXPECT_EQ(proxies_["acme"].process->Stderr().find(kCanary), std::string::npos);
  EXPECT_EQ(appliance_->Logs().find(kCanary), std::string::npos);
}

TEST_F(OpenAiProxyTest, CurlGetsTheModelsAndTheReferenceGenerations) {
  Http models = Request("GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_NE(models.headers.find("application/json"), std::string::npos);
  ASSERT_EQ(models.doc["object"], "list");
  std::map<std::string, json> by_id;
  for (const json& model : models.doc["data"]) by_id[model["id"]] = model;
  ASSERT_EQ(by_id.count("tiny"), 1u) << models.body;
  ASSERT_EQ(by_id.count("bert"), 1u) << models.body;
  EXPECT_EQ(by_id["tiny"]["cloister"]["kind"], "llm");
  EXPECT_EQ(by_id["bert"]["cloister"]["kind"], "onnx");
  EXPECT_EQ(by_id["tiny"]["owned_by"], "acme");
  EXPECT_EQ(by_id["tiny"]["cloister"]["published"], false);
  // The operator's published model, after the tenant's own: same package, same digest.
  ASSERT_EQ(by_id.count("shared-tiny"), 1u) << models.body;
  EXPECT_EQ(models.doc["data"].back()["id"], "shared-tiny");
  EXPECT_EQ(by_id["shared-tiny"]["owned_by"], "operator");
  EXPECT_EQ(by_id["shared-tiny"]["cloister"]["published"], true);
  EXPECT_EQ(by_id["shared-tiny"]["cloister"]["kind"], "llm");
  EXPECT_EQ(by_id["shared-tiny"]["cloister"]["digest"], by_id["tiny"]["cloister"]["digest"]);
  // The measurement is the attested one (what `cloister attest` verifies).
  RunResult attest = Cli("acme", {"attest", "--json"});
  ASSERT_EQ(attest.exit_code, 0) << attest.err;
  json verdict = json::parse(attest.out);
  EXPECT_EQ(by_id["tiny"]["cloister"]["measurement"], verdict["claims"]["cvm.measurement"]);
  // The digest is the one the upload printed.
  RunResult listed = Cli("acme", {"models", "--json"});
  ASSERT_EQ(listed.exit_code, 0);
  for (const json& model : json::parse(listed.out)["models"]) {
    EXPECT_EQ(by_id[model["name"]]["cloister"]["digest"], model["digest"]);
  }

  const json& chat = FirstOfKind("chat");
  const int max_tokens = references_["generation"]["max_new_tokens"].get<int>();
  json body = {{"model", "tiny"},
               {"messages", chat["messages"]},
               {"temperature", 0},
               {"max_tokens", max_tokens}};
  Http completion = Request("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(completion.doc["object"], "chat.completion");
  EXPECT_EQ(completion.doc["choices"][0]["message"]["content"], chat["generated_text"]);
  EXPECT_EQ(completion.doc["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(completion.doc["usage"]["completion_tokens"], chat["generated_ids"].size());

  // Streamed: server-sent events ending with [DONE].
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Http stream = Request("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(stream.status, 200) << stream.body;
  EXPECT_NE(stream.headers.find("text/event-stream"), std::string::npos) << stream.headers;
  std::string text;
  std::vector<std::string> events = absl::StrSplit(stream.body, "\n\n", absl::SkipEmpty());
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "data: [DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    ASSERT_TRUE(absl::StartsWith(events[i], "data: ")) << events[i];
    json event = json::parse(events[i].substr(6));
    EXPECT_EQ(event["object"], "chat.completion.chunk");
    for (const json& choice : event["choices"]) {
      if (choice["delta"].contains("content"))
        text += choice["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(text, chat["generated_text"]);
  json last = json::parse(events[events.size() - 2].substr(6));
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], chat["generated_ids"].size());
  EXPECT_FALSE(last["cloister"]["receipt"].get<std::string>().empty());

  // The published model answers as the tenant's own copy does.
  body["model"] = "shared-tiny";
  body.erase("stream");
  body.erase("stream_options");
  Http shared = Request("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(shared.status, 200) << shared.body;
  EXPECT_EQ(shared.doc["model"], "shared-tiny");
  EXPECT_EQ(shared.doc["choices"][0]["message"]["content"], chat["generated_text"]);

  const json& plain = FirstOfKind("plain");
  Http text_completion = Request("POST", "/v1/completions",
                                 json({{"model", "tiny"},
                                       {"prompt", plain["text"]},
                                       {"temperature", 0},
                                       {"max_tokens", max_tokens}})
                                     .dump());
  ASSERT_EQ(text_completion.status, 200) << text_completion.body;
  EXPECT_EQ(text_completion.doc["choices"][0]["text"], plain["generated_text"]);
}

// stream_options.tokens_per_chunk (Cloister's own) reaches the enclave's stream shaping: the
// same text in fewer events.
TEST_F(OpenAiProxyTest, StreamOptionsShapeTheEnclavesChunks) {
  const json& chat = FirstOfKind("chat");
  const size_t generated = chat["generated_ids"].size();
  auto content_events = [&](const json& options, std::string& text) {
    json body = {{"model", "tiny"},     {"messages", chat["messages"]}, {"temperature", 0},
                 {"max_tokens", 64},    {"stream", true}};
    if (!options.is_null()) body["stream_options"] = options;
    Http stream = Request("POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(stream.status, 200) << stream.body;
    size_t count = 0;
    for (absl::string_view event : absl::StrSplit(stream.body, "\n\n", absl::SkipEmpty())) {
      if (event == "data: [DONE]" || !absl::StartsWith(event, "data: ")) continue;
      json doc = json::parse(event.substr(6));
      for (const json& choice : doc["choices"]) {
        if (choice["delta"].contains("content") &&
            !choice["delta"]["content"].get<std::string>().empty()) {
          text += choice["delta"]["content"].get<std::string>();
          ++count;
        }
      }
    }
    return count;
  };
  std::string every_token, by_eight;
  const size_t events_every_token = content_events(nullptr, every_token);
  const size_t events_by_eight = content_events({{"tokens_per_chunk", 8}}, by_eight);
  EXPECT_EQ(every_token, chat["generated_text"]);
  EXPECT_EQ(by_eight, chat["generated_text"]);
  EXPECT_GT(events_every_token, generated / 2) << "about one event per token";
  EXPECT_LE(events_by_eight, (generated + 7) / 8 + 1) << "at most one event per 8 tokens";

  // A bad value is a 400 naming the field, before anything is generated.
  Http bad = Request("POST", "/v1/chat/completions",
                     json({{"model", "tiny"}, {"messages", chat["messages"]}, {"stream", true},
                           {"stream_options", {{"interval_ms", 3}}}})
                         .dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.doc["error"]["param"], "stream_options.interval_ms") << bad.body;
}

TEST_F(OpenAiProxyTest, EveryErrorIsAnOpenAiErrorObject) {
  // No key, a wrong key.
  ExpectError(Request("GET", "/v1/models", "", "acme", ""), 401, "invalid_api_key");
  ExpectError(Request("GET", "/v1/models", "", "acme", "sk-wrong"), 401, "invalid_api_key");
  // Bad JSON, a field of the wrong type, a value the engine cannot do.
  ExpectError(Request("POST", "/v1/chat/completions", "{\"model\": "), 400, "");
  ExpectError(Request("POST", "/v1/chat/completions",
                      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                          "max_tokens": "many"})"),
              400, "", "max_tokens");
  ExpectError(Request("POST", "/v1/chat/completions",
                      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                          "n": 3})"),
              400, "", "n");
  ExpectError(Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x",
                                                     "echo": true})"),
              400, "", "echo");
  ExpectError(Request("POST", "/v1/embeddings", R"({"model": "bert", "input": "words"})"), 400, "",
              "input");
  // A model that does not exist, a path that does not either.
  ExpectError(Request("POST", "/v1/chat/completions",
                      R"({"model": "nope", "messages": [{"role": "user", "content": "x"}]})"),
              404, "model_not_found", "model");
  ExpectError(Request("POST", "/v1/chat/completions",
                      R"({"model": "nope", "stream": true,
                          "messages": [{"role": "user", "content": "x"}]})"),
              404, "model_not_found", "model");
  ExpectError(Request("POST", "/v1/embeddings", R"({"model": "nope", "input": [1]})"), 404,
              "model_not_found", "model");
  ExpectError(Request("GET", "/v1/models/nope"), 404, "model_not_found", "model");
  ExpectError(Request("POST", "/v1/images/generations", "{}"), 404, "unknown_url");
  ExpectError(Request("GET", "/v1/chat/completions"), 404, "unknown_url");
  // The enclave's own refusal of a sampling value (a prompt past the context here) is a 400.
  json past = {{"model", "tiny"}, {"prompt", std::vector<int>(600, 65)}, {"max_tokens", 1}};
  Http too_long = Request("POST", "/v1/completions", past.dump());
  EXPECT_EQ(too_long.status, 400) << too_long.body;

  // metered's token bucket (60 tokens, refilled at 0.5 a second): a request that can never fit
  // is 400, one that fits runs, and the next one finds the bucket empty: 429 with Retry-After.
  auto ask = [](int max_tokens) {
    return json({{"model", "tiny"},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"max_tokens", max_tokens},
                 {"ignore_eos", true}})
        .dump();
  };
  ExpectError(Request("POST", "/v1/chat/completions", ask(100), "metered"), 400,
              "request_too_large");
  Http fits = Request("POST", "/v1/chat/completions", ask(30), "metered");
  EXPECT_EQ(fits.status, 200) << fits.body;
  Http refused = Request("POST", "/v1/chat/completions", ask(30), "metered");
  ExpectError(refused, 429, "rate_limit_exceeded");
  EXPECT_NE(refused.headers.find("Retry-After: 1"), std::string::npos) << refused.headers;
}

// A connection to the proxy at `host_port` that has sent a streamed chat request with `body`.
int OpenStream(const std::string& host_port, const std::string& body) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &address.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string request = absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: ", host_port, "\r\nAuthorization: Bearer ",
      kApiKey, "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n",
      body);
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  return fd;
}

// Reads from a stream until `events` events with text arrived (or it ends); returns how many.
int ReadContentEvents(int fd, int events) {
  std::string received;
  char buffer[4096];
  int seen = 0;
  while (seen < events) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
    seen = 0;
    for (size_t at = received.find("\"content\":\""); at != std::string::npos;
         at = received.find("\"content\":\"", at + 1)) {
      if (received.compare(at, 13, "\"content\":\"\"") != 0) ++seen;  // not the role event's ""
    }
  }
  return seen;
}

// A greedy chat request for 400 tokens that ignores the end of text, streamed or not.
std::string EndlessChat(bool stream) {
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Tell me a fortune."}}}},
               {"temperature", 0},
               {"max_tokens", 400},
               {"ignore_eos", true}};
  if (stream) body["stream"] = true;
  return body.dump();
}

TEST_F(OpenAiProxyTest, ADisconnectMidStreamCancelsTheGenerationAndFreesTheSequence) {
  const std::string endless = EndlessChat(/*stream=*/true);
  const std::string hello = json({{"model", "tiny"},
                                  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                  {"max_tokens", 1}})
                                .dump();
  // Waits until solo's one generation slot is free: a short request stops being refused.
  auto when_free = [&] {
    Http after;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    do {
      after = Request("POST", "/v1/chat/completions", hello, "solo");
      if (after.status != 429) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < deadline);
    EXPECT_EQ(after.status, 200) << after.body;
  };
  const std::string& solo = proxies_["solo"].host_port;

  // A caller reads three tokens and hangs up; the proxy cancels, so the slot frees and the
  // enclave stops generating.
  int reader = OpenStream(solo, endless);
  // At least three: events that piled up while the proxy wrote arrive in one HTTP chunk.
  EXPECT_GE(ReadContentEvents(reader, 3), 3);
  close(reader);
  when_free();

  ExpectStreamCutShort();

  // The operator sees it in the metrics: the chunks relayed for solo (the cut stream and the
  // one-token answers that found the slot free) stay far below the 400 tokens asked for.
  double chunks = -1;
  const std::string metrics = HttpGet(appliance_->metrics_address(), "/metrics");
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (absl::StartsWith(line, "cloister_generation_chunks_total{") &&
        absl::StrContains(line, "tenant=\"solo\"")) {
      ASSERT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &chunks)) << line;
    }
  }
  EXPECT_GE(chunks, 3) << metrics;
  EXPECT_LT(chunks, 400) << metrics;
}

TEST_F(OpenAiProxyTest, ACallerThatHangsUpOnAnAnswerNotStreamedCancelsTheGeneration) {
  const std::string endless = EndlessChat(/*stream=*/false);
  const std::string& solo = proxies_["solo"].host_port;
  // A caller that hangs up while its answer is being generated stops it: the enclave's signed
  // receipt shows it short of its 400 tokens. Without the proxy's check every such generation
  // runs to 400. The caller hangs up a few milliseconds after sending, longer on each try: one
  // that left before the proxy took its request started no generation (and no receipt), and one
  // whose generation ended first (a fast machine) is no proof either way. Solo has one
  // generation slot, so a new receipt is this try's; the host logs it once the slot is free.
  std::vector<uint64_t> counts;
  for (absl::Duration wait : {absl::Milliseconds(3), absl::Milliseconds(10),
                              absl::Milliseconds(30), absl::Milliseconds(100)}) {
    const size_t receipts = CompletionTokensOf("solo").size();
    const int caller = OpenStream(solo, endless);
    absl::SleepFor(wait);
    close(caller);
    std::vector<uint64_t> tokens;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(3);
         absl::Now() < deadline && tokens.size() <= receipts;
         absl::SleepFor(absl::Milliseconds(20))) {
      tokens = CompletionTokensOf("solo");
    }
    if (tokens.size() <= receipts) continue;
    counts.push_back(tokens.back());
    if (tokens.back() < 400) break;
  }
  ASSERT_FALSE(counts.empty()) << "no try started a generation";
  EXPECT_LT(counts.back(), 400u) << "every generation ran to its end: "
                                  << absl::StrJoin(counts, ", ");
  EXPECT_GE(counts.back(), 1u);
}

TEST_F(OpenAiProxyTest, NoPromptReachesAnyLogOrFile) {
  const std::string prompt = absl::StrCat("Keep this secret: ", kCanary);
  for (bool stream : {false, true}) {
    Http chat = Request("POST", "/v1/chat/completions",
                        json({{"model", "tiny"},
                              {"messages", {{{"role", "user"}, {"content", prompt}}}},
                              {"max_tokens", 8},
                              {"stream", stream}})
                            .dump());
    EXPECT_EQ(chat.status, 200) << chat.body;
  }
  Http completion =
      Request("POST", "/v1/completions",
              json({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}}).dump());
  EXPECT_EQ(completion.status, 200) << completion.body;
  // A refused request echoes nothing of the prompt into a log either.
  Http refused = Request(
      "POST", "/v1/chat/completions",
      json({{"model", "nope"}, {"messages", {{{"role", "user"}, {"content", prompt}}}}}).dump());
  EXPECT_EQ(refused.status, 404);

  for (auto& [tenant, proxy] : proxies_) {
    EXPECT_EQ(proxy.process->Stop(SIGTERM), 0);
    EXPECT_EQ(proxy.process->Stdout().find(kCanary), std::string::npos) << tenant;
    EXPECT_EQ(proxy.process->Stderr().find(kCanary), std::string::npos) << tenant;
    proxy.process.reset();
  }
  appliance_->Stop();
  EXPECT_EQ(appliance_->Logs().find(kCanary), std::string::npos);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(appliance_->data_dir())) {
    if (!entry.is_regular_file()) continue;
    EXPECT_EQ(ReadWholeFile(entry.path().string()).find(kCanary), std::string::npos)
        << entry.path();
  }
}

TEST_F(OpenAiProxyTest, AnApplianceThatFailsThePolicyStopsTheProxyAtStart) {
  RunResult attest = Cli("acme", {"attest", "--json"});
  ASSERT_EQ(attest.exit_code, 0) << attest.err;
  const std::string measurement = json::parse(attest.out)["claims"]["cvm.measurement"];
  ASSERT_FALSE(measurement.empty());
  auto policy = ReadFile(appliance_->data_dir() + "/dev-policy.yaml");
  ASSERT_TRUE(policy.ok());
  std::string pinned_elsewhere = *policy;
  const size_t at = pinned_elsewhere.find(measurement);
  ASSERT_NE(at, std::string::npos) << "the policy does not pin the measurement";
  pinned_elsewhere.replace(at, measurement.size(), std::string(measurement.size(), '0'));
  const std::string other = work_ + "/other-policy.yaml";
  std::ofstream(other) << pinned_elsewhere;

  Process proxy({CLOISTER_CLI_BINARY, "proxy", "--listen", "127.0.0.1:0"},
                MakeTempDir("cloister-proxy-log"), Env("acme", other));
  EXPECT_EQ(proxy.WaitForStdout("listening", absl::Seconds(30)), "");
  EXPECT_EQ(proxy.Stop(SIGTERM, absl::Seconds(30)), 1);
  EXPECT_NE(proxy.Stderr().find("attestation failed"), std::string::npos) << proxy.Stderr();
  EXPECT_NE(proxy.Stderr().find("cvm.measurement"), std::string::npos) << proxy.Stderr();
}

TEST_F(OpenAiProxyTest, AnApplianceGoneIs503AndSignalsStopTheProxyCleanly) {
  ASSERT_EQ(Request("GET", "/v1/models").status, 200);
  appliance_->Stop();
  Http gone = Request("GET", "/v1/models");
  ExpectError(gone, 503, "service_unavailable");
  Http chat = Request("POST", "/v1/chat/completions",
                      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(chat.status, 503) << chat.body;
  EXPECT_EQ(proxies_["acme"].process->Stop(SIGTERM), 0) << proxies_["acme"].process->Stderr();
  EXPECT_EQ(proxies_["solo"].process->Stop(SIGINT), 0) << proxies_["solo"].process->Stderr();
  proxies_.clear();
}

}  // namespace
}  // namespace cloister::testing
