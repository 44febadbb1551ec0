// `cloister proxy`'s command line (proxy_command.h): --listen addresses, and every local input
// refused (exit 2, one line) before any connection is made. The proxy against a real appliance
// is tests/integration/openai/.
#include "sdk/proxy/proxy_command.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/cli.h"

namespace cloister::sdk::cli_internal {
namespace {

using ::testing::HasSubstr;

TEST(ProxyListenAddress, HostsAndPortsParse) {
  struct Case {
    std::string text, host;
    int port;
    bool loopback;
  };
  for (const Case& c : std::vector<Case>{{"127.0.0.1:8080", "127.0.0.1", 8080, true},
                                         {"127.5.6.7:0", "127.5.6.7", 0, true},
                                         {"localhost:1", "localhost", 1, true},
                                         {"[::1]:65535", "::1", 65535, true},
                                         {"0.0.0.0:80", "0.0.0.0", 80, false},
                                         {"10.1.2.3:5", "10.1.2.3", 5, false},
                                         {"[::]:8080", "::", 8080, false},
                                         {"proxy.example:8080", "proxy.example", 8080, false}}) {
    absl::StatusOr<ListenAddress> address = ParseListenAddress(c.text);
    ASSERT_TRUE(address.ok()) << c.text << ": " << address.status();
    EXPECT_EQ(address->host, c.host) << c.text;
    EXPECT_EQ(address->port, c.port) << c.text;
    EXPECT_EQ(address->loopback, c.loopback) << c.text;
  }
}

TEST(ProxyListenAddress, MalformedAddressesAreRefused) {
  for (const std::string text : {"", "8080", ":8080", "host:", "host:99999", "host:8a", "host:-1",
                                 "::1:8080", "[::1]8080", "[::1]:", "[]:80", "[::1"}) {
    absl::StatusOr<ListenAddress> address = ParseListenAddress(text);
    EXPECT_FALSE(address.ok()) << text;
    EXPECT_EQ(address.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(address.status().message()), HasSubstr("--listen")) << text;
  }
}

struct Ran {
  int exit_code;
  std::string out, err;
};

Ran Cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  CliIo io{out, err, {}};
  const int code = RunCli(args, io);
  return {code, out.str(), err.str()};
}

TEST(ProxyCommand, HelpDescribesTheFlags) {
  Ran help = Cli({"proxy", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: cloister proxy"));
  EXPECT_THAT(help.out, HasSubstr("--api-key-file"));
  Ran main_help = Cli({"--help"});
  EXPECT_THAT(main_help.out, HasSubstr("proxy"));
}

TEST(ProxyCommand, LocalMistakesAreUsageErrorsOfOneLine) {
  const std::string dir = ::testing::TempDir();
  const std::string empty_key = dir + "/empty.key";
  std::ofstream(empty_key) << "  \n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"proxy", "--listen", "8080"}, "--listen must be HOST:PORT"},
      {{"proxy", "--listen", "127.0.0.1:70000"}, "from 0 to 65535"},
      {{"proxy", "--listen", "0.0.0.0:0"}, "not a loopback address"},
      {{"proxy", "--api-key-file", dir + "/no-such-file"}, "cannot read --api-key-file"},
      {{"proxy", "--api-key-file", empty_key}, "is empty"},
      {{"proxy", "--listen", "127.0.0.1:0"}, "no tenant id given"},
      {{"proxy", "--bogus"}, "unknown flag --bogus"},
  };
  for (const auto& [args, message] : cases) {
    Ran ran = Cli(args);
    EXPECT_EQ(ran.exit_code, kExitUsage) << args.back();
    EXPECT_THAT(ran.err, HasSubstr(message)) << args.back();
    EXPECT_EQ(ran.err.find('\n'), ran.err.size() - 1) << ran.err;
  }
}

}  // namespace
}  // namespace cloister::sdk::cli_internal
