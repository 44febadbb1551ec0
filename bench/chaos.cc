#include "base/flags.h"
#include "bench/chaos.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/status.h"
#include "bench/bench_support.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "nlohmann/json.hpp"
#include "onnx/onnx_pb.h"
#include "proto/checkpoint_dir.h"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "tests/support/process.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

constexpr int kWidth = 4;  // X and Y are [1, 4]: request number, tenant, two random values

float OffsetOf(int tenant) { return 1000.0f * static_cast<float>(tenant + 1); }
std::string ModelName(int tenant) { return absl::StrCat("chaos-model-", tenant); }

// Y = X + [offset, offset, offset, offset]: each tenant's answers say whose model made them.
std::string TenantModel(int tenant) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("cloister-bench chaos");
  auto* import = model.add_opset_import();
  import->set_domain("");
  import->set_version(17);
  onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name(absl::StrCat("chaos_", tenant));
  auto value_info = [](onnx::ValueInfoProto* value, const std::string& name) {
    value->set_name(name);
    auto* type = value->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto::FLOAT);
    type->mutable_shape()->add_dim()->set_dim_param("n");
    type->mutable_shape()->add_dim()->set_dim_value(kWidth);
  };
  value_info(graph.add_input(), "x");
  value_info(graph.add_output(), "y");
  onnx::TensorProto& offset = *graph.add_initializer();
  offset.set_name("offset");
  offset.set_data_type(onnx::TensorProto::FLOAT);
  offset.add_dims(kWidth);
  for (int i = 0; i < kWidth; ++i) offset.add_float_data(OffsetOf(tenant));
  onnx::NodeProto& add = *graph.add_node();
  add.set_op_type("Add");
  add.set_name("add");
  add.add_input("x");
  add.add_input("offset");
  add.add_output("y");
  return model.SerializeAsString();
}

// The whole of a /proc file (their sizes read as 0, so no ReadFile); "" when unreadable.
std::string ReadProcFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The cloister-enclave processes whose parent is `parent`.
std::vector<pid_t> EnclaveChildren(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (dirent* entry = ::readdir(proc)) {
    int pid;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    const std::string stat = ReadProcFile(absl::StrCat("/proc/", pid, "/stat"));
    if (stat.empty()) continue;
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
    int ppid;
    if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &ppid) || ppid != parent) continue;
    const std::string cmdline = ReadProcFile(absl::StrCat("/proc/", pid, "/cmdline"));
    if (cmdline.empty()) continue;
    const std::string program = cmdline.substr(0, cmdline.find('\0'));
    if (fs::path(program).filename() == "cloister-enclave") children.push_back(pid);
  }
  ::closedir(proc);
  return children;
}

int CountLines(const std::string& text, const std::string& needle) {
  int count = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) ++count;
  }
  return count;
}

// One tenant: its client and its ledger of request numbers.
struct Tenant {
  int index = 0;
  std::string id;
  std::string token;
  std::unique_ptr<sdk::Client> client;
  std::atomic<uint64_t> next{0};
  absl::Mutex mu;
  std::vector<uint8_t> finished ABSL_GUARDED_BY(mu);  // per request number: 1 once answered
};

// Counters shared by every tenant thread.
struct Tally {
  absl::Mutex mu;
  ChaosResult result ABSL_GUARDED_BY(mu);
  std::vector<double> ok_ms ABSL_GUARDED_BY(mu);
};

api::v1::Tensor InputTensor(const float (&values)[kWidth]) {
  api::v1::Tensor tensor;
  tensor.set_name("x");
  tensor.set_datatype("FP32");
  tensor.add_shape(1);
  tensor.add_shape(kWidth);
  tensor.set_raw(reinterpret_cast<const char*>(values), sizeof(values));
  return tensor;
}

// The four floats of output y, or nullopt if the answer is not shaped like one.
std::optional<std::vector<float>> OutputValues(const std::vector<api::v1::Tensor>& outputs) {
  if (outputs.size() != 1 || outputs[0].datatype() != "FP32" ||
      outputs[0].raw().size() != kWidth * sizeof(float)) {
    return std::nullopt;
  }
  std::vector<float> values(kWidth);
  std::memcpy(values.data(), outputs[0].raw().data(), kWidth * sizeof(float));
  return values;
}

