#include "bench/llm_fairness.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "attest/policy.h"
#include "base/file.h"
#include "base/flags.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "enclave/enclave.h"
#include "nlohmann/json.hpp"
#include "sdk/model_dir.h"
#include "tests/support/enclave_tenant.h"
#include "tests/support/temp_dir.h"

namespace cloister::bench {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

constexpr double kPromptCost = 1.0;      // llm::GeneratorOptions' defaults
constexpr double kCompletionCost = 2.0;
constexpr int kStepSequences = 16;       // GenerationOptions::max_sequences

// The frames the enclave streams, handed to the benchmark's thread in order.
class QueueSink : public enclave::FrameSink {
 public:
  void Write(const EnclaveToHost& frame) override {
    absl::MutexLock lock(&mu_);
    frames_.push_back(frame);
  }
  // The frames that came since the last call, waiting up to `timeout` for one.
  std::deque<EnclaveToHost> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !frames_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
    std::deque<EnclaveToHost> out;
    out.swap(frames_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::deque<EnclaveToHost> frames_ ABSL_GUARDED_BY(mu_);
};

struct Side {
  std::unique_ptr<testing::EnclaveTenant> tenant;
  double weight = 1;
  double service = 0;
  double tokens = 0;
  bool started = false;  // has had a chunk
};

struct Open {
  int side;
  boundary::v1::ForwardedRequest item;
  size_t prompt_tokens;
  bool first = true;
};

}  // namespace

absl::StatusOr<LlmFairnessOptions> ParseLlmFairnessFlags(const std::vector<std::string>& args,
                                                         LlmFairnessOptions options) {
  std::vector<FlagSpec> specs = {
      {"--json", SwitchFlag{&options.json}},
      {"--light-weight", IntFlag{&options.light_weight, 1}},
      {"--heavy-weight", IntFlag{&options.heavy_weight, 1}},
      {"--backlog", IntFlag{&options.backlog, 1}},
      {"--max-tokens", IntFlag{&options.max_tokens, 1}},
      {"--duration-ms", IntFlag{&options.duration_ms, 1}},
      {"--threads", IntFlag{&options.threads, 1}},
      {"--models-dir", StringFlag{&options.models_dir, {}}},
  };
  RETURN_IF_ERROR(ParseFlags(args, specs));
  return options;
}

std::string LlmFairnessUsage() {
  return "token service of two backlogged tenants with weights 1 and 3 on one enclave worker's\n"
         "                   LLM engine [--json] [--duration-ms N (5000)] [--light-weight N (1)]\n"
         "                   [--heavy-weight N (3)] [--backlog N (32 streams each)]\n"
         "                   [--max-tokens N (32)] [--threads N (1)] [--models-dir DIR]\n";
}

absl::StatusOr<LlmFairnessResult> RunLlmFairness(const LlmFairnessOptions& options,
                                                 std::FILE* out, std::FILE* log) {
  const std::string model_dir = options.models_dir + "/llm/tiny-llama";
  const std::string dir = testing::MakeTempDir("cloister-llm-fairness");
  enclave::EnclaveOptions enclave_options;
  enclave_options.sim_dir = dir + "/sim";
  enclave_options.dev_policy_out = dir + "/dev-policy.yaml";
  enclave_options.measurement = crypto::Sha384(AsBytes("llm-fairness bench"));
  enclave_options.generation.threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<enclave::Enclave> worker,
                   enclave::Enclave::Create(std::move(enclave_options)));
  ASSIGN_OR_RETURN(attest::v1::Policy policy, attest::LoadPolicyFile(dir + "/dev-policy.yaml"));
  ASSIGN_OR_RETURN(Bytes package, sdk::PackModelDir(model_dir, uint64_t{1} << 30));
  ASSIGN_OR_RETURN(std::string references, ReadFile(model_dir + "/reference.json", 16 << 20));
  std::vector<std::vector<int32_t>> prompts;
  const nlohmann::json parsed = nlohmann::json::parse(references);
  for (const auto& prompt : parsed["prompts"]) {
    prompts.push_back(prompt["prompt_ids"].get<std::vector<int32_t>>());
  }
  size_t longest_prompt = 0;
  for (const auto& p : prompts) longest_prompt = std::max(longest_prompt, p.size());

  Side sides[2];
  sides[0].weight = options.light_weight;
  sides[1].weight = options.heavy_weight;
  const char* names[2] = {"light", "heavy"};
  for (int i = 0; i < 2; ++i) {
    sides[i].tenant = std::make_unique<testing::EnclaveTenant>(worker.get(), names[i], policy);
    RETURN_IF_ERROR(sides[i].tenant->attestation());
    RETURN_IF_ERROR(sides[i].tenant->Open());
    HostToEnclave load = sides[i].tenant->LoadCall("tiny", ToString(package));
    EnclaveToHost loaded = worker->Handle(load);
    if (loaded.status().code() != 0) {
      return absl::InternalError(absl::StrCat("upload: ", loaded.status().message()));
    }
    RETURN_IF_ERROR(sides[i].tenant->OpenReply(crypto::MessageKind::kLoadModel,
                                               load.load_model().request(),
                                               loaded.load_model().reply()));
  }

