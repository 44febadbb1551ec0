// `cloister-bench scheduler-overhead`: the host time cloisterd's Scheduler (host/scheduler)
// adds per inference request, against handing the same request straight to the same in-process
// executor. Both sides use a FunctionEnclaveClient with the no-op executor (NoOpInferHandler:
// it answers every item at once, no enclave, cryptography or I/O), so all that is measured is
// admission, queueing, batch forming, dispatch and answer:
//
//   scheduler  Scheduler::Submit of one request, until its Done callback has run
//   direct     FunctionEnclaveClient::Call with a one-item InferBatchCall, until its Done ran
//
// Latency is closed loop (one request at a time; p50 and p99 per request). Throughput is open
// loop: `producers` threads submit `requests` requests as fast as they can, timed until every
// one is answered. The scheduler runs with max_queue_delay 0 (dispatch at once), no rate limit
// and queue limits large enough for the whole run.
//
// Threading: runs its own producer threads and joins them. Ownership: plain values.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct SchedulerOverheadOptions {
  int latency_requests = 20000;      // closed-loop requests per side
  int throughput_requests = 200000;  // open-loop requests per side
  int producers = 1;
  int tenants = 4;
  int max_batch_size = 8;
  bool json = false;
};

struct SchedulerOverheadResult {
  std::string side;  // "scheduler" or "direct"
  double ns_per_request_p50 = 0;
  double ns_per_request_p99 = 0;
  double requests_per_s = 0;
  int latency_requests = 0;
  int throughput_requests = 0;
};

absl::StatusOr<SchedulerOverheadOptions> ParseSchedulerOverheadFlags(
    const std::vector<std::string>& args, SchedulerOverheadOptions defaults);
std::string SchedulerOverheadUsage();

// One JSON object on one line: side, ns_per_request_p50, ns_per_request_p99, requests_per_s, and
// the extras latency_requests, throughput_requests.
std::string SchedulerOverheadJsonLine(const SchedulerOverheadResult& result);
// Both sides and the scheduler's added time per request (p50 difference).
std::string SchedulerOverheadTable(const std::vector<SchedulerOverheadResult>& results);

// Runs both sides (scheduler first, then direct). Errors: the scheduler refuses its options or a
// request is answered with an error.
absl::StatusOr<std::vector<SchedulerOverheadResult>> RunSchedulerOverhead(
    const SchedulerOverheadOptions& options, std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
