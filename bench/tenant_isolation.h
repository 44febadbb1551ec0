// `cloister-bench fairness` and `cloister-bench noisy-neighbour`: how well cloisterd's Scheduler
// (host/scheduler) keeps tenants that share one enclave worker apart. Both drive a real Scheduler
// whose one worker is a FunctionEnclaveClient (one thread) with a metered executor: each batch of
// N requests is one `Model::Run` of the classifier (cls, `x [N,3,48,192]`, on the enclave
// runtime's CPU executor) or, with `--executor spin`, a busy loop of N times `--spin-us`; the
// executor times every batch itself, keeps the time per tenant and reports it to the scheduler as
// the batch's execution time.
//
//   fairness         two standard-class tenants with weights 1 and 3 both keep `queue_depth`
//                    requests outstanding (saturation); over the measured window, the heavier
//                    tenant's execution time over the lighter's (target: 3 within 10 %), and the
//                    same ratio of the scheduler's charged_time.
//   noisy-neighbour  a realtime tenant sends single requests at a fixed rate, first alone, then
//                    beside a batch-class (best-effort) tenant that keeps its queue full while a
//                    concurrent Model::Load of the recogniser (rec) stands in for an upload; the
//                    best-effort tenant also runs alone. Realtime p99 shared over alone (target:
//                    at most 1.10) and best-effort throughput shared over alone (at least 0.7).
//
// Threading: runs its own producer, pacer and loader threads and joins them. Ownership: plain
// values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

// What runs each batch, shared by both cases.
struct MeteredExecutorOptions {
  std::string executor = "cls";  // "cls" (the classifier through Model::Run) or "spin"
  int spin_us = 2000;            // spin: busy time per request
  int threads = 1;               // cls: BLAS threads
  std::string models_dir;
  uint64_t seed = 20261130;
};

struct FairnessOptions {
  MeteredExecutorOptions executor;
  int light_weight = 1;
  int heavy_weight = 3;
  int duration_ms = 20000;  // measured window
  int warmup_ms = 2000;     // saturated, not measured
  int queue_depth = 32;     // outstanding requests per tenant
  int max_batch_size = 8;
  bool json = false;
};

struct FairnessResult {
  double share_ratio = 0;    // heavy_exec_ms / light_exec_ms (executor's own timing)
  double charged_ratio = 0;  // heavy_charged_ms / light_charged_ms (Scheduler::StatsFor)
  double heavy_exec_ms = 0;
  double light_exec_ms = 0;
  double heavy_charged_ms = 0;
  double light_charged_ms = 0;
  int64_t heavy_requests = 0;  // rows executed in the window
  int64_t light_requests = 0;
  int heavy_weight = 0;
  int light_weight = 0;
  double seconds = 0;
  std::string executor;
};

struct NoisyNeighbourOptions {
  MeteredExecutorOptions executor;
  int realtime_rate = 50;  // realtime requests per second, one row each
  int duration_ms = 4000;  // each of the three phases, in each round
  int warmup_ms = 500;     // before each phase's window
  int rounds = 5;          // the three phases take turns this many times
  int queue_depth = 32;    // best-effort requests outstanding
  int max_batch_size = 8;
  int best_effort_max_batch_size = 1;  // SchedulerOptions::best_effort_max_batch_size
  int best_effort_max_batch_ms = 5;    // SchedulerOptions::best_effort_max_batch_time
  int max_batches_in_flight = 1;       // per worker (the worker runs this many at once)
  int realtime_reserved_slots = 0;     // SchedulerOptions::realtime_reserved_slots
  int arrival_guard_us = 1000;         // SchedulerOptions::realtime_arrival_guard; 0: off
  // SchedulerOptions::max_queue_delay. 0: a lone realtime request is dispatched at once rather
  // than waiting for company (the best-effort queue is full anyway).
  int queue_delay_ms = 0;
  // Model::Load of rec, one after another from the start of each round's shared window.
  int loads = 1;
  bool json = false;
};

struct NoisyNeighbourResult {
  double p50_alone_ms = 0;
  double p99_alone_ms = 0;
  double p50_shared_ms = 0;
  double p99_shared_ms = 0;
  double p99_inflation = 0;        // p99_shared_ms / p99_alone_ms
  double be_alone_rps = 0;         // best-effort requests answered per second, alone
  double be_shared_rps = 0;        // the same beside the realtime tenant and the loads
  double be_throughput_share = 0;  // be_shared_rps / be_alone_rps
  int64_t realtime_alone_requests = 0;
  int64_t realtime_shared_requests = 0;
  int loads_done = 0;  // rec loads finished during the shared phases
  double load_ms = 0;  // mean time of one of them
  std::string executor;
};

absl::StatusOr<FairnessOptions> ParseFairnessFlags(const std::vector<std::string>& args,
                                                   FairnessOptions defaults);
std::string FairnessUsage();
// One JSON object on one line: share_ratio, charged_ratio, heavy_exec_ms, light_exec_ms,
// heavy_charged_ms, light_charged_ms, heavy_requests, light_requests, heavy_weight, light_weight,
// seconds, executor.
std::string FairnessJsonLine(const FairnessResult& result);
std::string FairnessTable(const FairnessResult& result);
// Errors: the model cannot be loaded or run, the scheduler refuses its options, a request is
// answered with an error, or a tenant executed nothing in the window.
absl::StatusOr<FairnessResult> RunFairness(const FairnessOptions& options, std::FILE* out,
                                           std::FILE* log);

absl::StatusOr<NoisyNeighbourOptions> ParseNoisyNeighbourFlags(const std::vector<std::string>& args,
                                                               NoisyNeighbourOptions defaults);
std::string NoisyNeighbourUsage();
// One JSON object on one line: p50_alone_ms, p99_alone_ms, p50_shared_ms, p99_shared_ms,
// p99_inflation, be_alone_rps, be_shared_rps, be_throughput_share, realtime_alone_requests,
// realtime_shared_requests, loads_done, load_ms, executor.
std::string NoisyNeighbourJsonLine(const NoisyNeighbourResult& result);
std::string NoisyNeighbourTable(const NoisyNeighbourResult& result);
// Errors as for RunFairness, and the recogniser cannot be read or loaded.
absl::StatusOr<NoisyNeighbourResult> RunNoisyNeighbour(const NoisyNeighbourOptions& options,
                                                       std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
