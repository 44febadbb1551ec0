// cloisterd: the untrusted host broker (DESIGN.md sections 2 and 8). It authenticates tenants,
// admits, queues and batches their sealed requests, keeps model ciphertext at rest and relays
// everything to its enclave workers (`workers: N`, one per device); it never sees plaintext.
//
// Start-up: settings (flags over --config), data dir (0700), tenants (the development tenant
// "demo" with its token in DATA_DIR/demo.token unless the config lists tenants), the enclave
// workers (the first one alone until it answers a GetEvidenceCall, so it creates the simulated
// roots the others then share), reload of every stored model into every worker, the gRPC
// server (TLS when the config has a `tls` section), then exactly one line on stdout:
// "cloisterd listening on HOST:PORT".
// SIGHUP: reload the config file's tenants and attestation policies (host/config/
// config_reloader.h); a bad file is refused and logged, the running config stays.
// SIGTERM or SIGINT: stop accepting, finish in-flight calls (with a deadline), stop the worker,
// exit 0. Exit 1 if start-up fails or a worker that died cannot be restarted (a worker that dies
// is restarted with backoff: host/supervisor/worker_supervisor.h); exit 2 for bad usage or config.
// `cloisterd --check-config FILE` only validates FILE (exit 0, or 2 with every error).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpc/support/log.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "grpcpp/health_check_service_interface.h"
#include "host/config/config_reloader.h"
#include "host/config/daemon_config.h"
#include "host/config/tenant_tls.h"
#include "host/receipts/receipt_log.h"
#include "host/enclave_client/process_enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "host/server/cloister_service.h"
#include "host/server/grpc_server.h"
#include "host/server/operator_plane.h"
#include "host/storage/file_blob_store.h"
#include "host/supervisor/worker_supervisor.h"
#include "host/tenants/tenant_registry.h"

namespace cloister::host {
namespace {

constexpr absl::Duration kEnclaveReadyTimeout = absl::Seconds(120);
constexpr absl::Duration kReloadTimeout = absl::Seconds(300);
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
// Room for framing around the largest sealed call (and for a 1 MiB upload chunk).
constexpr int kGrpcMessageOverhead = 1 << 20;

// Each worker's current evidence signing key, for checking its usage receipts; replaced when a
// restarted worker brings a new one. Thread-safe.
class WorkerKeys {
 public:
  explicit WorkerKeys(size_t count) : keys_(count) {}
  void Set(int worker, Bytes key) {
    absl::MutexLock lock(&mu_);
    keys_[worker] = std::move(key);
  }
  Bytes Get(int worker) const {
    absl::MutexLock lock(&mu_);
    return keys_[worker];
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Bytes> keys_ ABSL_GUARDED_BY(mu_);
};

// gRPC's own log lines (a port already taken, a failed handshake) join cloisterd's JSON lines
// on stderr instead of breaking their format.
void LogGrpcLine(gpr_log_func_args* args) {
  const LogLevel level = args->severity == GPR_LOG_SEVERITY_ERROR ? LogLevel::kError
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                                   : LogLevel::kDebug;
  Log(level, "grpc",
      {{"message", args->message == nullptr ? "" : args->message},
       {"file", args->file == nullptr ? "" : args->file},
       {"line", args->line}});
}

int Fail(const absl::Status& status) {
  Log(LogLevel::kError, "startup_failed", {{"error", status.ToString()}});
  std::fprintf(stderr, "cloisterd: %s\n", std::string(status.message()).c_str());
  return 1;
}

int Run(const DaemonConfig& config) {
  // Signals are taken synchronously by the main thread (sigtimedwait below); every thread
  // started from here on inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);  // reload, not stop
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Every gRPC server built from here on (tenant and operator ports) answers
  // grpc.health.v1.Health: SERVING once it listens (the workers are ready by then), NOT_SERVING
  // while draining. Kubernetes probes and load balancers use it.
  grpc::EnableDefaultHealthCheckService(true);
  gpr_set_log_function(LogGrpcLine);

  std::string enclave_binary = config.enclave_binary;
  if (enclave_binary.empty()) {
    absl::StatusOr<std::string> path = DefaultEnclaveBinaryPath();
    if (!path.ok()) return Fail(path.status());
    enclave_binary = *path;
  }
  // Checked before anything is created, so a wrong path leaves no trace.
  if (::access(enclave_binary.c_str(), X_OK) != 0) {
    return Fail(absl::NotFoundError(absl::StrCat("enclave worker binary ", enclave_binary,
                                                 " is missing or not executable; set "
                                                 "--enclave-binary or enclave_binary")));
  }

  std::error_code ec;
  std::string data_dir = std::filesystem::absolute(config.data_dir, ec).lexically_normal();
  if (ec) data_dir = config.data_dir;
  if (!data_dir.empty() && data_dir.size() > 1 && data_dir.back() == '/') data_dir.pop_back();
  // Create the data dir 0700; an existing one keeps its mode (it may be shared, like /tmp),
  // with a warning if other users can read it.
  struct stat data_dir_stat;
  if (::stat(data_dir.c_str(), &data_dir_stat) == 0) {
    if (!S_ISDIR(data_dir_stat.st_mode)) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(data_dir, " is not a directory")));
    }
    if ((data_dir_stat.st_mode & 077) != 0) {
      Log(LogLevel::kWarning, "data_dir_not_private",
          {{"data_dir", data_dir}, {"advice", "chmod 700 it: it holds the tenant token"}});
    }
  } else if (absl::Status status = MakeDirs(data_dir, 0700); !status.ok()) {
    return Fail(status);
  }

