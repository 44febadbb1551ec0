#include "host/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace cloister::host {
namespace {

using Labels = std::map<std::string, std::string>;

constexpr uint64_t kTransferRounding = 64 * 1024;

std::string TenantLabel(absl::string_view tenant_id) {
  return tenant_id.empty() ? "-" : std::string(tenant_id);
}

std::string PriorityLabel(absl::string_view priority) {
  return priority.empty() ? "-" : std::string(priority);
}

// Request latencies from 100 us to 30 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
}

prometheus::Histogram::BucketBoundaries BatchSizeBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

}  // namespace

class Metrics::Collector : public prometheus::Collectable {
 public:
  explicit Collector(const Metrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_->RefreshGauges();
    return metrics_->registry_->Collect();
  }

 private:
  const Metrics* const metrics_;
};

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  requests_ = &prometheus::BuildCounter()
                   .Name("cloister_requests_total")
                   .Help("Tenant API calls finished, by method, tenant and priority class")
                   .Register(r);
  errors_ = &prometheus::BuildCounter()
                 .Name("cloister_request_errors_total")
                 .Help(
                     "Tenant API calls that failed, by method, tenant, priority class and "
                     "gRPC status code")
                 .Register(r);
  batch_size_ = &prometheus::BuildHistogram()
                     .Name("cloister_batch_size")
                     .Help("Requests per batch sent to an enclave worker")
                     .Register(r);
  queue_latency_ = &prometheus::BuildHistogram()
                        .Name("cloister_queue_latency_seconds")
                        .Help(
                            "Time a request waited in its queue before its batch was "
                            "dispatched")
                        .Register(r);
  execution_latency_ = &prometheus::BuildHistogram()
                            .Name("cloister_execution_latency_seconds")
                            .Help(
                                "Time from a batch's dispatch to its answer (transfer, "
                                "execution and sealing in the enclave)")
                            .Register(r);
  pcie_bytes_ = &prometheus::BuildCounter()
                     .Name("cloister_pcie_bytes_total")
                     .Help(
                         "Tensor bytes moved over the PCIe path, both directions, by mode, "
                         "rounded up to 64 KiB per batch")
                     .Register(r);
  pcie_seconds_ = &prometheus::BuildCounter()
                       .Name("cloister_pcie_transfer_seconds_total")
                       .Help("Time spent on the PCIe path (encryption included), by mode")
                       .Register(r);
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("cloister_queue_depth")
                      .Help("Requests queued and not yet dispatched")
                      .Register(r);
  sessions_ =
      &prometheus::BuildGauge().Name("cloister_sessions").Help("Open tenant sessions").Register(r);
  models_ = &prometheus::BuildGauge().Name("cloister_models").Help("Stored models").Register(r);
  model_memory_ = &prometheus::BuildGauge()
                       .Name("cloister_model_memory_bytes")
                       .Help("Stored model bytes counted against the tenant's model-memory quota")
                       .Register(r);
  enclave_model_memory_ =
      &prometheus::BuildGauge()
           .Name("cloister_enclave_model_memory_bytes")
           .Help("Bytes of decrypted models held in enclave memory, summed over the workers")
           .Register(r);
  generation_sequences_ =
      &prometheus::BuildGauge()
           .Name("cloister_generation_sequences")
           .Help("Generations in the enclaves, running (in steps, with KV blocks) or waiting")
           .Register(r);
  kv_blocks_ = &prometheus::BuildGauge()
                    .Name("cloister_kv_blocks")
                    .Help("LLM KV-cache blocks the tenant's running generations hold")
                    .Register(r);
  kv_cache_blocks_ = &prometheus::BuildGauge()
                          .Name("cloister_kv_cache_blocks")
                          .Help("Blocks of each worker's LLM KV caches, total and used")
                          .Register(r);
  interrupted_steps_ =
      &prometheus::BuildGauge()
           .Name("cloister_generation_interrupted_steps")
           .Help("Best-effort generation steps each worker gave up part-way for a realtime "
                 "arrival since it started (the work thrown away, in steps)")
           .Register(r);
  device_memory_ = &prometheus::BuildGauge()
                        .Name("cloister_device_memory_bytes")
                        .Help("GPU memory of each worker's device, total and used")
                        .Register(r);
  workers_ = &prometheus::BuildGauge()
                  .Name("cloister_workers")
                  .Help("Enclave workers (one per device)")
                  .Register(r);
  in_flight_ = &prometheus::BuildGauge()
                    .Name("cloister_batches_in_flight")
                    .Help("Batches with an enclave worker, by worker")
                    .Register(r);
  evidence_age_ = &prometheus::BuildGauge()
                       .Name("cloister_evidence_age_seconds")
                       .Help("Age of the newest attestation evidence seen from each worker")
                       .Register(r);
  audit_entries_ = &prometheus::BuildGauge()
                        .Name("cloister_audit_entries")
                        .Help("Entries in the audit log")
                        .Register(r);
  audit_signed_ = &prometheus::BuildGauge()
                       .Name("cloister_audit_signed_entries")
                       .Help("Audit log entries covered by an enclave-signed checkpoint")
                       .Register(r);
  first_chunk_latency_ =
      &prometheus::BuildHistogram()
           .Name("cloister_generation_first_chunk_seconds")
           .Help("Generation streams: time from the call to its first sealed chunk (time to "
                 "first token)")
           .Register(r);
  chunk_gap_latency_ =
      &prometheus::BuildHistogram()
           .Name("cloister_generation_chunk_gap_seconds")
           .Help("Generation streams: time between consecutive sealed chunks (inter-token "
                 "latency at one token per chunk)")
           .Register(r);
  chunks_ = &prometheus::BuildCounter()
                 .Name("cloister_generation_chunks_total")
                 .Help("Sealed chunks relayed from generation streams (tokens at one per chunk)")
                 .Register(r);
  collector_ = std::make_shared<Collector>(this);
}

