// The trusted enclave worker's request handler: one Handle() per boundary call
// (docs/PROTOCOL.md). It owns the enclave's keys, its attested evidence, the sessions and the
// model store, and re-checks everything the host hands in: that sessions belong to the tenant
// the host names, that a batch holds one tenant's requests for one model, sizes and sequence
// numbers. Bad input gets an error and changes nothing. A batch's tensors cross to the executor
// and back on the PCIe path (pcie/transfer_path.h, in the mode of EnclaveOptions::pcie_mode),
// and each batch's usage comes back to the host as a signed receipt (accounting/usage_ledger.h).
//
// Thread-safe: Handle() may run on several threads at once.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attest/collector.h"
#include "attest/collectors/hardware_collector.h"
#include "base/clock.h"
#include "base/status.h"
#include "base/task_pool.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "enclave/accounting/usage_ledger.h"
#include "enclave/boundary/boundary_server.h"
#include "enclave/generation_service.h"
#include "enclave/models/model_store.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/pcie/transfer_path.h"
#include "enclave/session/session_manager.h"

#if defined(CLOISTER_HOST_SIDE)
#error "enclave/ headers must not be included by host/ code: use EnclaveClient and the boundary protocol"
#endif

namespace cloister::enclave {

// Where evidence and the sealing key come from: the simulated TEE (development), or the
// hardware of an SEV-SNP or TDX confidential VM (attest/collectors/hardware_collector.h).
enum class TeeMode { kSim, kSevSnp, kTdx };
// The GPUs whose evidence goes into the bundle: the simulated GPU (only with TeeMode::kSim),
// NVIDIA GPUs in confidential-computing mode through NVML (only in a confidential VM), or none.
enum class GpuMode { kSim, kNvidiaCc, kNone };

// Memory of the GPU the executor runs on, in bytes.
struct DeviceMemoryInfo {
  uint64_t total_size = 0;
  uint64_t used_size = 0;
};

struct EnclaveOptions {
  TeeMode tee = TeeMode::kSim;
  GpuMode gpu = GpuMode::kSim;
  std::string sim_dir;             // simulated TEE roots and device keys (TeeMode::kSim only)
  std::string dev_policy_out;      // when set, write the development policy here (kSim only)
  // Hardware interfaces; tests point them elsewhere.
  std::string tsm_root = std::string(attest::kDefaultTsmReportRoot);
  std::string sev_guest_device = std::string(attest::kDefaultSevGuestDevice);
  std::string nvml_library = std::string(attest::kNvmlLibraryName);
  Bytes measurement;               // SHA-384 of this enclave binary
  runtime::LoadOptions load_options;
  SessionLimits session_limits;
  ModelStoreLimits model_limits;
  // How batches cross to the executor: off (plaintext copy, the CPU-only default), driver (a CC
  // GPU's driver encrypts) or emulated (our AES-256-GCM chunks).
  pcie::PcieMode pcie_mode = pcie::PcieMode::kOff;
  pcie::TransferOptions pcie_options;
  // Model runs a batch may split into, side by side, one group of requests each (RunBatch):
  // for the CPU executor, whose runs are single-threaded; 1 runs each batch at once (a device).
  int run_threads = 1;
  Clock* clock = Clock::Real();
  // Reads the executor's device memory for the operator's statistics (GetStatsCall); empty when
  // models run on the CPU (the statistics then carry no device memory).
  std::function<absl::StatusOr<DeviceMemoryInfo>()> device_memory;
  // Generation (GenerateCall): each LLM's engine threads and step limits.
  GenerationOptions generation;
  // The engine backend LLMs run on (llm/engine.h): empty follows the executor (the CUDA LLM
  // engine beside the CUDA executor where it is in the build, else the CPU engine); a name must
  // resolve (llm::ResolveExecutor), or Create fails.
  std::string llm_executor;
};

class Enclave {
 public:
  // Generates the enclave keys, collects evidence over a fresh nonce, derives the sealing key.
  // With a hardware TEE: FailedPrecondition when its interfaces or the requested GPUs are not
  // there, Unimplemented for TDX (its sealing key needs a key service). InvalidArgument for a
  // simulated GPU with a hardware TEE or an NVIDIA GPU with the simulated TEE.
  static absl::StatusOr<std::unique_ptr<Enclave>> Create(EnclaveOptions options);

  // Takes the call by value: inference requests are opened in place in their ciphertext
  // fields, so a caller that is done with the call moves it in.
  boundary::v1::EnclaveToHost Handle(boundary::v1::HostToEnclave call);
  // The same, for a boundary that streams: a GenerateCall returns nothing here and answers
  // with frames written to `sink` later (docs/PROTOCOL.md, "Generation streams").
  std::optional<boundary::v1::EnclaveToHost> Handle(boundary::v1::HostToEnclave call,
                                                    const std::shared_ptr<FrameSink>& sink);

