#include "base/flags.h"
#include "bench/tenant_isolation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/status.h"
#include "bench/runtime_vs_ort.h"
#include "enclave/runtime/model.h"
#include "host/enclave_client/function_enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
using NamedTensors = std::vector<std::pair<std::string, runtime::Tensor>>;

constexpr char kModelHandle[] = "c1a55f1e4c1a55f1e4c1a55f1e4c1a55";

double MillisSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
}

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Nearest rank; CHECK-fails on an empty set.
double Percentile(std::vector<double> samples, double fraction) {
  CLOISTER_CHECK(!samples.empty());
  std::sort(samples.begin(), samples.end());
  const size_t rank = std::min(samples.size() - 1, static_cast<size_t>(fraction * samples.size()));
  return samples[rank];
}

absl::StatusOr<std::string> ModelPath(const std::string& models_dir, const std::string& name) {
  for (const BenchModel& model : BenchModels()) {
    if (model.name == name) return (std::filesystem::path(models_dir) / model.file).string();
  }
  return absl::NotFoundError(absl::StrCat("no model named \"", name, "\""));
}

// The one worker's executor: runs each InferBatchCall of N requests as N rows and keeps the
// execution time per tenant. Thread-safe; the handler runs on the client's one thread.
class MeteredExecutor {
 public:
  struct Usage {
    int64_t execution_ns = 0;
    int64_t rows = 0;
  };

  static absl::StatusOr<std::unique_ptr<MeteredExecutor>> Create(
      const MeteredExecutorOptions& options, int max_rows) {
    auto executor = std::unique_ptr<MeteredExecutor>(new MeteredExecutor(options));
    if (options.executor == "cls") {
      ASSIGN_OR_RETURN(std::string path, ModelPath(options.models_dir, "cls"));
      ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
      runtime::LoadOptions load_options;
      load_options.threads = options.threads;
      ASSIGN_OR_RETURN(executor->model_, runtime::Model::Load(AsBytes(bytes), load_options));
      for (int rows = 1; rows <= max_rows; ++rows) {
        ASSIGN_OR_RETURN(NamedTensors inputs, MakeInputs("cls", rows, options.seed + rows));
        // One untimed run per batch size, so that the measured runs find warm buffers.
        RETURN_IF_ERROR(executor->model_->Run(inputs).status());
        executor->inputs_.push_back(std::move(inputs));
      }
    }
    return executor;
  }

  host::FunctionEnclaveClient::Handler Handler() {
    return [this](const boundary::v1::HostToEnclave& call)
               -> absl::StatusOr<boundary::v1::EnclaveToHost> {
      if (call.call_case() != boundary::v1::HostToEnclave::kInferBatch) {
        return absl::UnimplementedError("the metered executor only answers inference batches");
      }
      const boundary::v1::InferBatchCall& batch = call.infer_batch();
      const int rows = batch.items_size();
      const auto start = SteadyClock::now();
      RETURN_IF_ERROR(Execute(rows));
      const int64_t execution_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
      {
        absl::MutexLock lock(&mu_);
        Usage& usage = usage_[batch.tenant_id()];
        usage.execution_ns += execution_ns;
        usage.rows += rows;
      }
      boundary::v1::EnclaveToHost reply;
      boundary::v1::InferBatchResult* result = reply.mutable_infer_batch();
      for (const boundary::v1::ForwardedRequest& item : batch.items()) {
        boundary::v1::EnclaveReply* out = result->add_replies();
        out->set_request_id(item.request_id());
        out->set_sequence(item.sequence());
      }
      result->set_execution_ns(execution_ns);
      return reply;
    };
  }

  Usage UsageOf(const std::string& tenant) const {
    absl::MutexLock lock(&mu_);
    auto it = usage_.find(tenant);
    return it == usage_.end() ? Usage{} : it->second;
  }

 private:
  explicit MeteredExecutor(const MeteredExecutorOptions& options) : options_(options) {}

