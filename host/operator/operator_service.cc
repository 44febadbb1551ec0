#include "host/operator/operator_service.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "cloister/attest/v1/evidence.pb.h"
#include "crypto/hash.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace cloister::host {
namespace {

constexpr absl::string_view kTenantApiPrefix = "/cloister.api.v1.Cloister/";

}  // namespace

// ---- EvidenceTracker ----

EvidenceTracker::EvidenceTracker(int worker_count, AuditLog* audit)
    : audit_(audit), seen_(static_cast<size_t>(std::max(worker_count, 0))) {}

void EvidenceTracker::Observe(int worker, const boundary::v1::GetEvidenceResult& result) {
  attest::v1::ChallengeResponse response;
  attest::v1::EvidenceBundle bundle;
  if (!response.ParseFromString(result.challenge_response()) ||
      !bundle.ParseFromString(response.bundle())) {
    return;
  }
  std::string bundle_sha256 = HexEncode(crypto::Sha256(AsBytes(response.bundle())));
  Seen now_seen{absl::FromUnixSeconds(bundle.collected_at_unix()),
                ToBytes(bundle.enclave_signing_public_key()), bundle_sha256};
  bool refreshed = false;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || static_cast<size_t>(worker) >= seen_.size()) return;
    Seen& seen = seen_[static_cast<size_t>(worker)];
    if (seen.bundle_sha256 == bundle_sha256) return;
    // A fresh bundle collected over a tenant's nonce is also new; only a newer collection time
    // replaces what Status reports as the worker's evidence age.
    if (now_seen.collected_at < seen.collected_at) return;
    seen = now_seen;
    refreshed = true;
  }
  if (!refreshed) return;
  std::string collected =
      absl::FormatTime(absl::RFC3339_sec, now_seen.collected_at, absl::UTCTimeZone());
  Log(LogLevel::kInfo, "evidence_refreshed",
      {{"worker", worker}, {"bundle_sha256", bundle_sha256}, {"collected_at", collected}});
  if (audit_ != nullptr) {
    absl::Status recorded =
        audit_->Record(audit_event::kEvidenceRefreshed, "",
                       {{"worker", absl::StrCat(worker)},
                        {"bundle_sha256", bundle_sha256},
                        {"collected_at", collected},
                        {"enclave_signing_public_key", HexEncode(now_seen.signing_public_key)}});
    if (!recorded.ok()) {
      Log(LogLevel::kError, "audit_write_failed", {{"error", recorded.ToString()}});
    }
  }
}

std::vector<EvidenceTracker::Seen> EvidenceTracker::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return seen_;
}

// ---- OperatorService ----

OperatorService::OperatorService(OperatorSources sources)
    : sources_(std::move(sources)),
      clock_(sources_.clock != nullptr ? sources_.clock : Clock::Real()),
      started_(clock_->Now()) {
  CLOISTER_CHECK(sources_.scheduler != nullptr && sources_.service != nullptr &&
                 sources_.blobs != nullptr && sources_.evidence != nullptr);
}

OperatorService::~OperatorService() = default;

ops::v1::StatusResponse OperatorService::Snapshot() const {
  ops::v1::StatusResponse status;
  absl::Time now = clock_->Now();
  status.set_started_at_unix(absl::ToUnixSeconds(started_));
  status.set_uptime_seconds(absl::ToDoubleSeconds(now - started_));

  std::vector<int> in_flight = sources_.scheduler->InFlightPerWorker();
  std::vector<EvidenceTracker::Seen> evidence = sources_.evidence->Snapshot();
  for (int index = 0; index < sources_.scheduler->worker_count(); ++index) {
    ops::v1::WorkerStatus* worker = status.add_workers();
    worker->set_index(index);
    if (static_cast<size_t>(index) < sources_.worker_kinds.size()) {
      worker->set_tee(sources_.worker_kinds[index].first);
      worker->set_gpu(sources_.worker_kinds[index].second);
    }
    if (static_cast<size_t>(index) < in_flight.size()) {
      worker->set_batches_in_flight(in_flight[index]);
      status.set_batches_in_flight(status.batches_in_flight() + in_flight[index]);
    }
    worker->set_evidence_age_seconds(-1);
    if (static_cast<size_t>(index) < evidence.size() &&
        evidence[index].collected_at != absl::InfinitePast()) {
      worker->set_evidence_collected_at_unix(absl::ToUnixSeconds(evidence[index].collected_at));
      worker->set_evidence_age_seconds(
          std::max(0.0, absl::ToDoubleSeconds(now - evidence[index].collected_at)));
      worker->set_signing_public_key_hex(HexEncode(evidence[index].signing_public_key));
    }
  }

  // Tenants: the configured ones, and any other the scheduler or the stores still know.
  std::map<std::string, ops::v1::TenantStatus> tenants;
  if (sources_.tenant_ids) {
    for (const std::string& id : sources_.tenant_ids()) tenants[id].set_id(id);
  }
  for (const Scheduler::TenantQueueState& queue : sources_.scheduler->TenantQueues()) {
    ops::v1::TenantStatus& tenant = tenants[queue.tenant_id];
    tenant.set_id(queue.tenant_id);
    tenant.set_queued_requests(queue.queued_count);
    tenant.set_admitted(queue.stats.admitted);
    tenant.set_refused(queue.stats.refused);
    tenant.set_expired(queue.stats.expired);
    tenant.set_dispatched(queue.stats.dispatched);
    tenant.set_batches(queue.stats.batches);
    status.set_queued_requests(status.queued_requests() + queue.queued_count);
  }
  for (const auto& [id, count] : sources_.service->SessionCountsByTenant()) {
    tenants[id].set_id(id);
    tenants[id].set_sessions(count);
    status.set_sessions(status.sessions() + count);
  }
  absl::StatusOr<std::vector<StoredModel>> models = sources_.blobs->List();
  if (models.ok()) {
    for (const StoredModel& model : *models) {
      tenants[model.tenant_id].set_id(model.tenant_id);
      tenants[model.tenant_id].set_models(tenants[model.tenant_id].models() + 1);
    }
    status.set_models(static_cast<int>(models->size()));
  }
  for (auto& [id, tenant] : tenants) {
    const TenantLimits& limits = sources_.scheduler->LimitsFor(id);
    tenant.set_priority(std::string(PriorityClassName(limits.priority)));
    tenant.set_weight(limits.weight);
    *status.add_tenants() = std::move(tenant);
  }
  if (sources_.audit != nullptr) {
    status.set_audit_entries(sources_.audit->entry_count());
    status.set_audit_signed_entries(sources_.audit->signed_count());
    status.set_audit_log_path(sources_.audit->path());
  }
  return status;
}

