#include "enclave/enclave.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/policy.h"
#include "attest/sim/sim_tee.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "crypto/receipt.h"
#include "enclave/batch_runner.h"
#include "enclave/llm/engine.h"
#include "enclave/runtime/executor.h"
#include "proto/duration.h"
#include "proto/error_reason.h"
#include "proto/infer_request_view.h"
#include "proto/wipe.h"

namespace cloister::enclave {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

namespace {

constexpr size_t kNonceSize = 32;
constexpr size_t kMaxBatchItems = 1024;
constexpr size_t kMaxRecentDigests = 64;
constexpr absl::Duration kEvidenceRefresh = absl::Hours(1);
constexpr uint64_t kMaxTensorSize = uint64_t{1} << 31;

void SetStatus(EnclaveToHost& reply, const absl::Status& status) {
  proto::SetBoundaryStatus(status, *reply.mutable_status());
}

// Checks one request tensor: its type, and that its shape needs exactly the bytes sent. The
// result borrows the bytes (`raw`, inside the opened request).
absl::StatusOr<BatchInput> CheckInput(const api::v1::Tensor& proto, ByteSpan raw) {
  auto dtype = runtime::DataTypeFromKServe(proto.datatype());
  if (!dtype.ok() || *dtype == runtime::DataType::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", proto.name(), "': unsupported datatype '", proto.datatype(), "'"));
  }
  if (proto.shape_size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat("input '", proto.name(), "': rank over 16"));
  }
  BatchInput input;
  input.name = proto.name();
  input.dtype = *dtype;
  uint64_t count = 1;
  for (int64_t d : proto.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("input '", proto.name(), "': negative dimension"));
    }
    if (d != 0 && count > kMaxTensorSize / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(absl::StrCat("input '", proto.name(), "': shape too large"));
    }
    count *= static_cast<uint64_t>(d);
    input.shape.push_back(d);
  }
  uint64_t size = count * runtime::ElementSize(*dtype);
  if (size != raw.size()) {
    return absl::InvalidArgumentError(absl::StrCat("input '", proto.name(), "': shape needs ", size,
                                                   " bytes but ", raw.size(), " were sent"));
  }
  input.raw = raw;
  return input;
}

// Reads an opened request's checked tensors and output names into `request`. Its deadline is
// the item's `time_left` (from the host, like the rest of the item: it can only cut its
// tenant's request short, which it could do by not sending it) after `start` on `clock`;
// absent means none.
absl::Status ReadRequest(const proto::InferRequestView& payload,
                         const boundary::v1::ForwardedRequest& item, absl::Time start,
                         const Clock* clock, BatchRequest& request) {
  for (const auto& tensor : payload.inputs) {
    ASSIGN_OR_RETURN(BatchInput input, CheckInput(tensor.meta, tensor.raw));
    request.inputs.push_back(std::move(input));
  }
  request.requested_outputs.assign(payload.rest.outputs().begin(), payload.rest.outputs().end());
  if (item.has_time_left()) {
    request.deadline = Deadline::At(start + proto::FromProtoDuration(item.time_left()), clock);
  }
  return absl::OkStatus();
}

// The option combinations Create refuses before touching anything.
absl::Status CheckOptions(const EnclaveOptions& opts) {
  if (opts.measurement.size() != 48)
    return absl::InvalidArgumentError("measurement must be 48 bytes");
  if (opts.run_threads < 1 || opts.run_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("run threads must be from 1 to 64, not ", opts.run_threads));
  }
  const bool sim_tee = opts.tee == TeeMode::kSim;
  if (sim_tee && opts.gpu == GpuMode::kNvidiaCc) {
    return absl::InvalidArgumentError(
        "NVIDIA CC GPUs need a hardware TEE (SEV-SNP or TDX), not the simulated one");
  }
  if (!sim_tee && opts.gpu == GpuMode::kSim) {
    return absl::InvalidArgumentError("the simulated GPU only works with the simulated TEE");
  }
  if (!sim_tee && !opts.dev_policy_out.empty()) {
    return absl::InvalidArgumentError("a development policy needs the simulated TEE");
  }
  return absl::OkStatus();
}

attest::HardwareOptions HardwareOptionsOf(const EnclaveOptions& opts) {
  return {
      .tee = opts.tee == TeeMode::kTdx ? attest::HardwareTee::kTdx : attest::HardwareTee::kSevSnp,
      .gpu = opts.gpu == GpuMode::kNvidiaCc ? attest::HardwareGpu::kNvidiaCc
                                            : attest::HardwareGpu::kNone,
      .tsm_root = opts.tsm_root,
      .sev_guest_device = opts.sev_guest_device,
      .nvml_library = opts.nvml_library,
      .clock = opts.clock,
  };
}