  absl::Status Execute(int rows) {
    if (options_.executor == "spin") {
      const auto until =
          SteadyClock::now() + std::chrono::microseconds(int64_t{rows} * options_.spin_us);
      while (SteadyClock::now() < until) {
      }
      return absl::OkStatus();
    }
    if (rows < 1 || rows > static_cast<int>(inputs_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch of ", rows, " requests exceeds the prepared ", inputs_.size()));
    }
    return model_->Run(inputs_[rows - 1]).status();
  }

  const MeteredExecutorOptions options_;
  std::unique_ptr<runtime::Model> model_;
  std::vector<NamedTensors> inputs_;  // [rows - 1]
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
};

host::InferRequest MakeRequest(const std::string& tenant, int64_t index) {
  host::InferRequest request;
  request.tenant_id = tenant;
  request.item.set_request_id(absl::StrCat(tenant, "-", index));
  request.item.set_model_handle(kModelHandle);
  request.item.set_ciphertext("x");
  return request;
}

// Keeps `depth` requests of one tenant outstanding until stopped.
class Flooder {
 public:
  Flooder(host::Scheduler* scheduler, std::string tenant, int depth)
      : scheduler_(scheduler), tenant_(std::move(tenant)), depth_(depth) {}
  ~Flooder() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }
  // Stops submitting and waits until every outstanding request is answered.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Flooder::Drained));
  }
  int64_t answered() const {
    absl::MutexLock lock(&mu_);
    return answered_;
  }
  int64_t failed() const {
    absl::MutexLock lock(&mu_);
    return failed_;
  }

 private:
  bool MaySubmit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || outstanding_ < depth_;
  }
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; }

  void Loop() {
    for (int64_t index = 0;; ++index) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Flooder::MaySubmit));
        if (stopping_) return;
        ++outstanding_;
      }
      scheduler_->Submit(MakeRequest(tenant_, index),
                         [this](absl::StatusOr<boundary::v1::EnclaveReply> reply) {
                           absl::MutexLock lock(&mu_);
                           --outstanding_;
                           ++(reply.ok() ? answered_ : failed_);
                         });
    }
  }

  host::Scheduler* const scheduler_;
  const std::string tenant_;
  const int depth_;
  mutable absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t answered_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Sends one request every 1/rate seconds for `untimed_ms` plus `duration_ms` on the calling
// thread and returns the latency (submission to answer, ms) of each one sent after the first
// `untimed_ms`, once all are answered. One unbroken pace, so the scheduler sees a steady
// period from warm-up into the timed requests.
absl::StatusOr<std::vector<double>> PacedLatencies(host::Scheduler& scheduler,
                                                   const std::string& tenant, int rate,
                                                   int untimed_ms, int duration_ms) {
  absl::Mutex mu;
  std::vector<double> latencies;
  int outstanding = 0;
  int64_t failed = 0;
  const auto interval = std::chrono::nanoseconds(1'000'000'000 / rate);
  const int64_t untimed = int64_t{untimed_ms} * rate / 1000;
  const int64_t count = untimed + std::max<int64_t>(1, int64_t{duration_ms} * rate / 1000);
  const auto first = SteadyClock::now();
  for (int64_t i = 0; i < count; ++i) {
    std::this_thread::sleep_until(first + i * interval);
    {
      absl::MutexLock lock(&mu);
      ++outstanding;
    }
    const auto submitted = SteadyClock::now();
    const bool timed = i >= untimed;
    scheduler.Submit(MakeRequest(tenant, i),
                     [&, submitted, timed](absl::StatusOr<boundary::v1::EnclaveReply> reply) {
                       const double ms = MillisSince(submitted);
                       absl::MutexLock lock(&mu);
                       --outstanding;
                       if (reply.ok()) {
                         if (timed) latencies.push_back(ms);
                       } else {
                         ++failed;
                       }
                     });
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &outstanding));
  if (failed != 0) {
    return absl::InternalError(
        absl::StrCat(failed, " realtime requests were answered with errors"));
  }
  return latencies;
}

