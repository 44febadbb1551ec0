#include "sdk/proxy/proxy_command.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "sdk/client.h"
#include "sdk/proxy/proxy_server.h"

namespace cloister::sdk::cli_internal {

const char kProxyHelp[] =
    R"(usage: cloister proxy [--listen HOST:PORT] [--api-key-file FILE] [--fresh]
                      [connection flags]

Runs an OpenAI-compatible API on this machine for the apps that speak it: point their base URL
at the printed address (http://127.0.0.1:8080/v1) and they use your Cloister models. The proxy
attests the appliance against your policy on start (and again whenever it replaces a session),
holds your identity key and session keys, and seals every prompt to the attested enclave; the
host in between sees only ciphertext. It never logs prompts or completions.

Endpoints: GET /v1/models, POST /v1/chat/completions and /v1/completions (your LLMs and the
operator's published ones; streamed or not), POST /v1/embeddings (ONNX encoders with a
sentence_embedding output; input as token ids). See docs/OPENAI.md.

It prints `cloister proxy listening on http://HOST:PORT/v1` when ready and serves until
SIGINT or SIGTERM.

flags:
  --listen HOST:PORT    where to listen (default 127.0.0.1:8080; port 0: any free port, the
                        line above says which). An address other than loopback needs
                        --api-key-file
  --api-key-file FILE   require "Authorization: Bearer KEY" of every caller, KEY being the
                        contents of FILE (else 401)
  --fresh               attest with fresh hardware evidence
  --timeout SECONDS     a limit on each call (default 60) and on each generation (default 600)
needs: --server, --policy, --tenant, --token-file, --key
exit status: 1 when the appliance fails attestation (the failed checks are printed) or the
address cannot be bound; 0 after SIGINT or SIGTERM.
)";

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text) {
  ListenAddress address;
  absl::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen must be HOST:PORT or [IPV6]:PORT, not '", text, "'"));
    }
    address.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos || text.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen must be HOST:PORT or [IPV6]:PORT, not '", text, "'"));
    }
    address.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (address.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen '", text, "' has no host"));
  }
  int port = -1;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen '", text, "': the port must be a number from 0 to 65535"));
  }
  address.port = port;
  in_addr v4;
  in6_addr v6;
  if (address.host == "localhost") {
    address.loopback = true;
  } else if (::inet_pton(AF_INET, address.host.c_str(), &v4) == 1) {
    address.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else if (::inet_pton(AF_INET6, address.host.c_str(), &v6) == 1) {
    address.loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return address;
}

namespace {

// Blocks SIGINT and SIGTERM in this thread (and the threads it starts) while alive, so they
// wait for sigwait instead of ending the process.
class BlockedStopSignals {
 public:
  BlockedStopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
    // An ignored signal is discarded before sigwait could see it, and a shell starts
    // background jobs with SIGINT ignored: catch both (the handler never runs while blocked).
    struct sigaction action = {};
    action.sa_handler = [](int) {};
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_int_);
    sigaction(SIGTERM, &action, &previous_term_);
  }
  ~BlockedStopSignals() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  BlockedStopSignals(const BlockedStopSignals&) = delete;
  BlockedStopSignals& operator=(const BlockedStopSignals&) = delete;

  // Waits for SIGINT or SIGTERM; returns which.
  int Wait() {
    int signal = 0;
    while (sigwait(&set_, &signal) != 0) {
    }
    return signal;
  }

 private:
  sigset_t set_;
  sigset_t previous_;
  struct sigaction previous_int_ = {};
  struct sigaction previous_term_ = {};
};

}  // namespace

Result RunProxy(const Flags& flags, CliIo& io) {
  absl::StatusOr<ListenAddress> listen =
      ParseListenAddress(flags.Get("listen").value_or("127.0.0.1:8080"));
  if (!listen.ok()) return Usage(listen.status());
  proxy::ProxyOptions proxy_options;
  proxy_options.host = listen->host;
  proxy_options.port = listen->port;
  if (std::optional<std::string> key_file = flags.Get("api-key-file"); key_file.has_value()) {
    absl::StatusOr<std::string> key = ReadFile(*key_file, /*max_size=*/4096);
    if (!key.ok()) {
      return Usage(absl::StrCat("cannot read --api-key-file: ", key.status().message()));
    }
    proxy_options.api_key = std::string(absl::StripAsciiWhitespace(*key));
    if (proxy_options.api_key.empty()) {
      return Usage(absl::StrCat("--api-key-file ", *key_file, " is empty"));
    }
  }
  if (!listen->loopback && proxy_options.api_key.empty()) {
    return Usage(absl::StrCat("--listen ", listen->host,
                              " is not a loopback address: anyone who reaches it could use your "
                              "models and keys, so give --api-key-file too"));
  }
  absl::StatusOr<ClientOptions> options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  proxy_options.generation_timeout =
      flags.Get("timeout").has_value() ? options->call_timeout : absl::Minutes(10);

  // Before any thread exists (gRPC starts its own in Connect), so that all of them inherit it.
  BlockedStopSignals signals;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());  // names the failed checks
  absl::StatusOr<std::unique_ptr<proxy::ProxyServer>> server =
      proxy::ProxyServer::Create(proxy_options, std::shared_ptr<Client>(*std::move(client)));
  if (!server.ok()) return Refused(server.status());
  io.out << "cloister proxy listening on " << (*server)->base_url() << std::endl;
  signals.Wait();
  (*server)->Shutdown();
  return std::nullopt;
}

}  // namespace cloister::sdk::cli_internal
