#include "sdk/proxy/proxy_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/bytes.h"
#include "base/status.h"
#include "crypto/random.h"
#include "sdk/proxy/openai_mapping.h"

namespace cloister::sdk::proxy {

namespace api = ::cloister::api::v1;

namespace {

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.retry_after_seconds > 0) {
    res.set_header("Retry-After", std::to_string(error.retry_after_seconds));
  }
  res.set_content(ErrorBody(error), "application/json");
}

ApiError RequestError(int http_status, std::string message, std::string code = "") {
  ApiError error;
  error.http_status = http_status;
  error.type = "invalid_request_error";
  error.message = std::move(message);
  error.code = std::move(code);
  return error;
}

// "chatcmpl-" and 24 random hex digits.
std::string NewResponseId(absl::string_view prefix) {
  return absl::StrCat(prefix, HexEncode(crypto::RandomBytes(12)));
}

// A socket address as cpp-httplib writes it into a request (numeric host, port).
bool AddressIs(const sockaddr_storage& address, socklen_t size, const std::string& host, int port) {
  char name[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), size, name, sizeof(name), service,
                  sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  return host == name && std::to_string(port) == service;
}

// The accepted socket `req` came in on, or -1. This cpp-httplib (0.11) gives a handler no
// connection object, so the socket is found among the process's descriptors by its two
// addresses, which no other live connection shares. The handler's thread holds it open until
// the handler returns.
int ConnectionOf(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage peer{};
    socklen_t peer_size = sizeof(peer);
    sockaddr_storage local{};
    socklen_t local_size = sizeof(local);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0 ||
        getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_size) != 0) {
      continue;
    }
    if (AddressIs(peer, peer_size, req.remote_addr, req.remote_port) &&
        AddressIs(local, local_size, req.local_addr, req.local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// Whether the caller on `connection` (-1: its socket was not found; never gone) has hung up:
// the socket reads end-of-stream or an error. Bytes waiting (a pipelined next request) mean it
// is still there. A client that half-closes after sending its request counts as gone; HTTP
// clients do not do that.
bool CallerHasGone(int connection) {
  if (connection < 0) return false;
  char byte;
  const ssize_t n = recv(connection, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

// One streamed generation, shared by the thread that runs it (producer of `events`) and the
// HTTP worker that writes them (consumer).
struct StreamState {
  absl::Mutex mu;
  std::deque<std::string> events ABSL_GUARDED_BY(mu);  // server-sent events not yet written
  bool started ABSL_GUARDED_BY(mu) = false;            // a chunk has been accepted
  bool finished ABSL_GUARDED_BY(mu) = false;           // Generate returned; no more events come
  absl::Status status ABSL_GUARDED_BY(mu);             // what it returned
  std::atomic<bool> cancel{false};                     // the caller has gone: stop the generation
  std::thread thread;                                  // runs the generation; joined once

  static bool StartedOrFinished(StreamState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    return s->started || s->finished;
  }
  static bool Ready(StreamState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    return !s->events.empty() || s->finished;
  }
  void Join() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace

class ProxyServer::Impl {
 public:
  Impl(const ProxyOptions& options, std::shared_ptr<Client> client)
      : options_(options), client_(std::move(client)) {}
  ~Impl() { Shutdown(); }

  absl::Status Start() {
    if (options_.port < 0 || options_.port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("port ", options_.port, " is out of range (0 to 65535)"));
    }
    if (options_.threads < 1) {
      return absl::InvalidArgumentError("the proxy needs at least one HTTP thread");
    }
    Install();
    if (options_.port == 0) {
      port_ = server_.bind_to_any_port(options_.host);
    } else if (server_.bind_to_port(options_.host, options_.port)) {
      port_ = options_.port;
    }
    if (port_ <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", HostPort(options_.port),
                                                 ": the address is in use or not this "
                                                 "machine's"));
    }
    listener_ = std::thread([this] { server_.listen_after_bind(); });
    // Serving before Create returns, so that a Shutdown right after it cannot miss the loop.
    while (!server_.is_running()) absl::SleepFor(absl::Milliseconds(1));
    return absl::OkStatus();
  }

  void Shutdown() {
    if (shut_down_.exchange(true)) return;
    stopping_ = true;  // every generation's cancel hook says stop
    server_.stop();
    if (listener_.joinable()) listener_.join();
  }

  int port() const { return port_; }
  std::string base_url() const { return absl::StrCat("http://", HostPort(port_), "/v1"); }

 private:
  std::string HostPort(int port) const {
    const bool v6 = options_.host.find(':') != std::string::npos;
    return v6 ? absl::StrCat("[", options_.host, "]:", port)
              : absl::StrCat(options_.host, ":", port);
  }

  absl::Duration Timeout() const { return options_.generation_timeout; }

  // The attested enclave measurement of the current session (hex), or "" when the evidence
  // carries none.
  std::string Measurement() const {
    attest::Verdict verdict = client_->verdict();
    auto it = verdict.claims.find("cvm.measurement");
    return it == verdict.claims.end() ? std::string() : it->second;
  }

  void Install() {
    const int threads = options_.threads;
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_payload_max_length(options_.max_body_size);
    server_.set_tcp_nodelay(true);
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
    });
    server_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                      httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours
      if (res.status == 404) {
        SendError(res, RequestError(404,
                                    absl::StrCat("Invalid URL (", req.method, " ", req.path,
                                                 "): the proxy serves GET /v1/models, "
                                                 "POST /v1/chat/completions, "
                                                 "/v1/completions and /v1/embeddings"),
                                    "unknown_url"));
      } else if (res.status == 413) {
        SendError(res, RequestError(413, "the request body is too large"));
      } else {
        const int status = res.status;
        SendError(res, RequestError(status, absl::StrCat("the HTTP request was refused (status ",
                                                         status, ")")));
      }
      return httplib::Server::HandlerResponse::Handled;
    }));
    server_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          ApiError error;
          error.message = "the proxy failed to answer this request (an internal error)";
          SendError(res, error);
        });

    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      absl::StatusOr<std::vector<api::ModelInfo>> models = client_->ListModels();
      if (!models.ok()) return SendError(res, ApiErrorFromStatus(models.status(), ""));
      res.set_content(ModelListJson(*models, client_->tenant_id(), Measurement()),
                      "application/json");
    });
    server_.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string name = req.matches[1];
      absl::StatusOr<std::vector<api::ModelInfo>> models = client_->ListModels();
      if (!models.ok()) return SendError(res, ApiErrorFromStatus(models.status(), name));
      for (const api::ModelInfo& model : *models) {
        if (model.name() == name) {
          return res.set_content(ModelJson(model, client_->tenant_id(), Measurement()),
                                 "application/json");
        }
      }
      SendError(res, ApiErrorFromStatus(absl::NotFoundError("model not found"), name));
    });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   Generation(ParseChatCompletionRequest(req.body), "chatcmpl-", req, res);
                 });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generation(ParseCompletionRequest(req.body), "cmpl-", req, res);
    });
    server_.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
      Embeddings(req, res);
    });
  }

  // With an API key set: whether `req` carries it (else `res` holds the 401).
  bool Authorized(const httplib::Request& req, httplib::Response& res) const {
    if (options_.api_key.empty()) return true;
    const std::string header = req.get_header_value("Authorization");
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(header, kBearer)) {
      SendError(res, RequestError(401,
                                  "You didn't provide an API key: send it as "
                                  "\"Authorization: Bearer KEY\" (the key in the proxy's "
                                  "--api-key-file)",
                                  "invalid_api_key"));
      return false;
    }
    if (!ConstantTimeEquals(AsBytes(std::string_view(header).substr(kBearer.size())),
                            AsBytes(options_.api_key))) {
      SendError(res, RequestError(401, "Incorrect API key provided", "invalid_api_key"));
      return false;
    }
    return true;
  }

  void Generation(absl::StatusOr<GenerationCall> call, absl::string_view id_prefix,
                  const httplib::Request& req, httplib::Response& res) {
    if (!call.ok()) return SendError(res, ApiErrorFromStatus(call.status(), ""));
    ResponseContext context{NewResponseId(id_prefix), absl::ToUnixSeconds(absl::Now()),
                            call->model};
    // A caller that hangs up is seen on its socket as each chunk arrives (a stream also when a
    // write fails): the generation stops in the enclave then.
    const int connection = ConnectionOf(req);
    if (call->stream) return Stream(*std::move(call), std::move(context), connection, res);
    const bool logprobs = call->request.sampling().logprobs();
    std::vector<api::SampledTokenInfo> tokens;
    absl::StatusOr<GenerateResult> result = client_->Generate(
        call->model, call->request,
        [&](const api::GenerateChunk& chunk) {
          if (logprobs) tokens.insert(tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
        },
        Timeout(),
        [this, connection] { return stopping_.load() || CallerHasGone(connection); });
    if (!result.ok()) return SendError(res, ApiErrorFromStatus(result.status(), call->model));
    res.set_content(CompletionResponseJson(*call, context, *result, tokens), "application/json");
  }

  void Stream(GenerationCall call, ResponseContext context, int connection,
              httplib::Response& res) {
    auto state = std::make_shared<StreamState>();
    const std::string model = call.model;
    state->thread =
        std::thread([this, state, connection, call = std::move(call),
                     context = std::move(context)]() {
          StreamEncoder encoder(call, context);
          absl::StatusOr<GenerateResult> result = client_->Generate(
              call.model, call.request,
              [&](const api::GenerateChunk& chunk) {
                std::string events = encoder.OnChunk(chunk);
                absl::MutexLock lock(&state->mu);
                state->started = true;
                if (!events.empty()) state->events.push_back(std::move(events));
              },
              Timeout(), [this, &state, connection] {
                return state->cancel.load() || stopping_.load() || CallerHasGone(connection);
              });
          absl::MutexLock lock(&state->mu);
          if (!result.ok() && state->started) {
            state->events.push_back(
                StreamEncoder::OnError(ApiErrorFromStatus(result.status(), call.model)));
          }
          state->status = result.status();
          state->finished = true;
        });

    // The status line waits for the first chunk: a refusal before it is a plain error answer.
    bool started;
    absl::Status status;
    {
      absl::MutexLock lock(&state->mu);
      state->mu.Await(absl::Condition(&StreamState::StartedOrFinished, state.get()));
      started = state->started;
      status = state->status;
    }
    if (!started) {
      state->Join();
      return SendError(res, ApiErrorFromStatus(status, model));
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // for a reverse proxy in front, if any
    res.set_chunked_content_provider(
        "text/event-stream",
        [state](size_t /*offset*/, httplib::DataSink& sink) {
          while (true) {
            std::deque<std::string> batch;
            bool finished;
            {
              absl::MutexLock lock(&state->mu);
              // Wakes at least every 200 ms to see whether the caller is still there.
              state->mu.AwaitWithTimeout(absl::Condition(&StreamState::Ready, state.get()),
                                         absl::Milliseconds(200));
              batch.swap(state->events);
              finished = state->finished;
            }
            // The events that piled up while the last write was under way go out as one
            // chunk: one write (and one HTTP chunk) instead of one per token.
            std::string out;
            if (batch.size() == 1) {
              out = std::move(batch.front());
            } else {
              for (const std::string& event : batch) out += event;
            }
            if (!out.empty() && !sink.write(out.data(), out.size())) {
              state->cancel = true;  // the caller went away: the generation stops
              return false;
            }
            if (finished) {
              sink.done();
              return true;
            }
            if (!sink.is_writable()) {
              state->cancel = true;
              return false;
            }
          }
        },
        [state](bool /*success*/) {
          // Runs when the response is done with, written or not.
          state->cancel = true;
          state->Join();
        });
  }

  void Embeddings(const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<EmbeddingCall> call = ParseEmbeddingRequest(req.body);
    if (!call.ok()) return SendError(res, ApiErrorFromStatus(call.status(), ""));
    absl::StatusOr<std::vector<api::ModelInfo>> models = client_->ListModels();
    if (!models.ok()) return SendError(res, ApiErrorFromStatus(models.status(), call->model));
    const api::ModelInfo* model = nullptr;
    for (const api::ModelInfo& m : *models) {
      if (m.name() == call->model) model = &m;
    }
    if (model == nullptr) {
      return SendError(res,
                       ApiErrorFromStatus(absl::NotFoundError("model not found"), call->model));
    }
    if (!IsEmbeddingModel(*model)) {
      return SendError(
          res,
          ApiErrorFromStatus(
              InvalidField("model", model->kind() == api::MODEL_KIND_LLM
                                        ? absl::StrCat("model ", call->model,
                                                       " is a generative model: use "
                                                       "/v1/chat/completions or /v1/completions")
                                        : absl::StrCat("model ", call->model,
                                                       " is not an embedding model: /v1/embeddings "
                                                       "needs an ONNX encoder with an INT64 "
                                                       "input_ids input and a sentence_embedding "
                                                       "output")),
              call->model));
    }
    absl::StatusOr<std::vector<api::Tensor>> inputs = EmbeddingInputs(*model, call->rows);
    if (!inputs.ok()) return SendError(res, ApiErrorFromStatus(inputs.status(), call->model));
    absl::StatusOr<std::vector<api::Tensor>> outputs =
        client_->Infer(call->model, *inputs, {"sentence_embedding"}, Timeout());
    if (!outputs.ok()) return SendError(res, ApiErrorFromStatus(outputs.status(), call->model));
    absl::StatusOr<std::string> body = EmbeddingResponseJson(*call, *outputs);
    if (!body.ok()) return SendError(res, ApiErrorFromStatus(body.status(), call->model));
    res.set_content(*body, "application/json");
  }

  const ProxyOptions options_;
  const std::shared_ptr<Client> client_;
  httplib::Server server_;
  std::thread listener_;
  int port_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> shut_down_{false};
};

absl::StatusOr<std::unique_ptr<ProxyServer>> ProxyServer::Create(const ProxyOptions& options,
                                                                 std::shared_ptr<Client> client) {
  if (client == nullptr) return absl::InvalidArgumentError("the proxy needs a connected Client");
  auto impl = std::make_unique<Impl>(options, std::move(client));
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<ProxyServer>(new ProxyServer(std::move(impl)));
}

ProxyServer::ProxyServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProxyServer::~ProxyServer() { Shutdown(); }

int ProxyServer::port() const { return impl_->port(); }
std::string ProxyServer::base_url() const { return impl_->base_url(); }
void ProxyServer::Shutdown() { impl_->Shutdown(); }

}  // namespace cloister::sdk::proxy