std::vector<FlagSpec> ExecutorFlags(MeteredExecutorOptions& options) {
  return {{"--executor", StringFlag{&options.executor, {"cls", "spin"}}},
          {"--spin-us", IntFlag{&options.spin_us, 1}},
          {"--threads", IntFlag{&options.threads, 1}},
          {"--models-dir", StringFlag{&options.models_dir, {}}}};
}

void PrepareLimits(host::SchedulerOptions& options) {
  options.default_limits.max_queued_requests = 1 << 20;
  options.default_limits.max_queued_size = uint64_t{1} << 40;
}

}  // namespace

absl::StatusOr<FairnessOptions> ParseFairnessFlags(const std::vector<std::string>& args,
                                                   FairnessOptions options) {
  std::vector<FlagSpec> specs = ExecutorFlags(options.executor);
  specs.push_back({"--json", SwitchFlag{&options.json}});
  specs.push_back({"--light-weight", IntFlag{&options.light_weight, 1}});
  specs.push_back({"--heavy-weight", IntFlag{&options.heavy_weight, 1}});
  specs.push_back({"--duration-ms", IntFlag{&options.duration_ms, 1}});
  specs.push_back({"--warmup-ms", IntFlag{&options.warmup_ms, 0}});
  specs.push_back({"--queue-depth", IntFlag{&options.queue_depth, 1}});
  specs.push_back({"--max-batch", IntFlag{&options.max_batch_size, 1}});
  RETURN_IF_ERROR(ParseFlags(args, specs));
  return options;
}

std::string FairnessUsage() {
  return "execution-time shares of two saturating tenants with weights 1 and 3 on one worker\n"
         "                   [--json] [--duration-ms N (20000)] [--warmup-ms N (2000)]\n"
         "                   [--light-weight N (1)] [--heavy-weight N (3)] [--queue-depth N "
         "(32)]\n"
         "                   [--max-batch N (8)] [--executor cls|spin (cls)] [--spin-us N "
         "(2000)]\n"
         "                   [--threads N (1)] [--models-dir DIR]\n";
}

std::string FairnessJsonLine(const FairnessResult& result) {
  nlohmann::ordered_json line;
  line["share_ratio"] = result.share_ratio;
  line["charged_ratio"] = result.charged_ratio;
  line["heavy_exec_ms"] = result.heavy_exec_ms;
  line["light_exec_ms"] = result.light_exec_ms;
  line["heavy_charged_ms"] = result.heavy_charged_ms;
  line["light_charged_ms"] = result.light_charged_ms;
  line["heavy_requests"] = result.heavy_requests;
  line["light_requests"] = result.light_requests;
  line["heavy_weight"] = result.heavy_weight;
  line["light_weight"] = result.light_weight;
  line["seconds"] = result.seconds;
  line["executor"] = result.executor;
  return line.dump();
}

std::string FairnessTable(const FairnessResult& result) {
  std::string table = absl::StrFormat("%-7s %6s %12s %12s %10s\n", "tenant", "weight", "exec ms",
                                      "charged ms", "requests");
  absl::StrAppendFormat(&table, "%-7s %6d %12.1f %12.1f %10d\n", "light", result.light_weight,
                        result.light_exec_ms, result.light_charged_ms, result.light_requests);
  absl::StrAppendFormat(&table, "%-7s %6d %12.1f %12.1f %10d\n", "heavy", result.heavy_weight,
                        result.heavy_exec_ms, result.heavy_charged_ms, result.heavy_requests);
  const double target = static_cast<double>(result.heavy_weight) / result.light_weight;
  absl::StrAppendFormat(
      &table,
      "share ratio %.3f (target %.2f within 10 %%: %s), charged ratio %.3f; %s executor, %.1f s\n",
      result.share_ratio, target,
      std::abs(result.share_ratio / target - 1) <= 0.1 ? "met" : "missed", result.charged_ratio,
      result.executor, result.seconds);
  return table;
}

