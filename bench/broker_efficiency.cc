#include "base/flags.h"
#include "bench/broker_efficiency.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/file.h"
#include "base/status.h"
#include "bench/bench_support.h"
#include "bench/runtime_vs_ort.h"
#include "enclave/batch_runner.h"
#include "enclave/runtime/model.h"
#include "nlohmann/json.hpp"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "tests/support/process.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using NamedTensors = std::vector<std::pair<std::string, runtime::Tensor>>;

absl::StatusOr<std::string> DataTypeName(runtime::DataType dtype) {
  switch (dtype) {
    case runtime::DataType::kFloat:
      return "FP32";
    case runtime::DataType::kInt64:
      return "INT64";
    default:
      return absl::InvalidArgumentError("the benchmark inputs are FP32 or INT64 only");
  }
}

absl::StatusOr<std::vector<api::v1::Tensor>> ToApiTensors(const NamedTensors& inputs) {
  std::vector<api::v1::Tensor> tensors;
  for (const auto& [name, tensor] : inputs) {
    api::v1::Tensor& out = tensors.emplace_back();
    out.set_name(name);
    ASSIGN_OR_RETURN(std::string datatype, DataTypeName(tensor.dtype()));
    out.set_datatype(datatype);
    for (int64_t dim : tensor.shape()) out.add_shape(dim);
    out.set_raw(static_cast<const char*>(tensor.raw_data()), tensor.size());
  }
  return tensors;
}

// The direct side loads the model as the enclave worker does: on the CPU, with the BLAS
// threads shared out among the two batches a worker runs at once.
runtime::LoadOptions DirectLoadOptions() {
  runtime::LoadOptions options;
  // As cloister-enclave sets them on the CPU executor: two boundary threads, each batch in up to
  // DefaultRunThreads() runs side by side.
  options.threads = runtime::BlasThreadsFor(2 * enclave::DefaultRunThreads());
  return options;
}

// The largest |a - b| over the FP32 outputs the broker returned, against the direct outputs of
// the same name. InvalidArgument when an output is missing or its size differs.
absl::StatusOr<double> MaxAbsDiff(const std::vector<api::v1::Tensor>& broker,
                                  const NamedTensors& direct) {
  double largest = 0;
  int compared = 0;
  for (const api::v1::Tensor& output : broker) {
    if (output.datatype() != "FP32") continue;
    const auto match = std::find_if(direct.begin(), direct.end(), [&](const auto& named) {
      return named.first == output.name();
    });
    if (match == direct.end() || match->second.size() != output.raw().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output ", output.name(), " differs in presence or size between the sides"));
    }
    const float* theirs = match->second.data<float>();
    for (size_t i = 0; i < output.raw().size() / sizeof(float); ++i) {
      float ours;
      std::memcpy(&ours, output.raw().data() + i * sizeof(float), sizeof(float));
      largest = std::max(largest, static_cast<double>(std::fabs(ours - theirs[i])));
    }
    ++compared;
  }
  if (compared == 0) return absl::InvalidArgumentError("the broker returned no FP32 output");
  return largest;
}

// Runs `work(caller, index)` `count` times spread over `threads` threads; returns the wall time
// in seconds, or the first error.
absl::StatusOr<double> RunConcurrently(int threads, int count,
                                       const std::function<absl::Status(int caller)>& work) {
  std::atomic<int> next{0};
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (next.fetch_add(1) < count) {
        absl::Status status = work(t);
        if (!status.ok()) {
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = status;
          next.store(count);
          return;
        }
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  RETURN_IF_ERROR(first_error);
  return seconds;
}

}  // namespace