  // The tenant port's credentials first: a bad certificate stops start-up before any worker runs.
  std::shared_ptr<TenantIdentityCheck> identities;
  if (!config.tls.client_ca_file.empty()) {
    identities = std::make_shared<TenantIdentityCheck>(config.tenants);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tenant_credentials =
      TenantPortCredentials(config.tls, identities);
  if (!tenant_credentials.ok()) return Fail(tenant_credentials.status());
  if (!config.tls.enabled() && ListenHost(config.listen) != "127.0.0.1" &&
      ListenHost(config.listen) != "[::1]" && ListenHost(config.listen) != "localhost") {
    Log(LogLevel::kWarning, "tenant_port_plaintext",
        {{"listen", config.listen},
         {"advice", "API tokens cross the network in the clear; add a tls section"}});
  }

  std::vector<TenantCredential> tenants = config.Credentials();
  std::vector<TenantCredential> development_tenants;
  if (tenants.empty()) {
    std::string token_path = absl::StrCat(data_dir, "/demo.token");
    absl::StatusOr<std::string> token = LoadOrCreateDevToken(token_path);
    if (!token.ok()) return Fail(token.status());
    tenants.push_back({kDevTenantId, TokenHash(*token)});
    development_tenants = tenants;
    Log(LogLevel::kInfo, "development_tenant",
        {{"tenant", kDevTenantId}, {"token_file", token_path}});
  }
  absl::StatusOr<std::unique_ptr<TenantRegistry>> registry =
      TenantRegistry::Create(std::move(tenants));
  if (!registry.ok()) return Fail(registry.status());
  // Applies a changed config file's tenants and policies (SIGHUP below, or the operator RPC).
  ConfigReloader reloader(config, {.registry = registry->get(),
                                   .identities = identities.get(),
                                   .development_tenants = development_tenants});

  // The models folder first: every worker gets the stored models from it, at start and restart.
  absl::StatusOr<std::unique_ptr<FileBlobStore>> blobs =
      FileBlobStore::Open(absl::StrCat(data_dir, "/models"));
  if (!blobs.ok()) return Fail(blobs.status());

  // The enclave workers, supervised (host/supervisor/worker_supervisor.h): a worker that dies is
  // restarted with backoff and gets fresh evidence and the stored models again; the calls it held
  // get UNAVAILABLE and its sessions are refused with a request to re-attest.
  const std::vector<DeviceConfig> devices = config.Workers();
  std::atomic<bool> worker_given_up{false};
  WorkerKeys enclave_keys(devices.size());  // each worker's evidence signing key, for its receipts
  std::vector<boundary::v1::GetEvidenceResult> startup_evidence(devices.size());
  std::atomic<OperatorPlane*> evidence_observer{nullptr};  // set once the plane exists
  WorkerSupervisorOptions supervisor_options;
  supervisor_options.worker_count = static_cast<int>(devices.size());
  supervisor_options.blobs = blobs->get();
  supervisor_options.ready_timeout = kEnclaveReadyTimeout;
  supervisor_options.reload_timeout = kReloadTimeout;
  supervisor_options.start_worker = [&devices, &enclave_binary, &data_dir, &config](
                                        int index,
                                        std::function<void(const absl::Status&)> on_exit) {
    const DeviceConfig& device = devices[index];
    ProcessEnclaveOptions enclave_options;
    enclave_options.binary_path = enclave_binary;
    enclave_options.data_dir = data_dir;
    enclave_options.tee = config.tee;
    enclave_options.gpu = device.gpu;
    if (!device.executor.empty()) {
      enclave_options.worker_arguments.insert(enclave_options.worker_arguments.end(),
                                              {"--executor", device.executor});
    }
    if (!device.pcie_mode.empty()) {
      enclave_options.worker_arguments.insert(enclave_options.worker_arguments.end(),
                                              {"--pcie-mode", device.pcie_mode});
    }
    if (device.run_threads > 0) {
      enclave_options.worker_arguments.insert(
          enclave_options.worker_arguments.end(),
          {"--run-threads", std::to_string(device.run_threads)});
    }
    // The first worker creates the simulated roots and sealing secret the others share.
    enclave_options.write_dev_policy = index == 0;
    enclave_options.on_exit = std::move(on_exit);
    return ProcessEnclaveClient::Start(std::move(enclave_options));
  };
  supervisor_options.on_ready = [&devices, &enclave_keys, &startup_evidence, &evidence_observer](
                                    int index, int generation,
                                    const boundary::v1::GetEvidenceResult& evidence) {
    if (generation == 0) {
      startup_evidence[index] = evidence;  // for the operator plane's evidence tracker
    } else if (OperatorPlane* plane = evidence_observer.load()) {
      plane->ObserveStartupEvidence(index, evidence);
    }
    // Its usage receipts are verified against the signing key in this evidence.
    absl::StatusOr<Bytes> key = EnclaveSigningKeyFromEvidence(evidence);
    if (!key.ok()) {
      // Serving goes on; this worker's receipts will be refused (and logged) as unverifiable.
      Log(LogLevel::kWarning, "enclave_key_unknown",
          {{"worker", index}, {"device", devices[index].name}, {"error", key.status().ToString()}});
    }
    enclave_keys.Set(index, key.ok() ? *std::move(key) : Bytes());
  };
  supervisor_options.on_gave_up = [&worker_given_up](int, const absl::Status&) {
    worker_given_up.store(true);
  };
  absl::StatusOr<std::unique_ptr<WorkerSupervisor>> supervisor =
      WorkerSupervisor::Start(std::move(supervisor_options));
  if (!supervisor.ok()) return Fail(supervisor.status());
  std::vector<EnclaveClient*> workers = (*supervisor)->clients();
  auto stop_workers = [&supervisor] { (*supervisor)->Stop(); };
  Log(LogLevel::kInfo, "enclave_workers_ready", {{"workers", config.workers}});

  // Usage receipts: every batch reply carries one signed by its worker's enclave key; they are
  // verified against that key and kept in DATA_DIR/receipts/receipts.jsonl.
  absl::StatusOr<std::unique_ptr<ReceiptLog>> receipt_log = ReceiptLog::Open(data_dir);
  if (!receipt_log.ok()) {
    stop_workers();
    return Fail(receipt_log.status());
  }
  // The operator plane: audit log, metrics, operator API (docs/OPERATIONS.md).
  OperatorPlaneOptions plane_options;
  plane_options.data_dir = data_dir;
  plane_options.operator_listen = config.operator_api.listen;
  plane_options.metrics_listen = config.operator_api.metrics_listen;  // empty: operator port + 1
  for (const DeviceConfig& device : devices) {
    plane_options.worker_kinds.emplace_back(config.tee, device.gpu.empty() ? config.gpu : device.gpu);
  }
  absl::StatusOr<std::unique_ptr<OperatorPlane>> plane =
      OperatorPlane::Create(std::move(plane_options), workers, &reloader);
  if (!plane.ok()) {
    stop_workers();
    return Fail(plane.status());
  }
  for (size_t index = 0; index < startup_evidence.size(); ++index) {
    (*plane)->ObserveStartupEvidence(static_cast<int>(index), startup_evidence[index]);
  }
  evidence_observer.store(plane->get());  // evidence of restarted workers from now on

  SchedulerOptions scheduler_options = config.scheduler;
  (*plane)->InstallSchedulerHooks(scheduler_options);
  scheduler_options.on_batch_reply = [log = receipt_log->get(), &enclave_keys,
                                      plane = plane->get()](int worker,
                                                            const EnclaveClient::Reply& reply) {
    if (!reply.ok() || !reply->has_infer_batch() || !reply->infer_batch().has_receipt()) return;
    absl::StatusOr<boundary::v1::UsageReceipt> kept = log->Append(
        absl::StrCat("worker", worker), enclave_keys.Get(worker), reply->infer_batch().receipt());
    if (!kept.ok()) {
      Log(LogLevel::kWarning, "receipt_refused",
          {{"worker", worker}, {"reason", std::string(kept.status().message())}});
    } else {
      plane->ObserveReceipt(*kept);
    }
  };

  // Tenants without limits of their own (the development tenant too) get tenant_defaults.
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Create(workers, scheduler_options);
  if (!scheduler.ok()) {
    stop_workers();
    return Fail(scheduler.status());
  }

  ServiceOptions service_options;
  service_options.max_model_size = config.limits.max_model_size;
  service_options.max_sealed_message_size = config.limits.max_sealed_message_size;
  service_options.session_ttl = config.limits.session_ttl;
  service_options.max_sessions_per_tenant = config.limits.max_sessions_per_tenant;
  service_options.upload_idle_timeout = config.limits.upload_idle_timeout;
  service_options.upload_timeout = config.limits.upload_timeout;
  if (identities != nullptr) {
    service_options.admit_by_certificate = [identities](absl::string_view tenant_id,
                                                        const grpc::AuthContext& peer) {
      return identities->AdmitByCertificate(tenant_id, peer);
    };
  }
  (*plane)->InstallServiceHooks(service_options);
  auto service = std::make_unique<CloisterService>(registry->get(), workers, scheduler->get(),
                                                   blobs->get(), service_options);
  absl::StatusOr<RunningServer> server = StartGrpcServer(
      service.get(), config.listen,
      static_cast<int>(config.limits.max_sealed_message_size) + kGrpcMessageOverhead,
      *tenant_credentials, (*plane)->TenantApiInterceptors());
  if (!server.ok()) return Fail(server.status());
  if (absl::Status started = (*plane)->Start(scheduler->get(), service.get(), blobs->get());
      !started.ok()) {
    // An operator address chosen in the config must be served; at the default address (the
    // development default, tests, several daemons on one host) cloisterd goes on without the
    // operator endpoints. The audit log and its checkpoints work either way.
    if (config.operator_api.listen != OperatorConfig().listen ||
        !config.operator_api.metrics_listen.empty()) {
      return Fail(started);
    }
    Log(LogLevel::kWarning, "operator_endpoints_unavailable",
        {{"error", started.ToString()},
         {"advice", "set operator.listen in a config file (port 0 picks a free one)"}});
  }

  std::string address = absl::StrCat(ListenHost(config.listen), ":", server->port);
  Log(LogLevel::kInfo, "listening",
      {{"address", address}, {"data_dir", data_dir}, {"tls", config.tls.enabled() ? "on" : "off"}});
  std::printf("cloisterd listening on %s\n", address.c_str());
  std::fflush(stdout);

  int exit_code = 0;
  while (true) {
    struct timespec wait = {0, 200 * 1000 * 1000};
    int signal_number = sigtimedwait(&stop_signals, nullptr, &wait);
    if (signal_number == SIGHUP) {
      // Logs config_reloaded or config_reload_refused itself; serving goes on either way.
      (void)(*plane)->Reload();  // also kept in the audit log
      continue;
    }
    if (signal_number > 0) {
      Log(LogLevel::kInfo, "shutting_down", {{"signal", signal_number}});
      break;
    }
    if (worker_given_up.load()) {
      Log(LogLevel::kError, "shutting_down", {{"reason", "an enclave worker cannot be restarted"}});
      exit_code = 1;
      break;
    }
  }

  (*supervisor)->StopRestarting();  // a worker that exits from now on stays down
  // Refuse new calls, let running ones finish within the grace period, then close the server
  // (an immediate deadline: all that is left are idle connections). Calls still waiting on the
  // worker after the grace period are completed by stopping it.
  if (grpc::HealthCheckServiceInterface* health = server->server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  service->BeginDrain();
  if (!service->WaitUntilIdle(kShutdownGrace)) {
    Log(LogLevel::kWarning, "shutdown_forcing",
        {{"reason", "calls still in flight after the grace period"},
         {"active_rpcs", service->active_rpcs()}});
    stop_workers();
  }
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server.reset();
  (*plane)->Stop();  // a last signed checkpoint while the workers still run
  (*scheduler)->Stop();
  service.reset();
  stop_workers();
  if (absl::Status synced = (*receipt_log)->Sync(); !synced.ok()) {
    Log(LogLevel::kWarning, "receipt_log_sync_failed", {{"error", synced.ToString()}});
  }
  Log(LogLevel::kInfo, "stopped", {{"exit_code", exit_code}});
  return exit_code;
}

}  // namespace
}  // namespace cloister::host