constexpr char kLlmName[] = "chaos-llm";

// Whether `models` is exactly the tenant's own model `own`, then the published LLM when
// `published` (and nothing else: no other tenant's model).
bool ListsOnly(const std::vector<api::v1::ModelInfo>& models, const std::string& own,
               bool published) {
  const size_t expected = published ? 2 : 1;
  if (models.size() != expected) return false;
  if (models[0].name() != own || models[0].published()) return false;
  return !published || (models[1].name() == kLlmName && models[1].published());
}

// A reference prompt of the tiny model: its ids and the ids greedy decoding gives.
struct ReferencePrompt {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
};

// Sends requests for tenant `tenant` until `end`.
void TenantLoop(const ChaosOptions& options, Tenant& tenant, SteadyClock::time_point end,
                uint64_t seed, const std::vector<ReferencePrompt>& references, uint64_t max_tokens,
                Tally& tally) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int> small(0, 1 << 20);
  std::vector<double> ok_ms;
  ChaosResult local;
  auto finish = [&](uint64_t n) {
    absl::MutexLock lock(&tenant.mu);
    if (tenant.finished[n] != 0) {
      ++local.duplicated;
    } else {
      tenant.finished[n] = 1;
    }
  };
  auto is_finished = [&](uint64_t n) {
    absl::MutexLock lock(&tenant.mu);
    return n < tenant.finished.size() && tenant.finished[n] != 0;
  };
  auto failed = [&](const absl::Status& status) {
    if (absl::IsDeadlineExceeded(status)) {
      ++local.lost;
    } else {
      ++local.errors;
      ++local.error_codes[absl::StatusCodeToString(status.code())];
    }
  };
  while (SteadyClock::now() < end) {
    const uint64_t n = tenant.next.fetch_add(1);
    {
      absl::MutexLock lock(&tenant.mu);
      if (tenant.finished.size() <= n) tenant.finished.resize(n + 1, 0);
    }
    ++local.sent;
    const auto started = SteadyClock::now();
    const uint64_t list_every = static_cast<uint64_t>(std::max(options.list_every, 0));
    const uint64_t generate_every = static_cast<uint64_t>(std::max(options.generate_every, 0));
    const bool list = list_every > 0 && n % list_every == list_every - 1;
    if (list) {
      absl::StatusOr<std::vector<api::v1::ModelInfo>> models = tenant.client->ListModels();
      if (!models.ok()) {
        failed(models.status());
      } else if (ListsOnly(*models, ModelName(tenant.index), !references.empty())) {
        ++local.ok;
        ok_ms.push_back(
            std::chrono::duration<double, std::milli>(SteadyClock::now() - started).count());
      } else {
        ++local.misrouted;
      }
      finish(n);
      continue;
    }
    const bool generate =
        !references.empty() && generate_every > 0 && n % generate_every == generate_every - 1;
    if (generate) {
      ++local.streams;
      const ReferencePrompt& reference = references[n % references.size()];
      api::v1::GenerateRequest request;
      request.mutable_ids()->mutable_ids()->Add(reference.prompt.begin(), reference.prompt.end());
      request.mutable_sampling()->set_temperature(0);
      request.mutable_sampling()->set_seed(n);  // seeded: the SDK may retry before a chunk came
      request.set_max_tokens(max_tokens);
      absl::StatusOr<sdk::GenerateResult> generated = tenant.client->Generate(kLlmName, request);
      if (!generated.ok()) {
        failed(generated.status());
      } else if (generated->ids == reference.generated) {
        ++local.ok;
        ++local.streams_ok;
        ok_ms.push_back(
            std::chrono::duration<double, std::milli>(SteadyClock::now() - started).count());
      } else if (generated->ids.size() < reference.generated.size() &&
                 std::equal(generated->ids.begin(), generated->ids.end(),
                            reference.generated.begin())) {
        ++local.truncated;
      } else {
        ++local.misrouted;
      }
      finish(n);
      continue;
    }
    const float input[kWidth] = {static_cast<float>(n), static_cast<float>(tenant.index),
                                 static_cast<float>(small(random)),
                                 static_cast<float>(small(random))};
    absl::StatusOr<std::vector<api::v1::Tensor>> outputs =
        tenant.client->Infer(ModelName(tenant.index), {InputTensor(input)});
    if (!outputs.ok()) {
      failed(outputs.status());
      finish(n);
      continue;
    }
    std::optional<std::vector<float>> values = OutputValues(*outputs);
    bool right = values.has_value();
    for (int i = 0; right && i < kWidth; ++i) {
      right = (*values)[i] == input[i] + OffsetOf(tenant.index);
    }
    if (right) {
      ++local.ok;
      ok_ms.push_back(
          std::chrono::duration<double, std::milli>(SteadyClock::now() - started).count());
    } else {
      ++local.misrouted;
      // An answer that belongs to another of this tenant's requests, already answered, is a
      // duplicate as well.
      if (values.has_value() && (*values)[1] - OffsetOf(tenant.index) == tenant.index) {
        double other = (*values)[0] - OffsetOf(tenant.index);
        if (other >= 0 && other != static_cast<double>(n) &&
            is_finished(static_cast<uint64_t>(other))) {
          ++local.duplicated;
        }
      }
    }
    finish(n);
  }
  absl::MutexLock lock(&tally.mu);
  ChaosResult& total = tally.result;
  total.sent += local.sent;
  total.ok += local.ok;
  total.errors += local.errors;
  total.lost += local.lost;
  total.duplicated += local.duplicated;
  total.misrouted += local.misrouted;
  total.streams += local.streams;
  total.streams_ok += local.streams_ok;
  total.truncated += local.truncated;
  for (const auto& [code, count] : local.error_codes) total.error_codes[code] += count;
  tally.ok_ms.insert(tally.ok_ms.end(), ok_ms.begin(), ok_ms.end());
}

double Percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

}  // namespace

absl::StatusOr<ChaosOptions> ParseChaosFlags(const std::vector<std::string>& args,
                                             ChaosOptions options) {
  int seed = static_cast<int>(options.seed % 1000000007);
  RETURN_IF_ERROR(
      ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                            {"--check", SwitchFlag{&options.check}},
                            {"--cloisterd", StringFlag{&options.cloisterd, {}}},
                            {"--duration-s", IntFlag{&options.duration_s, 1}},
                            {"--kills", IntFlag{&options.kills, 0}},
                            {"--tenants", IntFlag{&options.tenants, 1}},
                            {"--threads-per-tenant", IntFlag{&options.threads_per_tenant, 1}},
                            {"--workers", IntFlag{&options.workers, 1}},
                            {"--list-every", IntFlag{&options.list_every, 0}},
                            {"--generate-every", IntFlag{&options.generate_every, 0}},
                            {"--models-dir", StringFlag{&options.models_dir, {}}},
                            {"--call-timeout-s", IntFlag{&options.call_timeout_s, 1}},
                            {"--seed", IntFlag{&seed, 0}}}));
  options.seed = static_cast<uint64_t>(seed);
  if (options.kills > options.duration_s * 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kills (", options.kills, ") is more than ten per second of --duration-s (",
                     options.duration_s, ")"));
  }
  if (options.workers > 64) {
    return absl::InvalidArgumentError("--workers must be at most 64 (cloisterd's limit)");
  }
  return options;
}

std::string ChaosUsage() {
  return "a steady mixed load from several tenants while enclave workers are SIGKILLed\n"
         "                   [--json] [--check] [--duration-s N (120)] [--kills N (20)]\n"
         "                   [--tenants N (3)] [--threads-per-tenant N (2)] [--workers N (2)]\n"
         "                   [--list-every N (10)] [--generate-every N (4; 0: no streams)]\n"
         "                   [--call-timeout-s N (30)] [--seed N] [--cloisterd PATH]\n"
         "                   [--models-dir DIR]\n";
}