absl::StatusOr<BrokerEfficiencyOptions> ParseBrokerEfficiencyFlags(
    const std::vector<std::string>& args, BrokerEfficiencyOptions options) {
  std::string models = absl::StrJoin(options.models, ",");
  std::string model;
  RETURN_IF_ERROR(ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                                        {"--models", StringFlag{&models, {}}},
                                        {"--model", StringFlag{&model, {"cls", "bert_mini"}}},
                                        {"--models-dir", StringFlag{&options.models_dir, {}}},
                                        {"--cloisterd", StringFlag{&options.cloisterd, {}}},
                                        {"--batch", IntFlag{&options.batch, 1}},
                                        {"--callers", IntFlag{&options.callers, 1}},
                                        {"--direct-callers", IntFlag{&options.direct_callers, 0}},
                                        {"--requests", IntFlag{&options.requests, 1}},
                                        {"--rounds", IntFlag{&options.rounds, 1}},
                                        {"--max-batch", IntFlag{&options.max_batch, 0}},
                                        {"--workers", IntFlag{&options.workers, 0}},
                                        {"--warmup", IntFlag{&options.warmup, 0}}}));
  options.models = absl::StrSplit(model.empty() ? models : model, ',');
  for (const std::string& name : options.models) {
    if (name != "cls" && name != "bert_mini") {
      return absl::InvalidArgumentError(
          absl::StrCat("--models: no model named \"", name, "\" (cls, bert_mini)"));
    }
  }
  if (options.requests < options.rounds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--requests (", options.requests, ") must be at least --rounds (", options.rounds, ")"));
  }
  return options;
}

std::string BrokerEfficiencyUsage() {
  return "throughput through a real cloisterd and the SDK over calling the runtime directly\n"
         "                   [--json] [--models cls,bert_mini (both, one after the other)]\n"
         "                   [--model cls|bert_mini (one of them)] [--batch N (16)]\n"
         "                   [--callers N (4)] [--direct-callers N (0: as --callers)]\n"
         "                   [--requests N (96)] [--rounds N (8)] [--warmup N (2)]\n"
         "                   [--max-batch N (0: cloisterd's default scheduler batch size)]\n"
         "                   [--workers N (0: cloisterd's default of one enclave worker)]\n"
         "                   [--cloisterd PATH] [--models-dir DIR]\n";
}

std::string BrokerEfficiencyJsonLine(const BrokerEfficiencyResult& result) {
  nlohmann::ordered_json line;
  line["model"] = result.model;
  line["batch"] = result.batch;
  line["ratio"] = result.ratio();
  line["broker_rows_per_s"] = result.broker_rows_per_s();
  line["direct_rows_per_s"] = result.direct_rows_per_s();
  line["broker_ms_per_request"] = result.broker_seconds * 1e3 / result.requests;
  line["direct_ms_per_request"] = result.direct_seconds * 1e3 / result.requests;
  line["callers"] = result.callers;
  line["direct_callers"] = result.direct_callers;
  line["requests"] = result.requests;
  line["request"] = absl::StrCat("one tensor of ", result.batch, " rows");
  line["max_abs_diff"] = result.max_abs_diff;
  line["max_batch"] = result.max_batch;
  line["workers"] = result.workers;
  const double per_request = 1e3 / result.requests;
  line["enclave_cpu_ms"] = result.broker_enclave_cpu_seconds * per_request;
  line["cloisterd_cpu_ms"] = result.broker_cloisterd_cpu_seconds * per_request;
  line["client_cpu_ms"] = result.broker_client_cpu_seconds * per_request;
  line["direct_cpu_ms"] = result.direct_cpu_seconds * per_request;
  line["cpu_ceiling"] = result.cpu_ceiling();
  return line.dump();
}

std::string BrokerEfficiencyTable(const BrokerEfficiencyResult& result) {
  std::string table =
      absl::StrFormat("%-6s %5s %7s %8s %14s %14s %7s %10s\n", "model", "batch", "callers",
                      "requests", "broker rows/s", "direct rows/s", "ratio", "max|diff|");
  absl::StrAppendFormat(&table, "%-6s %5d %3d/%-3d %8d %14.1f %14.1f %7.3f %10.1e\n", result.model,
                        result.batch, result.callers, result.direct_callers, result.requests,
                        result.broker_rows_per_s(), result.direct_rows_per_s(), result.ratio(),
                        result.max_abs_diff);
  const double per_request = 1e3 / result.requests;
  absl::StrAppendFormat(&table,
                        "CPU per request: enclave %.1f ms, cloisterd %.1f ms, SDK callers %.1f ms "
                        "(broker); runtime %.1f ms (direct)\n",
                        result.broker_enclave_cpu_seconds * per_request,
                        result.broker_cloisterd_cpu_seconds * per_request,
                        result.broker_client_cpu_seconds * per_request,
                        result.direct_cpu_seconds * per_request);
  absl::StrAppendFormat(&table,
                        "CPU ceiling %.3f (direct CPU over the broker side's: the ratio when both "
                        "sides keep every core busy)\n",
                        result.cpu_ceiling());
  absl::StrAppendFormat(&table, "ratio %.3f (target at least %.2f: %s)\n", result.ratio(),
                        kBrokerTargetRatio,
                        result.ratio() >= kBrokerTargetRatio ? "met" : "missed");
  return table;
}

