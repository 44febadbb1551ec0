// Client (client.h): UploadModel (docs/PROTOCOL.md section 4): the model file or checkpoint
// package encrypted in chunks as it is streamed, then its key sealed in the finishing call.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "proto/error_reason.h"
#include "proto/frame.h"
#include "sdk/client.h"
#include "sdk/client_internal.h"
#include "sdk/model_dir.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

using client_internal::FromGrpc;
using client_internal::IsRetryable;
using client_internal::NewRequestId;
using client_internal::OpenReply;
using client_internal::PrepareContext;
using client_internal::SpanOf;
using client_internal::StringOf;
using client_internal::WipeString;

absl::StatusOr<api::ModelInfo> Client::UploadModel(const std::string& path, const std::string& name,
                                                   const UploadProgress& progress) {
  // An upload is retried only when cloisterd says that nothing of it was stored (its worker
  // died during it): otherwise a retry could meet its own first attempt.
  absl::Duration pause = options_.retry_backoff;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<api::ModelInfo> uploaded = UploadModelOnce(path, name, progress);
    if (uploaded.ok() || attempt >= std::max(1, options_.max_attempts) ||
        proto::ReasonOf(uploaded.status()) != api::NOTHING_STORED) {
      return uploaded;
    }
    absl::SleepFor(pause);
    pause *= 2;
  }
}