absl::StatusOr<std::unique_ptr<attest::EvidenceCollector>> MakeCollector(
    const EnclaveOptions& opts, const attest::HardwareOptions& hardware) {
  if (opts.tee != TeeMode::kSim) return attest::MakeHardwareCollector(hardware);
  attest::SimOptions sim_options;
  sim_options.gpu_count = opts.gpu == GpuMode::kSim ? 1 : 0;
  sim_options.clock = opts.clock;
  return attest::MakeSimCollector(opts.sim_dir, opts.measurement, sim_options);
}

// The LLM engine backend: the one named in the options (which must resolve), else the one of
// the executor's name where this build has it and it can run, else the CPU engine (logged, so an
// operator sees that a GPU worker generates on the CPU).
absl::StatusOr<std::string> ChooseLlmExecutor(const EnclaveOptions& opts,
                                              std::string_view executor) {
  if (!opts.llm_executor.empty()) {
    absl::StatusOr<std::string> named = llm::ResolveExecutor(opts.llm_executor);
    if (!named.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LLM engine \"", opts.llm_executor, "\": ", named.status().message()));
    }
    return named;
  }
  absl::StatusOr<std::string> chosen = llm::ResolveExecutor(executor);
  if (!chosen.ok()) {
    Log(LogLevel::kWarning, "llm_engine_on_cpu",
        {{"executor", std::string(executor)}, {"reason", std::string(chosen.status().message())}});
    return std::string("cpu");
  }
  Log(LogLevel::kInfo, "llm_engine", {{"name", *chosen}});
  return chosen;
}

void LogReady(const EnclaveOptions& opts, const pcie::BatchPath& path, ByteSpan evidence_digest) {
  Log(opts.pcie_mode == pcie::PcieMode::kOff && opts.tee != TeeMode::kSim ? LogLevel::kWarning
                                                                          : LogLevel::kInfo,
      "pcie_path",
      {{"mode", std::string(pcie::PcieModeName(opts.pcie_mode))},
       {"threads", path.threads()},
       {"executor_memory", path.executor_memory_on_device() ? "device" : "host"},
       {"chunk_size", static_cast<unsigned long>(opts.pcie_options.chunk_size)},
       {"plaintext_on_bus", opts.pcie_mode == pcie::PcieMode::kOff ? "yes" : "no"}});
  Log(LogLevel::kInfo, "enclave_ready",
      {{"measurement", HexEncode(opts.measurement)}, {"evidence", HexEncode(evidence_digest)}});
}

}  // namespace

absl::StatusOr<std::unique_ptr<Enclave>> Enclave::Create(EnclaveOptions options) {
  std::unique_ptr<Enclave> enclave(new Enclave());
  enclave->options_ = std::move(options);
  EnclaveOptions& opts = enclave->options_;
  RETURN_IF_ERROR(CheckOptions(opts));
  const bool sim_tee = opts.tee == TeeMode::kSim;
  const attest::HardwareOptions hardware = HardwareOptionsOf(opts);
  const ByteSpan sealing_label = AsBytes("cloister/v1 model sealing");
  SecretBytes sealing_key;
  if (sim_tee) {
    RETURN_IF_ERROR(attest::EnsureSimRoots(opts.sim_dir));
    if (!opts.dev_policy_out.empty()) {
      RETURN_IF_ERROR(attest::WriteDevPolicy(opts.dev_policy_out, opts.sim_dir, opts.measurement));
    }
  } else if (opts.tee == TeeMode::kTdx) {
    // Refuse before touching any hardware: there is no TDX sealing key without a key service.
    ASSIGN_OR_RETURN(sealing_key, attest::HardwareSealingKey(hardware, sealing_label));
  }

  enclave->keys_ = EnclaveKeys::Generate();
  ASSIGN_OR_RETURN(enclave->collector_, MakeCollector(opts, hardware));
  ASSIGN_OR_RETURN(auto evidence, enclave->CurrentEvidence());

  if (sim_tee) {
    ASSIGN_OR_RETURN(sealing_key,
                     attest::SimSealingKey(opts.sim_dir, opts.measurement, sealing_label));
  } else if (opts.tee == TeeMode::kSevSnp) {
    // The firmware's key, bound to this guest's launch measurement and policy.
    ASSIGN_OR_RETURN(sealing_key, attest::HardwareSealingKey(hardware, sealing_label));
  }
  enclave->sessions_ =
      std::make_unique<SessionManager>(&enclave->keys_, opts.clock, opts.session_limits);
  // A device executor with a path of its own takes batches into device memory (and in mode
  // emulated decrypts them there); the others compute in host memory, over a TransferPath.
  const std::string_view executor_name =
      opts.load_options.executor != nullptr ? opts.load_options.executor->name() : "cpu";
  ASSIGN_OR_RETURN(const std::string llm_executor, ChooseLlmExecutor(opts, executor_name));
  enclave->models_ = std::make_unique<ModelStore>(std::move(sealing_key), opts.load_options,
                                                  opts.model_limits, llm_executor);
  ASSIGN_OR_RETURN(enclave->batch_path_,
                   pcie::NewBatchPath(executor_name, opts.pcie_mode, opts.pcie_options));
  if (opts.run_threads > 1) enclave->runs_ = std::make_unique<TaskPool>(opts.run_threads);
  enclave->usage_ =
      std::make_unique<UsageLedger>(enclave->keys_.signing_public_key,
                                    std::string(pcie::PcieModeName(opts.pcie_mode)), opts.clock);
  // An LLM's steps cross the same host path as the batches (a device engine has its own).
  GenerationOptions generation = opts.generation;
  if (auto* host = dynamic_cast<pcie::HostBatchPath*>(enclave->batch_path_.get())) {
    generation.transfer = &host->transfer();
  }
  enclave->generation_ = std::make_unique<GenerationService>(
      &enclave->keys_.signing_seed, enclave->usage_.get(), opts.clock, generation);
  LogReady(opts, *enclave->batch_path_, evidence.second);
  return enclave;
}