  auto sink = std::make_shared<QueueSink>();
  std::map<uint64_t, Open> open;
  uint64_t next_call = 1;
  size_t next_prompt = 0;
  auto send = [&](int side) -> absl::Status {
    api::v1::GenerateRequest request;
    const std::vector<int32_t>& prompt = prompts[next_prompt++ % prompts.size()];
    request.mutable_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    request.mutable_sampling()->set_temperature(0);
    request.set_max_tokens(options.max_tokens);
    request.set_ignore_eos(true);
    HostToEnclave call;
    call.set_call_id(next_call);
    call.mutable_generate()->set_tenant_id(names[side]);
    *call.mutable_generate()->mutable_request() = sides[side].tenant->Seal(
        crypto::MessageKind::kGenerate, sides[side].tenant->Handle("tiny"), request);
    call.mutable_generate()->mutable_limits()->set_weight(static_cast<uint32_t>(sides[side].weight));
    open[next_call] = Open{side, call.generate().request(), prompt.size()};
    ++next_call;
    std::optional<EnclaveToHost> refused = worker->Handle(call, sink);
    if (refused) return absl::InternalError(absl::StrCat("generate: ", refused->status().message()));
    return absl::OkStatus();
  };
  for (int i = 0; i < options.backlog; ++i) {
    RETURN_IF_ERROR(send(0));
    RETURN_IF_ERROR(send(1));
  }
  if (!options.json) absl::FPrintF(log, "both tenants backlogged: measuring %d ms\n", options.duration_ms);

  LlmFairnessResult result;
  result.model = "tiny-llama";
  result.light_weight = options.light_weight;
  result.heavy_weight = options.heavy_weight;
  absl::Time measure_start = absl::InfiniteFuture();
  double base[2] = {0, 0}, base_tokens[2] = {0, 0};
  const absl::Time give_up = absl::Now() + absl::Milliseconds(options.duration_ms) + absl::Seconds(60);
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= measure_start + absl::Milliseconds(options.duration_ms)) break;
    if (now >= give_up) return absl::DeadlineExceededError("the streams stopped coming");
    for (EnclaveToHost& frame : sink->Take(absl::Milliseconds(100))) {
      auto it = open.find(frame.call_id());
      if (it == open.end()) continue;
      if (frame.status().code() != 0) {
        return absl::InternalError(absl::StrCat("stream refused: ", frame.status().message()));
      }
      Side& side = sides[it->second.side];
      ASSIGN_OR_RETURN(api::v1::GenerateChunk chunk,
                       side.tenant->OpenChunk(it->second.item, frame.generate()));
      if (chunk.code() != 0) return absl::InternalError(absl::StrCat("stream: ", chunk.message()));
      if (it->second.first) {
        side.service += kPromptCost * static_cast<double>(it->second.prompt_tokens);
        it->second.first = false;
      }
      side.service += kCompletionCost * chunk.tokens_size();
      side.tokens += chunk.tokens_size();
      side.started = true;
      if (measure_start == absl::InfiniteFuture() && sides[0].started && sides[1].started) {
        measure_start = absl::Now();
        for (int i = 0; i < 2; ++i) {
          base[i] = sides[i].service;
          base_tokens[i] = sides[i].tokens;
        }
      }
      if (measure_start != absl::InfiniteFuture()) {
        const double gap = std::abs((sides[0].service - base[0]) / sides[0].weight -
                                    (sides[1].service - base[1]) / sides[1].weight);
        result.max_gap = std::max(result.max_gap, gap);
      }
      if (frame.generate().final()) {
        const int again = it->second.side;
        open.erase(it);
        RETURN_IF_ERROR(send(again));  // stays backlogged
      }
    }
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - measure_start);
  result.light_service = sides[0].service - base[0];
  result.heavy_service = sides[1].service - base[1];
  result.light_tokens = sides[0].tokens - base_tokens[0];
  result.heavy_tokens = sides[1].tokens - base_tokens[1];
  result.share_ratio = result.light_service > 0 ? result.heavy_service / result.light_service : 0;
  const double request_cost =
      kPromptCost * static_cast<double>(longest_prompt) + kCompletionCost * options.max_tokens;
  result.vtc_bound = 2.0 * kStepSequences * request_cost /
                     std::min(sides[0].weight, sides[1].weight);

  if (options.json) {
    nlohmann::ordered_json line;
    line["case"] = "llm-fairness";
    line["model"] = result.model;
    line["weights"] = {result.light_weight, result.heavy_weight};
    line["share_ratio"] = result.share_ratio;
    line["target"] = static_cast<double>(result.heavy_weight) / result.light_weight;
    line["max_gap"] = result.max_gap;
    line["vtc_bound"] = result.vtc_bound;
    line["service"] = {result.light_service, result.heavy_service};
    line["tokens_per_s"] = {result.light_tokens / result.seconds,
                            result.heavy_tokens / result.seconds};
    line["seconds"] = result.seconds;
    absl::FPrintF(out, "%s\n", line.dump());
  } else {
    absl::FPrintF(out,
                  "llm-fairness (%s, weights %d:%d, %.1f s)\n"
                  "  generated tokens/s  light %.1f  heavy %.1f\n"
                  "  share_ratio %.3f (target %.1f within 10%%)\n"
                  "  max_gap %.1f against the VTC bound %.1f\n",
                  result.model, result.light_weight, result.heavy_weight, result.seconds,
                  result.light_tokens / result.seconds, result.heavy_tokens / result.seconds,
                  result.share_ratio,
                  static_cast<double>(result.heavy_weight) / result.light_weight, result.max_gap,
                  result.vtc_bound);
  }
  // The streams still open end when the enclave does (here, on return).
  return result;
}

}  // namespace cloister::bench
