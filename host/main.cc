// cloisterd: the untrusted host broker (DESIGN.md sections 2 and 8). It authenticates tenants,
// admits, queues and batches their sealed requests, keeps model ciphertext at rest and relays
// everything to its enclave workers (`workers: N`, one per device); it never sees plaintext.
//
// Start-up: settings (flags over --config), data dir (0700), tenants (the development tenant
// "demo" with its token in DATA_DIR/demo.token unless the config lists tenants), the enclave
// workers (the first one alone until it answers a GetEvidenceCall, so it creates the simulated
// roots the others then share), reload of every stored model into every worker, the gRPC
// server, then exactly one line on stdout: "cloisterd listening on HOST:PORT".
// SIGTERM or SIGINT: stop accepting, finish in-flight calls (with a deadline), stop the worker,
// exit 0. Exit 1 if start-up fails or the worker dies; exit 2 for bad usage or config.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "host/config/daemon_config.h"
#include "host/receipts/receipt_log.h"
#include "host/enclave_client/process_enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "host/server/cloister_service.h"
#include "host/server/grpc_server.h"
#include "host/storage/file_blob_store.h"
#include "host/tenants/tenant_registry.h"

namespace cloister::host {
namespace {

constexpr absl::Duration kEnclaveReadyTimeout = absl::Seconds(120);
constexpr absl::Duration kReloadTimeout = absl::Seconds(300);
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
constexpr int kMaxGrpcMessageSize = (64 << 20) + (1 << 20);  // a sealed call plus framing

// Sends GetEvidenceCalls until one succeeds (the worker answers once it has written its
// simulated roots and development policy) and returns that answer.
absl::StatusOr<boundary::v1::GetEvidenceResult> WaitForEnclave(
    EnclaveClient& enclave, const std::atomic<bool>& worker_exited) {
  absl::Time give_up = absl::Now() + kEnclaveReadyTimeout;
  absl::Status last;
  while (absl::Now() < give_up) {
    boundary::v1::HostToEnclave call;
    call.mutable_get_evidence()->set_nonce(ToString(crypto::RandomBytes(32)));
    absl::StatusOr<boundary::v1::EnclaveToHost> reply =
        CallAndWait(enclave, std::move(call), give_up - absl::Now());
    if (reply.ok()) return reply->get_evidence();
    last = reply.status();
    if (worker_exited.load() || absl::IsUnavailable(last)) return last;
    Log(LogLevel::kInfo, "waiting_for_enclave", {{"error", last.ToString()}});
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("enclave worker not ready after ",
                                                  absl::FormatDuration(kEnclaveReadyTimeout), ": ",
                                                  last.ToString()));
}

// Hands every stored model back to the enclave. A model that fails is logged and skipped; only
// a dead worker stops start-up.
absl::Status ReloadStoredModels(BlobStore& blobs, EnclaveClient& enclave) {
  ASSIGN_OR_RETURN(std::vector<StoredModel> models, blobs.List());
  int reloaded = 0;
  for (const StoredModel& model : models) {
    auto skip = [&](const absl::Status& why) {
      Log(LogLevel::kWarning, "model_reload_failed",
          {{"tenant", model.tenant_id}, {"handle", model.handle}, {"error", why.ToString()}});
    };
    absl::StatusOr<std::string> ciphertext = blobs.ReadCiphertext(model.tenant_id, model.handle);
    if (!ciphertext.ok()) {
      skip(ciphertext.status());
      continue;
    }
    if (HexEncode(crypto::Sha256(AsBytes(*ciphertext))) != model.ciphertext_sha256) {
      skip(absl::DataLossError("stored ciphertext does not match its recorded SHA-256"));
      continue;
    }
    absl::StatusOr<std::string> wrapped_key = blobs.ReadWrappedKey(model.tenant_id, model.handle);
    if (!wrapped_key.ok()) {
      skip(wrapped_key.status());
      continue;
    }
    boundary::v1::HostToEnclave call;
    boundary::v1::ReloadModelCall* reload = call.mutable_reload_model();
    reload->set_model_handle(model.handle);
    reload->set_wrapped_model_key(*std::move(wrapped_key));
    reload->set_model_ciphertext(*std::move(ciphertext));
    absl::StatusOr<boundary::v1::EnclaveToHost> reply =
        CallAndWait(enclave, std::move(call), kReloadTimeout);
    if (!reply.ok()) {
      if (absl::IsUnavailable(reply.status())) return reply.status();
      skip(reply.status());
      continue;
    }
    ++reloaded;
    Log(LogLevel::kInfo, "model_reloaded", {{"tenant", model.tenant_id}, {"handle", model.handle}});
  }
  Log(LogLevel::kInfo, "models_reloaded",
      {{"reloaded", reloaded}, {"stored", static_cast<long long>(models.size())}});
  return absl::OkStatus();
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
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

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

  std::vector<TenantCredential> tenants = config.Credentials();
  if (tenants.empty()) {
    std::string token_path = absl::StrCat(data_dir, "/demo.token");
    absl::StatusOr<std::string> token = LoadOrCreateDevToken(token_path);
    if (!token.ok()) return Fail(token.status());
    tenants.push_back({kDevTenantId, TokenHash(*token)});
    Log(LogLevel::kInfo, "development_tenant",
        {{"tenant", kDevTenantId}, {"token_file", token_path}});
  }
  absl::StatusOr<std::unique_ptr<TenantRegistry>> registry =
      TenantRegistry::Create(std::move(tenants));
  if (!registry.ok()) return Fail(registry.status());

  std::atomic<bool> worker_exited{false};
  std::vector<std::unique_ptr<ProcessEnclaveClient>> enclaves;
  std::vector<Bytes> enclave_keys;  // each worker's evidence signing key, for its receipts
  std::vector<EnclaveClient*> workers;
  auto stop_workers = [&enclaves] {
    for (auto& enclave : enclaves) enclave->Stop();
  };
  for (int index = 0; index < config.workers; ++index) {
    ProcessEnclaveOptions enclave_options;
    enclave_options.binary_path = enclave_binary;
    enclave_options.data_dir = data_dir;
    enclave_options.tee = config.tee;
    enclave_options.gpu = config.gpu;
    enclave_options.write_dev_policy = index == 0;
    enclave_options.on_exit = [&worker_exited](const absl::Status&) { worker_exited.store(true); };
    absl::StatusOr<std::unique_ptr<ProcessEnclaveClient>> enclave =
        ProcessEnclaveClient::Start(std::move(enclave_options));
    if (!enclave.ok()) {
      stop_workers();
      return Fail(enclave.status());
    }
    enclaves.push_back(*std::move(enclave));
    workers.push_back(enclaves.back().get());
    // The first worker creates the simulated roots and sealing secret the others share.
    absl::StatusOr<boundary::v1::GetEvidenceResult> evidence =
        WaitForEnclave(*enclaves.back(), worker_exited);
    if (!evidence.ok()) {
      stop_workers();
      return Fail(evidence.status());
    }
    // Its usage receipts are verified against the signing key in this evidence.
    absl::StatusOr<Bytes> key = EnclaveSigningKeyFromEvidence(*evidence);
    if (!key.ok()) {
      // Serving goes on; this worker's receipts will be refused (and logged) as unverifiable.
      Log(LogLevel::kWarning, "enclave_key_unknown",
          {{"worker", index}, {"error", key.status().ToString()}});
    }
    enclave_keys.push_back(key.ok() ? *std::move(key) : Bytes());
  }
  Log(LogLevel::kInfo, "enclave_workers_ready", {{"workers", config.workers}});
  absl::StatusOr<std::unique_ptr<FileBlobStore>> blobs =
      FileBlobStore::Open(absl::StrCat(data_dir, "/models"));
  if (!blobs.ok()) {
    stop_workers();
    return Fail(blobs.status());
  }
  for (size_t index = 0; index < enclaves.size(); ++index) {
    if (absl::Status status = ReloadStoredModels(**blobs, *enclaves[index]); !status.ok()) {
      stop_workers();
      return Fail(status);
    }
  }

  // Usage receipts: every batch reply carries one signed by its worker's enclave key; they are
  // verified against that key and kept in DATA_DIR/receipts/receipts.jsonl.
  absl::StatusOr<std::unique_ptr<ReceiptLog>> receipt_log = ReceiptLog::Open(data_dir);
  if (!receipt_log.ok()) {
    stop_workers();
    return Fail(receipt_log.status());
  }
  SchedulerOptions scheduler_options = config.scheduler;
  scheduler_options.on_batch_reply = [log = receipt_log->get(), &enclave_keys](
                                         int worker, const EnclaveClient::Reply& reply) {
    if (!reply.ok() || !reply->has_infer_batch() || !reply->infer_batch().has_receipt()) return;
    absl::StatusOr<boundary::v1::UsageReceipt> kept =
        log->Append(absl::StrCat("worker", worker), enclave_keys[worker],
                    reply->infer_batch().receipt());
    if (!kept.ok()) {
      Log(LogLevel::kWarning, "receipt_refused",
          {{"worker", worker}, {"reason", std::string(kept.status().message())}});
    }
  };

  // Tenants without limits of their own (the development tenant too) get tenant_defaults.
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Create(workers, scheduler_options);
  if (!scheduler.ok()) {
    stop_workers();
    return Fail(scheduler.status());
  }

  auto service = std::make_unique<CloisterService>(registry->get(), workers, scheduler->get(),
                                                   blobs->get(), ServiceOptions());
  absl::StatusOr<RunningServer> server =
      StartGrpcServer(service.get(), config.listen, kMaxGrpcMessageSize);
  if (!server.ok()) return Fail(server.status());

  std::string address = absl::StrCat(ListenHost(config.listen), ":", server->port);
  Log(LogLevel::kInfo, "listening", {{"address", address}, {"data_dir", data_dir}});
  std::printf("cloisterd listening on %s\n", address.c_str());
  std::fflush(stdout);

  int exit_code = 0;
  while (true) {
    struct timespec wait = {0, 200 * 1000 * 1000};
    int signal_number = sigtimedwait(&stop_signals, nullptr, &wait);
    if (signal_number > 0) {
      Log(LogLevel::kInfo, "shutting_down", {{"signal", signal_number}});
      break;
    }
    if (worker_exited.load()) {
      Log(LogLevel::kError, "shutting_down", {{"reason", "enclave worker exited"}});
      exit_code = 1;
      break;
    }
  }

  // Refuse new calls, let running ones finish within the grace period, then close the server
  // (an immediate deadline: all that is left are idle connections). Calls still waiting on the
  // worker after the grace period are completed by stopping it.
  service->BeginDrain();
  if (!service->WaitUntilIdle(kShutdownGrace)) {
    Log(LogLevel::kWarning, "shutdown_forcing",
        {{"reason", "calls still in flight after the grace period"},
         {"active_rpcs", service->active_rpcs()}});
    stop_workers();
  }
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server.reset();
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
  absl::StatusOr<DaemonConfig> config = ResolveDaemonConfig(*command_line);
  if (!config.ok()) {
    std::fprintf(stderr, "cloisterd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  return Run(*config);
}
