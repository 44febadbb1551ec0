// `cloister`: the tenant command line. Everything is in sdk/cli*.cc; this file only gathers
// the arguments, the CLOISTER_* environment variables and the terminal check.
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "base/mutex_tuning.h"
#include "sdk/cli.h"

extern char** environ;

int main(int argc, char** argv) {
  // The CLI (and `cloister proxy`, which serves many clients) is our program, not a library.
  cloister::SkipRunTimeDeadlockDetection();
  std::vector<std::string> args(argv + 1, argv + argc);
  cloister::sdk::CliIo io{std::cout, std::cerr, {}, ::isatty(STDERR_FILENO) == 1};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "CLOISTER_", 9) != 0) continue;
    const char* eq = std::strchr(*entry, '=');
    if (eq == nullptr) continue;
    io.env.emplace(std::string(*entry, static_cast<size_t>(eq - *entry)), std::string(eq + 1));
  }
  return cloister::sdk::RunCli(args, io);
}