  // The batches' host transfer path, for its statistics. FailedPrecondition when models
  // compute in device memory: a device executor's own path has no host path (batch_path.h).
  absl::StatusOr<const pcie::TransferPath*> transfer_path() const;
  // The enclave's public signing key (the one in its evidence bundle, which verifies its usage
  // receipts).
  const Bytes& signing_public_key() const { return keys_.signing_public_key; }

 private:
  // One inference batch on its way through InferBatch, item by item (enclave.cc).
  struct OpenedBatch;

  Enclave() = default;

  absl::StatusOr<boundary::v1::GetEvidenceResult> GetEvidence(const boundary::v1::GetEvidenceCall&)
      ABSL_LOCKS_EXCLUDED(evidence_mu_);
  absl::StatusOr<boundary::v1::OpenSessionResult> OpenSession(const boundary::v1::OpenSessionCall&);
  // The sealed calls take their message mutable: each opens its request in place.
  absl::StatusOr<boundary::v1::LoadModelResult> LoadModel(boundary::v1::LoadModelCall&);
  absl::StatusOr<boundary::v1::PublishModelResult> PublishModel(boundary::v1::PublishModelCall&);
  absl::StatusOr<boundary::v1::TenantCallResult> ListModels(boundary::v1::TenantCall&);
  absl::StatusOr<boundary::v1::TenantCallResult> DeleteModel(boundary::v1::TenantCall&);
  absl::StatusOr<boundary::v1::InferBatchResult> InferBatch(boundary::v1::InferBatchCall&);
  // Opens a generation and hands it to generation_; an error only when it did not open.
  absl::Status Generate(uint64_t call_id, boundary::v1::GenerateCall& call,
                        const std::shared_ptr<FrameSink>& sink);
  // InferBatch's steps. CheckBatch refuses a batch that is too large or mixes models or
  // tenants; OpenBatchItem opens item `index` and reads its request, or records why not;
  // RunOpenedBatch runs the requests that opened (an error refuses the whole batch);
  // SealBatchReplies seals one reply per item that opened in a session and counts it; and
  // SignBatchUsage adds the signed usage receipt when any item did.
  absl::Status CheckBatch(const boundary::v1::InferBatchCall&);
  void OpenBatchItem(boundary::v1::InferBatchCall&, int index, absl::Time start, OpenedBatch&);
  absl::Status RunOpenedBatch(const boundary::v1::InferBatchCall&, OpenedBatch&);
  void SealBatchReplies(const boundary::v1::InferBatchCall&, OpenedBatch&,
                        boundary::v1::InferBatchResult&);
  absl::Status SignBatchUsage(const boundary::v1::InferBatchCall&,
                              boundary::v1::UsageCounters& usage, boundary::v1::InferBatchResult&);
  // Signs the head of the host's audit log (a 32-byte digest and its sequence number) with the
  // evidence signing key; InvalidArgument for a digest of another size or sequence 0.
  absl::StatusOr<boundary::v1::SignAuditCheckpointResult> SignAuditCheckpoint(
      const boundary::v1::SignAuditCheckpointCall&);

  // Model memory by handle and, when there is a device, its memory.
  absl::StatusOr<boundary::v1::StatsResult> GetStats();

  bool IsKnownEvidence(ByteSpan digest) ABSL_LOCKS_EXCLUDED(evidence_mu_);
  // Collects evidence over `nonce` and serializes it with the collection time.
  absl::StatusOr<std::string> CollectSerialized(ByteSpan nonce);
  // The cached evidence and its digest, recollected over a new nonce when older than
  // kEvidenceRefresh, so clients with a maximum evidence age keep accepting it.
  absl::StatusOr<std::pair<std::string, Bytes>> CurrentEvidence() ABSL_LOCKS_EXCLUDED(evidence_mu_);

  EnclaveOptions options_;
  EnclaveKeys keys_;
  std::unique_ptr<attest::EvidenceCollector> collector_;
  absl::Mutex evidence_mu_;
  std::string evidence_ ABSL_GUARDED_BY(evidence_mu_);  // serialized EvidenceBundle
  Bytes evidence_digest_ ABSL_GUARDED_BY(evidence_mu_);
  absl::Time evidence_time_ ABSL_GUARDED_BY(evidence_mu_);
  // Digests sessions may still open against: earlier cached evidence and recent fresh evidence.
  std::deque<Bytes> recent_digests_ ABSL_GUARDED_BY(evidence_mu_);
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<ModelStore> models_;
  std::unique_ptr<pcie::BatchPath> batch_path_;  // a HostBatchPath, or the executor's own
  std::unique_ptr<TaskPool> runs_;  // nullptr when run_threads is 1
  std::unique_ptr<UsageLedger> usage_;
  // Last, so that it stops (ending its streams) while the sessions and ledger it uses live.
  std::unique_ptr<GenerationService> generation_;
};

}  // namespace cloister::enclave
