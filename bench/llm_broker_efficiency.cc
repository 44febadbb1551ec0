#include "bench/llm_broker_efficiency.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/flags.h"
#include "base/status.h"
#include "bench/bench_support.h"
#include "bench/llm_enclave_driver.h"
#include "enclave/batch_runner.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/model.h"
#include "nlohmann/json.hpp"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "tests/support/process.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kModelName[] = "bench-llm";

// One direct round: every prompt of `prompts` added to `generator` at once, stepped until all
// are done. The ids per request and the completion tokens.
absl::StatusOr<std::vector<std::vector<int32_t>>> DirectRound(
    llm::Generator& generator, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    llm::GenerationRequest request;
    request.prompt_ids = prompts[i];
    request.sampling.temperature = 0;
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    ASSIGN_OR_RETURN(uint64_t sequence, generator.Add(std::move(request)));
    index[sequence] = i;
  }
  std::vector<std::vector<int32_t>> ids(prompts.size());
  while (!generator.idle()) {
    ASSIGN_OR_RETURN(std::vector<llm::TokenEvent> events, generator.Step());
    for (const llm::TokenEvent& event : events) {
      if (event.finish == llm::FinishReason::kCancelled) {
        return absl::InternalError("a direct sequence was cancelled");
      }
      ids[index.at(event.sequence)].push_back(event.token.id);
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<LlmBrokerEfficiencyOptions> ParseLlmBrokerEfficiencyFlags(
    const std::vector<std::string>& args, LlmBrokerEfficiencyOptions options) {
  RETURN_IF_ERROR(ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                                    {"--models-dir", StringFlag{&options.models_dir, {}}},
                                    {"--model-dir", StringFlag{&options.model_dir, {}}},
                                    {"--cloisterd", StringFlag{&options.cloisterd, {}}},
                                    {"--concurrency", IntFlag{&options.concurrency, 1}},
                                    {"--max-tokens", IntFlag{&options.max_tokens, 1}},
                                    {"--rounds", IntFlag{&options.rounds, 1}}}));
  if (options.concurrency > 64) {
    return absl::InvalidArgumentError(
        "--concurrency must be at most 64 (cloisterd's default max_generations)");
  }
  return options;
}

std::string LlmBrokerEfficiencyUsage() {
  return "generation throughput through a real cloisterd and the SDK over the engine driven\n"
         "                   directly [--json] [--concurrency N (16)] [--max-tokens N (64)]\n"
         "                   [--rounds N (3)] [--model-dir DIR (default: the tiny model)]\n"
         "                   [--cloisterd PATH] [--models-dir DIR]\n";
}

std::string LlmBrokerEfficiencyJsonLine(const LlmBrokerEfficiencyResult& result) {
  nlohmann::ordered_json line;
  line["case"] = "llm-broker-efficiency";
  line["model"] = result.model;
  line["concurrency"] = result.concurrency;
  line["max_tokens"] = result.max_tokens;
  line["rounds"] = result.rounds;
  line["threads"] = result.threads;
  line["ratio"] = result.ratio();
  line["broker_tokens_per_s"] = result.broker_tokens_per_s();
  line["direct_tokens_per_s"] = result.direct_tokens_per_s();
  line["ids_match"] = result.ids_match;
  return line.dump();
}

