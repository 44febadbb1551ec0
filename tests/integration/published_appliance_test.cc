// Operator-published models through the whole appliance (real cloisterd, real
// cloister-enclave), as an operator and tenants use them: the config names the shared tiny
// model's folder and its digest; `cloister attest` shows the digest among the attested claims;
// `cloister models` lists it as published to every tenant; tenants who never uploaded anything
// generate from it by name and get the reference ids, several tenants' streams at once; a worker
// restarted after a crash publishes it again; and a config whose digest is not the folder's
// stops cloisterd at start with a line that names both digests.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/tenants/tenant_registry.h"
#include "nlohmann/json.hpp"
#include "sdk/client.h"
#include "sdk/model_dir.h"
#include "tests/support/appliance.h"
#include "tests/support/http.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace cloister::testing {
namespace {

using ::testing::HasSubstr;

const std::string kTinyLlama = std::string(CLOISTER_SHARED_DIR) + "/models/llm/tiny-llama";
const std::vector<std::string> kTenants = {"acme", "globex", "initech"};

std::string TokenOf(const std::string& tenant) { return "token-of-" + tenant; }

class PublishedApplianceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-published-appliance");
    auto package = sdk::PackModelDir(kTinyLlama, uint64_t{256} << 20);
    ASSERT_TRUE(package.ok()) << package.status();
    digest_ = HexEncode(crypto::Sha256(*package));
    auto text = ReadFile(kTinyLlama + "/reference.json", 16 << 20);
    ASSERT_TRUE(text.ok());
    references_ = nlohmann::json::parse(*text);
  }

  // Writes the config, publishing the tiny model's folder with `digest`; its path.
  std::string WriteConfig(const std::string& digest) {
    const std::string config = work_ + "/cloisterd.yaml";
    std::ofstream out(config);
    out << "operator:\n  listen: 127.0.0.1:0\n  stats_interval_seconds: 0.1\n";
    out << "published_models:\n  - name: tiny-llama\n    file: " << kTinyLlama
        << "\n    digest: " << digest << "\n";
    out << "tenants:\n";
    for (const std::string& tenant : kTenants) {
      out << "  - id: " << tenant
          << "\n    token_sha256: " << HexEncode(host::TokenHash(TokenOf(tenant))) << "\n";
      std::ofstream(work_ + "/" + tenant + ".token") << TokenOf(tenant) << "\n";
    }
    return config;
  }

  void StartAppliance() {
    appliance_ =
        std::make_unique<Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                    std::vector<std::string>{"--config", WriteConfig(digest_)});
    ASSERT_TRUE(appliance_->Start().ok());
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

  api::v1::GenerateRequest Greedy(const nlohmann::json& prompt) {
    api::v1::GenerateRequest request;
    request.mutable_ids()->mutable_ids()->Add(prompt["prompt_ids"].begin(),
                                              prompt["prompt_ids"].end());
    request.mutable_sampling()->set_temperature(0);
    request.set_max_tokens(references_["generation"]["max_new_tokens"].get<uint64_t>());
    return request;
  }

  std::string work_;
  std::string digest_;
  nlohmann::json references_;
  std::unique_ptr<Appliance> appliance_;
};