void Metrics::RecordGeneration(absl::string_view tenant_id, absl::Duration first_chunk,
                               const std::vector<absl::Duration>& gaps) {
  std::string priority = "-";
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = priority_by_tenant_.find(tenant_id);
    if (it != priority_by_tenant_.end()) priority = it->second;
  }
  Labels labels = {{"tenant", TenantLabel(tenant_id)}, {"priority", PriorityLabel(priority)}};
  first_chunk_latency_->Add(labels, LatencyBuckets()).Observe(absl::ToDoubleSeconds(first_chunk));
  prometheus::Histogram& gap = chunk_gap_latency_->Add(labels, LatencyBuckets());
  for (absl::Duration d : gaps) gap.Observe(absl::ToDoubleSeconds(d));
  chunks_->Add(labels).Increment(static_cast<double>(gaps.size() + 1));
}

Metrics::~Metrics() = default;

void Metrics::SetTenantClasses(std::map<std::string, std::string> priority_by_tenant) {
  absl::MutexLock lock(&mu_);
  priority_by_tenant_.clear();
  for (auto& [tenant, priority] : priority_by_tenant) {
    priority_by_tenant_.emplace(tenant, std::move(priority));
  }
}

void Metrics::RecordRequest(absl::string_view method, absl::string_view claimed_tenant_id,
                            absl::StatusCode code) {
  std::string tenant = "-", priority = "-";
  if (code != absl::StatusCode::kUnauthenticated) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = priority_by_tenant_.find(claimed_tenant_id);
    if (it != priority_by_tenant_.end()) {
      tenant = it->first;
      priority = it->second;
    }
  }
  Labels labels = {{"method", std::string(method)},
                   {"tenant", std::move(tenant)},
                   {"priority", std::move(priority)}};
  requests_->Add(labels).Increment();
  if (code != absl::StatusCode::kOk) {
    labels["code"] = absl::StatusCodeToString(code);
    errors_->Add(labels).Increment();
  }
}

