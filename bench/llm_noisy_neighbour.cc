#include "bench/llm_noisy_neighbour.h"

#include <algorithm>
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

constexpr int kRealtime = 0, kBestEffort = 1;  // the driver's tenants
constexpr int kRealtimeTokens = 32;
constexpr int kBestEffortTokens = 96;
constexpr size_t kLongPrompt = 400;

struct Phase {
  std::vector<double> ttft_ms, itl_ms;
  double be_tokens = 0;
  double seconds = 0;
};

// One phase: the realtime tenant at `rate` (if on) and the best-effort backlog (if on).
absl::Status RunPhase(LlmEnclaveDriver& driver, const LlmNoisyNeighbourOptions& options,
                      bool realtime, bool best_effort, Phase& phase) {
  const auto& prompts = driver.prompts();
  std::vector<int32_t> long_prompt;
  while (long_prompt.size() < kLongPrompt) {
    for (int32_t id : prompts.back()) long_prompt.push_back(id);
  }
  long_prompt.resize(kLongPrompt);
  struct Open {
    int tenant;
    absl::Time sent, last;
    bool first = true;
  };
  std::map<uint64_t, Open> open;
  size_t next_prompt = 0;
  auto send = [&](int tenant) -> absl::Status {
    const bool realtime = tenant == kRealtime;
    const api::v1::GenerateRequest request =
        realtime ? GreedyRequest(prompts[next_prompt++ % 3], kRealtimeTokens)  // chat prompts
                 : GreedyRequest(long_prompt, kBestEffortTokens);
    boundary::v1::GenerateLimits limits;
    limits.set_priority_class(realtime ? 1 : 3);
    const absl::Time sent = absl::Now();
    ASSIGN_OR_RETURN(uint64_t call, driver.Send(tenant, request, limits));
    open[call] = Open{tenant, sent, sent};
    return absl::OkStatus();
  };
  if (best_effort) {
    for (int i = 0; i < options.backlog; ++i) RETURN_IF_ERROR(send(kBestEffort));
  }
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Milliseconds(options.duration_ms);
  const absl::Duration period = absl::Seconds(1) / options.rate;
  absl::Time next_rt = start;
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= end) break;
    if (realtime && now >= next_rt) {
      RETURN_IF_ERROR(send(kRealtime));
      next_rt += period;
    }
    const absl::Duration wait =
        realtime ? std::max(absl::ZeroDuration(), std::min(next_rt, end) - absl::Now())
                 : end - absl::Now();
    ASSIGN_OR_RETURN(std::vector<LlmEnclaveDriver::Chunk> chunks,
                     driver.Take(std::min(wait, absl::Milliseconds(50))));
    for (const LlmEnclaveDriver::Chunk& c : chunks) {
      if (c.chunk.code() != 0) return absl::InternalError(absl::StrCat("stream: ", c.chunk.message()));
      auto it = open.find(c.call_id);
      if (it == open.end()) continue;
      Open& o = it->second;
      if (o.tenant == kRealtime) {
        (o.first ? phase.ttft_ms : phase.itl_ms)
            .push_back(absl::ToDoubleMilliseconds(c.arrived - (o.first ? o.sent : o.last)));
      } else if (c.arrived < end) {
        phase.be_tokens += c.chunk.tokens_size();
      }
      o.first = false;
      o.last = c.arrived;
      if (c.final) {
        const int tenant = o.tenant;
        open.erase(it);
        if (tenant == kBestEffort && absl::Now() < end) RETURN_IF_ERROR(send(kBestEffort));
      }
    }
  }
  phase.seconds = absl::ToDoubleSeconds(end - start);
  // Let what is still open finish (its chunks are not counted), so phases do not overlap.
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (!open.empty()) {
    if (absl::Now() > give_up) return absl::DeadlineExceededError("the streams stopped coming");
    ASSIGN_OR_RETURN(std::vector<LlmEnclaveDriver::Chunk> chunks, driver.Take(absl::Seconds(1)));
    for (const LlmEnclaveDriver::Chunk& c : chunks) {
      if (c.final) open.erase(c.call_id);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlmNoisyNeighbourOptions> ParseLlmNoisyNeighbourFlags(
    const std::vector<std::string>& args, LlmNoisyNeighbourOptions options) {
  std::vector<FlagSpec> specs = {
      {"--json", SwitchFlag{&options.json}},
      {"--rate", IntFlag{&options.rate, 1}},
      {"--duration-ms", IntFlag{&options.duration_ms, 100}},
      {"--backlog", IntFlag{&options.backlog, 1}},
      {"--threads", IntFlag{&options.threads, 1}},
      {"--models-dir", StringFlag{&options.models_dir, {}}},
  };
  RETURN_IF_ERROR(ParseFlags(args, specs));
  return options;
}

std::string LlmNoisyNeighbourUsage() {
  return "a realtime chat tenant alone and beside a best-effort tenant's long prompts and\n"
         "                   generations [--json] [--rate N (20/s)] [--duration-ms N (4000 per "
         "phase)]\n"
         "                   [--backlog N (8 best-effort streams)] [--threads N (1)] "
         "[--models-dir DIR]\n";
}

absl::StatusOr<LlmNoisyNeighbourResult> RunLlmNoisyNeighbour(
    const LlmNoisyNeighbourOptions& options, std::FILE* out, std::FILE* log) {
  enclave::EnclaveOptions enclave_options;
  enclave_options.generation.threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<LlmEnclaveDriver> driver,
                   LlmEnclaveDriver::Create(options.models_dir, std::move(enclave_options),
                                            {"realtime", "best-effort"}));
  Phase rt_alone, be_alone, shared;
  if (!options.json) absl::FPrintF(log, "realtime alone, best effort alone, both: %d ms each\n", options.duration_ms);
  RETURN_IF_ERROR(RunPhase(*driver, options, true, false, rt_alone));
  RETURN_IF_ERROR(RunPhase(*driver, options, false, true, be_alone));
  RETURN_IF_ERROR(RunPhase(*driver, options, true, true, shared));
  LlmNoisyNeighbourResult r;
  const Phase* rt[2] = {&rt_alone, &shared};
  for (int i = 0; i < 2; ++i) {
    r.rt_ttft_p50_ms[i] = Percentile(rt[i]->ttft_ms, 0.5);
    r.rt_ttft_p99_ms[i] = Percentile(rt[i]->ttft_ms, 0.99);
    r.rt_itl_p50_ms[i] = Percentile(rt[i]->itl_ms, 0.5);
    r.rt_itl_p99_ms[i] = Percentile(rt[i]->itl_ms, 0.99);
  }
  r.be_tokens_per_s[0] = be_alone.be_tokens / be_alone.seconds;
  r.be_tokens_per_s[1] = shared.be_tokens / shared.seconds;
  r.itl_p99_inflation = r.rt_itl_p99_ms[1] / r.rt_itl_p99_ms[0];
  r.ttft_p99_inflation = r.rt_ttft_p99_ms[1] / r.rt_ttft_p99_ms[0];
  r.be_tokens_share = r.be_tokens_per_s[1] / r.be_tokens_per_s[0];
  if (options.json) {
    nlohmann::ordered_json j;
    j["case"] = "llm-noisy-neighbour";
    j["model"] = "tiny-llama";
    j["rate"] = options.rate;
    j["rt_ttft_p99_ms"] = {r.rt_ttft_p99_ms[0], r.rt_ttft_p99_ms[1]};
    j["rt_itl_p50_ms"] = {r.rt_itl_p50_ms[0], r.rt_itl_p50_ms[1]};
    j["rt_itl_p99_ms"] = {r.rt_itl_p99_ms[0], r.rt_itl_p99_ms[1]};
    j["be_tokens_per_s"] = {r.be_tokens_per_s[0], r.be_tokens_per_s[1]};
    j["itl_p99_inflation"] = r.itl_p99_inflation;
    j["ttft_p99_inflation"] = r.ttft_p99_inflation;
    j["be_tokens_share"] = r.be_tokens_share;
    absl::FPrintF(out, "%s\n", j.dump());
  } else {
    absl::FPrintF(out,
                  "realtime (alone / shared): ttft p50 %.2f / %.2f ms, p99 %.2f / %.2f ms; itl "
                  "p50 %.3f / %.3f ms, p99 %.3f / %.3f ms\n"
                  "best effort tokens/s (alone / shared): %.0f / %.0f\n"
                  "itl_p99_inflation %.3f  ttft_p99_inflation %.3f (targets <= 1.10)  "
                  "be_tokens_share %.3f (>= 0.7)\n",
                  r.rt_ttft_p50_ms[0], r.rt_ttft_p50_ms[1], r.rt_ttft_p99_ms[0],
                  r.rt_ttft_p99_ms[1], r.rt_itl_p50_ms[0], r.rt_itl_p50_ms[1], r.rt_itl_p99_ms[0],
                  r.rt_itl_p99_ms[1], r.be_tokens_per_s[0], r.be_tokens_per_s[1],
                  r.itl_p99_inflation, r.ttft_p99_inflation, r.be_tokens_share);
  }
  return r;
}

}  // namespace cloister::bench