std::string ChaosJsonLine(const ChaosResult& result) {
  nlohmann::ordered_json line;
  line["duration_s"] = result.duration_s;
  line["tenants"] = result.tenants;
  line["workers"] = result.workers;
  line["kills"] = result.kills;
  line["sent"] = result.sent;
  line["ok"] = result.ok;
  line["errors"] = result.errors;
  line["lost"] = result.lost;
  line["duplicated"] = result.duplicated;
  line["misrouted"] = result.misrouted;
  line["streams"] = result.streams;
  line["streams_ok"] = result.streams_ok;
  line["truncated"] = result.truncated;
  nlohmann::ordered_json codes = nlohmann::ordered_json::object();
  for (const auto& [code, count] : result.error_codes) codes[code] = count;
  line["error_codes"] = codes;
  line["worker_deaths_logged"] = result.worker_deaths_logged;
  line["worker_restarts_logged"] = result.worker_restarts_logged;
  line["ok_p50_ms"] = result.ok_p50_ms;
  line["ok_p99_ms"] = result.ok_p99_ms;
  line["recovered"] = result.recovered;
  return line.dump();
}

std::string ChaosTable(const ChaosResult& result) {
  std::string codes;
  for (const auto& [code, count] : result.error_codes) {
    absl::StrAppend(&codes, codes.empty() ? "" : ", ", code, " ", count);
  }
  return absl::StrFormat(
      "%d s, %d tenants, %d workers, %d kills (%d deaths and %d restarts logged)\n"
      "sent %d  ok %d  errors %d%s  lost %d  duplicated %d  misrouted %d\n"
      "streams %d  with their reference ids %d  truncated and not detected %d\n"
      "ok latency p50 %.1f ms  p99 %.1f ms  recovered %s\n",
      result.duration_s, result.tenants, result.workers, result.kills, result.worker_deaths_logged,
      result.worker_restarts_logged, result.sent, result.ok, result.errors,
      codes.empty() ? "" : absl::StrCat(" (", codes, ")"), result.lost, result.duplicated,
      result.misrouted, result.streams, result.streams_ok, result.truncated, result.ok_p50_ms, result.ok_p99_ms, result.recovered ? "yes" : "no");
}

absl::Status CheckChaosResult(const ChaosOptions& options, const ChaosResult& result) {
  std::vector<std::string> missed;
  if (result.lost != 0) missed.push_back(absl::StrCat("lost ", result.lost));
  if (result.duplicated != 0) missed.push_back(absl::StrCat("duplicated ", result.duplicated));
  if (result.misrouted != 0) missed.push_back(absl::StrCat("misrouted ", result.misrouted));
  if (result.truncated != 0) missed.push_back(absl::StrCat("truncated ", result.truncated));
  if (options.generate_every > 0 && result.streams_ok == 0) {
    missed.push_back("no generation stream succeeded");
  }
  if (result.kills < options.kills) {
    missed.push_back(absl::StrCat("only ", result.kills, " of ", options.kills, " kills happened"));
  }
  if (result.ok == 0) missed.push_back("no request succeeded");
  if (!result.recovered) missed.push_back("the appliance did not recover after the last kill");
  if (missed.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrJoin(missed, "; "));
}

