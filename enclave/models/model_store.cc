#include "enclave/models/model_store.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/aead.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "proto/model_package.h"

namespace cloister::enclave {
namespace {

constexpr std::string_view kWrapLabel = "cloister/v1 wrapped model key";

Bytes WrapAad(const std::string& handle) {
  Bytes aad = ToBytes(kWrapLabel);
  AppendLengthPrefixed(aad, AsBytes(handle));
  return aad;
}

// Reads a 4-byte big-endian length-prefixed field from `in` at `pos`.
absl::StatusOr<ByteSpan> ReadField(ByteSpan in, size_t& pos) {
  if (in.size() - pos < 4) return absl::DataLossError("wrapped model key is truncated");
  uint32_t size = uint32_t{in[pos]} << 24 | in[pos + 1] << 16 | in[pos + 2] << 8 | in[pos + 3];
  pos += 4;
  if (in.size() - pos < size) return absl::DataLossError("wrapped model key is truncated");
  ByteSpan field = in.subspan(pos, size);
  pos += size;
  return field;
}

std::string DataTypeName(runtime::DataType type) { return std::string(runtime::KServeName(type)); }

api::v1::ModelInfo DescribeModel(const StoredModel& model, ByteSpan digest) {
  api::v1::ModelInfo info;
  info.set_name(model.name);
  info.set_handle(model.handle);
  info.set_size(model.size);
  info.set_digest(HexEncode(digest));
  if (model.llm != nullptr) {
    // Generated text has no fixed tensors, and its sequences share the engine's steps.
    info.set_kind(api::v1::MODEL_KIND_LLM);
    return info;
  }
  info.set_kind(api::v1::MODEL_KIND_ONNX);
  for (const auto& spec : model.model->inputs()) {
    auto* t = info.add_inputs();
    t->set_name(spec.name);
    t->set_datatype(DataTypeName(spec.dtype));
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  for (const auto& spec : model.model->outputs()) {
    auto* t = info.add_outputs();
    t->set_name(spec.name);
    t->set_datatype(DataTypeName(spec.dtype));
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  const runtime::RowIndependence& rows = model.model->row_independence();
  info.set_rows_coalesce(rows.independent);
  info.set_rows_shared_reason(rows.reason);
  return info;
}

// Reads a model package with the strict reader and loads the checkpoint it holds into
// `stored`. The engine checks config.json and every safetensors header against the bytes (ranges
// inside the file, shapes matching ranges, no duplicates) before it allocates, and refuses
// weights over `max_weight_bytes` (0: no limit) before allocating them. For the CPU engine it
// copies the weights out, so the package may be wiped once this returns; for a device engine
// the model keeps no weights and `stored` keeps a copy of the package, which must fit the same
// budget. InvalidArgument ("model refused: ..."), or ResourceExhausted for weights over the
// budget.
absl::Status LoadPackagedLlm(ByteSpan package, uint64_t max_weight_bytes,
                             const std::string& executor, StoredModel& stored) {
  const bool device = executor != "cpu";
  if (device && max_weight_bytes != 0 && package.size() > max_weight_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model refused: the package of ", package.size(), " bytes, kept for the ", executor,
        " engine, is over the limit of ", max_weight_bytes,
        " bytes (the tenant's model-memory quota left)"));
  }
  // A device engine reads its weights from the package when a generator makes it: the copy it
  // keeps is the one whose members are read (once) and loaded. A refused one is wiped here.
  SecretBytes kept;
  if (device) kept = SecretBytes(package);
  absl::StatusOr<package::PackageMembers> members =
      package::ReadModelPackage(device ? kept.span() : package);
  if (!members.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model refused: ", members.status().message()));
  }
  llm::CheckpointFiles files(members->begin(), members->end());
  llm::LoadOptions options;
  options.weights = device ? llm::WeightFormat::kNone : llm::WeightFormat::kAsStored;
  options.max_weight_bytes = static_cast<size_t>(max_weight_bytes);
  absl::StatusOr<std::unique_ptr<llm::Model>> model = llm::Model::Load(files, options);
  if (!model.ok()) {
    std::string message = absl::StrCat("model refused: ", model.status().message());
    if (absl::IsResourceExhausted(model.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat(message, " (the tenant's model-memory quota left)"));
    }
    return absl::InvalidArgumentError(message);
  }
  stored.llm = *std::move(model);
  stored.llm_executor = executor;
  if (device) {
    // The files view `kept`'s bytes, which move with it.
    stored.llm_package = std::move(kept);
    stored.llm_files = std::move(files);
  }
  return absl::OkStatus();
}

}  // namespace

ModelStore::ModelStore(SecretBytes sealing_key, runtime::LoadOptions load_options,
                       ModelStoreLimits limits, std::string llm_executor)
    : sealing_key_(std::move(sealing_key)),
      load_options_(load_options),
      limits_(limits),
      llm_executor_(std::move(llm_executor)) {}

absl::StatusOr<std::shared_ptr<StoredModel>> ModelStore::Decrypt(
    ByteSpan owner, const std::string& handle, const std::string& name, ByteSpan key,
    ByteSpan digest, uint64_t size, ByteSpan ciphertext, uint64_t memory_budget) {
  if (key.size() != crypto::kChunkedKeySize) {
    return absl::InvalidArgumentError("model key must be 32 bytes");
  }
  if (digest.size() != 32) return absl::InvalidArgumentError("model digest must be SHA-256 (32 bytes)");
  if (size > limits_.max_model_size) {
    return absl::InvalidArgumentError(absl::StrCat("model of ", size, " bytes exceeds the limit of ",
                                                   limits_.max_model_size));
  }
  if (ciphertext.size() != crypto::ChunkedCiphertextSize(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model upload is ", ciphertext.size(), " bytes but a model of ", size,
                     " bytes encrypts to ", crypto::ChunkedCiphertextSize(size),
                     " (truncated or padded upload)"));
  }
  ASSIGN_OR_RETURN(auto decryptor,
                   crypto::ChunkedDecryptor::Create(key, crypto::ModelEncryptionContext(handle)));
  // The plaintext model lives only in this buffer while it is parsed, then is wiped.
  SecretBytes plaintext(size);
  std::vector<uint8_t> chunk_out;
  size_t written = 0;
  auto drain = [&]() {
    if (chunk_out.empty()) return;  // (memcpy from an empty vector's null data is undefined)
    std::memcpy(plaintext.data() + written, chunk_out.data(), chunk_out.size());
    written += chunk_out.size();
    SecureWipe(chunk_out.data(), chunk_out.size());
    chunk_out.clear();
  };
  constexpr size_t kStep = crypto::kChunkedCipherChunkSize * 64;
  // Room for a whole step's plaintext up front: a vector that grows frees its old buffer,
  // plaintext and all, without wiping it.
  chunk_out.reserve(std::min<size_t>(size, kStep) + crypto::kChunkedCipherChunkSize);
  for (size_t pos = 0; pos < ciphertext.size(); pos += kStep) {
    size_t n = std::min(kStep, ciphertext.size() - pos);
    absl::Status st = decryptor->Update(ciphertext.subspan(pos, n), chunk_out);
    if (written + chunk_out.size() > size) return absl::InvalidArgumentError("model is larger than declared");
    drain();
    if (!st.ok()) {
      return absl::DataLossError(
          absl::StrCat("model upload does not decrypt (tampered or wrong key): ", st.message()));
    }
  }
  absl::Status st = decryptor->Finish(chunk_out);
  if (written + chunk_out.size() > size) return absl::InvalidArgumentError("model is larger than declared");
  drain();
  if (!st.ok()) {
    return absl::DataLossError(
        absl::StrCat("model upload does not decrypt (tampered or truncated): ", st.message()));
  }
  if (written != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model decrypted to ", written, " bytes, not the declared ", size));
  }
  if (!ConstantTimeEquals(crypto::Sha256(plaintext.span()), digest)) {
    return absl::InvalidArgumentError("model digest does not match the uploaded bytes");
  }
  auto stored = std::make_shared<StoredModel>();
  RETURN_IF_ERROR(LoadPlaintext(plaintext.span(), memory_budget, *stored));
  stored->handle = handle;
  stored->name = name;
  stored->owner = Bytes(owner.begin(), owner.end());
  stored->size = size;
  stored->info = DescribeModel(*stored, digest);
  return stored;
}