absl::StatusOr<FairnessResult> RunFairness(const FairnessOptions& options, std::FILE* out,
                                           std::FILE* log) {
  ASSIGN_OR_RETURN(std::unique_ptr<MeteredExecutor> executor,
                   MeteredExecutor::Create(options.executor, options.max_batch_size));
  host::FunctionEnclaveClient worker(executor->Handler(), /*threads=*/1);
  host::SchedulerOptions scheduler_options;
  scheduler_options.max_batch_size = options.max_batch_size;
  scheduler_options.max_batches_in_flight = 1;
  PrepareLimits(scheduler_options);
  const std::string light = "light", heavy = "heavy";
  scheduler_options.tenant_limits[light] = scheduler_options.default_limits;
  scheduler_options.tenant_limits[light].weight = options.light_weight;
  scheduler_options.tenant_limits[heavy] = scheduler_options.default_limits;
  scheduler_options.tenant_limits[heavy].weight = options.heavy_weight;
  ASSIGN_OR_RETURN(std::unique_ptr<host::Scheduler> scheduler,
                   host::Scheduler::Create(&worker, scheduler_options));

  Flooder light_flood(scheduler.get(), light, options.queue_depth);
  Flooder heavy_flood(scheduler.get(), heavy, options.queue_depth);
  light_flood.Start();
  heavy_flood.Start();
  if (!options.json)
    absl::FPrintF(log, "saturating both tenants: %d ms warm-up\n", options.warmup_ms);
  SleepMs(options.warmup_ms);
  const MeteredExecutor::Usage light_start = executor->UsageOf(light);
  const MeteredExecutor::Usage heavy_start = executor->UsageOf(heavy);
  const absl::Duration light_charged_start = scheduler->StatsFor(light).charged_time;
  const absl::Duration heavy_charged_start = scheduler->StatsFor(heavy).charged_time;
  const auto window_start = SteadyClock::now();
  if (!options.json) absl::FPrintF(log, "measuring: %d ms\n", options.duration_ms);
  SleepMs(options.duration_ms);
  const MeteredExecutor::Usage light_end = executor->UsageOf(light);
  const MeteredExecutor::Usage heavy_end = executor->UsageOf(heavy);
  const absl::Duration light_charged_end = scheduler->StatsFor(light).charged_time;
  const absl::Duration heavy_charged_end = scheduler->StatsFor(heavy).charged_time;
  const double seconds = MillisSince(window_start) / 1000;
  light_flood.Stop();
  heavy_flood.Stop();
  scheduler->Stop();
  if (light_flood.failed() + heavy_flood.failed() != 0) {
    return absl::InternalError(absl::StrCat(light_flood.failed() + heavy_flood.failed(),
                                            " requests were answered with errors"));
  }

  FairnessResult result;
  result.light_weight = options.light_weight;
  result.heavy_weight = options.heavy_weight;
  result.light_exec_ms = (light_end.execution_ns - light_start.execution_ns) / 1e6;
  result.heavy_exec_ms = (heavy_end.execution_ns - heavy_start.execution_ns) / 1e6;
  result.light_requests = light_end.rows - light_start.rows;
  result.heavy_requests = heavy_end.rows - heavy_start.rows;
  result.light_charged_ms = absl::ToDoubleMilliseconds(light_charged_end - light_charged_start);
  result.heavy_charged_ms = absl::ToDoubleMilliseconds(heavy_charged_end - heavy_charged_start);
  result.seconds = seconds;
  result.executor = options.executor.executor;
  if (result.light_exec_ms <= 0 || result.heavy_exec_ms <= 0 || result.light_charged_ms <= 0) {
    return absl::InternalError(absl::StrFormat(
        "a tenant executed nothing in the %d ms window (light %.1f ms, heavy %.1f ms)",
        options.duration_ms, result.light_exec_ms, result.heavy_exec_ms));
  }
  result.share_ratio = result.heavy_exec_ms / result.light_exec_ms;
  result.charged_ratio = result.heavy_charged_ms / result.light_charged_ms;
  if (options.json) {
    absl::FPrintF(out, "%s\n", FairnessJsonLine(result));
  } else {
    absl::FPrintF(out, "%s", FairnessTable(result));
  }
  std::fflush(out);
  return result;
}

