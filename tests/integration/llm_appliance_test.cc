// Generation through the whole appliance (real cloisterd, real cloister-enclave), as tenants
// use it: the shared tiny model uploaded from its folder with the `cloister` CLI, then
// `cloister generate --temperature 0 --json` of every reference prompt (chat prompts from a
// messages file, rendered by the model's template in the enclave) gives exactly its reference
// ids; 32 streams of three tenants at once through the SDK all give theirs; another tenant's
// model is refused exactly as a model that does not exist; a client that goes away mid-stream
// leaves the appliance serving; and the signed usage reaches the receipt log, whose audit adds
// up the tokens.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "host/tenants/tenant_registry.h"
#include "nlohmann/json.hpp"
#include "sdk/client.h"
#include "tests/support/appliance.h"
#include "tests/support/http.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace cloister::testing {
namespace {

const std::string kTinyLlama = std::string(CLOISTER_SHARED_DIR) + "/models/llm/tiny-llama";
const std::vector<std::string> kTenants = {"acme", "globex", "initech"};

std::string TokenOf(const std::string& tenant) { return "token-of-" + tenant; }

class LlmApplianceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-llm-appliance");
    const std::string config = work_ + "/cloisterd.yaml";
    std::ofstream out(config);
    out << "operator:\n  listen: 127.0.0.1:0\ntenants:\n";
    // hooli's requests may generate at most 8 tokens.
    std::vector<std::string> tenants = kTenants;
    tenants.push_back("hooli");
    for (const std::string& tenant : tenants) {
      out << "  - id: " << tenant << "\n    token_sha256: "
          << HexEncode(host::TokenHash(TokenOf(tenant))) << "\n";
      if (tenant == "hooli") out << "    max_tokens: 8\n";
      std::ofstream(work_ + "/" + tenant + ".token") << TokenOf(tenant) << "\n";
    }
    // CLOISTER_TEST_EXECUTOR=cuda (ctest llm_appliance_cuda, label gpu): the worker runs on the
    // CUDA executor, and generation on the CUDA LLM engine beside it.
    const char* executor = std::getenv("CLOISTER_TEST_EXECUTOR");
    executor_ = executor != nullptr ? executor : "";
    if (executor_ == "cuda" && ::access("/dev/nvidia0", F_OK) != 0) {
      GTEST_SKIP() << "CLOISTER_TEST_EXECUTOR=cuda and no /dev/nvidia0: no GPU here";
    }
    if (!executor_.empty()) {
      out << "devices:\n  - name: dev0\n    executor: " << executor_ << "\n";
    }
    out.close();
    appliance_ = std::make_unique<Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                             std::vector<std::string>{"--config", config});
    ASSERT_TRUE(appliance_->Start().ok());
    if (executor_ == "cuda") {
      ASSERT_NE(appliance_->Logs().find("\"event\":\"llm_engine\",\"name\":\"cuda\""),
                std::string::npos)
          << appliance_->Logs();
    }
    auto text = ReadFile(kTinyLlama + "/reference.json", 16 << 20);
    ASSERT_TRUE(text.ok());
    references_ = nlohmann::json::parse(*text);
  }

  RunResult Cli(const std::string& tenant, std::vector<std::string> args) {
    args.insert(args.begin(), CLOISTER_CLI_BINARY);
    return testing::Run(args,
               {{"CLOISTER_SERVER", appliance_->address()},
                {"CLOISTER_POLICY", appliance_->data_dir() + "/dev-policy.yaml"},
                {"CLOISTER_TENANT", tenant},
                {"CLOISTER_TOKEN_FILE", work_ + "/" + tenant + ".token"},
                {"CLOISTER_KEY", work_ + "/" + tenant + ".key"}},
               absl::Seconds(120));
  }

  std::unique_ptr<sdk::Client> Connect(const std::string& tenant) {
    sdk::ClientOptions options = appliance_->TenantOptions(tenant, TokenOf(tenant));
    options.max_attempts = 1;
    auto client = sdk::Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  api::v1::GenerateRequest Greedy(const nlohmann::json& prompt) {
    api::v1::GenerateRequest request;
    request.mutable_ids()->mutable_ids()->Add(prompt["prompt_ids"].begin(),
                                              prompt["prompt_ids"].end());
    request.mutable_sampling()->set_temperature(0);
    request.set_max_tokens(references_["generation"]["max_new_tokens"].get<uint64_t>());
    return request;
  }

  std::string work_;
  std::string executor_;  // CLOISTER_TEST_EXECUTOR, empty: the worker's default
  std::unique_ptr<Appliance> appliance_;
  nlohmann::json references_;
};