absl::StatusOr<const pcie::TransferPath*> Enclave::transfer_path() const {
  const auto* host = dynamic_cast<const pcie::HostBatchPath*>(batch_path_.get());
  if (host == nullptr) {
    return absl::FailedPreconditionError(
        "the enclave's batches take the executor's device path, which has no host transfer path");
  }
  return &host->transfer();
}

EnclaveToHost Enclave::Handle(HostToEnclave call) {
  // Without a sink a generation has nowhere to stream to, so it is refused in its one reply.
  return *Handle(std::move(call), nullptr);
}

std::optional<EnclaveToHost> Enclave::Handle(HostToEnclave call,
                                             const std::shared_ptr<FrameSink>& sink) {
  EnclaveToHost reply;
  reply.set_call_id(call.call_id());
  absl::Status status;
  switch (call.call_case()) {
    case HostToEnclave::kGenerate: {
      if (sink == nullptr) {
        status = absl::FailedPreconditionError("a generation needs a streaming boundary");
        break;
      }
      auto r = Generate(call.call_id(), *call.mutable_generate(), sink);
      if (r.ok()) return std::nullopt;  // its frames follow through `sink`
      status = r;
      break;
    }
    case HostToEnclave::kCancel:
      reply.mutable_cancel()->set_found(generation_->Cancel(call.cancel().target_call_id()));
      break;
    case HostToEnclave::kGetEvidence: {
      auto r = GetEvidence(call.get_evidence());
      if (r.ok()) *reply.mutable_get_evidence() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kOpenSession: {
      auto r = OpenSession(call.open_session());
      if (r.ok()) *reply.mutable_open_session() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kLoadModel: {
      auto r = LoadModel(*call.mutable_load_model());
      if (r.ok()) *reply.mutable_load_model() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kReloadModel: {
      const auto& reload = call.reload_model();
      status = models_->Reload(reload.model_handle(), AsBytes(reload.wrapped_model_key()),
                               AsBytes(reload.model_ciphertext()));
      if (status.ok()) reply.mutable_reload_model();
      break;
    }
    case HostToEnclave::kListModels: {
      auto r = ListModels(*call.mutable_list_models());
      if (r.ok()) *reply.mutable_list_models() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kDeleteModel: {
      auto r = DeleteModel(*call.mutable_delete_model());
      if (r.ok()) *reply.mutable_delete_model() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kInferBatch: {
      auto r = InferBatch(*call.mutable_infer_batch());
      if (r.ok()) *reply.mutable_infer_batch() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kSignAuditCheckpoint: {
      auto r = SignAuditCheckpoint(call.sign_audit_checkpoint());
      if (r.ok()) *reply.mutable_sign_audit_checkpoint() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kPublishModel: {
      auto r = PublishModel(*call.mutable_publish_model());
      if (r.ok()) *reply.mutable_publish_model() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::kGetStats: {
      auto r = GetStats();
      if (r.ok()) *reply.mutable_get_stats() = std::move(*r);
      status = r.status();
      break;
    }
    case HostToEnclave::CALL_NOT_SET:
      status = absl::InvalidArgumentError("boundary call carries no known call");
      break;
  }
  SetStatus(reply, status);
  if (!status.ok()) {
    Log(LogLevel::kWarning, "call_refused",
        {{"call", static_cast<int>(call.call_case())},
         {"code", absl::StatusCodeToString(status.code())},
         {"reason", std::string(status.message())}});
  }
  return reply;
}

absl::StatusOr<std::string> Enclave::CollectSerialized(ByteSpan nonce) {
  ASSIGN_OR_RETURN(auto bundle,
                   collector_->Collect(nonce, keys_.hpke_public_key, keys_.signing_public_key));
  bundle.set_collected_at_unix(absl::ToUnixSeconds(options_.clock->Now()));
  return bundle.SerializeAsString();
}

absl::StatusOr<std::pair<std::string, Bytes>> Enclave::CurrentEvidence() {
  absl::MutexLock lock(&evidence_mu_);
  absl::Time now = options_.clock->Now();
  if (evidence_.empty() || now - evidence_time_ >= kEvidenceRefresh) {
    ASSIGN_OR_RETURN(std::string serialized, CollectSerialized(crypto::RandomBytes(kNonceSize)));
    if (!evidence_digest_.empty()) recent_digests_.push_back(evidence_digest_);
    while (recent_digests_.size() > kMaxRecentDigests) recent_digests_.pop_front();
    evidence_ = std::move(serialized);
    evidence_digest_ = attest::EvidenceDigest(evidence_);
    evidence_time_ = now;
  }
  return std::make_pair(evidence_, evidence_digest_);
}

absl::StatusOr<boundary::v1::GetEvidenceResult> Enclave::GetEvidence(
    const boundary::v1::GetEvidenceCall& call) {
  if (call.nonce().size() != kNonceSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("evidence nonce is ", call.nonce().size(), " bytes, not 32"));
  }
  attest::v1::ChallengeResponse response;
  std::string bundle;
  Bytes digest;
  if (call.fresh()) {
    ASSIGN_OR_RETURN(bundle, CollectSerialized(AsBytes(call.nonce())));
    digest = attest::EvidenceDigest(bundle);
    absl::MutexLock lock(&evidence_mu_);
    recent_digests_.push_back(digest);
    while (recent_digests_.size() > kMaxRecentDigests) recent_digests_.pop_front();
  } else {
    ASSIGN_OR_RETURN(std::tie(bundle, digest), CurrentEvidence());
  }
  // The signature covers the digest of exactly the bytes sent.
  ASSIGN_OR_RETURN(Bytes signature,
                   crypto::Ed25519Sign(keys_.signing_seed.span(),
                                       attest::ChallengeMessage(digest, AsBytes(call.nonce()))));
  // The published models, signed for this evidence and nonce.
  attest::v1::PublishedModels published;
  for (const auto& model : models_->Published()) {
    attest::v1::PublishedModel* entry = published.add_models();
    entry->set_name(model->name);
    entry->set_digest(model->info.digest());
    entry->set_size(model->size);
    entry->set_kind(model->llm != nullptr ? "llm" : "onnx");
  }
  std::string published_bytes = published.SerializeAsString();
  ASSIGN_OR_RETURN(Bytes published_signature,
                   crypto::Ed25519Sign(keys_.signing_seed.span(),
                                       attest::PublishedModelsMessage(
                                           digest, AsBytes(call.nonce()), AsBytes(published_bytes))));
  response.set_bundle(std::move(bundle));
  response.set_fresh(call.fresh());
  response.set_nonce_signature(ToString(signature));
  response.set_published_models(std::move(published_bytes));
  response.set_published_models_signature(ToString(published_signature));
  boundary::v1::GetEvidenceResult result;
  result.set_challenge_response(response.SerializeAsString());
  return result;
}

bool Enclave::IsKnownEvidence(ByteSpan digest) {
  absl::MutexLock lock(&evidence_mu_);
  if (ConstantTimeEquals(digest, evidence_digest_)) return true;
  for (const Bytes& d : recent_digests_) {
    if (ConstantTimeEquals(digest, d)) return true;
  }
  return false;
}

absl::StatusOr<boundary::v1::OpenSessionResult> Enclave::OpenSession(
    const boundary::v1::OpenSessionCall& call) {
  if (!IsKnownEvidence(AsBytes(call.evidence_digest()))) {
    return proto::WithReason(
        absl::FailedPreconditionError(
            "open session: evidence digest is not this enclave's current evidence; attest again"),
        api::v1::EVIDENCE_STALE);
  }
  return sessions_->Open(call.tenant_id(), AsBytes(call.hpke_enc()), AsBytes(call.sealed_hello()),
                         AsBytes(call.evidence_digest()));
}

absl::StatusOr<boundary::v1::LoadModelResult> Enclave::LoadModel(
    boundary::v1::LoadModelCall& call) {
  auto& item = *call.mutable_request();
  ASSIGN_OR_RETURN(auto opened,
                   sessions_->OpenItem(item, crypto::MessageKind::kLoadModel, call.tenant_id()));
  boundary::v1::LoadModelResult result;
  api::v1::LoadModelRequest request;
  absl::StatusOr<ModelStore::LoadResult> loaded =
      absl::InvalidArgumentError("malformed load request");
  if (request.ParseFromArray(opened.plaintext.data(), static_cast<int>(opened.plaintext.size()))) {
    loaded = models_->Load(opened.session->identity_public_key(), item.model_handle(), request,
                           AsBytes(call.model_ciphertext()), call.model_memory_budget());
  }
  proto::WipeString(*item.mutable_ciphertext());
  proto::WipeMessage(request);  // the model key and the model's name
  api::v1::ReplyEnvelope envelope;
  if (loaded.ok()) {
    api::v1::LoadModelReply body;
    *body.mutable_model() = loaded->info;
    envelope = MakeEnvelope(absl::OkStatus(), &body);
    result.set_wrapped_model_key(ToString(loaded->wrapped_key));
    result.set_model_memory_size(loaded->memory_size);
    Log(LogLevel::kInfo, "model_loaded", {{"tenant", call.tenant_id()}, {"handle", item.model_handle()}});
  } else {
    // Sealed to the client with the reason; no wrapped key, so the host stores nothing.
    envelope = MakeEnvelope(loaded.status());
  }
  *result.mutable_reply() =
      sessions_->SealReply(*opened.session, item, crypto::MessageKind::kLoadModel,
                           std::move(envelope));
  return result;
}

absl::StatusOr<boundary::v1::PublishModelResult> Enclave::PublishModel(
    boundary::v1::PublishModelCall& call) {
  ASSIGN_OR_RETURN(auto stored,
                   models_->Publish(call.name(), AsBytes(call.model()), call.digest()));
  std::string().swap(*call.mutable_model());  // not secret; the copy is large
  boundary::v1::PublishModelResult result;
  result.set_model_handle(stored->handle);
  result.set_size(stored->size);
  result.set_kind(stored->llm != nullptr ? "llm" : "onnx");
  Log(LogLevel::kInfo, "model_published",
      {{"name", stored->name}, {"handle", stored->handle}, {"digest", stored->info.digest()}});
  return result;
}

absl::StatusOr<boundary::v1::TenantCallResult> Enclave::ListModels(
    boundary::v1::TenantCall& call) {
  ASSIGN_OR_RETURN(auto opened, sessions_->OpenItem(*call.mutable_request(),
                                                    crypto::MessageKind::kListModels,
                                                    call.tenant_id()));
  api::v1::ListModelsReply body;
  for (auto& info : models_->List(opened.session->identity_public_key())) {
    *body.add_models() = std::move(info);
  }
  proto::WipeString(*call.mutable_request()->mutable_ciphertext());
  boundary::v1::TenantCallResult result;
  *result.mutable_reply() =
      sessions_->SealReply(*opened.session, call.request(), crypto::MessageKind::kListModels,
                           MakeEnvelope(absl::OkStatus(), &body));
  return result;
}

absl::StatusOr<boundary::v1::TenantCallResult> Enclave::DeleteModel(
    boundary::v1::TenantCall& call) {
  ASSIGN_OR_RETURN(auto opened, sessions_->OpenItem(*call.mutable_request(),
                                                    crypto::MessageKind::kDeleteModel,
                                                    call.tenant_id()));
  api::v1::DeleteModelRequest request;
  boundary::v1::TenantCallResult result;
  absl::Status status;
  if (!request.ParseFromArray(opened.plaintext.data(), static_cast<int>(opened.plaintext.size()))) {
    status = absl::InvalidArgumentError("malformed delete request");
  } else {
    auto handle = models_->Delete(request.name(), opened.session->identity_public_key());
    status = handle.status();
    if (handle.ok()) {
      result.set_model_deleted(true);
      result.set_deleted_handle(*handle);
      Log(LogLevel::kInfo, "model_deleted", {{"tenant", call.tenant_id()}, {"handle", *handle}});
    }
  }
  proto::WipeString(*call.mutable_request()->mutable_ciphertext());
  proto::WipeMessage(request);
  *result.mutable_reply() =
      sessions_->SealReply(*opened.session, call.request(), crypto::MessageKind::kDeleteModel,
                           MakeEnvelope(status));  // DeleteModelReply has no fields
  return result;
}

struct Enclave::OpenedBatch {
  explicit OpenedBatch(boundary::v1::InferBatchCall& call)
      : call(call),
        replies(call.items_size()),
        sessions(call.items_size()),
        outcome(call.items_size()),
        payloads(call.items_size()),
        requests(call.items_size()),
        bodies(call.items_size()) {}
  // The requests' plaintext (opened in place in the items' ciphertext fields, where the
  // tensors stay; the names read out of it) is wiped on every way out of InferBatch.
  ~OpenedBatch() {
    for (auto& item : *call.mutable_items()) proto::WipeString(*item.mutable_ciphertext());
    for (auto& payload : payloads) {
      for (auto& input : payload.inputs) proto::WipeMessage(input.meta);
      proto::WipeMessage(payload.rest);
    }
  }

  boundary::v1::InferBatchCall& call;
  std::vector<boundary::v1::EnclaveReply> replies;
  std::vector<std::shared_ptr<Session>> sessions;  // null where the item did not open
  std::vector<absl::Status> outcome;
  std::vector<proto::InferRequestView> payloads;
  std::vector<BatchRequest> requests;  // their tensors view the items' opened ciphertext
  std::vector<absl::StatusOr<api::v1::InferReplyPayload>> bodies;
  std::shared_ptr<const StoredModel> model;  // set once a request for it opened
  boundary::v1::UsageCounters usage;
};

absl::StatusOr<boundary::v1::InferBatchResult> Enclave::InferBatch(
    boundary::v1::InferBatchCall& call) {
  RETURN_IF_ERROR(CheckBatch(call));
  const absl::Time start = options_.clock->Now();
  OpenedBatch batch(call);
  for (int i = 0; i < call.items_size(); ++i) OpenBatchItem(call, i, start, batch);
  RETURN_IF_ERROR(RunOpenedBatch(call, batch));
  boundary::v1::InferBatchResult result;
  SealBatchReplies(call, batch, result);
  result.set_execution_ns(absl::ToInt64Nanoseconds(options_.clock->Now() - start));
  RETURN_IF_ERROR(SignBatchUsage(call, batch.usage, result));
  return result;
}

absl::Status Enclave::CheckBatch(const boundary::v1::InferBatchCall& call) {
  if (call.items_size() == 0) return absl::InvalidArgumentError("empty inference batch");
  if (static_cast<size_t>(call.items_size()) > kMaxBatchItems) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", call.items_size(), " requests exceeds ", kMaxBatchItems));
  }
  // A batch holds one tenant's requests for one model: refuse the whole batch otherwise.
  for (const auto& item : call.items()) {
    if (item.model_handle() != call.model_handle()) {
      return absl::InvalidArgumentError("refused: batch mixes requests for different models");
    }
    auto session = sessions_->Find(AsBytes(item.session_id()));
    if (session.ok() && (*session)->tenant_id() != call.tenant_id()) {
      return absl::PermissionDeniedError("refused: batch mixes requests of different tenants");
    }
  }
  return absl::OkStatus();
}

void Enclave::OpenBatchItem(boundary::v1::InferBatchCall& call, int index, absl::Time start,
                            OpenedBatch& batch) {
  auto& item = *call.mutable_items(index);
  // Opened in place in the item's ciphertext field, where the tensors are read and stay until
  // the batch has run (`batch` wipes it).
  auto opened = sessions_->OpenItem(item, crypto::MessageKind::kInfer, call.tenant_id());
  if (!opened.ok()) {
    // Not sealed: the session or message did not authenticate, so there is no key to
    // answer under. The host relays this status.
    batch.replies[index].set_request_id(item.request_id());
    proto::SetBoundaryStatus(opened.status(), *batch.replies[index].mutable_status());
    batch.outcome[index] = opened.status();
    return;
  }
  batch.sessions[index] = opened->session;
  auto found = models_->Get(call.model_handle(), opened->session->identity_public_key());
  proto::InferRequestView& payload = batch.payloads[index];
  if (!found.ok()) {
    batch.outcome[index] = found.status();
  } else if ((*found)->llm != nullptr) {
    // An LLM: its requests are prompts, not tensors.
    batch.outcome[index] = absl::FailedPreconditionError(
        absl::StrCat("model '", (*found)->name, "' is a generative model: use Generate"));
  } else if (!proto::ReadInferRequestView(opened->plaintext, payload)) {
    // (A partly read payload is wiped with the others on the way out.)
    batch.outcome[index] = absl::InvalidArgumentError("malformed inference request");
  } else {
    batch.model = *found;
    batch.outcome[index] = ReadRequest(payload, item, start, options_.clock, batch.requests[index]);
  }
}

// Every valid request crosses to the executor in one transfer and runs (together when their
// shapes allow); a refused transfer refuses the whole batch before anything runs.
absl::Status Enclave::RunOpenedBatch(const boundary::v1::InferBatchCall& call, OpenedBatch& batch) {
  std::vector<size_t> runnable;
  std::vector<BatchRequest> requests;
  for (size_t i = 0; i < batch.sessions.size(); ++i) {
    if (batch.sessions[i] && batch.outcome[i].ok()) {
      runnable.push_back(i);
      requests.push_back(std::move(batch.requests[i]));
    }
  }
  if (runnable.empty()) return absl::OkStatus();
  auto ran = RunBatch(*batch.model->model, *batch_path_, requests, runs_.get());
  if (!ran.ok()) {
    Log(LogLevel::kError, "batch_transfer_refused",
        {{"tenant", call.tenant_id()},
         {"requests", static_cast<int>(runnable.size())},
         {"reason", std::string(ran.status().message())}});
    return ran.status();
  }
  for (size_t r = 0; r < runnable.size(); ++r) {
    auto& body = batch.bodies[runnable[r]];
    body = std::move(ran->replies[r]);
    if (!body.ok()) batch.outcome[runnable[r]] = body.status();
  }
  batch.usage.set_input_size(ran->input_size);
  batch.usage.set_output_size(ran->output_size);
  batch.usage.set_execution_ns(ran->execution_ns);
  batch.usage.set_transfer_ns(ran->transfer_ns);
  return absl::OkStatus();
}

void Enclave::SealBatchReplies(const boundary::v1::InferBatchCall& call, OpenedBatch& batch,
                               boundary::v1::InferBatchResult& result) {
  for (size_t i = 0; i < batch.sessions.size(); ++i) {
    if (!batch.sessions[i]) continue;
    const absl::Status& outcome = batch.outcome[i];
    if (outcome.ok()) {
      batch.usage.set_requests(batch.usage.requests() + 1);
    } else {
      batch.usage.set_failed_requests(batch.usage.failed_requests() + 1);
    }
    batch.replies[i] =
        sessions_->SealReply(*batch.sessions[i], call.items(i), crypto::MessageKind::kInfer,
                             MakeEnvelope(outcome, outcome.ok() ? &*batch.bodies[i] : nullptr));
  }
  for (auto& reply : batch.replies) *result.add_replies() = std::move(reply);
}

// The signed account of a batch. A batch in which no request opened in a session is nobody's
// usage and gets none.
absl::Status Enclave::SignBatchUsage(const boundary::v1::InferBatchCall& call,
                                     boundary::v1::UsageCounters& usage,
                                     boundary::v1::InferBatchResult& result) {
  if (usage.requests() + usage.failed_requests() == 0) return absl::OkStatus();
  usage.set_batches(1);
  boundary::v1::UsageReceipt receipt = usage_->Record(call.tenant_id(), call.model_handle(), usage);
  std::string serialized = receipt.SerializeAsString();
  ASSIGN_OR_RETURN(Bytes signature,
                   crypto::SignUsageReceipt(keys_.signing_seed.span(), AsBytes(serialized)));
  result.mutable_receipt()->set_receipt(std::move(serialized));
  result.mutable_receipt()->set_signature(ToString(signature));
  return absl::OkStatus();
}

// Opens the request; from then on the stream answers (GenerationService), errors included.
// Only a request that does not open (no session key to seal under) fails here, in the one
// frame the host relays.
absl::Status Enclave::Generate(uint64_t call_id, boundary::v1::GenerateCall& call,
                               const std::shared_ptr<FrameSink>& sink) {
  boundary::v1::ForwardedRequest& item = *call.mutable_request();
  const absl::Time start = options_.clock->Now();
  ASSIGN_OR_RETURN(SessionManager::Opened opened,
                   sessions_->OpenItem(item, crypto::MessageKind::kGenerate, call.tenant_id()));
  GenerationService::Request request;
  request.call_id = call_id;
  request.tenant_id = call.tenant_id();
  request.session = opened.session;
  request.request_id = item.request_id();
  request.model_handle = item.model_handle();
  request.max_tokens_limit = call.limits().max_tokens();
  switch (call.limits().priority_class()) {
    case 1:
      request.priority = llm::Priority::kRealtime;
      break;
    case 3:
      request.priority = llm::Priority::kBatch;
      break;
    default:
      request.priority = llm::Priority::kStandard;
  }
  request.weight = call.limits().weight() == 0 ? 1.0 : call.limits().weight();
  request.kv_cache_tokens = call.limits().kv_cache_tokens();
  request.tokens_per_second = call.limits().tokens_per_second();
  request.token_burst = call.limits().token_burst();
  request.sink = sink;
  if (item.has_time_left()) {
    request.deadline = start + proto::FromProtoDuration(item.time_left());
  }
  if (!request.request.ParseFromArray(opened.plaintext.data(),
                                      static_cast<int>(opened.plaintext.size()))) {
    request.refusal = absl::InvalidArgumentError("malformed generate request");
  } else {
    auto found = models_->Get(item.model_handle(), opened.session->identity_public_key());
    if (!found.ok()) {
      request.refusal = found.status();
    } else if ((*found)->llm == nullptr) {
      request.refusal = absl::FailedPreconditionError(absl::StrCat(
          "model '", (*found)->name, "' is not a generative model: use Infer"));
    } else {
      request.model = *found;
    }
  }
  proto::WipeString(*item.mutable_ciphertext());
  generation_->Start(std::move(request));
  return absl::OkStatus();
}

absl::StatusOr<boundary::v1::SignAuditCheckpointResult> Enclave::SignAuditCheckpoint(
    const boundary::v1::SignAuditCheckpointCall& call) {
  if (call.chain_digest().size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat("audit chain digest is ",
                                                   call.chain_digest().size(), " bytes, not 32"));
  }
  if (call.sequence() == 0) {
    return absl::InvalidArgumentError("audit checkpoint sequence must be at least 1");
  }
  boundary::v1::AuditCheckpoint checkpoint;
  checkpoint.set_enclave_signing_public_key(ToString(keys_.signing_public_key));
  checkpoint.set_chain_digest(call.chain_digest());
  checkpoint.set_sequence(call.sequence());
  checkpoint.set_signed_at_unix_ns(absl::ToUnixNanos(options_.clock->Now()));
  std::string serialized = checkpoint.SerializeAsString();
  ASSIGN_OR_RETURN(Bytes signature,
                   crypto::SignAuditCheckpoint(keys_.signing_seed.span(), AsBytes(serialized)));
  boundary::v1::SignAuditCheckpointResult result;
  result.mutable_signed_()->set_checkpoint(std::move(serialized));
  result.mutable_signed_()->set_signature(ToString(signature));
  return result;
}

absl::StatusOr<boundary::v1::StatsResult> Enclave::GetStats() {
  boundary::v1::StatsResult result;
  for (auto& [handle, size] : models_->SizesByHandle()) {
    boundary::v1::ModelMemory* model = result.add_models();
    model->set_model_handle(std::move(handle));
    model->set_size(size);
  }
  GenerationService::Occupancy generation = generation_->occupancy();
  for (const llm::Generator::Occupancy& entry : generation.tenants) {
    boundary::v1::GenerationOccupancy* out = result.add_generation();
    out->set_tenant_id(entry.tenant);
    out->set_priority_class(static_cast<uint32_t>(entry.priority) + 1);
    out->set_running(static_cast<uint64_t>(entry.running));
    out->set_waiting(static_cast<uint64_t>(entry.waiting));
    out->set_kv_blocks(static_cast<uint64_t>(entry.kv_blocks));
  }
  result.set_kv_blocks_total(static_cast<uint64_t>(generation.kv_blocks_total));
  result.set_kv_block_size(static_cast<uint32_t>(generation.kv_block_size));
  result.set_interrupted_steps(static_cast<uint64_t>(generation.interrupted_steps));
  if (options_.device_memory) {
    ASSIGN_OR_RETURN(DeviceMemoryInfo device, options_.device_memory());
    result.mutable_device_memory()->set_total_size(device.total_size);
    result.mutable_device_memory()->set_used_size(device.used_size);
  }
  return result;
}

}  // namespace cloister::enclave
