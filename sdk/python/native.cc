// The Python extension module `cloister._native`: a thin layer over the C++ tenant client
// (sdk/client.h), so that Python and C++ share one implementation of attestation, sessions and
// encryption. The Python package `cloister` wraps these functions in its public API; nothing
// here is meant to be called directly.
//
// Errors: every non-OK absl::Status becomes a StatusError, which the registered translator
// turns into the exception class that the package's error factory picks for its code (set
// once at import with _set_error_factory). The message is the C++ status message unchanged.
// Threading: the GIL is released for all network, crypto and file work; a NativeClient may be
// used from several Python threads at once (the C++ Client is thread-safe). Progress and chunk
// callbacks take the GIL back while they run. A NativeGeneration runs on one thread (the
// package's background thread for a stream); its stop() may be called from any other.
// Ownership: a NativeClient shares its Client with the calls in flight, so close() while
// another thread waits on a reply only drops this object's reference.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attest/nvidia/bundle_verifier.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "proto/error_reason.h"
#include "sdk/client.h"
#include "sdk/generate_stream.h"
#include "sdk/identity.h"
#include "sdk/npy.h"

namespace py = pybind11;

namespace cloister::sdk::python {
namespace {

namespace api = ::cloister::api::v1;

// A failed call on its way to Python. `verdict` is set when attestation ran and failed.
struct StatusError : std::exception {
  StatusError(absl::Status s, std::optional<attest::Verdict> v)
      : status(std::move(s)), verdict(std::move(v)) {}
  const char* what() const noexcept override { return "cloister: call failed"; }
  absl::Status status;
  std::optional<attest::Verdict> verdict;
};

// The package's factory `(code: int, message: str, verdict: tuple | None) -> Exception`.
// Leaked on purpose: it must outlive every translation, including at interpreter exit.
py::object* error_factory = nullptr;

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status, std::nullopt);
}