absl::StatusOr<ChaosResult> RunChaos(const ChaosOptions& options, std::FILE* out, std::FILE* log) {
  if (::access(options.cloisterd.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cloisterd binary ", options.cloisterd,
                                            " is missing or not executable (see --cloisterd)"));
  }
  ASSIGN_OR_RETURN(const std::string scratch, MakeScratchDir("cloister-chaos"));
  const std::string data = scratch + "/data";
  std::vector<std::unique_ptr<Tenant>> tenants;
  // Free operator and metrics ports, so that it never collides with another daemon.
  std::string config =
      absl::StrCat("operator:\n  listen: 127.0.0.1:0\nworkers: ", options.workers, "\n");
  // The streams' model, published to every tenant, and its reference ids.
  std::vector<ReferencePrompt> references;
  uint64_t max_tokens = 0;
  if (options.generate_every > 0) {
    const std::string llm_dir = (fs::path(options.models_dir) / "llm" / "tiny-llama").string();
    ASSIGN_OR_RETURN(Bytes package, package::PackCheckpointDir(llm_dir, uint64_t{256} << 20));
    ASSIGN_OR_RETURN(std::string text, ReadFile(llm_dir + "/reference.json"));
    nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded() || !json.contains("prompts")) {
      return absl::InvalidArgumentError(llm_dir + "/reference.json is not the reference file");
    }
    max_tokens = json["generation"]["max_new_tokens"].get<uint64_t>();
    for (const auto& prompt : json["prompts"]) {
      references.push_back({prompt["prompt_ids"].get<std::vector<int32_t>>(),
                            prompt["generated_ids"].get<std::vector<int32_t>>()});
    }
    absl::StrAppend(&config, "published_models:\n  - name: ", kLlmName,
                    "\n    file: ", fs::absolute(llm_dir).string(),
                    "\n    digest: ", HexEncode(crypto::Sha256(package)), "\n");
  }
  absl::StrAppend(&config, "tenants:\n");
  for (int t = 0; t < options.tenants; ++t) {
    auto tenant = std::make_unique<Tenant>();
    tenant->index = t;
    tenant->id = absl::StrCat("chaos", t);
    tenant->token = HexEncode(crypto::RandomBytes(32));
    absl::StrAppend(&config, "  - id: ", tenant->id,
                    "\n    token_sha256: ", HexEncode(crypto::Sha256(AsBytes(tenant->token))),
                    "\n");
    tenants.push_back(std::move(tenant));
  }
  const std::string config_path = scratch + "/cloisterd.yaml";
  RETURN_IF_ERROR(WriteFileAtomic(config_path, config, 0600));
  std::vector<std::string> argv = {options.cloisterd, "--listen", "127.0.0.1:0", "--data-dir", data,
                                   "--config",        config_path};
  if (!options.json) absl::FPrintF(log, "starting %s\n", absl::StrJoin(argv, " "));
  testing::Process cloisterd(argv, scratch);
  const std::string listening =
      cloisterd.WaitForStdout("cloisterd listening on ", absl::Seconds(120));
  if (listening.empty()) {
    return absl::UnavailableError(absl::StrCat("cloisterd did not start: ", cloisterd.Stderr()));
  }
  const std::string address = listening.substr(listening.rfind(' ') + 1);

  for (auto& tenant : tenants) {
    sdk::ClientOptions client_options;
    client_options.server = address;
    client_options.tenant_id = tenant->id;
    client_options.token = tenant->token;
    client_options.policy_path = data + "/dev-policy.yaml";
    client_options.identity =
        std::make_shared<sdk::TenantIdentity>(sdk::TenantIdentity::Generate());
    client_options.call_timeout = absl::Seconds(options.call_timeout_s);
    auto client = sdk::Client::Connect(client_options);
    if (!client.ok()) {
      return absl::Status(client.status().code(), absl::StrCat("connecting tenant ", tenant->id,
                                                               ": ", client.status().message()));
    }
    tenant->client = *std::move(client);
    const std::string model_path =
        absl::StrCat(scratch, "/", ModelName(tenant->index), ".onnx");
    RETURN_IF_ERROR(WriteFileAtomic(model_path, TenantModel(tenant->index), 0600));
    if (auto uploaded = tenant->client->UploadModel(model_path, ModelName(tenant->index));
        !uploaded.ok()) {
      return absl::Status(uploaded.status().code(), absl::StrCat("uploading for ", tenant->id, ": ",
                                                                 uploaded.status().message()));
    }
  }

  Tally tally;
  const auto start = SteadyClock::now();
  const auto end = start + std::chrono::seconds(options.duration_s);
  std::atomic<int> kills{0};
  std::atomic<bool> senders_done{false};
  std::thread killer([&] {
    std::mt19937_64 random(options.seed ^ 0x5eed);
    std::uniform_real_distribution<double> within(0.15, 0.85);
    if (options.kills == 0) return;
    const auto slot = std::chrono::duration<double>(options.duration_s) / options.kills;
    for (int k = 0; k < options.kills && !senders_done.load(); ++k) {
      const auto at =
          start + std::chrono::duration_cast<SteadyClock::duration>(slot * (k + within(random)));
      const auto slot_end =
          start + std::chrono::duration_cast<SteadyClock::duration>(slot * (k + 1));
      while (SteadyClock::now() < at && !senders_done.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      // Both workers may be restarting; wait (within the slot) until one is there to kill.
      while (SteadyClock::now() < slot_end + std::chrono::seconds(2) && !senders_done.load()) {
        std::vector<pid_t> children = EnclaveChildren(cloisterd.pid());
        if (!children.empty()) {
          pid_t victim = children[random() % children.size()];
          if (::kill(victim, SIGKILL) == 0) {
            ++kills;
            if (!options.json) {
              absl::FPrintF(log, "%.1f s: killed cloister-enclave pid %d\n",
                            std::chrono::duration<double>(SteadyClock::now() - start).count(),
                            victim);
            }
            break;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  std::vector<std::thread> senders;
  for (auto& tenant : tenants) {
    for (int thread = 0; thread < options.threads_per_tenant; ++thread) {
      const uint64_t seed = options.seed * 1000003 + tenant->index * 101 + thread;
      senders.emplace_back(
          [&, raw = tenant.get(), seed] {
            TenantLoop(options, *raw, end, seed, references, max_tokens, tally);
          });
    }
  }
  for (std::thread& sender : senders) sender.join();
  senders_done = true;
  killer.join();

  ChaosResult result;
  {
    absl::MutexLock lock(&tally.mu);
    result = tally.result;
    result.ok_p50_ms = Percentile(tally.ok_ms, 0.5);
    result.ok_p99_ms = Percentile(tally.ok_ms, 0.99);
  }
  // Every ledger entry must have its outcome by now.
  for (auto& tenant : tenants) {
    absl::MutexLock lock(&tenant->mu);
    for (uint8_t finished : tenant->finished) {
      if (finished == 0) ++result.lost;
    }
  }
  result.duration_s = options.duration_s;
  result.tenants = options.tenants;
  result.workers = options.workers;
  result.kills = kills.load();

  // Recovery: every tenant gets one more answer right (the SDK retries; allow for a worker that
  // was killed at the very end to come back).
  result.recovered = true;
  for (auto& tenant : tenants) {
    bool right = false;
    for (int attempt = 0; attempt < 20 && !right; ++attempt) {
      const float input[kWidth] = {0, static_cast<float>(tenant->index), 7, 11};
      auto outputs = tenant->client->Infer(ModelName(tenant->index), {InputTensor(input)});
      if (outputs.ok()) {
        std::optional<std::vector<float>> values = OutputValues(*outputs);
        right = values.has_value() && (*values)[3] == 11 + OffsetOf(tenant->index);
        if (!right) break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
    result.recovered = result.recovered && right;
  }
  for (auto& tenant : tenants) tenant->client.reset();
  const int stopped = cloisterd.Stop(SIGTERM);
  const std::string logs = cloisterd.Stderr();
  result.worker_deaths_logged = CountLines(logs, "\"enclave_worker_died\"");
  result.worker_restarts_logged =
      std::max(0, CountLines(logs, "\"enclave_worker_ready\"") - options.workers);
  if (stopped != 0) {
    absl::FPrintF(log, "cloisterd exited with %d on SIGTERM\n", stopped);
  }
  if (!options.json) {
    for (absl::string_view line : absl::StrSplit(logs, '\n')) {
      if (absl::StrContains(line, "\"enclave_worker_died\"") ||
          absl::StrContains(line, "\"enclave_worker_restart_failed\"")) {
        absl::FPrintF(log, "cloisterd: %s\n", line);
      }
    }
  }
  if (options.json) {
    absl::FPrintF(out, "%s\n", ChaosJsonLine(result));
  } else {
    absl::FPrintF(out, "%s", ChaosTable(result));
  }
  return result;
}

}  // namespace cloister::bench