absl::StatusOr<api::ModelInfo> Client::UploadModelOnce(const std::string& path,
                                                       const std::string& name,
                                                       const UploadProgress& progress) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  // What is uploaded: the ONNX file, read as it is sent, or the package of a checkpoint folder
  // (docs/PROTOCOL.md, "Model packages"), packed in memory first.
  struct stat path_st;
  const bool is_folder = ::stat(path.c_str(), &path_st) == 0 && S_ISDIR(path_st.st_mode);
  Bytes package;
  int fd = -1;
  if (is_folder) {
    ASSIGN_OR_RETURN(package, PackModelDir(path, boundary::kMaxFrameSize));
  } else {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      std::string message = absl::StrCat("cannot open model file ", path, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
    }
  }
  // Closes the file, and wipes the package's plaintext, on every way out.
  struct SourceCloser {
    int fd;
    Bytes& package;
    ~SourceCloser() {
      if (fd >= 0) ::close(fd);
      SecureWipe(package.data(), package.size());
    }
  } closer{fd, package};
  uint64_t plaintext_size = package.size();
  if (!is_folder) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model file ", path, " is not a regular file"));
    }
    plaintext_size = static_cast<uint64_t>(st.st_size);
  }
  // Reads the next piece of the plaintext into `buffer`: its size, 0 at the end.
  size_t package_offset = 0;
  auto read_piece = [&](std::vector<uint8_t>& buffer) -> absl::StatusOr<size_t> {
    if (is_folder) {
      size_t n = std::min(buffer.size(), package.size() - package_offset);
      std::memcpy(buffer.data(), package.data() + package_offset, n);
      package_offset += n;
      return n;
    }
    for (;;) {
      ssize_t n = ::read(fd, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot read model file ", path, ": ", std::strerror(errno)));
      }
      return static_cast<size_t>(n);
    }
  };
  const uint64_t ciphertext_size = crypto::ChunkedCiphertextSize(plaintext_size);

  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, CurrentSession());
  const std::string handle = crypto::ModelHandle(identity_->public_key(), name);
  SecretBytes model_key = crypto::RandomSecret(crypto::kChunkedKeySize);
  ASSIGN_OR_RETURN(
      std::unique_ptr<crypto::ChunkedEncryptor> encryptor,
      crypto::ChunkedEncryptor::Create(model_key.span(), crypto::ModelEncryptionContext(handle)));

  grpc::ClientContext context;
  PrepareContext(context, options_, /*with_deadline=*/false);
  api::UploadModelResponse response;
  std::unique_ptr<grpc::ClientWriter<api::UploadModelRequest>> writer =
      endpoints_[session->endpoint].stub->UploadModel(&context, &response);

  // Sends fail once the server has closed the stream; Finish() then says why.
  bool stream_open = true;
  auto finish_with = [&](absl::Status local) -> absl::Status {
    if (stream_open) context.TryCancel();
    writer->Finish();
    return local;
  };
  {
    api::UploadModelRequest start;
    start.mutable_start()->set_session_id(StringOf(session->id));
    start.mutable_start()->set_model_handle(handle);
    start.mutable_start()->set_ciphertext_size(ciphertext_size);
    stream_open = writer->Write(start);
  }

  uint64_t sent_size = 0;
  Bytes pending;  // ciphertext not yet sent
  auto send_pending = [&](bool all) {
    size_t offset = 0;
    while (stream_open &&
           (pending.size() - offset >= kUploadMessageSize || (all && offset < pending.size()))) {
      size_t piece = std::min(kUploadMessageSize, pending.size() - offset);
      api::UploadModelRequest message;
      message.set_data(pending.data() + offset, piece);
      stream_open = writer->Write(message);
      offset += piece;
      sent_size += piece;
      if (stream_open && progress) progress(sent_size, ciphertext_size);
    }
    pending.erase(pending.begin(), pending.begin() + offset);
  };

  crypto::Hasher hasher(crypto::HashAlg::kSha256);
  std::vector<uint8_t> buffer(kUploadMessageSize);
  uint64_t read_size = 0;
  while (stream_open) {
    absl::StatusOr<size_t> n = read_piece(buffer);
    if (!n.ok()) return finish_with(n.status());
    if (*n == 0) break;
    ByteSpan piece(buffer.data(), *n);
    read_size += piece.size();
    if (read_size > plaintext_size) break;
    hasher.Update(piece);
    absl::Status updated = encryptor->Update(piece, pending);
    if (!updated.ok()) return finish_with(updated);
    send_pending(/*all=*/false);
  }
  SecureWipe(buffer.data(), buffer.size());
  if (stream_open && read_size != plaintext_size) {
    return finish_with(absl::AbortedError(
        absl::StrCat("model file ", path, " changed size while it was being uploaded")));
  }
  if (stream_open) {
    absl::Status finished = encryptor->Finish(pending);
    if (!finished.ok()) return finish_with(finished);
    send_pending(/*all=*/true);
  }

  crypto::MessageHeader header{crypto::MessageKind::kLoadModel, NewRequestId(), handle};
  if (stream_open) {
    CLOISTER_CHECK(sent_size == ciphertext_size);
    api::LoadModelRequest load;
    load.set_name(name);
    load.set_model_key(StringOf(model_key.span()));
    load.set_plaintext_sha256(StringOf(hasher.Finish()));
    load.set_plaintext_size(plaintext_size);
    std::string plaintext = load.SerializeAsString();
    WipeString(*load.mutable_model_key());
    api::UploadModelRequest finish;
    api::SealedRequest& call = *finish.mutable_finish();
    {
      absl::MutexLock lock(&session->mu);
      auto sealed = session->sender->Seal(header, SpanOf(plaintext));
      WipeString(plaintext);
      if (!sealed.ok()) return finish_with(sealed.status());
      call.set_sequence(sealed->first);
      call.set_ciphertext(StringOf(sealed->second));
    }
    call.set_session_id(StringOf(session->id));
    call.set_request_id(header.request_id);
    call.set_model_handle(handle);
    stream_open = writer->Write(finish) && writer->WritesDone();
  }
  grpc::Status status = writer->Finish();
  if (!status.ok()) {
    absl::Status failure =
        FromGrpc(status, "UploadModel", endpoints_[session->endpoint].address, options_);
    // Not retried, but the next call attests again (on the next node when this one is down).
    if (IsRetryable(failure)) DropSession(session);
    return failure;
  }
  if (!stream_open) {
    return absl::UnavailableError("UploadModel: cloisterd closed the upload stream early");
  }
  api::LoadModelReply reply;
  {
    absl::MutexLock lock(&session->mu);
    RETURN_IF_ERROR(OpenReply(*session->receiver, header, *response.mutable_reply(), reply));
  }
  return std::move(*reply.mutable_model());
}

}  // namespace cloister::sdk