void Metrics::RecordBatch(absl::string_view tenant_id, absl::string_view priority, int count,
                          const std::vector<absl::Duration>& queue_waits,
                          absl::Duration execution) {
  Labels labels = {{"tenant", TenantLabel(tenant_id)}, {"priority", PriorityLabel(priority)}};
  batch_size_->Add(labels, BatchSizeBuckets()).Observe(count);
  prometheus::Histogram& waits = queue_latency_->Add(labels, LatencyBuckets());
  for (absl::Duration wait : queue_waits) waits.Observe(absl::ToDoubleSeconds(wait));
  execution_latency_->Add(labels, LatencyBuckets()).Observe(absl::ToDoubleSeconds(execution));
}

void Metrics::RecordTransfer(absl::string_view pcie_mode, uint64_t size, absl::Duration time) {
  Labels labels = {{"mode", pcie_mode.empty() ? "-" : std::string(pcie_mode)}};
  uint64_t rounded = (size + kTransferRounding - 1) / kTransferRounding * kTransferRounding;
  pcie_bytes_->Add(labels).Increment(static_cast<double>(rounded));
  pcie_seconds_->Add(labels).Increment(absl::ToDoubleSeconds(time));
}

void Metrics::SetGaugeSource(GaugeSource source) {
  absl::MutexLock lock(&mu_);
  source_ = std::move(source);
}

void Metrics::RefreshGauges() const {
  GaugeSource source;
  {
    absl::MutexLock lock(&mu_);
    source = source_;
  }
  if (!source) return;
  GaugeSnapshot snapshot = source();  // without the lock: it reads other components

  absl::MutexLock lock(&mu_);
  std::vector<Labels> tenant_labels, worker_labels, device_labels, sequence_labels,
      kv_cache_labels;
  for (const GaugeSnapshot::Tenant& tenant : snapshot.tenants) {
    Labels labels = {{"tenant", TenantLabel(tenant.tenant_id)},
                     {"priority", PriorityLabel(tenant.priority)}};
    queue_depth_->Add(labels).Set(tenant.queued_requests);
    sessions_->Add(labels).Set(tenant.sessions);
    models_->Add(labels).Set(tenant.models);
    model_memory_->Add(labels).Set(static_cast<double>(tenant.model_memory_size));
    enclave_model_memory_->Add(labels).Set(static_cast<double>(tenant.enclave_model_memory_size));
    kv_blocks_->Add(labels).Set(static_cast<double>(tenant.kv_blocks));
    for (auto [state, count] : {std::pair{"running", tenant.generations_running},
                                std::pair{"waiting", tenant.generations_waiting}}) {
      Labels with_state = labels;
      with_state["state"] = state;
      generation_sequences_->Add(with_state).Set(static_cast<double>(count));
      sequence_labels.push_back(std::move(with_state));
    }
    tenant_labels.push_back(std::move(labels));
  }
  for (const GaugeSnapshot::Worker& worker : snapshot.workers) {
    Labels labels = {{"worker", absl::StrCat(worker.index)}};
    in_flight_->Add(labels).Set(worker.batches_in_flight);
    interrupted_steps_->Add(labels).Set(static_cast<double>(worker.interrupted_steps));
    evidence_age_->Add(labels).Set(worker.evidence_age_seconds);
    if (worker.has_device_memory) {
      for (auto [kind, size] : {std::pair{"total", worker.device_memory_total_size},
                                std::pair{"used", worker.device_memory_used_size}}) {
        Labels device = {{"worker", absl::StrCat(worker.index)}, {"kind", kind}};
        device_memory_->Add(device).Set(static_cast<double>(size));
        device_labels.push_back(std::move(device));
      }
    }
    for (auto [kind, count] : {std::pair{"total", worker.kv_blocks_total},
                               std::pair{"used", worker.kv_blocks_used}}) {
      Labels cache = {{"worker", absl::StrCat(worker.index)}, {"kind", kind}};
      kv_cache_blocks_->Add(cache).Set(static_cast<double>(count));
      kv_cache_labels.push_back(std::move(cache));
    }
    worker_labels.push_back(std::move(labels));
  }
  // Drop the series of tenants and workers that went away (a reload removed a tenant).
  for (const Labels& old : tenant_labels_) {
    if (std::find(tenant_labels.begin(), tenant_labels.end(), old) != tenant_labels.end()) continue;
    for (auto* family :
         {queue_depth_, sessions_, models_, model_memory_, enclave_model_memory_, kv_blocks_}) {
      family->Remove(&family->Add(old));
    }
  }
  for (const Labels& old : worker_labels_) {
    if (std::find(worker_labels.begin(), worker_labels.end(), old) != worker_labels.end()) continue;
    for (auto* family : {in_flight_, evidence_age_, interrupted_steps_}) {
      family->Remove(&family->Add(old));
    }
  }
  for (const Labels& old : device_labels_) {
    if (std::find(device_labels.begin(), device_labels.end(), old) != device_labels.end()) continue;
    device_memory_->Remove(&device_memory_->Add(old));
  }
  for (const Labels& old : sequence_labels_) {
    if (std::find(sequence_labels.begin(), sequence_labels.end(), old) != sequence_labels.end()) {
      continue;
    }
    generation_sequences_->Remove(&generation_sequences_->Add(old));
  }
  for (const Labels& old : kv_cache_labels_) {
    if (std::find(kv_cache_labels.begin(), kv_cache_labels.end(), old) != kv_cache_labels.end()) {
      continue;
    }
    kv_cache_blocks_->Remove(&kv_cache_blocks_->Add(old));
  }
  sequence_labels_ = std::move(sequence_labels);
  kv_cache_labels_ = std::move(kv_cache_labels);
  device_labels_ = std::move(device_labels);
  tenant_labels_ = std::move(tenant_labels);
  worker_labels_ = std::move(worker_labels);
  workers_->Add({}).Set(static_cast<double>(snapshot.workers.size()));
  audit_entries_->Add({}).Set(static_cast<double>(snapshot.audit_entries));
  audit_signed_->Add({}).Set(static_cast<double>(snapshot.audit_signed_entries));
}

