// `cloister proxy`: the CLI subcommand that runs the OpenAI-compatible proxy (proxy_server.h)
// on the tenant's machine. It reads the usual connection settings (flags or CLOISTER_*), attests
// the appliance and opens a session (exit 1 naming the failed checks when the appliance fails
// the policy), serves until SIGINT or SIGTERM and then stops cleanly. The CLI's dispatch
// (sdk/cli.cc) calls RunProxy; the help text lives here beside the code it describes.
// Threading: RunProxy blocks SIGINT and SIGTERM in the calling thread (and so in every thread it
// starts) and waits for them with sigwait; run it from the program's main thread, once.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sdk/cli_internal.h"

namespace cloister::sdk::cli_internal {

extern const char kProxyHelp[];

// Where --listen asks the proxy to listen: "HOST:PORT" or "[IPV6]:PORT", port 0 to 65535.
struct ListenAddress {
  std::string host;
  int port = 0;
  bool loopback = false;  // localhost, 127.0.0.0/8 or ::1
};
// InvalidArgument naming the flag for a missing host or port, or a port that is not a number
// in range.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text);

// The subcommand. Exit 2 for bad flags, an unreadable --api-key-file or connection file, or a
// non-loopback --listen without --api-key-file; 1 when attestation fails, cloisterd refuses, or
// the address cannot be bound; 0 after a clean stop.
Result RunProxy(const Flags& flags, CliIo& io);

}  // namespace cloister::sdk::cli_internal
