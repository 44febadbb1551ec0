#include "base/flags.h"
#include "bench/scheduler_overhead.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "host/enclave_client/function_enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

using Clock = std::chrono::steady_clock;
// Submits request `index` from `producer`; `done` runs once with whether it was answered OK.
using Submitter = std::function<void(int producer, int index, std::function<void(bool ok)> done)>;

constexpr char kModelHandle[] = "0123456789abcdef0123456789abcdef";

boundary::v1::ForwardedRequest MakeItem(int producer, int index) {
  boundary::v1::ForwardedRequest item;
  item.set_request_id(absl::StrCat(producer, "-", index));
  item.set_model_handle(kModelHandle);
  item.set_ciphertext("x");
  return item;
}

double Percentile(std::vector<double>& sorted, double fraction) {
  const size_t rank = std::min(sorted.size() - 1, static_cast<size_t>(fraction * sorted.size()));
  return sorted[rank];
}

// Closed loop: one request at a time, nanoseconds from submission to answer.
absl::Status MeasureLatency(const Submitter& submit, int count, SchedulerOverheadResult* result) {
  std::vector<double> samples;
  samples.reserve(count);
  absl::Mutex mu;
  for (int i = 0; i < count; ++i) {
    bool answered = false, ok = false;
    const auto start = Clock::now();
    submit(0, i, [&](bool reply_ok) {
      absl::MutexLock lock(&mu);
      ok = reply_ok;
      answered = true;
    });
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&answered));
    }
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count());
    if (!ok) return absl::InternalError(absl::StrCat("request ", i, " was answered with an error"));
  }
  std::sort(samples.begin(), samples.end());
  result->ns_per_request_p50 = Percentile(samples, 0.5);
  result->ns_per_request_p99 = Percentile(samples, 0.99);
  result->latency_requests = count;
  return absl::OkStatus();
}

// Open loop: producers submit as fast as they can; requests per second until all are answered.
absl::Status MeasureThroughput(const Submitter& submit, int count, int producers,
                               SchedulerOverheadResult* result) {
  std::atomic<int64_t> answered{0}, failed{0};
  const int per_producer = std::max(1, count / producers);
  const int64_t total = int64_t{per_producer} * producers;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < per_producer; ++i) {
        submit(p, i, [&](bool ok) {
          if (!ok) failed.fetch_add(1);
          answered.fetch_add(1, std::memory_order_release);
        });
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  while (answered.load(std::memory_order_acquire) < total) std::this_thread::yield();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed.load() != 0) {
    return absl::InternalError(absl::StrCat(failed.load(), " requests were answered with errors"));
  }
  result->requests_per_s = total / seconds;
  result->throughput_requests = static_cast<int>(total);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<host::Scheduler>> MakeScheduler(
    const SchedulerOverheadOptions& options, host::EnclaveClient* worker) {
  host::SchedulerOptions scheduler_options;
  scheduler_options.max_batch_size = options.max_batch_size;
  scheduler_options.max_queue_delay = absl::ZeroDuration();
  scheduler_options.default_limits.max_queued_requests = 1 << 24;
  scheduler_options.default_limits.max_queued_size = uint64_t{1} << 40;
  return host::Scheduler::Create(worker, scheduler_options);
}

}  // namespace

absl::StatusOr<SchedulerOverheadOptions> ParseSchedulerOverheadFlags(
    const std::vector<std::string>& args, SchedulerOverheadOptions options) {
  RETURN_IF_ERROR(
      ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                            {"--latency-requests", IntFlag{&options.latency_requests, 1}},
                            {"--throughput-requests", IntFlag{&options.throughput_requests, 1}},
                            {"--producers", IntFlag{&options.producers, 1}},
                            {"--tenants", IntFlag{&options.tenants, 1}},
                            {"--max-batch", IntFlag{&options.max_batch_size, 1}}}));
  return options;
}

std::string SchedulerOverheadUsage() {
  return "host time per request in the Scheduler against calling the executor directly\n"
         "                   [--json] [--latency-requests N (20000)] [--throughput-requests N "
         "(200000)]\n"
         "                   [--producers N (1)] [--tenants N (4)] [--max-batch N (8)]\n";
}