std::string Metrics::Text() const {
  return prometheus::TextSerializer().Serialize(collector_->Collect());
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    Metrics* metrics, const std::string& listen) {
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  // prometheus-cpp reports a failed bind by throwing (from civetweb); this is the one place
  // that calls it.
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& error) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", listen, ": ",
                                               error.what(), " (address in use or invalid?)"));
  }
  server->exposer_->RegisterCollectable(metrics->collector_);
  std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", listen));
  }
  server->port_ = ports.front();
  // The host of "HOST:PORT" or "[HOST]:PORT" ("" and the wildcards: the loopback).
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "*") host = "127.0.0.1";
  if (host == "::") host = "::1";
  server->host_ = host;
  return server;
}

namespace {

// Opens a connection to host:port and drops it (best effort, nothing waited for).
void Knock(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    (void)connect(fd, found->ai_addr, found->ai_addrlen);
    close(fd);
  }
  freeaddrinfo(found);
}

}  // namespace

MetricsHttpServer::~MetricsHttpServer() {
  // civetweb's master thread polls the listening socket in quanta of 2 s and sees that it is to
  // stop only when a poll returns, so a stop took up to 2 s (1.9 s of cloisterd's 2 s shutdown,
  // every appliance test paid it). Connections made while the Exposer stops end that poll.
  std::atomic<bool> stopped{false};
  std::thread knocker([this, &stopped] {
    while (!stopped.load()) {
      Knock(host_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  exposer_.reset();
  stopped.store(true);
  knocker.join();
}

std::string MetricsAddressFor(absl::string_view operator_listen) {
  if (absl::StartsWith(operator_listen, "unix:")) return "127.0.0.1:7702";
  size_t colon = operator_listen.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(operator_listen.substr(colon + 1), &port) || port < 0 || port >= 65535) {
    return "127.0.0.1:7702";
  }
  return absl::StrCat(operator_listen.substr(0, colon), ":", port == 0 ? 0 : port + 1);
}

}  // namespace cloister::host
