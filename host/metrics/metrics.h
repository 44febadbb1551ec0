// cloisterd's metrics in the Prometheus text format (docs/OPERATIONS.md, "Metrics"), kept with
// prometheus-cpp (Debian's prometheus-cpp-dev) and served over plain HTTP at /metrics on the
// operator host (MetricsHttpServer).
//
// What may appear: tenant ids, priority classes, worker indexes, RPC method names, status codes,
// PCIe modes, counts and times. What never does: model names or handles, request ids, session
// ids, payload sizes (PCIe bytes are summed per mode over all tenants and rounded up to 64 KiB
// per batch), keys or tokens. Unauthenticated calls are counted under tenant "-", so a caller
// cannot create label values.
//
// Counters and histograms are updated by the code paths (RecordRequest, RecordBatch,
// RecordTransfer); gauges (queue depth, sessions, models, model memory in the enclaves, workers,
// device memory, evidence age, audit log) are read from a GaugeSource at every scrape.
//
// Threading: every method is thread-safe (prometheus-cpp's metrics are atomic; the family maps
// are guarded). Ownership: Metrics owns its registry; MetricsHttpServer borrows the Metrics,
// which must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace prometheus {
class Registry;
class Exposer;
class Counter;
class Histogram;
class Gauge;
template <typename T>
class Family;
}  // namespace prometheus

namespace cloister::host {

// Gauge values at one moment.
struct GaugeSnapshot {
  struct Tenant {
    std::string tenant_id;
    std::string priority;  // realtime, standard, batch
    int queued_requests = 0;
    int sessions = 0;
    int models = 0;
    uint64_t model_memory_size = 0;  // stored model bytes counted against the quota
    // Bytes of the tenant's decrypted models held in enclave memory, summed over the workers
    // (each worker holds its own copy), as the workers last reported them.
    uint64_t enclave_model_memory_size = 0;
    // The tenant's generations in the enclaves (summed over the workers, as they last reported
    // them): sequences running and waiting, and the KV blocks the running ones hold.
    uint64_t generations_running = 0;
    uint64_t generations_waiting = 0;
    uint64_t kv_blocks = 0;
  };
  struct Worker {
    int index = 0;
    int batches_in_flight = 0;
    double evidence_age_seconds = -1;  // -1: no evidence seen yet
    // The worker's GPU memory as it last reported it; no series when it has no device.
    bool has_device_memory = false;
    uint64_t device_memory_total_size = 0;
    uint64_t device_memory_used_size = 0;
    // The worker's LLM KV caches (blocks of the generators alive), and the blocks in use.
    uint64_t kv_blocks_total = 0;
    uint64_t kv_blocks_used = 0;
    // Best-effort generation steps the worker gave up for realtime arrivals since it started.
    uint64_t interrupted_steps = 0;
  };
  std::vector<Tenant> tenants;
  std::vector<Worker> workers;
  uint64_t audit_entries = 0;
  uint64_t audit_signed_entries = 0;
};

class Metrics {
 public:
  using GaugeSource = std::function<GaugeSnapshot()>;

  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The configured tenants and their priority classes (call at start and after a reload).
  // Requests are labelled with a tenant only when it is in this set.
  void SetTenantClasses(std::map<std::string, std::string> priority_by_tenant);
  // One finished tenant API call from the tenant the caller claimed. A call refused as
  // UNAUTHENTICATED, or from a tenant not configured, is counted under tenant "-".
  void RecordRequest(absl::string_view method, absl::string_view claimed_tenant_id,
                     absl::StatusCode code);
  // One finished batch: its size, each request's queue wait, and its execution time.
  void RecordBatch(absl::string_view tenant_id, absl::string_view priority, int count,
                   const std::vector<absl::Duration>& queue_waits, absl::Duration execution);
  // One generation stream that ended: the time to its first chunk and the gaps between its
  // chunks (inter-token latency at one token per chunk), and its chunks as tokens streamed.
  void RecordGeneration(absl::string_view tenant_id, absl::Duration first_chunk,
                        const std::vector<absl::Duration>& gaps);
  // One batch's PCIe traffic (plaintext tensor bytes both ways) and transfer time.
  void RecordTransfer(absl::string_view pcie_mode, uint64_t size, absl::Duration time);

  // Read at every scrape; unset: no gauges but the counters.
  void SetGaugeSource(GaugeSource source);

  // The whole exposition in the Prometheus text format (what /metrics serves).
  std::string Text() const;

 private:
  friend class MetricsHttpServer;
  class Collector;

  // Gauges from the source, then every family.
  void RefreshGauges() const;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Collector> collector_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Family<prometheus::Histogram>* first_chunk_latency_;
  prometheus::Family<prometheus::Histogram>* chunk_gap_latency_;
  prometheus::Family<prometheus::Counter>* chunks_;
  prometheus::Family<prometheus::Histogram>* batch_size_;
  prometheus::Family<prometheus::Histogram>* queue_latency_;
  prometheus::Family<prometheus::Histogram>* execution_latency_;
  prometheus::Family<prometheus::Counter>* pcie_bytes_;
  prometheus::Family<prometheus::Counter>* pcie_seconds_;
  prometheus::Family<prometheus::Gauge>* queue_depth_;
  prometheus::Family<prometheus::Gauge>* sessions_;
  prometheus::Family<prometheus::Gauge>* models_;
  prometheus::Family<prometheus::Gauge>* model_memory_;
  prometheus::Family<prometheus::Gauge>* enclave_model_memory_;
  prometheus::Family<prometheus::Gauge>* device_memory_;
  prometheus::Family<prometheus::Gauge>* generation_sequences_;
  prometheus::Family<prometheus::Gauge>* kv_blocks_;
  prometheus::Family<prometheus::Gauge>* kv_cache_blocks_;
  prometheus::Family<prometheus::Gauge>* interrupted_steps_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Family<prometheus::Gauge>* in_flight_;
  prometheus::Family<prometheus::Gauge>* evidence_age_;
  prometheus::Family<prometheus::Gauge>* audit_entries_;
  prometheus::Family<prometheus::Gauge>* audit_signed_;

  mutable absl::Mutex mu_;
  GaugeSource source_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> priority_by_tenant_ ABSL_GUARDED_BY(mu_);
  // Label sets of the gauges set at the last scrape, to drop the ones that went away.
  mutable std::vector<std::map<std::string, std::string>> tenant_labels_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::map<std::string, std::string>> worker_labels_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::map<std::string, std::string>> device_labels_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::map<std::string, std::string>> sequence_labels_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::map<std::string, std::string>> kv_cache_labels_ ABSL_GUARDED_BY(mu_);
};

// Serves `metrics` at http://ADDRESS/metrics (plain HTTP, like every Prometheus target).
class MetricsHttpServer {
 public:
  // `listen` is HOST:PORT (port 0 picks one). Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(Metrics* metrics,
                                                                  const std::string& listen);
  ~MetricsHttpServer();
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;  // where a local client reaches the listening socket
  int port_ = 0;
};

// The /metrics address that goes with an operator gRPC address: the same host and the next port
// (port 0 stays 0); for a unix socket, 127.0.0.1:7702.
std::string MetricsAddressFor(absl::string_view operator_listen);

}  // namespace cloister::host