absl::Status ModelStore::LoadPlaintext(ByteSpan plaintext, uint64_t memory_budget,
                                       StoredModel& stored) {
  if (package::IsModelPackage(plaintext)) {
    return LoadPackagedLlm(plaintext, memory_budget, llm_executor_, stored);
  }
  auto model = runtime::Model::Load(plaintext, load_options_);
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model refused: ", model.status().message()));
  }
  stored.model = std::move(*model);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const StoredModel>> ModelStore::Publish(
    const std::string& name, ByteSpan plaintext, const std::string& expected_digest) {
  if (name.empty() || name.size() > 128 ||
      name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
          std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "published model name '", name, "' must be 1 to 128 characters of A-Z a-z 0-9 . _ -"));
  }
  absl::StatusOr<Bytes> expected = HexDecode(expected_digest);
  if (!expected.ok() || expected->size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat("published model ", name,
                                                   ": digest must be 64 hex digits (SHA-256)"));
  }
  if (plaintext.size() > limits_.max_model_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("published model ", name, " of ", plaintext.size(),
                     " bytes exceeds the limit of ", limits_.max_model_size));
  }
  Bytes digest = crypto::Sha256(plaintext);
  if (!ConstantTimeEquals(digest, *expected)) {
    return absl::InvalidArgumentError(absl::StrCat("published model ", name, ": the bytes have digest ",
                                                   HexEncode(digest), ", not the expected ",
                                                   absl::AsciiStrToLower(expected_digest)));
  }
  const std::string handle = crypto::PublishedModelHandle(name);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [other, model] : models_) {
      if (!model->published && model->name == name) {
        return absl::AlreadyExistsError(absl::StrCat(
            "published model ", name, ": a tenant's model already has this name"));
      }
    }
    if (models_.size() >= limits_.max_models && !models_.count(handle)) {
      return absl::ResourceExhaustedError("the enclave holds its maximum number of models");
    }
  }
  auto stored = std::make_shared<StoredModel>();
  if (absl::Status status = LoadPlaintext(plaintext, 0, *stored); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("published model ", name, ": ", status.message()));
  }
  stored->handle = handle;
  stored->name = name;
  stored->published = true;
  stored->size = plaintext.size();
  stored->info = DescribeModel(*stored, digest);
  stored->info.set_published(true);
  absl::MutexLock lock(&mu_);
  models_[handle] = stored;
  published_names_[name] = handle;
  return std::shared_ptr<const StoredModel>(std::move(stored));
}