absl::StatusOr<NoisyNeighbourOptions> ParseNoisyNeighbourFlags(const std::vector<std::string>& args,
                                                               NoisyNeighbourOptions options) {
  std::vector<FlagSpec> specs = ExecutorFlags(options.executor);
  specs.push_back({"--json", SwitchFlag{&options.json}});
  specs.push_back({"--rate", IntFlag{&options.realtime_rate, 1}});
  specs.push_back({"--duration-ms", IntFlag{&options.duration_ms, 1}});
  specs.push_back({"--warmup-ms", IntFlag{&options.warmup_ms, 0}});
  specs.push_back({"--queue-depth", IntFlag{&options.queue_depth, 1}});
  specs.push_back({"--max-batch", IntFlag{&options.max_batch_size, 1}});
  specs.push_back({"--be-max-batch", IntFlag{&options.best_effort_max_batch_size, 1}});
  specs.push_back({"--be-max-batch-ms", IntFlag{&options.best_effort_max_batch_ms, 1}});
  specs.push_back({"--in-flight", IntFlag{&options.max_batches_in_flight, 1}});
  specs.push_back({"--reserved-slots", IntFlag{&options.realtime_reserved_slots, 0}});
  specs.push_back({"--arrival-guard-us", IntFlag{&options.arrival_guard_us, 0}});
  specs.push_back({"--queue-delay-ms", IntFlag{&options.queue_delay_ms, 0}});
  specs.push_back({"--loads", IntFlag{&options.loads, 0}});
  specs.push_back({"--rounds", IntFlag{&options.rounds, 1}});
  RETURN_IF_ERROR(ParseFlags(args, specs));
  return options;
}

std::string NoisyNeighbourUsage() {
  return "realtime latency alone and beside a flooding best-effort tenant and a model load\n"
         "                   [--json] [--rate N (50/s)] [--duration-ms N (4000 per phase and "
         "round)]\n"
         "                   [--warmup-ms N (500)] [--rounds N (5)] [--queue-depth N (32)]\n"
         "                   [--max-batch N (8)] [--be-max-batch N (1)] [--be-max-batch-ms N "
         "(5)]\n"
         "                   [--in-flight N (1)] [--queue-delay-ms N (0)] [--loads N (1)]\n"
         "                   [--reserved-slots N (0)] [--arrival-guard-us N (1000; 0: off)]\n"
         "                   [--executor cls|spin (cls)] [--spin-us N (2000)] [--threads N (1)]\n"
         "                   [--models-dir DIR]\n";
}

std::string NoisyNeighbourJsonLine(const NoisyNeighbourResult& result) {
  nlohmann::ordered_json line;
  line["p50_alone_ms"] = result.p50_alone_ms;
  line["p99_alone_ms"] = result.p99_alone_ms;
  line["p50_shared_ms"] = result.p50_shared_ms;
  line["p99_shared_ms"] = result.p99_shared_ms;
  line["p99_inflation"] = result.p99_inflation;
  line["be_alone_rps"] = result.be_alone_rps;
  line["be_shared_rps"] = result.be_shared_rps;
  line["be_throughput_share"] = result.be_throughput_share;
  line["realtime_alone_requests"] = result.realtime_alone_requests;
  line["realtime_shared_requests"] = result.realtime_shared_requests;
  line["loads_done"] = result.loads_done;
  line["load_ms"] = result.load_ms;
  line["executor"] = result.executor;
  return line.dump();
}

