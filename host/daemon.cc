#include "host/daemon.h"

#include <grpc/support/log.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status.h"
#include "grpcpp/health_check_service_interface.h"
#include "host/enclave_client/process_enclave_client.h"

namespace cloister::host {
namespace {

constexpr absl::Duration kEnclaveReadyTimeout = absl::Seconds(120);
constexpr absl::Duration kReloadTimeout = absl::Seconds(300);
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
// Room for framing around the largest sealed call (and for a 1 MiB upload chunk).
constexpr int kGrpcMessageOverhead = 1 << 20;

// gRPC's own log lines (a port already taken, a failed handshake) join cloisterd's JSON lines
// on stderr instead of breaking their format.
void LogGrpcLine(gpr_log_func_args* args) {
  const LogLevel level = args->severity == GPR_LOG_SEVERITY_ERROR  ? LogLevel::kError
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                                   : LogLevel::kDebug;
  Log(level, "grpc",
      {{"message", args->message == nullptr ? "" : args->message},
       {"file", args->file == nullptr ? "" : args->file},
       {"line", args->line}});
}

}  // namespace

// Each worker's current evidence signing key, for checking its usage receipts; replaced when a
// restarted worker brings a new one. Thread-safe.
class Daemon::WorkerKeys {
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

Daemon::Daemon(const DaemonConfig& config)
    : config_(config),
      devices_(config.Workers()),
      enclave_keys_(std::make_unique<WorkerKeys>(devices_.size())),
      startup_evidence_(devices_.size()) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonConfig& config) {
  std::unique_ptr<Daemon> daemon(new Daemon(config));
  RETURN_IF_ERROR(daemon->CreateAll());  // on error the destructor stops what was started
  return daemon;
}

Daemon::~Daemon() { Shutdown(); }

absl::Status Daemon::CreateAll() {
  // Signals are taken synchronously by the main thread (WaitForStop); every thread started from
  // here on inherits the blocked mask.
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGHUP);  // reload, not stop
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Every gRPC server built from here on (tenant and operator ports) answers
  // grpc.health.v1.Health: SERVING once it listens (the workers are ready by then), NOT_SERVING
  // while draining. Kubernetes probes and load balancers use it.
  grpc::EnableDefaultHealthCheckService(true);
  gpr_set_log_function(LogGrpcLine);

  enclave_binary_ = config_.enclave_binary;
  if (enclave_binary_.empty()) {
    ASSIGN_OR_RETURN(enclave_binary_, DefaultEnclaveBinaryPath());
  }
  // Checked before anything is created, so a wrong path leaves no trace.
  if (::access(enclave_binary_.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("enclave worker binary ", enclave_binary_,
                                            " is missing or not executable; set "
                                            "--enclave-binary or enclave_binary"));
  }
  RETURN_IF_ERROR(CheckDataDir());

  // The tenant port's credentials first: a bad certificate stops start-up before any worker runs.
  if (!config_.tls.client_ca_file.empty()) {
    identities_ = std::make_shared<TenantIdentityCheck>(config_.tenants);
  }
  ASSIGN_OR_RETURN(tenant_credentials_, TenantPortCredentials(config_.tls, identities_));
  const std::string host = ListenHost(config_.listen);
  if (!config_.tls.enabled() && host != "127.0.0.1" && host != "[::1]" && host != "localhost") {
    Log(LogLevel::kWarning, "tenant_port_plaintext",
        {{"listen", config_.listen},
         {"advice", "API tokens cross the network in the clear; add a tls section"}});
  }

  std::vector<TenantCredential> tenants = config_.Credentials();
  std::vector<TenantCredential> development_tenants;
  if (tenants.empty()) {
    std::string token_path = absl::StrCat(data_dir_, "/demo.token");
    ASSIGN_OR_RETURN(std::string token, LoadOrCreateDevToken(token_path));
    tenants.push_back({kDevTenantId, TokenHash(token)});
    development_tenants = tenants;
    Log(LogLevel::kInfo, "development_tenant",
        {{"tenant", kDevTenantId}, {"token_file", token_path}});
  }
  ASSIGN_OR_RETURN(registry_, TenantRegistry::Create(std::move(tenants)));
  // Applies a changed config file's tenants and policies (SIGHUP, or the operator RPC).
  reloader_ = std::make_unique<ConfigReloader>(
      config_, ConfigReloader::Targets{.registry = registry_.get(),
                                       .identities = identities_.get(),
                                       .development_tenants = development_tenants});