GaugeSnapshot OperatorService::Gauges() const {
  ops::v1::StatusResponse status = Snapshot();
  GaugeSnapshot gauges;
  for (const ops::v1::TenantStatus& tenant : status.tenants()) {
    GaugeSnapshot::Tenant& entry = gauges.tenants.emplace_back();
    entry.tenant_id = tenant.id();
    entry.priority = tenant.priority();
    entry.queued_requests = tenant.queued_requests();
    entry.sessions = tenant.sessions();
    entry.models = tenant.models();
  }
  absl::StatusOr<std::vector<StoredModel>> models = sources_.blobs->List();
  if (models.ok()) {
    for (const StoredModel& model : *models) {
      for (GaugeSnapshot::Tenant& entry : gauges.tenants) {
        if (entry.tenant_id == model.tenant_id) entry.model_memory_size += model.ciphertext_size;
      }
    }
  }
  for (const ops::v1::WorkerStatus& worker : status.workers()) {
    gauges.workers.push_back(
        {worker.index(), worker.batches_in_flight(), worker.evidence_age_seconds()});
  }
  gauges.audit_entries = status.audit_entries();
  gauges.audit_signed_entries = status.audit_signed_entries();
  return gauges;
}

grpc::ServerUnaryReactor* OperatorService::Status(grpc::CallbackServerContext* context,
                                                  const ops::v1::StatusRequest*,
                                                  ops::v1::StatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  worker_.Post([this, reactor, response] {
    *response = Snapshot();
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* OperatorService::Reload(grpc::CallbackServerContext* context,
                                                  const ops::v1::ReloadRequest*,
                                                  ops::v1::ReloadResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!sources_.reload) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "this cloisterd has no reload entry point (send SIGHUP, or "
                                 "restart it to apply a changed config)"));
    return reactor;
  }
  worker_.Post([this, reactor, response] {
    Log(LogLevel::kInfo, "operator_reload_requested");
    absl::StatusOr<std::string> summary = sources_.reload();
    if (!summary.ok()) {
      reactor->Finish(ToGrpcStatus(summary.status()));
      return;
    }
    response->set_summary(*summary);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

// ---- Request metrics interceptor ----

namespace {

class RequestMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RequestMetricsInterceptor(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      auto* metadata = methods->GetRecvInitialMetadata();
      if (metadata != nullptr) {
        auto it = metadata->find("x-cloister-tenant");
        if (it != metadata->end()) tenant_.assign(it->second.data(), it->second.size());
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->RecordRequest(method_, tenant_,
                              static_cast<absl::StatusCode>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  Metrics* const metrics_;
  const std::string method_;
  std::string tenant_;  // as claimed; Metrics labels it only when configured and authenticated
};

class RequestMetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestMetricsInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    absl::string_view method = info->method() != nullptr ? info->method() : "";
    if (!absl::StartsWith(method, kTenantApiPrefix)) return nullptr;
    return new RequestMetricsInterceptor(metrics_,
                                         std::string(method.substr(kTenantApiPrefix.size())));
  }

 private:
  Metrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRequestMetricsInterceptorFactory(Metrics* metrics) {
  return std::make_unique<RequestMetricsInterceptorFactory>(metrics);
}

absl::StatusOr<RunningOperatorServer> StartOperatorServer(OperatorService* service,
                                                          const std::string& listen) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  // gRPC binds with SO_REUSEPORT by default: a second cloisterd would share the port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  RunningOperatorServer running;
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || (port == 0 && !absl::StartsWith(listen, "unix:"))) {
    return absl::UnavailableError(absl::StrCat("cannot listen on operator address ", listen,
                                               " (address in use or not available?)"));
  }
  if (absl::StartsWith(listen, "unix:")) {
    running.address = listen;
  } else {
    running.address = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  }
  return running;
}

}  // namespace cloister::host
