// cloister-enclave: the trusted worker. Started by cloisterd with one end of a socket pair
// (--fd) or connected over vsock in a confidential VM; serves the boundary protocol until the
// host closes the socket or sends SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attest/measurement.h"
#include "base/log.h"
#include "enclave/boundary/boundary_server.h"
#include "enclave/enclave.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: cloister-enclave --fd N --sim-dir DIR [--dev-policy-out FILE] [--threads N]\n"
               "  Serves the host<->enclave boundary protocol on file descriptor N.\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cloister;
  SetLogComponent("enclave");
  int fd = -1;
  int threads = 2;
  enclave::EnclaveOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cloister-enclave: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--fd") {
      if (!absl::SimpleAtoi(value("--fd"), &fd) || fd < 0) {
        std::fprintf(stderr, "cloister-enclave: --fd needs a file descriptor number\n");
        return 2;
      }
    } else if (arg == "--sim-dir") {
      options.sim_dir = value("--sim-dir");
    } else if (arg == "--dev-policy-out") {
      options.dev_policy_out = value("--dev-policy-out");
    } else if (arg == "--data-dir") {
      value("--data-dir");  // Accepted for symmetry with cloisterd; the enclave keeps no files there.
    } else if (arg == "--threads") {
      if (!absl::SimpleAtoi(value("--threads"), &threads) || threads < 1 || threads > 64) {
        std::fprintf(stderr, "cloister-enclave: --threads needs a number from 1 to 64\n");
        return 2;
      }
    } else if (arg == "--help" || arg == "-h") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "cloister-enclave: unknown flag %s\n", arg.c_str());
      Usage();
      return 2;
    }
  }
  if (fd < 0 || options.sim_dir.empty()) {
    Usage();
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);

  auto measurement = attest::MeasureFile("/proc/self/exe");
  if (!measurement.ok()) {
    std::fprintf(stderr, "cloister-enclave: cannot measure own binary: %s\n",
                 std::string(measurement.status().message()).c_str());
    return 1;
  }
  options.measurement = *measurement;
  auto worker = enclave::Enclave::Create(std::move(options));
  if (!worker.ok()) {
    std::fprintf(stderr, "cloister-enclave: %s\n", std::string(worker.status().message()).c_str());
    return 1;
  }
  absl::Status status = enclave::ServeBoundary(
      fd, [&](const boundary::v1::HostToEnclave& call) { return (*worker)->Handle(call); }, threads);
  if (!status.ok()) {
    Log(LogLevel::kError, "boundary_failed", {{"reason", std::string(status.message())}});
    return 1;
  }
  Log(LogLevel::kInfo, "enclave_stopped");
  return 0;
}
