// The enclave's model store (docs/PROTOCOL.md section 4): decrypts uploaded models chunk by
// chunk, checks size and digest, loads them (an ONNX file into the runtime, a model package,
// docs/PROTOCOL.md "Model packages", into the LLM engine), records their owner (the
// identity key of the uploading session), and wraps each model key under the sealing key so
// the untrusted host can persist it and a restarted enclave can reload the model.
//
// Ownership is the only access rule for tenants' models: Get/List/Delete with another identity
// key behave exactly as if the model did not exist, so nothing leaks about other tenants'
// models. Operator-published models (Publish) have no owner: every tenant may Get and List them,
// none may Delete them, and no tenant may upload a model under a published name.
// Thread-safe: the table is guarded by a mutex; loaded models are immutable and shared.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"
#include "cloister/api/v1/api.pb.h"
#include "enclave/llm/model.h"
#include "enclave/runtime/model.h"

namespace cloister::enclave {

struct StoredModel {
  std::string handle;
  std::string name;
  Bytes owner;  // Ed25519 identity public key; empty for a published model
  bool published = false;
  uint64_t size = 0;
  // Exactly one of the two, as info.kind() says: an ONNX graph for Infer, or an LLM for
  // Generate.
  std::unique_ptr<const runtime::Model> model;
  std::unique_ptr<const llm::Model> llm;
  // The engine backend an LLM's generators run on (llm::CreateEngine): "cpu", whose engine
  // computes from `llm`'s weights, or a device backend, for which `llm` holds no weights and the
  // store keeps the package's plaintext instead, so that each generator's engine reads the
  // weights from `llm_files` (views into `llm_package`) when it is made.
  std::string llm_executor = "cpu";
  SecretBytes llm_package;
  llm::CheckpointFiles llm_files;
  api::v1::ModelInfo info;
};

struct ModelStoreLimits {
  uint64_t max_model_size = uint64_t{512} << 20;
  size_t max_models = 1024;
};

class ModelStore {
 public:
  // `llm_executor`: the engine backend LLMs are loaded for (an llm::ResolveExecutor result).
  ModelStore(SecretBytes sealing_key, runtime::LoadOptions load_options, ModelStoreLimits limits = {},
             std::string llm_executor = "cpu");

  struct LoadResult {
    api::v1::ModelInfo info;
    Bytes wrapped_key;
    // Bytes the model takes in memory as the store counts them: an LLM's weights
    // (llm::Model::weight_bytes, what the budget bounds), or for a device engine the package it
    // keeps; 0 for an ONNX model, not counted.
    uint64_t memory_size = 0;
  };
  // Loads a newly uploaded model for `owner` under `handle` (which must be the handle of
  // owner and name). A plaintext that is a model package (package::IsModelPackage) is read
  // with the strict package reader and loaded by the LLM engine, whose weights may take at most
  // `memory_budget` bytes (the owner's model-memory quota left; 0: no budget given); anything
  // else is an ONNX model for the runtime. Refuses, changing nothing: a wrong handle, a bad key
  // size, a ciphertext that does not decrypt or is truncated, a size or digest mismatch, a
  // model the runtime or the LLM engine refuses (a package whose headers lie included), weights
  // over the budget (ResourceExhausted), a name already in use by the same owner.
  absl::StatusOr<LoadResult> Load(ByteSpan owner, const std::string& handle,
                                  const api::v1::LoadModelRequest& request, ByteSpan ciphertext,
                                  uint64_t memory_budget = 0) ABSL_LOCKS_EXCLUDED(mu_);

  // Reloads a model from its wrapped key and stored ciphertext (after a restart).
  absl::Status Reload(const std::string& handle, ByteSpan wrapped_key, ByteSpan ciphertext)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Publishes the operator's model `name` from its plaintext (an ONNX file or a model package)
  // under crypto::PublishedModelHandle(name), after checking that its SHA-256 is
  // `expected_digest` (64 hex digits). Publishing a name again replaces the model (requests
  // holding the old one finish on it). InvalidArgument naming what is wrong: a bad name, a
  // digest that is not hex or does not match the bytes, a model the runtime or the LLM engine
  // refuses, a model over the size limit; ResourceExhausted when the store is full;
  // AlreadyExists when a tenant's model already has the name (published names must be unique
  // per tenant, so each name means one model).
  absl::StatusOr<std::shared_ptr<const StoredModel>> Publish(const std::string& name,
                                                             ByteSpan plaintext,
                                                             const std::string& expected_digest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The published models, sorted by name.
  std::vector<std::shared_ptr<const StoredModel>> Published() ABSL_LOCKS_EXCLUDED(mu_);

  // The model under `handle` if `owner` owns it or it is published; NotFound("model not
  // found") otherwise.
  absl::StatusOr<std::shared_ptr<const StoredModel>> Get(const std::string& handle, ByteSpan owner)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The models `owner` owns, then the published ones.
  std::vector<api::v1::ModelInfo> List(ByteSpan owner) ABSL_LOCKS_EXCLUDED(mu_);
  // Every stored model's handle and size (bytes of the decrypted model), for the operator's
  // statistics: no names, no owners.
  std::vector<std::pair<std::string, uint64_t>> SizesByHandle() ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes `owner`'s model `name`; returns its handle. NotFound if there is none.
  absl::StatusOr<std::string> Delete(const std::string& name, ByteSpan owner)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<std::shared_ptr<StoredModel>> Decrypt(ByteSpan owner, const std::string& handle,
                                                       const std::string& name, ByteSpan key,
                                                       ByteSpan digest, uint64_t size,
                                                       ByteSpan ciphertext, uint64_t memory_budget);
  // Loads a checked plaintext: a model package into the LLM engine (weights within
  // `memory_budget`, 0: none), anything else into the runtime.
  absl::Status LoadPlaintext(ByteSpan plaintext, uint64_t memory_budget, StoredModel& stored);
  absl::StatusOr<Bytes> Wrap(const StoredModel& model, ByteSpan key, ByteSpan digest);

  const SecretBytes sealing_key_;
  const runtime::LoadOptions load_options_;
  const ModelStoreLimits limits_;
  const std::string llm_executor_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const StoredModel>> models_ ABSL_GUARDED_BY(mu_);
  // Names of the published models (handles in models_).
  std::map<std::string, std::string> published_names_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cloister::enclave