std::string NoisyNeighbourTable(const NoisyNeighbourResult& result) {
  std::string table = absl::StrFormat("%-8s %10s %10s %12s %10s\n", "phase", "rt p50 ms",
                                      "rt p99 ms", "rt requests", "be req/s");
  absl::StrAppendFormat(&table, "%-8s %10.2f %10.2f %12d %10s\n", "alone", result.p50_alone_ms,
                        result.p99_alone_ms, result.realtime_alone_requests, "-");
  absl::StrAppendFormat(&table, "%-8s %10s %10s %12s %10.1f\n", "be alone", "-", "-", "-",
                        result.be_alone_rps);
  absl::StrAppendFormat(&table, "%-8s %10.2f %10.2f %12d %10.1f\n", "shared", result.p50_shared_ms,
                        result.p99_shared_ms, result.realtime_shared_requests,
                        result.be_shared_rps);
  absl::StrAppendFormat(&table,
                        "p99 inflation %.3f (target <= 1.10: %s), best-effort share %.3f "
                        "(target >= 0.7: %s); %d rec loads of %.0f ms; %s executor\n",
                        result.p99_inflation, result.p99_inflation <= 1.10 ? "met" : "missed",
                        result.be_throughput_share,
                        result.be_throughput_share >= 0.7 ? "met" : "missed", result.loads_done,
                        result.load_ms, result.executor);
  return table;
}

