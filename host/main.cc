// cloisterd: the untrusted host broker (DESIGN.md sections 2 and 8). It authenticates tenants,
// admits, queues and batches their sealed requests, keeps model ciphertext at rest and relays
// everything to its enclave workers (`workers: N`, one per device); it never sees plaintext.
//
// This file reads the settings (flags over --config); host/daemon.h creates, serves and stops
// the rest. Exit 0 after SIGTERM or SIGINT; 1 if start-up fails (an address that cannot be
// bound, the operator one too) or a worker that died cannot be restarted; 2 for bad usage or
// config. `cloisterd --check-config FILE` only validates FILE (exit 0, or 2 with every error);
// `cloisterd --model-digest PATH` prints the SHA-256 a `published_models` entry for the ONNX
// file, package or checkpoint folder PATH needs (exit 0, or 2 naming what is wrong).
#include <cstdio>
#include <memory>
#include <string>

#include "base/log.h"
#include "base/malloc_tuning.h"
#include "base/mutex_tuning.h"
#include "host/config/daemon_config.h"
#include "host/daemon.h"
#include "host/supervisor/worker_supervisor.h"

namespace {

int Fail(const absl::Status& status) {
  cloister::Log(cloister::LogLevel::kError, "startup_failed", {{"error", status.ToString()}});
  std::fprintf(stderr, "cloisterd: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cloister::host;
  cloister::SetLogComponent("cloisterd");
  cloister::KeepFreedBuffersForReuse();
  cloister::SkipRunTimeDeadlockDetection();
  absl::StatusOr<CommandLine> command_line = ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::fprintf(stderr, "cloisterd: %s (%s)\n",
                 std::string(command_line.status().message()).c_str(), kCloisterdUsage);
    return 2;
  }
  if (command_line->help) {
    std::printf("%s\n", kCloisterdUsage);
    return 0;
  }
  if (command_line->model_digest.has_value()) {
    absl::StatusOr<std::string> digest = PublishedModelDigest(*command_line->model_digest);
    if (!digest.ok()) {
      std::fprintf(stderr, "cloisterd: %s\n", std::string(digest.status().message()).c_str());
      return 2;
    }
    std::printf("%s\n", digest->c_str());
    return 0;
  }
  if (command_line->check_config.has_value()) {
    // Validates without starting anything: every error on stderr, exit 2; a summary and 0.
    absl::StatusOr<DaemonConfig> checked =
        LoadDaemonConfig(*command_line->check_config,
                         command_line->skip_file_checks ? FileChecks::kSkip : FileChecks::kRead);
    if (!checked.ok()) {
      std::fprintf(stderr, "%s\n", std::string(checked.status().message()).c_str());
      return 2;
    }
    std::printf("%s: ok (%s)\n", command_line->check_config->c_str(),
                DescribeDaemonConfig(*checked).c_str());
    return 0;
  }
  absl::StatusOr<DaemonConfig> config = ResolveDaemonConfig(*command_line);
  if (!config.ok()) {
    std::fprintf(stderr, "cloisterd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Create(*config);
  if (!daemon.ok()) return Fail(daemon.status());
  if (absl::Status serving = (*daemon)->Serve(); !serving.ok()) {
    (*daemon)->Shutdown();  // so that the reason is the last line
    return Fail(serving);
  }
  const int exit_code = (*daemon)->WaitForStop();
  (*daemon)->Shutdown();
  cloister::Log(cloister::LogLevel::kInfo, "stopped", {{"exit_code", exit_code}});
  return exit_code;
}