std::vector<std::shared_ptr<const StoredModel>> ModelStore::Published() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const StoredModel>> out;
  for (const auto& [name, handle] : published_names_) {
    auto it = models_.find(handle);
    if (it != models_.end()) out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<Bytes> ModelStore::Wrap(const StoredModel& model, ByteSpan key, ByteSpan digest) {
  SecretBytes plain;
  {
    Bytes fields;
    // Reserved up front: a vector that grows leaves the key behind in the buffer it frees.
    fields.reserve(model.owner.size() + model.name.size() + key.size() + digest.size() + 64);
    AppendLengthPrefixed(fields, model.owner);
    AppendLengthPrefixed(fields, AsBytes(model.name));
    AppendLengthPrefixed(fields, key);
    AppendLengthPrefixed(fields, digest);
    AppendBigEndian(fields, model.size, 8);
    plain = SecretBytes(fields);
    SecureWipe(fields.data(), fields.size());
  }
  ASSIGN_OR_RETURN(auto aead, crypto::Aead::Create(crypto::AeadAlg::kAes256Gcm, sealing_key_.span()));
  Bytes nonce = crypto::RandomBytes(crypto::kAeadNonceSize);
  ASSIGN_OR_RETURN(Bytes sealed, aead->Seal(nonce, WrapAad(model.handle), plain.span()));
  Bytes wrapped = nonce;
  Append(wrapped, sealed);
  return wrapped;
}

absl::StatusOr<ModelStore::LoadResult> ModelStore::Load(ByteSpan owner, const std::string& handle,
                                                        const api::v1::LoadModelRequest& request,
                                                        ByteSpan ciphertext,
                                                        uint64_t memory_budget) {
  if (request.name().empty() || request.name().size() > 256) {
    return absl::InvalidArgumentError("model name must be 1 to 256 bytes");
  }
  if (crypto::ModelHandle(owner, request.name()) != handle) {
    return absl::InvalidArgumentError("model handle does not match the owner and model name");
  }
  {
    absl::MutexLock lock(&mu_);
    if (models_.count(handle)) {
      return absl::AlreadyExistsError(
          absl::StrCat("model '", request.name(), "' already exists; delete it first"));
    }
    if (published_names_.count(request.name())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "model name '", request.name(),
          "' is taken by an operator-published model; choose another name"));
    }
    if (models_.size() >= limits_.max_models) {
      return absl::ResourceExhaustedError("the enclave holds its maximum number of models");
    }
  }
  ASSIGN_OR_RETURN(auto stored,
                   Decrypt(owner, handle, request.name(), AsBytes(request.model_key()),
                           AsBytes(request.plaintext_sha256()), request.plaintext_size(), ciphertext,
                           memory_budget));
  ASSIGN_OR_RETURN(Bytes wrapped, Wrap(*stored, AsBytes(request.model_key()),
                                       AsBytes(request.plaintext_sha256())));
  const uint64_t memory_size =
      stored->llm == nullptr          ? 0
      : stored->llm_package.empty() ? static_cast<uint64_t>(stored->llm->weight_bytes())
                                    : static_cast<uint64_t>(stored->llm_package.size());
  LoadResult result{stored->info, std::move(wrapped), memory_size};
  absl::MutexLock lock(&mu_);
  if (!models_.emplace(handle, std::move(stored)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("model '", request.name(), "' already exists; delete it first"));
  }
  return result;
}