  // The models folder first: every worker gets the stored models from it, at start and restart.
  ASSIGN_OR_RETURN(blobs_, FileBlobStore::Open(absl::StrCat(data_dir_, "/models")));
  RETURN_IF_ERROR(StartWorkers());
  return CreateServices();
}

absl::Status Daemon::CheckDataDir() {
  std::error_code ec;
  data_dir_ = std::filesystem::absolute(config_.data_dir, ec).lexically_normal();
  if (ec) data_dir_ = config_.data_dir;
  if (data_dir_.size() > 1 && data_dir_.back() == '/') data_dir_.pop_back();
  // Create the data dir 0700; an existing one keeps its mode (it may be shared, like /tmp),
  // with a warning if other users can read it.
  struct stat data_dir_stat;
  if (::stat(data_dir_.c_str(), &data_dir_stat) != 0) return MakeDirs(data_dir_, 0700);
  if (!S_ISDIR(data_dir_stat.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(data_dir_, " is not a directory"));
  }
  if ((data_dir_stat.st_mode & 077) != 0) {
    Log(LogLevel::kWarning, "data_dir_not_private",
        {{"data_dir", data_dir_}, {"advice", "chmod 700 it: it holds the tenant token"}});
  }
  return absl::OkStatus();
}

// The enclave workers, supervised: a worker that dies is restarted with backoff and gets fresh
// evidence and the stored models again; the calls it held get UNAVAILABLE and its sessions are
// refused with a request to re-attest.
absl::Status Daemon::StartWorkers() {
  WorkerSupervisorOptions options;
  options.worker_count = static_cast<int>(devices_.size());
  options.blobs = blobs_.get();
  for (const PublishedModelConfig& model : config_.published_models) {
    options.published.push_back({model.name, model.file, model.digest});
  }
  options.ready_timeout = kEnclaveReadyTimeout;
  options.reload_timeout = kReloadTimeout;
  options.start_worker = [this](int index, std::function<void(const absl::Status&)> on_exit) {
    const DeviceConfig& device = devices_[index];
    ProcessEnclaveOptions enclave_options;
    enclave_options.binary_path = enclave_binary_;
    enclave_options.data_dir = data_dir_;
    enclave_options.tee = config_.tee;
    enclave_options.gpu = device.gpu;
    std::vector<std::string>& arguments = enclave_options.worker_arguments;
    if (!device.executor.empty()) {
      arguments.insert(arguments.end(), {"--executor", device.executor});
    }
    if (!device.pcie_mode.empty()) {
      arguments.insert(arguments.end(), {"--pcie-mode", device.pcie_mode});
    }
    if (device.run_threads > 0) {
      arguments.insert(arguments.end(), {"--run-threads", std::to_string(device.run_threads)});
    }
    // The first worker creates the simulated roots and sealing secret the others share.
    enclave_options.write_dev_policy = index == 0;
    enclave_options.on_exit = std::move(on_exit);
    return ProcessEnclaveClient::Start(std::move(enclave_options));
  };
  options.on_ready = [this](int index, int generation,
                            const boundary::v1::GetEvidenceResult& evidence) {
    if (generation == 0) {
      startup_evidence_[index] = evidence;  // for the operator plane's evidence tracker
    } else if (OperatorPlane* plane = evidence_observer_.load()) {
      plane->ObserveStartupEvidence(index, evidence);
    }
    // Its usage receipts are verified against the signing key in this evidence.
    absl::StatusOr<Bytes> key = EnclaveSigningKeyFromEvidence(evidence);
    if (!key.ok()) {
      // Serving goes on; this worker's receipts will be refused (and logged) as unverifiable.
      Log(LogLevel::kWarning, "enclave_key_unknown",
          {{"worker", index},
           {"device", devices_[index].name},
           {"error", key.status().ToString()}});
    }
    enclave_keys_->Set(index, key.ok() ? *std::move(key) : Bytes());
  };
  options.on_gave_up = [this](int, const absl::Status&) { worker_given_up_.store(true); };
  ASSIGN_OR_RETURN(supervisor_, WorkerSupervisor::Start(std::move(options)));
  Log(LogLevel::kInfo, "enclave_workers_ready", {{"workers", config_.workers}});
  return absl::OkStatus();
}

