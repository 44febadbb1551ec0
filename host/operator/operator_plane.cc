#include "host/operator/operator_plane.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/random.h"
#include "grpcpp/server.h"

namespace cloister::host {
namespace {

void LogAuditFailure(const absl::Status& status) {
  if (!status.ok()) Log(LogLevel::kError, "audit_write_failed", {{"error", status.ToString()}});
}

}  // namespace

OperatorPlane::OperatorPlane(OperatorPlaneOptions options, std::vector<EnclaveClient*> workers,
                             ConfigReloader* reloader, std::unique_ptr<AuditLog> audit)
    : options_(std::move(options)),
      workers_(std::move(workers)),
      reloader_(reloader),
      audit_(std::move(audit)),
      evidence_(static_cast<int>(workers_.size()), audit_.get()) {}

absl::StatusOr<std::unique_ptr<OperatorPlane>> OperatorPlane::Create(
    OperatorPlaneOptions options, std::vector<EnclaveClient*> workers, ConfigReloader* reloader) {
  ASSIGN_OR_RETURN(std::unique_ptr<AuditLog> audit,
                   AuditLog::Open(absl::StrCat(options.data_dir, "/audit/audit.jsonl")));
  LogAuditFailure(
      audit->Record(audit_event::kDaemonStarted, "", {{"workers", absl::StrCat(workers.size())}}));
  std::unique_ptr<OperatorPlane> plane(
      new OperatorPlane(std::move(options), std::move(workers), reloader, std::move(audit)));
  plane->UpdateTenantClasses();
  return plane;
}

OperatorPlane::~OperatorPlane() { Stop(); }

std::vector<std::string> OperatorPlane::TenantIds() const {
  std::vector<std::string> ids;
  if (reloader_ != nullptr) {
    std::shared_ptr<const DaemonConfig> config = reloader_->config();
    for (const TenantConfig& tenant : config->tenants) ids.push_back(tenant.tenant_id);
  }
  if (ids.empty()) ids.push_back(kDevTenantId);
  return ids;
}

void OperatorPlane::UpdateTenantClasses() {
  std::map<std::string, std::string> classes;
  for (const std::string& id : TenantIds()) {
    const TenantLimits* limits = nullptr;
    if (scheduler_ != nullptr) limits = &scheduler_->LimitsFor(id);
    classes[id] = std::string(
        PriorityClassName(limits != nullptr ? limits->priority : PriorityClass::kStandard));
  }
  metrics_.SetTenantClasses(std::move(classes));
}

void OperatorPlane::InstallSchedulerHooks(SchedulerOptions& options) {
  auto previous = std::move(options.on_batch_done);
  options.on_batch_done = [this, previous = std::move(previous)](const BatchObservation& batch) {
    metrics_.RecordBatch(batch.tenant_id, PriorityClassName(batch.priority), batch.count,
                         batch.queue_waits, batch.execution);
    if (previous) previous(batch);
  };
}

void OperatorPlane::InstallServiceHooks(ServiceOptions& options) {
  options.audit = audit_.get();
  options.on_evidence = [this](int worker, const boundary::v1::GetEvidenceResult& result) {
    evidence_.Observe(worker, result);
  };
  options.on_generation_done = [this](const std::string& tenant_id, absl::Duration first_chunk,
                                      const std::vector<absl::Duration>& gaps, bool) {
    metrics_.RecordGeneration(tenant_id, first_chunk, gaps);
  };
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
OperatorPlane::TenantApiInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> list;
  list.push_back(NewRequestMetricsInterceptorFactory(&metrics_));
  return list;
}

void OperatorPlane::ObserveStartupEvidence(int worker,
                                           const boundary::v1::GetEvidenceResult& evidence) {
  evidence_.Observe(worker, evidence);
}

void OperatorPlane::ObserveReceipt(const boundary::v1::UsageReceipt& receipt) {
  metrics_.RecordTransfer(receipt.pcie_mode(),
                          receipt.batch().input_size() + receipt.batch().output_size(),
                          absl::Nanoseconds(receipt.batch().transfer_ns()));
}

absl::Status OperatorPlane::Start(Scheduler* scheduler, CloisterService* service,
                                  BlobStore* blobs) {
  scheduler_ = scheduler;
  blobs_ = blobs;
  UpdateTenantClasses();
  OperatorSources sources;
  sources.scheduler = scheduler;
  sources.service = service;
  sources.blobs = blobs;
  sources.evidence = &evidence_;
  sources.audit = audit_.get();
  sources.worker_kinds = options_.worker_kinds;
  sources.tenant_ids = [this] { return TenantIds(); };
  if (reloader_ != nullptr) sources.reload = [this] { return Reload(); };
  service_ = std::make_unique<OperatorService>(std::move(sources));
  metrics_.SetGaugeSource([this] { return Gauges(); });

  // Checkpoints and evidence probes run whether or not the addresses below can be bound.
  background_ = std::thread([this] { BackgroundLoop(); });
  ASSIGN_OR_RETURN(RunningOperatorServer running,
                   StartOperatorServer(service_.get(), options_.operator_listen));
  operator_server_ = std::move(running.server);
  operator_address_ = running.address;
  std::string metrics_listen = options_.metrics_listen.empty()
                                   ? MetricsAddressFor(options_.operator_listen)
                                   : options_.metrics_listen;
  ASSIGN_OR_RETURN(metrics_server_, MetricsHttpServer::Start(&metrics_, metrics_listen));
  metrics_address_ = absl::StrCat(metrics_listen.substr(0, metrics_listen.rfind(':')), ":",
                                  metrics_server_->port());
  Log(LogLevel::kInfo, "operator_listening",
      {{"address", operator_address_},
       {"metrics", absl::StrCat("http://", metrics_address_, "/metrics")}});
  return absl::OkStatus();
}

absl::StatusOr<std::string> OperatorPlane::Reload() {
  if (reloader_ == nullptr) {
    return absl::UnimplementedError("this cloisterd was started without a reloadable config");
  }
  absl::StatusOr<ReloadOutcome> outcome = reloader_->ReloadConfig();
  if (!outcome.ok()) {
    LogAuditFailure(audit_->Record(audit_event::kReloadRefused, "",
                                   {{"error", std::string(outcome.status().message())}}));
    return outcome.status();
  }
  UpdateTenantClasses();
  for (const auto& [list, change] : {std::pair{&outcome->tenants_added, "added"},
                                     std::pair{&outcome->tenants_removed, "removed"},
                                     std::pair{&outcome->tenants_changed, "changed"}}) {
    for (const std::string& tenant : *list) {
      LogAuditFailure(
          audit_->Record(audit_event::kTenantConfigChanged, tenant, {{"change", change}}));
    }
  }
  std::string summary =
      absl::StrCat("reloaded ", outcome->file, ": ", outcome->tenant_count, " tenants (",
                   outcome->tenants_added.size(), " added, ", outcome->tenants_removed.size(),
                   " removed, ", outcome->tenants_changed.size(), " changed)");
  if (!outcome->restart_needed.empty()) {
    absl::StrAppend(&summary, "; restart needed for ",
                    absl::StrJoin(outcome->restart_needed, ", "));
  }
  LogAuditFailure(
      audit_->Record(audit_event::kPolicyReloaded, "",
                     {{"file", outcome->file},
                      {"tenants", absl::StrCat(outcome->tenant_count)},
                      {"restart_needed", absl::StrJoin(outcome->restart_needed, ",")}}));
  return summary;
}

absl::StatusOr<boundary::v1::SignedAuditCheckpoint> OperatorPlane::SignCheckpoint(
    ByteSpan digest, uint64_t sequence) {
  absl::Status last = absl::UnavailableError("no enclave worker");
  // Any worker can sign; the first that answers does.
  for (EnclaveClient* worker : workers_) {
    boundary::v1::HostToEnclave call;
    call.mutable_sign_audit_checkpoint()->set_chain_digest(ToString(digest));
    call.mutable_sign_audit_checkpoint()->set_sequence(sequence);
    absl::StatusOr<boundary::v1::EnclaveToHost> reply =
        CallAndWait(*worker, std::move(call), options_.enclave_call_timeout);
    if (reply.ok()) return reply->sign_audit_checkpoint().signed_();
    last = reply.status();
  }
  return last;
}

void OperatorPlane::Checkpoint() {
  absl::Status status = audit_->Checkpoint(
      [this](ByteSpan digest, uint64_t sequence) { return SignCheckpoint(digest, sequence); });
  if (!status.ok()) {
    Log(LogLevel::kWarning, "audit_checkpoint_failed", {{"error", status.ToString()}});
  }
}

void OperatorPlane::ProbeEvidence() {
  for (size_t index = 0; index < workers_.size(); ++index) {
    boundary::v1::HostToEnclave call;
    call.mutable_get_evidence()->set_nonce(ToString(crypto::RandomBytes(32)));
    absl::StatusOr<boundary::v1::EnclaveToHost> reply =
        CallAndWait(*workers_[index], std::move(call), options_.enclave_call_timeout);
    if (reply.ok()) {
      evidence_.Observe(static_cast<int>(index), reply->get_evidence());
    } else {
      Log(LogLevel::kWarning, "evidence_probe_failed",
          {{"worker", static_cast<long long>(index)}, {"error", reply.status().ToString()}});
    }
  }
}

void OperatorPlane::ProbeStats() {
  std::vector<WorkerStats> stats(workers_.size());
  std::map<std::string, std::string> tenant_by_handle;
  if (blobs_ != nullptr) {
    absl::StatusOr<std::vector<StoredModel>> stored = blobs_->List();
    if (stored.ok()) {
      for (const StoredModel& model : *stored) tenant_by_handle[model.handle] = model.tenant_id;
    } else {
      Log(LogLevel::kWarning, "stats_probe_failed", {{"error", stored.status().ToString()}});
    }
  }
  for (size_t index = 0; index < workers_.size(); ++index) {
    boundary::v1::HostToEnclave call;
    call.mutable_get_stats();
    absl::StatusOr<boundary::v1::EnclaveToHost> reply =
        CallAndWait(*workers_[index], std::move(call), options_.enclave_call_timeout);
    if (!reply.ok()) {
      Log(LogLevel::kWarning, "stats_probe_failed",
          {{"worker", static_cast<long long>(index)}, {"error", reply.status().ToString()}});
      continue;
    }
    const boundary::v1::StatsResult& result = reply->get_stats();
    for (const boundary::v1::ModelMemory& model : result.models()) {
      // A model still being uploaded has no blob yet; it is counted once it is stored.
      auto owner = tenant_by_handle.find(model.model_handle());
      if (owner != tenant_by_handle.end()) {
        stats[index].model_memory_by_tenant[owner->second] += model.size();
      }
    }
    // The enclave's tenant ids are the ones this host passed with each generation.
    for (const boundary::v1::GenerationOccupancy& entry : result.generation()) {
      WorkerStats::Generations& sum = stats[index].generations_by_tenant[entry.tenant_id()];
      sum.running += entry.running();
      sum.waiting += entry.waiting();
      sum.kv_blocks += entry.kv_blocks();
      stats[index].kv_blocks_used += entry.kv_blocks();
    }
    stats[index].kv_blocks_total = result.kv_blocks_total();
    stats[index].interrupted_steps = result.interrupted_steps();
    if (result.has_device_memory()) {
      stats[index].has_device_memory = true;
      stats[index].device_memory_total_size = result.device_memory().total_size();
      stats[index].device_memory_used_size = result.device_memory().used_size();
    }
  }
  absl::MutexLock lock(&stats_mu_);
  worker_stats_ = std::move(stats);
}

GaugeSnapshot OperatorPlane::Gauges() {
  GaugeSnapshot gauges = service_->Gauges();
  absl::MutexLock lock(&stats_mu_);
  for (GaugeSnapshot::Worker& worker : gauges.workers) {
    if (worker.index < 0 || worker.index >= static_cast<int>(worker_stats_.size())) continue;
    const WorkerStats& stats = worker_stats_[worker.index];
    worker.has_device_memory = stats.has_device_memory;
    worker.device_memory_total_size = stats.device_memory_total_size;
    worker.device_memory_used_size = stats.device_memory_used_size;
    worker.kv_blocks_total = stats.kv_blocks_total;
    worker.kv_blocks_used = stats.kv_blocks_used;
    worker.interrupted_steps = stats.interrupted_steps;
  }
  for (GaugeSnapshot::Tenant& tenant : gauges.tenants) {
    for (const WorkerStats& stats : worker_stats_) {
      auto it = stats.model_memory_by_tenant.find(tenant.tenant_id);
      if (it != stats.model_memory_by_tenant.end()) tenant.enclave_model_memory_size += it->second;
      auto generations = stats.generations_by_tenant.find(tenant.tenant_id);
      if (generations != stats.generations_by_tenant.end()) {
        tenant.generations_running += generations->second.running;
        tenant.generations_waiting += generations->second.waiting;
        tenant.kv_blocks += generations->second.kv_blocks;
      }
    }
  }
  return gauges;
}

void OperatorPlane::BackgroundLoop() {
  absl::Time next_checkpoint = absl::Now() + options_.checkpoint_interval;
  absl::Time next_probe = absl::Now() + options_.evidence_probe_interval;
  absl::Time next_stats = absl::Now() + options_.stats_probe_interval;
  // The first checkpoint comes soon after start, so that start-up is signed early; the first
  // statistics too, so that a scrape soon after start shows the devices.
  Checkpoint();
  ProbeStats();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      absl::Time wake = std::min({next_checkpoint, next_probe, next_stats});
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithDeadline(absl::Condition(&stop), wake)) return;
    }
    absl::Time now = absl::Now();
    if (now >= next_probe) {
      ProbeEvidence();
      next_probe = now + options_.evidence_probe_interval;
    }
    if (now >= next_stats) {
      ProbeStats();
      next_stats = now + options_.stats_probe_interval;
    }
    if (now >= next_checkpoint) {
      Checkpoint();
      next_checkpoint = now + options_.checkpoint_interval;
    }
  }
}

void OperatorPlane::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  if (background_.joinable()) background_.join();
  if (operator_server_ != nullptr) {
    operator_server_->Shutdown(std::chrono::system_clock::now());
    operator_server_.reset();
  }
  metrics_server_.reset();
  LogAuditFailure(audit_->Record(audit_event::kDaemonStopped, ""));
  Checkpoint();
  if (absl::Status synced = audit_->Sync(); !synced.ok()) {
    Log(LogLevel::kWarning, "audit_log_sync_failed", {{"error", synced.ToString()}});
  }
}

}  // namespace cloister::host