absl::Status ModelStore::Reload(const std::string& handle, ByteSpan wrapped_key,
                                ByteSpan ciphertext) {
  if (!crypto::IsValidModelHandle(handle)) return absl::InvalidArgumentError("malformed model handle");
  if (wrapped_key.size() < crypto::kAeadNonceSize + crypto::kAeadTagSize) {
    return absl::InvalidArgumentError("wrapped model key is truncated");
  }
  ASSIGN_OR_RETURN(auto aead, crypto::Aead::Create(crypto::AeadAlg::kAes256Gcm, sealing_key_.span()));
  auto opened = aead->Open(wrapped_key.first(crypto::kAeadNonceSize), WrapAad(handle),
                           wrapped_key.subspan(crypto::kAeadNonceSize));
  if (!opened.ok()) {
    return absl::PermissionDeniedError(
        "wrapped model key does not open (another enclave measurement, sealing key or handle)");
  }
  SecretBytes plain(*opened);
  SecureWipe(opened->data(), opened->size());
  size_t pos = 0;
  ByteSpan fields = plain.span();
  ASSIGN_OR_RETURN(ByteSpan owner, ReadField(fields, pos));
  ASSIGN_OR_RETURN(ByteSpan name, ReadField(fields, pos));
  ASSIGN_OR_RETURN(ByteSpan key, ReadField(fields, pos));
  ASSIGN_OR_RETURN(ByteSpan digest, ReadField(fields, pos));
  if (fields.size() - pos != 8) return absl::DataLossError("wrapped model key is malformed");
  uint64_t size = 0;
  for (int i = 0; i < 8; ++i) size = size << 8 | fields[pos + i];
  std::string model_name = ToString(name);
  if (crypto::ModelHandle(owner, model_name) != handle) {
    return absl::PermissionDeniedError("wrapped model key belongs to another handle");
  }
  // Counted against the quota when it was uploaded: no budget again.
  ASSIGN_OR_RETURN(auto stored,
                   Decrypt(owner, handle, model_name, key, digest, size, ciphertext, 0));
  absl::MutexLock lock(&mu_);
  models_[handle] = std::move(stored);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const StoredModel>> ModelStore::Get(const std::string& handle,
                                                                   ByteSpan owner) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(handle);
  if (it == models_.end() ||
      (!it->second->published && !ConstantTimeEquals(it->second->owner, owner))) {
    return absl::NotFoundError("model not found");
  }
  return it->second;
}

std::vector<api::v1::ModelInfo> ModelStore::List(ByteSpan owner) {
  absl::MutexLock lock(&mu_);
  std::vector<api::v1::ModelInfo> out;
  for (const auto& [handle, model] : models_) {
    if (!model->published && ConstantTimeEquals(model->owner, owner)) out.push_back(model->info);
  }
  for (const auto& [name, handle] : published_names_) {
    auto it = models_.find(handle);
    if (it != models_.end()) out.push_back(it->second->info);
  }
  return out;
}

std::vector<std::pair<std::string, uint64_t>> ModelStore::SizesByHandle() {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, uint64_t>> sizes;
  sizes.reserve(models_.size());
  for (const auto& [handle, model] : models_) sizes.emplace_back(handle, model->size);
  return sizes;
}

absl::StatusOr<std::string> ModelStore::Delete(const std::string& name, ByteSpan owner) {
  std::string handle = crypto::ModelHandle(owner, name);
  absl::MutexLock lock(&mu_);
  auto it = models_.find(handle);
  if (it == models_.end() || it->second->published ||
      !ConstantTimeEquals(it->second->owner, owner)) {
    return absl::NotFoundError("model not found");
  }
  models_.erase(it);
  return handle;
}

}  // namespace cloister::enclave