absl::Status Daemon::CreateServices() {
  std::vector<EnclaveClient*> workers = supervisor_->clients();
  // Usage receipts: every batch reply carries one signed by its worker's enclave key; they are
  // verified against that key and kept in DATA_DIR/receipts/receipts.jsonl.
  ASSIGN_OR_RETURN(receipt_log_, ReceiptLog::Open(data_dir_));
  // The operator plane: audit log, metrics, operator API (docs/OPERATIONS.md).
  OperatorPlaneOptions plane_options;
  plane_options.data_dir = data_dir_;
  plane_options.operator_listen = config_.operator_api.listen;
  plane_options.metrics_listen = config_.operator_api.metrics_listen;  // empty: operator port + 1
  plane_options.stats_probe_interval = config_.operator_api.stats_interval;
  for (const DeviceConfig& device : devices_) {
    plane_options.worker_kinds.emplace_back(config_.tee,
                                            device.gpu.empty() ? config_.gpu : device.gpu);
  }
  ASSIGN_OR_RETURN(plane_,
                   OperatorPlane::Create(std::move(plane_options), workers, reloader_.get()));
  for (size_t index = 0; index < startup_evidence_.size(); ++index) {
    plane_->ObserveStartupEvidence(static_cast<int>(index), startup_evidence_[index]);
  }
  evidence_observer_.store(plane_.get());  // evidence of restarted workers from now on

  SchedulerOptions scheduler_options = config_.scheduler;
  plane_->InstallSchedulerHooks(scheduler_options);
  ReceiptSink::Callbacks receipt_callbacks;
  receipt_callbacks.on_kept = [plane = plane_.get()](const boundary::v1::UsageReceipt& kept) {
    plane->ObserveReceipt(kept);
  };
  receipt_callbacks.on_refused = [](const std::string& worker, const absl::Status& status) {
    Log(LogLevel::kWarning, "receipt_refused",
        {{"worker", worker}, {"reason", std::string(status.message())}});
  };
  receipt_sink_ = std::make_unique<ReceiptSink>(receipt_log_.get(), std::move(receipt_callbacks));
  // On the worker's reader thread: a copy into the sink's queue, so the callers are answered
  // without waiting for the signature check and the write.
  scheduler_options.on_batch_reply = [sink = receipt_sink_.get(), keys = enclave_keys_.get()](
                                         int worker, const EnclaveClient::Reply& reply) {
    if (!reply.ok() || !reply->has_infer_batch() || !reply->infer_batch().has_receipt()) return;
    sink->Submit(absl::StrCat("worker", worker), keys->Get(worker), reply->infer_batch().receipt());
  };
  // Tenants without limits of their own (the development tenant too) get tenant_defaults.
  ASSIGN_OR_RETURN(scheduler_, Scheduler::Create(workers, scheduler_options));

  ServiceOptions service_options;
  service_options.max_model_size = config_.limits.max_model_size;
  service_options.max_sealed_message_size = config_.limits.max_sealed_message_size;
  service_options.session_ttl = config_.limits.session_ttl;
  service_options.max_sessions_per_tenant = config_.limits.max_sessions_per_tenant;
  service_options.upload_idle_timeout = config_.limits.upload_idle_timeout;
  service_options.upload_timeout = config_.limits.upload_timeout;
  if (identities_ != nullptr) {
    service_options.admit_by_certificate =
        [identities = identities_](absl::string_view tenant_id, const grpc::AuthContext& peer) {
          return identities->AdmitByCertificate(tenant_id, peer);
        };
  }
  // A generation's receipt comes on its final chunk, past the scheduler; it goes the same way.
  service_options.on_generate_receipt = [sink = receipt_sink_.get(), keys = enclave_keys_.get()](
                                            int worker,
                                            const boundary::v1::SignedUsageReceipt& receipt) {
    sink->Submit(absl::StrCat("worker", worker), keys->Get(worker), receipt);
  };
  plane_->InstallServiceHooks(service_options);
  service_ = std::make_unique<CloisterService>(registry_.get(), workers, scheduler_.get(),
                                               blobs_.get(), service_options);
  return absl::OkStatus();
}