TEST_F(PublishedApplianceTest, TenantsAttestListAndGenerateFromThePublishedModel) {
  StartAppliance();
  ASSERT_EQ(Cli("acme", {"keygen"}).exit_code, 0);
  RunResult attested = Cli("acme", {"attest"});
  ASSERT_EQ(attested.exit_code, 0) << attested.err;
  EXPECT_THAT(attested.out, HasSubstr("published.tiny-llama.digest: " + digest_));
  EXPECT_THAT(attested.out, HasSubstr("published.models"));

  RunResult models = Cli("acme", {"models", "--json"});
  ASSERT_EQ(models.exit_code, 0) << models.err;
  EXPECT_THAT(models.out, HasSubstr("\"name\":\"tiny-llama\""));
  EXPECT_THAT(models.out, HasSubstr("\"digest\":\"" + digest_ + "\",\"published\":true"));

  const auto& prompt = references_["prompts"][3];
  const std::string max_tokens =
      std::to_string(references_["generation"]["max_new_tokens"].get<int>());
  RunResult generated =
      Cli("acme", {"generate", "--model", "tiny-llama", "--temperature", "0", "--max-tokens",
                   max_tokens, "--json", "--prompt", prompt["text"].get<std::string>()});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  nlohmann::json doc = nlohmann::json::parse(generated.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << generated.out;
  EXPECT_EQ(doc["ids"].get<std::vector<int32_t>>(),
            prompt["generated_ids"].get<std::vector<int32_t>>());

  // A tenant cannot delete it, nor upload a model of its own under the name.
  RunResult deleted = Cli("acme", {"delete", "--model", "tiny-llama"});
  EXPECT_NE(deleted.exit_code, 0);
  RunResult taken = Cli("acme", {"upload", "--model", kTinyLlama, "--name", "tiny-llama"});
  EXPECT_NE(taken.exit_code, 0);
  EXPECT_THAT(taken.err, HasSubstr("taken by an operator-published model"));
}

// Three tenants, four streams each, all on the one published model at once (steps that mix
// tenants): every stream gives its reference ids.
TEST_F(PublishedApplianceTest, StreamsOfSeveralTenantsShareItAndEachGetsItsIds) {
  StartAppliance();
  const auto& prompts = references_["prompts"];
  absl::Mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (const std::string& tenant : kTenants) {
    sdk::ClientOptions options = appliance_->TenantOptions(tenant, TokenOf(tenant));
    auto client = sdk::Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    std::shared_ptr<sdk::Client> shared(std::move(*client));
    for (int k = 0; k < 4; ++k) {
      const nlohmann::json& prompt = prompts[(k + threads.size()) % prompts.size()];
      threads.emplace_back([&, shared, tenant, prompt] {
        auto result = shared->Generate("tiny-llama", Greedy(prompt));
        std::string failure;
        if (!result.ok()) {
          failure = absl::StrCat(tenant, ": ", result.status().ToString());
        } else if (result->ids != prompt["generated_ids"].get<std::vector<int32_t>>()) {
          failure = absl::StrCat(tenant, ": other ids for ", prompt["name"].get<std::string>());
        }
        if (!failure.empty()) {
          absl::MutexLock lock(&mu);
          failures.push_back(failure);
        }
      });
    }
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// The sum of the samples of `metric` whose labels include `label` in a /metrics text.
double Sample(const std::string& metrics, const std::string& metric, const std::string& label) {
  double sum = 0;
  std::regex line("^" + metric + "\\{([^}]*)\\} ([0-9.e+-]+)$");
  std::smatch match;
  size_t start = 0;
  while (start < metrics.size()) {
    size_t end = metrics.find('\n', start);
    if (end == std::string::npos) end = metrics.size();
    const std::string text = metrics.substr(start, end - start);
    if (std::regex_match(text, match, line) && match[1].str().find(label) != std::string::npos) {
      sum += std::stod(match[2].str());
    }
    start = end + 1;
  }
  return sum;
}

// The operator's gauges of the enclave's generations: sequences running and waiting, and KV
// blocks held, by tenant, rise while streams run and fall back to 0 once they are cancelled.
TEST_F(PublishedApplianceTest, GaugesShowRunningAndWaitingSequencesAndTheirKvBlocks) {
  StartAppliance();
  sdk::ClientOptions options = appliance_->TenantOptions("initech", TokenOf("initech"));
  auto client = sdk::Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 60; ++i) {
    threads.emplace_back([&] {
      api::v1::GenerateRequest request;
      request.set_text("Once upon a time");
      request.set_max_tokens(480);
      request.set_ignore_eos(true);
      (void)(*client)->Generate("tiny-llama", request, {}, absl::ZeroDuration(),
                                [&] { return stop.load(); });
    });
  }
  const std::string tenant = "tenant=\"initech\"";
  bool seen = false;
  std::string metrics;
  for (absl::Time until = absl::Now() + absl::Seconds(90); !seen && absl::Now() < until;) {
    metrics = HttpGet(appliance_->metrics_address(), "/metrics");
    seen = Sample(metrics, "cloister_generation_sequences", "state=\"running\"," + tenant) > 0 &&
           Sample(metrics, "cloister_generation_sequences", "state=\"waiting\"," + tenant) > 0 &&
           Sample(metrics, "cloister_kv_blocks", tenant) > 0 &&
           Sample(metrics, "cloister_kv_cache_blocks", "kind=\"total\"") > 0;
    if (!seen) absl::SleepFor(absl::Milliseconds(200));
  }
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(seen) << metrics;
  bool drained = false;
  for (absl::Time until = absl::Now() + absl::Seconds(30); !drained && absl::Now() < until;) {
    metrics = HttpGet(appliance_->metrics_address(), "/metrics");
    drained = Sample(metrics, "cloister_generation_sequences", tenant) == 0 &&
              Sample(metrics, "cloister_kv_blocks", tenant) == 0 &&
              Sample(metrics, "cloister_kv_cache_blocks", "kind=\"used\"") == 0 &&
              metrics.find("cloister_kv_blocks{") != std::string::npos;
    if (!drained) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(drained) << metrics;
  // The steps given up for realtime arrivals, per worker (none here: no realtime tenant).
  EXPECT_NE(metrics.find("cloister_generation_interrupted_steps{worker=\"0\"} 0"),
            std::string::npos)
      << metrics;
}

TEST_F(PublishedApplianceTest, AWorkerRestartedAfterACrashPublishesItAgain) {
  StartAppliance();
  sdk::ClientOptions options = appliance_->TenantOptions("globex", TokenOf("globex"));
  auto client = sdk::Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<pid_t> workers = appliance_->WorkerPids();
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_EQ(::kill(workers[0], SIGKILL), 0);
  const auto& prompt = references_["prompts"][0];
  // The client re-attests on the restarted worker; the model is there again.
  absl::StatusOr<sdk::GenerateResult> result = absl::UnavailableError("not tried");
  for (int attempt = 0; attempt < 60 && !result.ok(); ++attempt) {
    api::v1::GenerateRequest request = Greedy(prompt);
    request.mutable_sampling()->set_seed(1);  // seeded: the SDK may retry it
    result = (*client)->Generate("tiny-llama", request);
    if (!result.ok()) absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->ids, prompt["generated_ids"].get<std::vector<int32_t>>());
  EXPECT_THAT(appliance_->Logs(), HasSubstr("\"models_published\":1"));
}

// A worker that dies while streams are open: each stream ends with one UNAVAILABLE, never a
// short answer, a repeated chunk or a silent retry of an unseeded generation.
TEST_F(PublishedApplianceTest, AWorkerDeathMidStreamGivesEachStreamOneUnavailable) {
  StartAppliance();
  sdk::ClientOptions options = appliance_->TenantOptions("acme", TokenOf("acme"));
  auto client = sdk::Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::once_flag killed;
  std::vector<absl::Status> outcomes(4);
  std::vector<int> chunks(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      api::v1::GenerateRequest request;
      request.set_text("Once upon a time");
      request.set_max_tokens(480);
      request.set_ignore_eos(true);
      auto result =
          (*client)->Generate("tiny-llama", request, [&, i](const api::v1::GenerateChunk&) {
            if (++chunks[i] == 3) {
              std::call_once(killed, [&] {
                for (pid_t pid : appliance_->WorkerPids()) {
                  ::kill(pid, SIGKILL);
                }
              });
            }
          });
      outcomes[i] = result.status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int i = 0; i < 4; ++i) {
    // A stream that had finished before the kill is fine too; none is cut short silently.
    EXPECT_TRUE(outcomes[i].ok() || absl::IsUnavailable(outcomes[i])) << i << ": " << outcomes[i];
    if (!outcomes[i].ok()) EXPECT_GE(chunks[i], 1) << i;
  }
  EXPECT_FALSE(std::all_of(outcomes.begin(), outcomes.end(),
                           [](const absl::Status& status) { return status.ok(); }));
}

TEST_F(PublishedApplianceTest, CloisterdPrintsTheDigestAnEntryNeeds) {
  RunResult digest =
      testing::Run({CLOISTERD_BINARY, "--model-digest", kTinyLlama}, {}, absl::Seconds(60));
  ASSERT_EQ(digest.exit_code, 0) << digest.err;
  EXPECT_EQ(digest.out, digest_ + "\n");
  RunResult missing =
      testing::Run({CLOISTERD_BINARY, "--model-digest", work_ + "/nothing"}, {}, absl::Seconds(60));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr(work_ + "/nothing"));
}

TEST_F(PublishedApplianceTest, AConfigWithAnotherDigestStopsCloisterdAtStart) {
  const std::string wrong(64, 'c');
  RunResult started = testing::Run({CLOISTERD_BINARY, "--listen", "127.0.0.1:0", "--data-dir",
                                    work_ + "/data", "--config", WriteConfig(wrong)},
                                   {}, absl::Seconds(120));
  EXPECT_NE(started.exit_code, 0);
  EXPECT_THAT(started.err + started.out,
              HasSubstr(absl::StrCat("has digest ", digest_, " but the config expects ", wrong)));

  RunResult bad = testing::Run({CLOISTERD_BINARY, "--check-config",
                                [&] {
                                  const std::string path = work_ + "/bad.yaml";
                                  std::ofstream(path) << "published_models:\n  - name: x\n"
                                                         "    file: /nonexistent\n"
                                                         "    digest: 12\n";
                                  return path;
                                }()},
                               {}, absl::Seconds(60));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err + bad.out, HasSubstr("published_models[0].digest"));
}

}  // namespace
}  // namespace cloister::testing