namespace {

// CPU seconds used so far by this process, cloisterd and its enclave workers.
struct CpuUse {
  double self = 0, cloisterd = 0, enclave = 0;
};
CpuUse CpuOf(pid_t cloisterd) {
  CpuUse use;
  use.self = testing::ProcessCpuSeconds(::getpid());
  use.cloisterd = testing::ProcessCpuSeconds(cloisterd);
  for (pid_t worker : testing::EnclaveWorkers(cloisterd)) {
    use.enclave += testing::ProcessCpuSeconds(worker);
  }
  return use;
}

}  // namespace

absl::StatusOr<BrokerEfficiencyResult> RunBrokerEfficiency(const BrokerEfficiencyOptions& options,
                                                           std::FILE* out, std::FILE* log) {
  const auto& known = BenchModels();
  const auto bench_model = std::find_if(known.begin(), known.end(), [&](const BenchModel& model) {
    return model.name == options.model;
  });
  if (bench_model == known.end()) {
    return absl::NotFoundError(absl::StrCat("no model named \"", options.model, "\""));
  }
  const std::string model_path = (fs::path(options.models_dir) / bench_model->file).string();
  if (::access(options.cloisterd.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cloisterd binary ", options.cloisterd,
                                            " is missing or not executable (see --cloisterd)"));
  }
  const int direct_callers = options.direct_callers > 0 ? options.direct_callers : options.callers;

  // Same input for both sides.
  ASSIGN_OR_RETURN(NamedTensors inputs, MakeInputs(options.model, options.batch, options.seed));
  ASSIGN_OR_RETURN(std::vector<api::v1::Tensor> api_inputs, ToApiTensors(inputs));

  // Direct side.
  ASSIGN_OR_RETURN(std::string model_bytes, ReadFile(model_path));
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model,
                   runtime::Model::Load(AsBytes(model_bytes), DirectLoadOptions()));
  ASSIGN_OR_RETURN(NamedTensors direct_outputs, model->Run(inputs));

  // Broker side: cloisterd with a fresh data dir, one SDK client per caller.
  ASSIGN_OR_RETURN(const std::string work, MakeScratchDir("cloister-broker-bench"));
  const std::string data = work + "/data";
  std::vector<std::string> argv = {options.cloisterd, "--listen", "127.0.0.1:0", "--data-dir",
                                   data};
  // Free operator and metrics ports, so that it never collides with another daemon.
  std::string config_text = "operator:\n  listen: 127.0.0.1:0\n";
  if (options.max_batch > 0) {
    absl::StrAppend(&config_text, "scheduler:\n  max_batch_size: ", options.max_batch, "\n");
  }
  if (options.workers > 0) absl::StrAppend(&config_text, "workers: ", options.workers, "\n");
  const std::string config = work + "/cloisterd.yaml";
  RETURN_IF_ERROR(WriteFileAtomic(config, config_text, 0600));
  argv.insert(argv.end(), {"--config", config});
  if (!options.json) absl::FPrintF(log, "starting %s\n", absl::StrJoin(argv, " "));
  testing::Process cloisterd(argv, work);
  const std::string listening =
      cloisterd.WaitForStdout("cloisterd listening on ", absl::Seconds(60));
  if (listening.empty()) {
    return absl::UnavailableError(absl::StrCat("cloisterd did not start: ", cloisterd.Stderr()));
  }
  const std::string address = listening.substr(listening.rfind(' ') + 1);
  ASSIGN_OR_RETURN(std::string token, ReadFile(data + "/demo.token"));
  sdk::ClientOptions client_options;
  client_options.server = address;
  client_options.tenant_id = "demo";
  client_options.token = std::string(absl::StripAsciiWhitespace(token));
  client_options.policy_path = data + "/dev-policy.yaml";
  client_options.identity = std::make_shared<sdk::TenantIdentity>(sdk::TenantIdentity::Generate());
  std::vector<std::unique_ptr<sdk::Client>> clients;
  for (int c = 0; c < options.callers; ++c) {
    auto client = sdk::Client::Connect(client_options);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat("connecting caller ", c, ": ", client.status().message()));
    }
    clients.push_back(*std::move(client));
  }
  const std::string model_name = "bench-" + options.model;
  if (auto uploaded = clients[0]->UploadModel(model_path, model_name); !uploaded.ok()) {
    return absl::Status(uploaded.status().code(),
                        absl::StrCat("uploading ", model_path, ": ", uploaded.status().message()));
  }
  auto broker_request = [&](int caller) -> absl::Status {
    return clients[caller]->Infer(model_name, api_inputs).status();
  };
  auto direct_request = [&](int) -> absl::Status { return model->Run(inputs).status(); };

  BrokerEfficiencyResult result;
  result.model = options.model;
  result.batch = options.batch;
  result.callers = options.callers;
  result.direct_callers = direct_callers;
  result.requests = options.requests;
  result.max_batch = options.max_batch;
  result.workers = options.workers;
  {
    ASSIGN_OR_RETURN(std::vector<api::v1::Tensor> broker_outputs,
                     clients[0]->Infer(model_name, api_inputs));
    ASSIGN_OR_RETURN(result.max_abs_diff, MaxAbsDiff(broker_outputs, direct_outputs));
    if (!(result.max_abs_diff <= 1e-3)) {
      return absl::InternalError(absl::StrFormat(
          "the broker's output differs from the direct run's by %g", result.max_abs_diff));
    }
  }
  RETURN_IF_ERROR(
      RunConcurrently(options.callers, options.warmup * options.callers, broker_request).status());
  RETURN_IF_ERROR(
      RunConcurrently(direct_callers, options.warmup * direct_callers, direct_request).status());
  for (int round = 0; round < options.rounds; ++round) {
    // The last round takes what the division leaves.
    const int share =
        round + 1 < options.rounds
            ? options.requests / options.rounds
            : options.requests - (options.rounds - 1) * (options.requests / options.rounds);
    for (int side = 0; side < 2; ++side) {
      const bool broker = (side + round) % 2 == 0;
      const CpuUse before = CpuOf(cloisterd.pid());
      ASSIGN_OR_RETURN(double seconds,
                       broker ? RunConcurrently(options.callers, share, broker_request)
                              : RunConcurrently(direct_callers, share, direct_request));
      const CpuUse after = CpuOf(cloisterd.pid());
      (broker ? result.broker_seconds : result.direct_seconds) += seconds;
      if (broker) {
        result.broker_enclave_cpu_seconds += after.enclave - before.enclave;
        result.broker_cloisterd_cpu_seconds += after.cloisterd - before.cloisterd;
        result.broker_client_cpu_seconds += after.self - before.self;
      } else {
        result.direct_cpu_seconds += after.self - before.self;
      }
      if (!options.json) {
        absl::FPrintF(log, "round %d %s: %d requests in %.3f s\n", round + 1,
                      broker ? "broker" : "direct", share, seconds);
      }
    }
  }
  clients.clear();
  const int stopped = cloisterd.Stop(SIGTERM);
  if (stopped != 0 && !options.json) {
    absl::FPrintF(log, "cloisterd exited with %d on SIGTERM\n", stopped);
  }
  if (options.json) {
    absl::FPrintF(out, "%s\n", BrokerEfficiencyJsonLine(result));
  } else {
    absl::FPrintF(out, "%s", BrokerEfficiencyTable(result));
  }
  return result;
}

}  // namespace cloister::bench