// Text from C++ (file names, server messages) that may not be valid UTF-8.
py::str Text(absl::string_view text) {
  PyObject* decoded =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

py::bytes BytesOf(const void* data, size_t size) {
  return py::bytes(static_cast<const char*>(data), size);
}

// (passed, [(name, result, detail)], {claim: value})
py::tuple VerdictTuple(const attest::Verdict& verdict) {
  py::list checks;
  for (const attest::Check& check : verdict.checks) {
    checks.append(py::make_tuple(Text(check.name),
                                 Text(std::string(attest::CheckResultName(check.result))),
                                 Text(check.detail)));
  }
  py::dict claims;
  for (const auto& [key, value] : verdict.claims) claims[Text(key)] = Text(value);
  return py::make_tuple(verdict.pass, checks, claims);
}

// (name, datatype, shape)
py::tuple TensorInfoTuple(const api::TensorInfo& info) {
  return py::make_tuple(Text(info.name()), Text(info.datatype()),
                        std::vector<int64_t>(info.shape().begin(), info.shape().end()));
}

// (name, handle, size, [inputs], [outputs], rows_coalesce, rows_shared_reason, kind, digest,
// published), kind "onnx", "llm" or "" (an enclave that does not say).
py::tuple ModelInfoTuple(const api::ModelInfo& model) {
  py::list inputs, outputs;
  for (const api::TensorInfo& info : model.inputs()) inputs.append(TensorInfoTuple(info));
  for (const api::TensorInfo& info : model.outputs()) outputs.append(TensorInfoTuple(info));
  const char* kind = model.kind() == api::MODEL_KIND_ONNX  ? "onnx"
                     : model.kind() == api::MODEL_KIND_LLM ? "llm"
                                                           : "";
  return py::make_tuple(Text(model.name()), Text(model.handle()), model.size(), inputs, outputs,
                        model.rows_coalesce(), Text(model.rows_shared_reason()), Text(kind),
                        Text(model.digest()), model.published());
}

// The numpy dtype string of a KServe datatype (all little-endian).
const char* NumpyDtype(absl::string_view datatype) {
  static constexpr std::pair<const char*, const char*> kTypes[] = {
      {"FP16", "<f2"},   {"FP32", "<f4"},   {"FP64", "<f8"},   {"INT8", "|i1"},
      {"INT16", "<i2"},  {"INT32", "<i4"},  {"INT64", "<i8"},  {"UINT8", "|u1"},
      {"UINT16", "<u2"}, {"UINT32", "<u4"}, {"UINT64", "<u8"}, {"BOOL", "|b1"},
  };
  for (const auto& [name, dtype] : kTypes) {
    if (datatype == name) return dtype;
  }
  return nullptr;
}

absl::Duration DurationOf(std::optional<double> seconds) {
  if (!seconds.has_value()) return absl::ZeroDuration();
  return absl::Seconds(*seconds);
}

absl::Status CheckTimeout(std::optional<double> seconds) {
  if (seconds.has_value() && !(*seconds > 0 && *seconds <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout must be a number of seconds above 0 and at most 86400, not ", *seconds));
  }
  return absl::OkStatus();
}

// Connection settings shared by connect() and attest(), as Python passes them.
struct Connection {
  std::string server, tenant, token, policy_path;
  std::string tls_ca, tls_client_cert, tls_client_key, tls_server_name;
  bool fresh = false;
  bool spread = false;
  std::optional<double> timeout;
};

absl::StatusOr<ClientOptions> MakeOptions(const Connection& connection) {
  RETURN_IF_ERROR(CheckTimeout(connection.timeout));
  ClientOptions options;
  options.server = connection.server;
  options.tenant_id = connection.tenant;
  options.token = connection.token;
  options.tls_ca_file = connection.tls_ca;
  options.tls_client_cert_file = connection.tls_client_cert;
  options.tls_client_key_file = connection.tls_client_key;
  options.tls_server_name = connection.tls_server_name;
  if (connection.policy_path.empty()) {
    return absl::InvalidArgumentError("no attestation policy given (policy= or CLOISTER_POLICY)");
  }
  ASSIGN_OR_RETURN(options.policy, attest::LoadPolicyFile(connection.policy_path));
  options.policy_path = connection.policy_path;
  options.fresh_evidence = connection.fresh;
  options.spread_endpoints = connection.spread;
  if (connection.timeout.has_value()) options.call_timeout = absl::Seconds(*connection.timeout);
  return options;
}

// The arguments of a generation as the package passes them. The package checks them first,
// for messages that name its keyword arguments; the enclave checks them again.
struct GenerateArgs {
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> ids;
  std::optional<std::vector<std::pair<std::string, std::string>>> messages;  // (role, content)
  uint64_t max_tokens = 0;  // 0: up to the model's context
  std::optional<float> temperature;
  std::optional<float> top_p;
  int32_t top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;
  float min_p = 0;
  std::optional<float> repetition_penalty;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint32_t pad_to = 0;
  uint32_t tokens_per_chunk = 0;
  uint32_t interval_ms = 0;
};

absl::StatusOr<api::GenerateRequest> MakeGenerateRequest(const GenerateArgs& args) {
  const int prompts = args.text.has_value() + args.ids.has_value() + args.messages.has_value();
  if (prompts != 1) {
    return absl::InvalidArgumentError(
        "a generation needs exactly one prompt: text, token ids or chat messages");
  }
  api::GenerateRequest request;
  if (args.text.has_value()) {
    request.set_text(*args.text);
  } else if (args.ids.has_value()) {
    request.mutable_ids()->mutable_ids()->Add(args.ids->begin(), args.ids->end());
  } else {
    for (const auto& [role, content] : *args.messages) {
      api::ChatMessage& message = *request.mutable_chat()->add_messages();
      message.set_role(role);
      message.set_content(content);
    }
  }
  request.set_max_tokens(args.max_tokens);
  api::SamplingParameters& sampling = *request.mutable_sampling();
  if (args.temperature.has_value()) sampling.set_temperature(*args.temperature);
  if (args.top_p.has_value()) sampling.set_top_p(*args.top_p);
  sampling.set_top_k(args.top_k);
  if (args.seed.has_value()) sampling.set_seed(*args.seed);
  sampling.set_logprobs(args.logprobs);
  sampling.set_top_logprobs(args.top_logprobs);
  for (const std::string& stop : args.stop) request.add_stop(stop);
  request.set_ignore_eos(args.ignore_eos);
  sampling.set_min_p(args.min_p);
  if (args.repetition_penalty.has_value()) sampling.set_repetition_penalty(*args.repetition_penalty);
  sampling.set_presence_penalty(args.presence_penalty);
  sampling.set_frequency_penalty(args.frequency_penalty);
  request.mutable_shape()->set_pad_to(args.pad_to);
  request.mutable_shape()->set_tokens_per_chunk(args.tokens_per_chunk);
  request.mutable_shape()->set_interval_ms(args.interval_ms);
  return request;
}

py::tuple UsageTuple(const api::GenerateUsage& usage) {
  return py::make_tuple(usage.prompt_tokens(), usage.cached_tokens(), usage.completion_tokens());
}

// (text, [ids], [logprob] | None, [[(id, logprob)]] | None, finish_reason, usage | None,
// receipt, receipt_signature); the last four are empty or None except on the final chunk.
py::tuple ChunkTuple(const api::GenerateChunk& chunk, bool logprobs, bool top_logprobs) {
  py::list ids;
  py::list chosen;
  py::list top;
  for (const api::SampledTokenInfo& token : chunk.tokens()) {
    ids.append(token.id());
    chosen.append(token.logprob());
    py::list alternatives;
    for (const api::TokenLogprob& other : token.top()) {
      alternatives.append(py::make_tuple(other.id(), other.logprob()));
    }
    top.append(alternatives);
  }
  const bool final = !chunk.finish_reason().empty();
  return py::make_tuple(
      Text(chunk.text()), ids, logprobs ? py::object(chosen) : py::none(),
      top_logprobs ? py::object(top) : py::none(), Text(chunk.finish_reason()),
      final ? py::object(UsageTuple(chunk.usage())) : py::none(),
      BytesOf(chunk.receipt().data(), chunk.receipt().size()),
      BytesOf(chunk.receipt_signature().data(), chunk.receipt_signature().size()));
}

// One generation, made by NativeClient::Generate (which checked the client and the request)
// and run once by Run. Stop stops the deliveries at once and the stream after the next chunk
// (Client::Generate's GenerateCancelled): the RPC is cancelled, and with it the sequence in the
// enclave; what arrives before that is dropped without taking the GIL.
class NativeGeneration {
 public:
  NativeGeneration(std::shared_ptr<Client> client, std::string name, api::GenerateRequest request,
                   absl::Duration timeout)
      : client_(std::move(client)),
        name_(std::move(name)),
        request_(std::move(request)),
        timeout_(timeout) {}

  // Runs the generation to its end with the GIL released and returns the assembled result,
  // (ids, text, finish_reason, usage, receipt, receipt_signature, chunk_count). `on_chunk`
  // (unless None) is called with each chunk's tuple, the GIL held, until Stop; an exception
  // from it stops further calls and is raised once the stream has ended. Errors: the
  // stream's status (the enclave's refusal, DATA_LOSS from the chunk checks, the gRPC error).
  py::tuple Run(const py::object& on_chunk) {
    if (started_.exchange(true)) {
      ThrowIfError(absl::FailedPreconditionError("this generation has already run"));
    }
    const bool logprobs = request_.sampling().logprobs();
    const bool top_logprobs = request_.sampling().top_logprobs() > 0;
    std::exception_ptr callback_error;  // written and read with the GIL held
    GenerateChunkCallback deliver;
    if (!on_chunk.is_none()) {
      deliver = [&](const api::GenerateChunk& chunk) {
        if (stopped_.load(std::memory_order_acquire)) return;
        py::gil_scoped_acquire gil;
        try {
          on_chunk(ChunkTuple(chunk, logprobs, top_logprobs));
        } catch (...) {
          callback_error = std::current_exception();
          stopped_.store(true, std::memory_order_release);
        }
      };
    }
    absl::StatusOr<GenerateResult> result;
    {
      py::gil_scoped_release release;
      result = client_->Generate(name_, request_, deliver, timeout_,
                                 [this] { return stopped_.load(std::memory_order_acquire); });
    }
    if (callback_error) std::rethrow_exception(callback_error);
    ThrowIfError(result.status());
    py::tuple out = py::make_tuple(
        result->ids, Text(result->text), Text(result->finish_reason), UsageTuple(result->usage),
        BytesOf(result->receipt.data(), result->receipt.size()),
        BytesOf(result->receipt_signature.data(), result->receipt_signature.size()),
        result->chunk_count);
    SecureWipe(result->text.data(), result->text.size());
    return out;
  }

  // No more chunks are handed to Python; safe from any thread.
  void Stop() { stopped_.store(true, std::memory_order_release); }

 private:
  const std::shared_ptr<Client> client_;
  const std::string name_;
  const api::GenerateRequest request_;
  const absl::Duration timeout_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
};

class NativeClient {
 public:
  static std::unique_ptr<NativeClient> Connect(Connection connection, const std::string& key_path) {
    absl::StatusOr<std::unique_ptr<Client>> client;
    attest::Verdict verdict;
    {
      py::gil_scoped_release release;
      absl::StatusOr<ClientOptions> options = MakeOptions(connection);
      if (!options.ok()) {
        client = options.status();
      } else if (key_path.empty()) {
        client = absl::InvalidArgumentError("no identity key given (key= or CLOISTER_KEY)");
      } else {
        options->identity_key_path = key_path;
        client = Client::Connect(*options, &verdict);
      }
    }
    if (!client.ok()) {
      std::optional<attest::Verdict> failed;
      if (!verdict.pass && !verdict.checks.empty()) failed = std::move(verdict);
      throw StatusError(client.status(), std::move(failed));
    }
    return std::unique_ptr<NativeClient>(new NativeClient(*std::move(client)));
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    client_.reset();
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return client_ == nullptr;
  }

  py::tuple Verdict() { return VerdictTuple(Get()->verdict()); }
  py::bytes Evidence() {
    std::string evidence = Get()->evidence();
    return BytesOf(evidence.data(), evidence.size());
  }
  py::bytes SessionId() {
    Bytes id = Get()->session_id();
    return BytesOf(id.data(), id.size());
  }
  std::string TenantId() { return Get()->tenant_id(); }
  std::string PublicKeyHex() { return HexEncode(Get()->identity_public_key()); }

  py::tuple UploadModel(const std::string& path, const std::string& name,
                        const py::object& progress) {
    std::shared_ptr<Client> client = Get();
    // An exception from the callback stops further calls to it and is raised once the upload
    // call returns (the C++ upload cannot be interrupted from the callback).
    std::unique_ptr<py::error_already_set> callback_error;
    UploadProgress on_progress;
    if (!progress.is_none()) {
      on_progress = [&progress, &callback_error](uint64_t sent, uint64_t total) {
        py::gil_scoped_acquire gil;
        if (callback_error != nullptr) return;
        try {
          progress(sent, total);
        } catch (py::error_already_set& error) {
          callback_error = std::make_unique<py::error_already_set>(std::move(error));
        }
      };
    }
    absl::StatusOr<api::ModelInfo> model;
    {
      py::gil_scoped_release release;
      model = client->UploadModel(path, name, on_progress);
    }
    if (callback_error != nullptr) throw std::move(*callback_error);
    if (!model.ok()) throw StatusError(model.status(), std::nullopt);
    return ModelInfoTuple(*model);
  }

  // Uploads a model held in memory: it goes through an anonymous memory file, so the
  // plaintext never touches a file system.
  py::tuple UploadModelBytes(const py::object& data, const std::string& name,
                             const py::object& progress) {
    Py_buffer view;
    if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      throw py::error_already_set();
    }
    struct BufferReleaser {
      Py_buffer* view;
      ~BufferReleaser() { PyBuffer_Release(view); }
    } releaser{&view};
    const size_t size = static_cast<size_t>(view.len);
    int fd = -1;
    absl::Status written;
    {
      py::gil_scoped_release release;
      fd = ::memfd_create("cloister-model", MFD_CLOEXEC);
      if (fd < 0) {
        written = absl::InternalError(
            absl::StrCat("cannot create a memory file for the model: ", std::strerror(errno)));
      } else {
        const char* at = static_cast<const char*>(view.buf);
        size_t done = 0;
        while (done < size) {
          ssize_t n = ::write(fd, at + done, size - done);
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            written = absl::InternalError(
                absl::StrCat("cannot write the model to a memory file: ", std::strerror(errno)));
            break;
          }
          done += static_cast<size_t>(n);
        }
      }
    }
    struct FdCloser {
      int fd;
      ~FdCloser() {
        if (fd >= 0) ::close(fd);
      }
    } closer{fd};
    ThrowIfError(written);
    return UploadModel(absl::StrCat("/proc/self/fd/", fd), name, progress);
  }

  py::list ListModels() {
    std::shared_ptr<Client> client = Get();
    absl::StatusOr<std::vector<api::ModelInfo>> models;
    {
      py::gil_scoped_release release;
      models = client->ListModels();
    }
    ThrowIfError(models.status());
    py::list out;
    for (const api::ModelInfo& model : *models) out.append(ModelInfoTuple(model));
    return out;
  }

  void DeleteModel(const std::string& name) {
    std::shared_ptr<Client> client = Get();
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = client->DeleteModel(name);
    }
    ThrowIfError(status);
  }

  // `inputs`: (name, datatype, shape, C-contiguous buffer) each. Returns [(name, ndarray)].
  py::list Infer(const std::string& name, const py::list& inputs,
                 const std::vector<std::string>& outputs, std::optional<double> timeout) {
    std::shared_ptr<Client> client = Get();
    ThrowIfError(CheckTimeout(timeout));
    std::vector<api::Tensor> tensors;
    tensors.reserve(inputs.size());
    for (const py::handle& item : inputs) {
      auto [input_name, datatype, shape, data] =
          item.cast<std::tuple<std::string, std::string, std::vector<int64_t>, py::object>>();
      Py_buffer view;
      if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
        throw py::error_already_set();
      }
      api::Tensor& tensor = tensors.emplace_back();
      tensor.set_name(input_name);
      tensor.set_datatype(datatype);
      for (int64_t dim : shape) tensor.add_shape(dim);
      tensor.set_raw(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
      PyBuffer_Release(&view);
    }
    absl::StatusOr<std::vector<api::Tensor>> results;
    {
      py::gil_scoped_release release;
      results = client->Infer(name, std::move(tensors), outputs, DurationOf(timeout));
    }
    ThrowIfError(results.status());
    py::list out;
    for (api::Tensor& tensor : *results) {
      absl::Status valid = ValidateTensor(tensor);
      const char* dtype = NumpyDtype(tensor.datatype());
      if (valid.ok() && dtype == nullptr) {
        valid = absl::UnimplementedError(absl::StrCat("output ", tensor.name(), " has datatype ",
                                                      tensor.datatype(),
                                                      ", which has no numpy equivalent here"));
      }
      if (!valid.ok()) {
        for (api::Tensor& t : *results) SecureWipe(t.mutable_raw()->data(), t.raw().size());
        ThrowIfError(valid);
      }
      std::vector<py::ssize_t> shape(tensor.shape().begin(), tensor.shape().end());
      py::array array(py::dtype(dtype), shape);
      std::memcpy(array.mutable_data(), tensor.raw().data(), tensor.raw().size());
      SecureWipe(tensor.mutable_raw()->data(), tensor.raw().size());
      out.append(py::make_tuple(Text(tensor.name()), array));
    }
    return out;
  }

  // A generation with `name`, ready to run (NativeGeneration::Run). FailedPrecondition for a
  // closed client, InvalidArgument for a bad timeout or a request without exactly one prompt.
  std::unique_ptr<NativeGeneration> Generate(const std::string& name, const GenerateArgs& args,
                                             std::optional<double> timeout) {
    std::shared_ptr<Client> client = Get();
    ThrowIfError(CheckTimeout(timeout));
    absl::StatusOr<api::GenerateRequest> request = MakeGenerateRequest(args);
    ThrowIfError(request.status());
    return std::make_unique<NativeGeneration>(std::move(client), name, *std::move(request),
                                              DurationOf(timeout));
  }

 private:
  explicit NativeClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  std::shared_ptr<Client> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (client_ == nullptr) {
      throw StatusError(absl::FailedPreconditionError("the client is closed"), std::nullopt);
    }
    return client_;
  }

  std::mutex mu_;
  std::shared_ptr<Client> client_;  // null once closed
};