TEST_F(LlmApplianceTest, TheCliGeneratesEveryReferencePromptExactly) {
  ASSERT_EQ(Cli("acme", {"keygen"}).exit_code, 0);
  RunResult uploaded = Cli("acme", {"upload", "--model", kTinyLlama, "--name", "tiny"});
  ASSERT_EQ(uploaded.exit_code, 0) << uploaded.err;
  EXPECT_NE(uploaded.out.find("generative model"), std::string::npos) << uploaded.out;
  const std::string max_tokens =
      std::to_string(references_["generation"]["max_new_tokens"].get<int>());
  int i = 0;
  for (const auto& prompt : references_["prompts"]) {
    SCOPED_TRACE(prompt["name"].get<std::string>());
    std::vector<std::string> args = {"generate", "--model", "tiny", "--temperature", "0",
                                     "--max-tokens", max_tokens, "--json"};
    if (prompt["kind"] == "chat") {
      const std::string chat = absl::StrCat(work_, "/chat", i++, ".json");
      std::ofstream(chat) << prompt["messages"].dump();
      args.insert(args.end(), {"--chat", chat});
    } else {
      args.insert(args.end(), {"--prompt", prompt["text"].get<std::string>()});
    }
    RunResult generated = Cli("acme", args);
    ASSERT_EQ(generated.exit_code, 0) << generated.err;
    nlohmann::json doc = nlohmann::json::parse(generated.out, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << generated.out;
    EXPECT_EQ(doc["ids"].get<std::vector<int32_t>>(),
              prompt["generated_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(doc["usage"]["prompt_tokens"].get<size_t>(), prompt["prompt_ids"].size());
    EXPECT_FALSE(doc["receipt"].get<std::string>().empty());
  }
  // Text as it streams, without --json.
  RunResult streamed = Cli("acme", {"generate", "--model", "tiny", "--prompt",
                                    references_["prompts"][3]["text"].get<std::string>(),
                                    "--temperature", "0", "--max-tokens", max_tokens});
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out,
            references_["prompts"][3]["generated_text"].get<std::string>() + "\n");

  // The host logged the signed receipts; the audit adds up every token.
  RunResult audit = testing::Run({CLOISTER_AUDIT_BINARY, "receipts",
                         appliance_->data_dir() + "/receipts/receipts.jsonl", "--json"},
                        {}, absl::Seconds(60));
  ASSERT_EQ(audit.exit_code, 0) << audit.err << audit.out;
  nlohmann::json totals = nlohmann::json::parse(audit.out, nullptr, false);
  ASSERT_FALSE(totals.is_discarded()) << audit.out;
  size_t completion = 0;
  for (const auto& prompt : references_["prompts"]) completion += prompt["generated_ids"].size();
  completion += references_["prompts"][3]["generated_ids"].size();
  ASSERT_EQ(totals["usage"].size(), 1u) << audit.out;
  EXPECT_EQ(totals["usage"][0]["sequences"].get<size_t>(), references_["prompts"].size() + 1);
  EXPECT_EQ(totals["usage"][0]["completion_tokens"].get<size_t>(), completion);
  // The KV memory held over time is summed too (a figure, present for every tenant and model).
  EXPECT_TRUE(totals["usage"][0].contains("kv_block_ms")) << audit.out;
}

// The operator's token cap reaches the enclave, which refuses a request over it in a sealed
// error that names the limit; a request within it runs.
TEST_F(LlmApplianceTest, TheOperatorsTokenCapIsEnforcedInTheEnclave) {
  ASSERT_EQ(Cli("hooli", {"keygen"}).exit_code, 0);
  ASSERT_EQ(Cli("hooli", {"upload", "--model", kTinyLlama, "--name", "tiny"}).exit_code, 0);
  RunResult over = Cli("hooli", {"generate", "--model", "tiny", "--prompt", "Hello",
                                 "--max-tokens", "20"});
  EXPECT_NE(over.exit_code, 0);
  EXPECT_NE(over.err.find("max_tokens 20 is over the tenant's limit of 8"), std::string::npos)
      << over.err;
  RunResult within = Cli("hooli", {"generate", "--model", "tiny", "--prompt", "Hello",
                                   "--max-tokens", "8", "--temperature", "0", "--json"});
  ASSERT_EQ(within.exit_code, 0) << within.err;
  nlohmann::json doc = nlohmann::json::parse(within.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_LE(doc["ids"].size(), 8u);
}

TEST_F(LlmApplianceTest, ThirtyTwoStreamsOfThreeTenantsEachGiveTheirReferenceIds) {
  std::vector<std::unique_ptr<sdk::Client>> clients;
  for (const std::string& tenant : kTenants) {
    clients.push_back(Connect(tenant));
    ASSERT_NE(clients.back(), nullptr);
    auto uploaded = clients.back()->UploadModel(kTinyLlama, "tiny");
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  }
  const auto& prompts = references_["prompts"];
  absl::Mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int s = 0; s < 32; ++s) {
    threads.emplace_back([&, s] {
      const auto& prompt = prompts[s % prompts.size()];
      auto result = clients[s % clients.size()]->Generate("tiny", Greedy(prompt));
      absl::MutexLock lock(&mu);
      if (!result.ok()) {
        failures.push_back(absl::StrCat("stream ", s, ": ", result.status().ToString()));
      } else if (result->ids != prompt["generated_ids"].get<std::vector<int32_t>>()) {
        failures.push_back(absl::StrCat("stream ", s, ": other ids"));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  // The operator sees time to first chunk, gaps between chunks and chunks by tenant, and no
  // content.
  const std::string metrics = HttpGet(appliance_->metrics_address(), "/metrics");
  for (const std::string& tenant : kTenants) {
    EXPECT_NE(metrics.find(absl::StrCat("cloister_generation_first_chunk_seconds_count{priority="
                                        "\"standard\",tenant=\"", tenant, "\"}")),
              std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find(absl::StrCat("cloister_generation_chunk_gap_seconds_count{priority="
                                        "\"standard\",tenant=\"", tenant, "\"}")),
              std::string::npos);
  }
  EXPECT_NE(metrics.find("cloister_generation_chunks_total"), std::string::npos);
}

TEST_F(LlmApplianceTest, AnotherTenantsModelIsRefusedAsIfThereWereNone) {
  auto acme = Connect("acme");
  auto globex = Connect("globex");
  ASSERT_NE(acme, nullptr);
  ASSERT_NE(globex, nullptr);
  ASSERT_TRUE(acme->UploadModel(kTinyLlama, "tiny").ok());
  auto theirs = globex->Generate("tiny", Greedy(references_["prompts"][3]));
  auto none = globex->Generate("nothing-here", Greedy(references_["prompts"][3]));
  ASSERT_FALSE(theirs.ok());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(theirs.status().code(), none.status().code());
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LlmApplianceTest, AClientThatGoesAwayMidStreamLeavesTheApplianceServing) {
  auto acme = Connect("acme");
  ASSERT_NE(acme, nullptr);
  ASSERT_TRUE(acme->UploadModel(kTinyLlama, "tiny").ok());
  api::v1::GenerateRequest endless = Greedy(references_["prompts"][3]);
  endless.set_ignore_eos(true);
  endless.set_max_tokens(400);
  int seen = 0;
  // A deadline far shorter than 400 tokens take: the RPC ends, cloisterd cancels the sequence.
  auto cut = acme->Generate("tiny", endless,
                            [&](const api::v1::GenerateChunk&) { ++seen; }, absl::Milliseconds(20));
  EXPECT_FALSE(cut.ok());
  EXPECT_LT(seen, 400);
  auto after = acme->Generate("tiny", Greedy(references_["prompts"][3]));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->ids, references_["prompts"][3]["generated_ids"].get<std::vector<int32_t>>());
}

}  // namespace
}  // namespace cloister::testing
