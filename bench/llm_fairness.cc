#include "bench/llm_fairness.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "base/status.h"
#include "bench/llm_enclave_driver.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

constexpr double kPromptCost = 1.0;      // llm::GeneratorOptions' defaults
constexpr double kCompletionCost = 2.0;
constexpr int kStepSequences = 16;       // GenerationOptions::max_sequences

struct Side {
  double weight = 1;
  double service = 0;
  double tokens = 0;
  bool started = false;  // has had a chunk
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
  enclave::EnclaveOptions enclave_options;
  enclave_options.generation.threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<LlmEnclaveDriver> driver,
                   LlmEnclaveDriver::Create(options.models_dir, std::move(enclave_options),
                                            {"light", "heavy"}));
  const auto& prompts = driver->prompts();
  size_t longest_prompt = 0;
  for (const auto& p : prompts) longest_prompt = std::max(longest_prompt, p.size());

  Side sides[2];
  sides[0].weight = options.light_weight;
  sides[1].weight = options.heavy_weight;
  std::map<uint64_t, size_t> prompt_tokens;  // of each open stream, until its first chunk
  size_t next_prompt = 0;
  auto send = [&](int side) -> absl::Status {
    const std::vector<int32_t>& prompt = prompts[next_prompt++ % prompts.size()];
    const api::v1::GenerateRequest request = GreedyRequest(prompt, options.max_tokens);
    boundary::v1::GenerateLimits limits;
    limits.set_weight(static_cast<uint32_t>(sides[side].weight));
    ASSIGN_OR_RETURN(uint64_t call, driver->Send(side, request, limits));
    prompt_tokens[call] = prompt.size();
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
    ASSIGN_OR_RETURN(std::vector<LlmEnclaveDriver::Chunk> chunks,
                     driver->Take(absl::Milliseconds(100)));
    for (const LlmEnclaveDriver::Chunk& c : chunks) {
      if (c.chunk.code() != 0) return absl::InternalError(absl::StrCat("stream: ", c.chunk.message()));
      Side& side = sides[c.tenant];
      if (auto first = prompt_tokens.find(c.call_id); first != prompt_tokens.end()) {
        side.service += kPromptCost * static_cast<double>(first->second);
        prompt_tokens.erase(first);
      }
      side.service += kCompletionCost * c.chunk.tokens_size();
      side.tokens += c.chunk.tokens_size();
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
      if (c.final) RETURN_IF_ERROR(send(c.tenant));  // stays backlogged
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
  return result;
}

}  // namespace cloister::bench
