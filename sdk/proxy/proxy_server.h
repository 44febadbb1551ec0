// The HTTP side of `cloister proxy` (docs/OPENAI.md): serves the OpenAI API (GET /v1/models,
// GET /v1/models/{id}, POST /v1/chat/completions, /v1/completions, /v1/embeddings) on a local
// address and answers each request through one attested sdk::Client, which holds the tenant's
// keys, seals every prompt to the enclave, checks every chunk of every stream and re-attests
// when it replaces a session. The JSON mapping is openai_mapping.h; this file is the wiring
// (cpp-httplib, kept out of this header).
//
// Streams: a streamed completion runs its generation on a thread of its own while the HTTP
// worker writes each chunk as a server-sent event. The HTTP status is decided by the first
// chunk: a generation refused before any chunk (unknown model, overload, a bad sampling value)
// answers with its error status, one that fails later ends the stream with an error event.
// A caller that goes away mid-stream (a write fails or the socket stops being writable)
// cancels the generation, so the enclave frees its sequence. Nothing of a prompt or a
// completion is logged.
//
// Threading: Create starts a pool of HTTP worker threads (ProxyOptions::threads); every handler
// may run at once, sharing the thread-safe Client. Shutdown (or the destructor) cancels the
// generations in flight, stops accepting, and joins every thread; call it from one thread.
// Ownership: the server shares the Client with its creator.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/client.h"

namespace cloister::sdk::proxy {

struct ProxyOptions {
  std::string host = "127.0.0.1";  // the address to bind (an IP address or "localhost")
  int port = 8080;                 // 0: any free port (ProxyServer::port says which)
  // When not empty, every request must carry "Authorization: Bearer <api_key>" (else 401).
  std::string api_key;
  int threads = 64;  // HTTP workers: requests served at once (streams included)
  // A limit on each generation (the stream as a whole); zero: the Client's call_timeout.
  absl::Duration generation_timeout = absl::ZeroDuration();
  // The largest request body accepted (413 beyond it).
  size_t max_body_size = size_t{32} << 20;
};

class ProxyServer {
 public:
  // Binds options.host:options.port and starts serving with `client`. Unavailable naming the
  // address when it cannot be bound; InvalidArgument for a port out of range or no threads.
  static absl::StatusOr<std::unique_ptr<ProxyServer>> Create(const ProxyOptions& options,
                                                             std::shared_ptr<Client> client);
  ~ProxyServer();

  ProxyServer(const ProxyServer&) = delete;
  ProxyServer& operator=(const ProxyServer&) = delete;

  // The port it listens on (the one chosen when options.port was 0).
  int port() const;
  // "http://HOST:PORT/v1", the base URL for OpenAI clients (IPv6 hosts in brackets).
  std::string base_url() const;

  // Cancels every generation in flight, stops serving and joins the threads. Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit ProxyServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cloister::sdk::proxy