int main(int argc, char** argv) {
  using namespace cloister::host;
  cloister::SetLogComponent("cloisterd");
  cloister::KeepFreedBuffersForReuse();
  absl::StatusOr<CommandLine> command_line = ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::fprintf(stderr, "cloisterd: %s (%s)\n",
                 std::string(command_line.status().message()).c_str(), kCloisterdUsage);
    return 2;
  }
  if (command_line->help) {
    std::printf("%s\n", kCloisterdUsage);
    return 0;
  }
  if (command_line->check_config.has_value()) {
    // Validates without starting anything: every error on stderr, exit 2; a summary and 0.
    absl::StatusOr<DaemonConfig> checked = LoadDaemonConfig(
        *command_line->check_config,
        command_line->skip_file_checks ? FileChecks::kSkip : FileChecks::kRead);
    if (!checked.ok()) {
      std::fprintf(stderr, "%s\n", std::string(checked.status().message()).c_str());
      return 2;
    }
    std::printf("%s: ok (%s)\n", command_line->check_config->c_str(),
                DescribeDaemonConfig(*checked).c_str());
    return 0;
  }
  absl::StatusOr<DaemonConfig> config = ResolveDaemonConfig(*command_line);
  if (!config.ok()) {
    std::fprintf(stderr, "cloisterd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  return Run(*config);
}