absl::StatusOr<LlmBrokerEfficiencyResult> RunLlmBrokerEfficiency(
    const LlmBrokerEfficiencyOptions& options, std::FILE* out, std::FILE* log) {
  const std::string model_dir = options.model_dir.empty()
                                    ? (fs::path(options.models_dir) / "llm" / "tiny-llama").string()
                                    : options.model_dir;
  if (::access(options.cloisterd.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cloisterd binary ", options.cloisterd,
                                            " is missing or not executable (see --cloisterd)"));
  }
  LlmBrokerEfficiencyResult result;
  result.model = ModelNameOfDir(model_dir);
  result.concurrency = options.concurrency;
  result.max_tokens = options.max_tokens;
  result.rounds = options.rounds;
  // The enclave's generation engine runs DefaultRunThreads() threads (cloister-enclave
  // --run-threads unset); the direct side runs as many.
  result.threads = enclave::DefaultRunThreads();

  // Direct side: the checkpoint loaded here, weights as stored (what the enclave does).
  std::vector<std::string> storage;
  ASSIGN_OR_RETURN(llm::CheckpointFiles checkpoint, llm::ReadCheckpointDir(model_dir, storage));
  llm::LoadOptions load_options;
  load_options.weights = llm::WeightFormat::kAsStored;
  ASSIGN_OR_RETURN(std::unique_ptr<llm::Model> model, llm::Model::Load(checkpoint, load_options));
  checkpoint.clear();
  storage.clear();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < options.concurrency; ++i) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     model->tokenizer().Encode(GenerationPrompt(i), true));
    prompts.push_back(std::move(ids));
  }
  llm::GeneratorOptions generator_options;
  generator_options.threads = result.threads;
  generator_options.max_sequences = 16;  // GenerationOptions' default
  generator_options.max_step_tokens = 512;
  ASSIGN_OR_RETURN(std::unique_ptr<llm::Generator> generator,
                   llm::Generator::Create(*model, generator_options));
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> expected,
                   DirectRound(*generator, prompts, options.max_tokens));  // warm-up and reference

  // Broker side: cloisterd publishing the checkpoint folder to its tenants.
  ASSIGN_OR_RETURN(const std::string work, MakeScratchDir("cloister-llm-broker"));
  ASSIGN_OR_RETURN(PublishingAppliance appliance,
                   StartPublishingAppliance(options.cloisterd, work, model_dir, kModelName));
  sdk::ClientOptions client_options;
  client_options.server = appliance.server;
  client_options.tenant_id = PublishingAppliance::kTenant;
  client_options.token = appliance.token;
  client_options.policy_path = appliance.policy_file;
  client_options.identity = std::make_shared<sdk::TenantIdentity>(sdk::TenantIdentity::Generate());
  client_options.call_timeout = absl::Minutes(10);
  std::vector<std::unique_ptr<sdk::Client>> clients;
  for (int c = 0; c < options.concurrency; ++c) {
    ASSIGN_OR_RETURN(std::unique_ptr<sdk::Client> client, sdk::Client::Connect(client_options));
    clients.push_back(std::move(client));
  }

  // One broker round: every client streams its request at once; the ids per request.
  auto broker_round = [&]() -> absl::StatusOr<std::vector<std::vector<int32_t>>> {
    std::vector<std::vector<int32_t>> ids(prompts.size());
    absl::Mutex mu;
    absl::Status first_error;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i) {
      threads.emplace_back([&, i] {
        absl::StatusOr<sdk::GenerateResult> generated =
            clients[i]->Generate(kModelName, GreedyRequest(prompts[i], options.max_tokens));
        absl::MutexLock lock(&mu);
        if (!generated.ok()) {
          if (first_error.ok()) first_error = generated.status();
          return;
        }
        ids[i] = generated->ids;
      });
    }
    for (std::thread& thread : threads) thread.join();
    RETURN_IF_ERROR(first_error);
    return ids;
  };
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> broker_ids, broker_round());  // warm-up
  result.ids_match = broker_ids == expected;
  if (!result.ids_match && !options.json) {
    absl::FPrintF(log, "the broker's greedy ids differ from the direct ones\n");
  }

  auto tokens_of = [](const std::vector<std::vector<int32_t>>& ids) {
    double tokens = 0;
    for (const auto& sequence : ids) tokens += static_cast<double>(sequence.size());
    return tokens;
  };
  for (int round = 0; round < options.rounds; ++round) {
    Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> direct,
                     DirectRound(*generator, prompts, options.max_tokens));
    const double direct_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    start = Clock::now();
    ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> broker, broker_round());
    const double broker_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.direct_seconds += direct_seconds;
    result.direct_tokens += tokens_of(direct);
    result.broker_seconds += broker_seconds;
    result.broker_tokens += tokens_of(broker);
    result.ids_match = result.ids_match && broker == expected && direct == expected;
    if (!options.json) {
      absl::FPrintF(log, "round %d: direct %.0f tokens/s, broker %.0f tokens/s\n", round + 1,
                    tokens_of(direct) / direct_seconds, tokens_of(broker) / broker_seconds);
    }
  }
  clients.clear();
  appliance.cloisterd->Stop(SIGTERM);
  if (options.json) {
    absl::FPrintF(out, "%s\n", LlmBrokerEfficiencyJsonLine(result));
  } else {
    absl::FPrintF(out,
                  "llm-broker-efficiency %s, concurrency %d, %d tokens each, %d threads: broker "
                  "%.0f tokens/s, direct %.0f tokens/s, ratio %.3f (target 0.95), ids %s\n",
                  result.model, result.concurrency, result.max_tokens, result.threads,
                  result.broker_tokens_per_s(), result.direct_tokens_per_s(), result.ratio(),
                  result.ids_match ? "match" : "DIFFER");
  }
  return result;
}

}  // namespace cloister::bench