py::tuple Attest(Connection connection) {
  absl::StatusOr<attest::Verdict> verdict;
  {
    py::gil_scoped_release release;
    absl::StatusOr<ClientOptions> options = MakeOptions(connection);
    verdict =
        options.ok() ? sdk::Attest(*options) : absl::StatusOr<attest::Verdict>(options.status());
  }
  ThrowIfError(verdict.status());
  return VerdictTuple(*verdict);
}

// Offline verification of a serialized EvidenceBundle (checked against `nonce`, or its own
// nonce when none is given) or ChallengeResponse (needs the client's `nonce`).
py::tuple Verify(const py::bytes& evidence, const std::string& policy_path,
                 std::optional<py::bytes> nonce, std::optional<double> at_unix) {
  std::string serialized = evidence;
  std::optional<std::string> nonce_bytes;
  if (nonce.has_value()) nonce_bytes = std::string(*nonce);
  absl::StatusOr<attest::Verdict> verdict;
  {
    py::gil_scoped_release release;
    verdict = [&]() -> absl::StatusOr<attest::Verdict> {
      ASSIGN_OR_RETURN(attest::Policy policy, attest::LoadPolicyFile(policy_path));
      attest::EnableNvidiaGpuVerification();
      absl::Time at = at_unix.has_value()
                          ? absl::FromUnixMicros(static_cast<int64_t>(*at_unix * 1e6))
                          : absl::Now();
      // A ChallengeResponse starts with field 1 as bytes (tag 0x0A); an EvidenceBundle does not.
      if (!serialized.empty() && static_cast<uint8_t>(serialized[0]) == 0x0A) {
        attest::ChallengeResponse response;
        if (!response.ParseFromString(serialized)) {
          return absl::InvalidArgumentError("the evidence is not a serialized ChallengeResponse");
        }
        if (!nonce_bytes.has_value()) {
          return absl::InvalidArgumentError(
              "a challenge response is verified against the client's nonce: pass nonce=");
        }
        return attest::VerifyChallenge(response, AsBytes(*nonce_bytes), policy, at);
      }
      attest::EvidenceBundle bundle;
      if (serialized.empty() || !bundle.ParseFromString(serialized)) {
        return absl::InvalidArgumentError(
            "the evidence is not a serialized EvidenceBundle or ChallengeResponse");
      }
      Bytes expected = nonce_bytes.has_value() ? ToBytes(*nonce_bytes) : ToBytes(bundle.nonce());
      return attest::VerifyBundle(bundle, expected, policy, at);
    }();
  }
  ThrowIfError(verdict.status());
  return VerdictTuple(*verdict);
}