std::string SchedulerOverheadJsonLine(const SchedulerOverheadResult& result) {
  nlohmann::ordered_json line;
  line["side"] = result.side;
  line["ns_per_request_p50"] = result.ns_per_request_p50;
  line["ns_per_request_p99"] = result.ns_per_request_p99;
  line["requests_per_s"] = result.requests_per_s;
  line["latency_requests"] = result.latency_requests;
  line["throughput_requests"] = result.throughput_requests;
  return line.dump();
}

std::string SchedulerOverheadTable(const std::vector<SchedulerOverheadResult>& results) {
  std::string table =
      absl::StrFormat("%-10s %12s %12s %14s\n", "side", "p50 ns", "p99 ns", "requests/s");
  for (const SchedulerOverheadResult& result : results) {
    absl::StrAppendFormat(&table, "%-10s %12.0f %12.0f %14.0f\n", result.side,
                          result.ns_per_request_p50, result.ns_per_request_p99,
                          result.requests_per_s);
  }
  if (results.size() == 2) {
    absl::StrAppendFormat(&table, "the scheduler adds %.0f ns per request at p50\n",
                          results[0].ns_per_request_p50 - results[1].ns_per_request_p50);
  }
  return table;
}

absl::StatusOr<std::vector<SchedulerOverheadResult>> RunSchedulerOverhead(
    const SchedulerOverheadOptions& options, std::FILE* out, std::FILE* log) {
  std::vector<SchedulerOverheadResult> results;
  auto report = [&](SchedulerOverheadResult result) {
    if (options.json) {
      absl::FPrintF(out, "%s\n", SchedulerOverheadJsonLine(result));
      std::fflush(out);
    } else {
      absl::FPrintF(log, "%s: p50 %.0f ns, %.0f requests/s\n", result.side,
                    result.ns_per_request_p50, result.requests_per_s);
    }
    results.push_back(std::move(result));
  };
  {
    host::FunctionEnclaveClient executor(host::NoOpInferHandler());
    ASSIGN_OR_RETURN(std::unique_ptr<host::Scheduler> scheduler, MakeScheduler(options, &executor));
    const Submitter submit = [&](int producer, int index, std::function<void(bool)> done) {
      host::InferRequest request;
      request.tenant_id = absl::StrCat("tenant", (producer + index) % options.tenants);
      request.item = MakeItem(producer, index);
      scheduler->Submit(
          std::move(request),
          [done = std::move(done)](absl::StatusOr<boundary::v1::EnclaveReply> reply) {
            done(reply.ok());
          });
    };
    SchedulerOverheadResult result;
    result.side = "scheduler";
    RETURN_IF_ERROR(MeasureLatency(submit, options.latency_requests, &result));
    RETURN_IF_ERROR(
        MeasureThroughput(submit, options.throughput_requests, options.producers, &result));
    scheduler->Stop();
    report(std::move(result));
  }
  {
    host::FunctionEnclaveClient executor(host::NoOpInferHandler());
    const Submitter submit = [&](int producer, int index, std::function<void(bool)> done) {
      boundary::v1::HostToEnclave call;
      boundary::v1::InferBatchCall* batch = call.mutable_infer_batch();
      batch->set_tenant_id(absl::StrCat("tenant", (producer + index) % options.tenants));
      batch->set_model_handle(kModelHandle);
      *batch->add_items() = MakeItem(producer, index);
      executor.Call(std::move(call), [done = std::move(done)](host::EnclaveClient::Reply reply) {
        done(reply.ok() && reply->infer_batch().replies_size() == 1);
      });
    };
    SchedulerOverheadResult result;
    result.side = "direct";
    RETURN_IF_ERROR(MeasureLatency(submit, options.latency_requests, &result));
    RETURN_IF_ERROR(
        MeasureThroughput(submit, options.throughput_requests, options.producers, &result));
    report(std::move(result));
  }
  if (!options.json) absl::FPrintF(out, "%s", SchedulerOverheadTable(results));
  return results;
}

}  // namespace cloister::bench