absl::StatusOr<NoisyNeighbourResult> RunNoisyNeighbour(const NoisyNeighbourOptions& options,
                                                       std::FILE* out, std::FILE* log) {
  ASSIGN_OR_RETURN(std::string rec_path, ModelPath(options.executor.models_dir, "rec"));
  ASSIGN_OR_RETURN(std::string rec_bytes, ReadFile(rec_path));
  ASSIGN_OR_RETURN(std::unique_ptr<MeteredExecutor> executor,
                   MeteredExecutor::Create(options.executor, options.max_batch_size));
  // The worker runs as many batches at once as may be in flight, as the enclave does.
  host::FunctionEnclaveClient worker(executor->Handler(), options.max_batches_in_flight);
  host::SchedulerOptions scheduler_options;
  scheduler_options.max_batch_size = options.max_batch_size;
  scheduler_options.max_batches_in_flight = options.max_batches_in_flight;
  scheduler_options.realtime_reserved_slots = options.realtime_reserved_slots;
  scheduler_options.realtime_arrival_guard = absl::Microseconds(options.arrival_guard_us);
  scheduler_options.max_queue_delay = absl::Milliseconds(options.queue_delay_ms);
  scheduler_options.best_effort_max_batch_size = options.best_effort_max_batch_size;
  scheduler_options.best_effort_max_batch_time =
      absl::Milliseconds(options.best_effort_max_batch_ms);
  PrepareLimits(scheduler_options);
  const std::string realtime = "realtime", best_effort = "best-effort";
  scheduler_options.tenant_limits[realtime] = scheduler_options.default_limits;
  scheduler_options.tenant_limits[realtime].priority = host::PriorityClass::kRealtime;
  scheduler_options.tenant_limits[best_effort] = scheduler_options.default_limits;
  scheduler_options.tenant_limits[best_effort].priority = host::PriorityClass::kBatch;
  ASSIGN_OR_RETURN(std::unique_ptr<host::Scheduler> scheduler,
                   host::Scheduler::Create(&worker, scheduler_options));
  auto progress = [&](const std::string& line) {
    if (!options.json) absl::FPrintF(log, "%s\n", line);
  };

  NoisyNeighbourResult result;
  result.executor = options.executor.executor;
  // The three phases take turns, `rounds` times, so that a change in the machine's load hits
  // all of them alike; their samples and counts are pooled.
  std::vector<double> alone, shared;
  int64_t be_alone_answered = 0, be_shared_answered = 0;
  double be_alone_ms = 0, be_shared_ms = 0, load_total_ms = 0;
  for (int round = 1; round <= options.rounds; ++round) {
    const std::string prefix = absl::StrCat("round ", round, "/", options.rounds, ": ");
    // Phase 1: the realtime tenant alone.
    progress(absl::StrCat(prefix, "realtime alone, ", options.warmup_ms, " + ", options.duration_ms,
                          " ms"));
    ASSIGN_OR_RETURN(std::vector<double> latencies,
                     PacedLatencies(*scheduler, realtime, options.realtime_rate, options.warmup_ms,
                                    options.duration_ms));
    alone.insert(alone.end(), latencies.begin(), latencies.end());
    // Phase 2: the best-effort tenant alone.
    progress(absl::StrCat(prefix, "best-effort alone, ", options.warmup_ms, " + ",
                          options.duration_ms, " ms"));
    {
      Flooder flood(scheduler.get(), best_effort, options.queue_depth);
      flood.Start();
      SleepMs(options.warmup_ms);
      const int64_t answered_start = flood.answered();
      const auto start = SteadyClock::now();
      SleepMs(options.duration_ms);
      be_alone_answered += flood.answered() - answered_start;
      be_alone_ms += MillisSince(start);
      flood.Stop();
      if (flood.failed() != 0) {
        return absl::InternalError(
            absl::StrCat(flood.failed(), " best-effort requests were answered with errors"));
      }
    }
    // Phase 3: both, with the recogniser loading beside them.
    progress(absl::StrCat(prefix, "shared with ", options.loads, " rec loads, ", options.warmup_ms,
                          " + ", options.duration_ms, " ms"));
    {
      Flooder flood(scheduler.get(), best_effort, options.queue_depth);
      flood.Start();
      absl::Status load_status;
      int loads_done = 0;
      double loads_ms = 0;
      // The realtime tenant sends through the warm-up too (untimed, as alone); this thread opens
      // the timed window when the warm-up ends and starts the loads with it.
      int64_t answered_start = 0;
      SteadyClock::time_point start;
      std::thread loader([&] {
        SleepMs(options.warmup_ms);
        answered_start = flood.answered();
        start = SteadyClock::now();
        for (int i = 0; i < options.loads; ++i) {
          const auto start = SteadyClock::now();
          // threads 0: leave the process-wide BLAS thread count as the executor set it.
          auto model = runtime::Model::Load(AsBytes(rec_bytes), runtime::LoadOptions{});
          if (!model.ok()) {
            load_status = model.status();
            return;
          }
          loads_ms += MillisSince(start);
          ++loads_done;
        }
      });
      auto shared_latencies = PacedLatencies(*scheduler, realtime, options.realtime_rate,
                                             options.warmup_ms, options.duration_ms);
      const int64_t answered_end = flood.answered();
      const auto end = SteadyClock::now();
      loader.join();
      be_shared_answered += answered_end - answered_start;
      be_shared_ms += std::chrono::duration<double, std::milli>(end - start).count();
      flood.Stop();
      RETURN_IF_ERROR(shared_latencies.status());
      if (!load_status.ok()) {
        return absl::Status(load_status.code(),
                            absl::StrCat("loading rec: ", load_status.message()));
      }
      if (flood.failed() != 0) {
        return absl::InternalError(
            absl::StrCat(flood.failed(), " best-effort requests were answered with errors"));
      }
      shared.insert(shared.end(), shared_latencies->begin(), shared_latencies->end());
      result.loads_done += loads_done;
      load_total_ms += loads_ms;
    }
  }
  result.be_alone_rps = be_alone_answered / (be_alone_ms / 1000);
  result.be_shared_rps = be_shared_answered / (be_shared_ms / 1000);
  result.load_ms = result.loads_done > 0 ? load_total_ms / result.loads_done : 0;
  scheduler->Stop();
  if (alone.empty() || shared.empty() || result.be_alone_rps <= 0) {
    return absl::InternalError("a phase answered no requests; lengthen --duration-ms");
  }
  result.p50_alone_ms = Percentile(alone, 0.5);
  result.p99_alone_ms = Percentile(alone, 0.99);
  result.p50_shared_ms = Percentile(shared, 0.5);
  result.p99_shared_ms = Percentile(shared, 0.99);
  result.p99_inflation = result.p99_shared_ms / result.p99_alone_ms;
  result.be_throughput_share = result.be_shared_rps / result.be_alone_rps;
  result.realtime_alone_requests = static_cast<int64_t>(alone.size());
  result.realtime_shared_requests = static_cast<int64_t>(shared.size());
  if (options.json) {
    absl::FPrintF(out, "%s\n", NoisyNeighbourJsonLine(result));
  } else {
    absl::FPrintF(out, "%s", NoisyNeighbourTable(result));
  }
  std::fflush(out);
  return result;
}

}  // namespace cloister::bench