std::string GenerateKey(const std::string& path) {
  absl::Status saved;
  std::string public_key;
  {
    py::gil_scoped_release release;
    TenantIdentity identity = TenantIdentity::Generate();
    saved = identity.Save(path);
    public_key = identity.public_key_hex();
  }
  ThrowIfError(saved);
  return public_key;
}

std::string KeyPublicKey(const std::string& path) {
  absl::StatusOr<TenantIdentity> identity;
  {
    py::gil_scoped_release release;
    identity = TenantIdentity::Load(path);
  }
  ThrowIfError(identity.status());
  return identity->public_key_hex();
}

}  // namespace
}  // namespace cloister::sdk::python

PYBIND11_MODULE(_native, m) {
  using namespace ::cloister::sdk::python;  // NOLINT: the module body binds this file's names
  m.doc() = "Cloister's C++ tenant client; use the `cloister` package instead.";

  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const StatusError& error) {
      if (error_factory == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, std::string(error.status.message()).c_str());
        return;
      }
      py::object verdict =
          error.verdict.has_value() ? py::object(VerdictTuple(*error.verdict)) : py::none();
      py::object exception = (*error_factory)(
          static_cast<int>(error.status.code()), Text(error.status.message()), verdict,
          Text(std::string(
              ::cloister::proto::ReasonName(::cloister::proto::ReasonOf(error.status)))));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
    }
  });

  m.def(
      "_set_error_factory",
      [](py::object factory) {
        if (error_factory == nullptr) error_factory = new py::object();
        *error_factory = std::move(factory);
      },
      py::arg("factory"));

  py::class_<Connection>(m, "Connection")
      .def(py::init<>())
      .def_readwrite("server", &Connection::server)
      .def_readwrite("tenant", &Connection::tenant)
      .def_readwrite("token", &Connection::token)
      .def_readwrite("policy", &Connection::policy_path)
      .def_readwrite("tls_ca", &Connection::tls_ca)
      .def_readwrite("tls_client_cert", &Connection::tls_client_cert)
      .def_readwrite("tls_client_key", &Connection::tls_client_key)
      .def_readwrite("tls_server_name", &Connection::tls_server_name)
      .def_readwrite("fresh", &Connection::fresh)
      .def_readwrite("spread", &Connection::spread)
      .def_readwrite("timeout", &Connection::timeout);

  py::class_<NativeClient>(m, "NativeClient")
      .def_static("connect", &NativeClient::Connect, py::arg("connection"), py::arg("key"))
      .def("close", &NativeClient::Close)
      .def_property_readonly("closed", &NativeClient::closed)
      .def("verdict", &NativeClient::Verdict)
      .def("evidence", &NativeClient::Evidence)
      .def("session_id", &NativeClient::SessionId)
      .def("tenant_id", &NativeClient::TenantId)
      .def("public_key", &NativeClient::PublicKeyHex)
      .def("upload_model", &NativeClient::UploadModel, py::arg("path"), py::arg("name"),
           py::arg("progress"))
      .def("upload_model_bytes", &NativeClient::UploadModelBytes, py::arg("data"), py::arg("name"),
           py::arg("progress"))
      .def("list_models", &NativeClient::ListModels)
      .def("delete_model", &NativeClient::DeleteModel, py::arg("name"))
      .def("infer", &NativeClient::Infer, py::arg("name"), py::arg("inputs"), py::arg("outputs"),
           py::arg("timeout"))
      .def("generate", &NativeClient::Generate, py::arg("name"), py::arg("args"),
           py::arg("timeout"));

  py::class_<GenerateArgs>(m, "GenerateArgs")
      .def(py::init<>())
      .def_readwrite("text", &GenerateArgs::text)
      .def_readwrite("ids", &GenerateArgs::ids)
      .def_readwrite("messages", &GenerateArgs::messages)
      .def_readwrite("max_tokens", &GenerateArgs::max_tokens)
      .def_readwrite("temperature", &GenerateArgs::temperature)
      .def_readwrite("top_p", &GenerateArgs::top_p)
      .def_readwrite("top_k", &GenerateArgs::top_k)
      .def_readwrite("seed", &GenerateArgs::seed)
      .def_readwrite("stop", &GenerateArgs::stop)
      .def_readwrite("logprobs", &GenerateArgs::logprobs)
      .def_readwrite("top_logprobs", &GenerateArgs::top_logprobs)
      .def_readwrite("ignore_eos", &GenerateArgs::ignore_eos)
      .def_readwrite("min_p", &GenerateArgs::min_p)
      .def_readwrite("repetition_penalty", &GenerateArgs::repetition_penalty)
      .def_readwrite("presence_penalty", &GenerateArgs::presence_penalty)
      .def_readwrite("frequency_penalty", &GenerateArgs::frequency_penalty)
      .def_readwrite("pad_to", &GenerateArgs::pad_to)
      .def_readwrite("tokens_per_chunk", &GenerateArgs::tokens_per_chunk)
      .def_readwrite("interval_ms", &GenerateArgs::interval_ms);

  py::class_<NativeGeneration>(m, "NativeGeneration")
      .def("run", &NativeGeneration::Run, py::arg("on_chunk"))
      .def("stop", &NativeGeneration::Stop);

  m.def("attest", &Attest, py::arg("connection"));
  m.def("verify", &Verify, py::arg("evidence"), py::arg("policy"), py::arg("nonce"), py::arg("at"));
  m.def("generate_key", &GenerateKey, py::arg("path"));
  m.def("key_public_key", &KeyPublicKey, py::arg("path"));
}