absl::Status Daemon::Serve() {
  ASSIGN_OR_RETURN(
      server_, StartGrpcServer(
                   service_.get(), config_.listen,
                   static_cast<int>(config_.limits.max_sealed_message_size) + kGrpcMessageOverhead,
                   tenant_credentials_, plane_->TenantApiInterceptors()));
  if (absl::Status started = plane_->Start(scheduler_.get(), service_.get(), blobs_.get());
      !started.ok()) {
    return absl::UnavailableError(absl::StrCat(
        started.message(),
        "; choose free operator.listen and operator.metrics_listen addresses in the config file "
        "(port 0 picks a free one)"));
  }
  std::string address = absl::StrCat(ListenHost(config_.listen), ":", server_.port);
  Log(LogLevel::kInfo, "listening",
      {{"address", address},
       {"data_dir", data_dir_},
       {"tls", config_.tls.enabled() ? "on" : "off"}});
  std::printf("cloisterd listening on %s\n", address.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

int Daemon::WaitForStop() {
  while (true) {
    struct timespec wait = {0, 200 * 1000 * 1000};
    int signal_number = sigtimedwait(&signals_, nullptr, &wait);
    if (signal_number == SIGHUP) {
      // Logs config_reloaded or config_reload_refused itself; serving goes on either way.
      (void)plane_->Reload();  // also kept in the audit log
      continue;
    }
    if (signal_number > 0) {
      Log(LogLevel::kInfo, "shutting_down", {{"signal", signal_number}});
      return 0;
    }
    if (worker_given_up_.load()) {
      Log(LogLevel::kError, "shutting_down", {{"reason", "an enclave worker cannot be restarted"}});
      return 1;
    }
  }
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (supervisor_ != nullptr) supervisor_->StopRestarting();  // a worker that exits stays down
  // Refuse new calls, let running ones finish within the grace period, then close the server
  // (an immediate deadline: all that is left are idle connections). Calls still waiting on the
  // worker after the grace period are completed by stopping it.
  if (server_.server != nullptr) {
    if (grpc::HealthCheckServiceInterface* health = server_.server->GetHealthCheckService()) {
      health->SetServingStatus(false);
    }
  }
  if (service_ != nullptr) {
    service_->BeginDrain();
    if (!service_->WaitUntilIdle(kShutdownGrace)) {
      Log(LogLevel::kWarning, "shutdown_forcing",
          {{"reason", "calls still in flight after the grace period"},
           {"active_rpcs", service_->active_rpcs()}});
      supervisor_->Stop();
    }
  }
  if (server_.server != nullptr) {
    server_.server->Shutdown(std::chrono::system_clock::now());
    server_.server.reset();
  }
  if (plane_ != nullptr) plane_->Stop();  // a last signed checkpoint while the workers still run
  if (scheduler_ != nullptr) scheduler_->Stop();
  receipt_sink_.reset();  // every receipt handed over is written before the sync below
  service_.reset();
  if (supervisor_ != nullptr) supervisor_->Stop();
  if (receipt_log_ != nullptr) {
    if (absl::Status synced = receipt_log_->Sync(); !synced.ok()) {
      Log(LogLevel::kWarning, "receipt_log_sync_failed", {{"error", synced.ToString()}});
    }
  }
}

}  // namespace cloister::host
