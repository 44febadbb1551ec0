// cloister-enclave: the trusted worker. Started by cloisterd with one end of a socket pair
// (--fd) or connected over vsock in a confidential VM; serves the boundary protocol until the
// host closes the socket or sends SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attest/collectors/hardware_collector.h"
#include "attest/measurement.h"
#include "base/flags.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "base/mutex_tuning.h"
#include "enclave/batch_runner.h"
#include "enclave/boundary/boundary_server.h"
#include "enclave/enclave.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/model.h"

namespace cloister::enclave {
namespace {

void Usage() {
  std::fprintf(
      stderr,
      "usage: cloister-enclave --fd N [--tee sim|sev-snp|tdx] [--gpu sim|nvidia-cc|none]\n"
      "                        [--sim-dir DIR] [--dev-policy-out FILE] [--threads N]\n"
      "                        [--tsm-root DIR] [--sev-guest PATH] [--nvml-library NAME]\n"
      "                        [--executor auto|cpu|cuda] [--pcie-mode driver|emulated|off]\n"
      "                        [--run-threads N]\n"
      "  Serves the host<->enclave boundary protocol on file descriptor N.\n"
      "  --tee      where evidence and the sealing key come from (default sim; sim needs\n"
      "             --sim-dir)\n"
      "  --gpu      GPU evidence: sim (default with --tee sim), nvidia-cc (NVML, in a\n"
      "             confidential VM) or none (default with a hardware TEE)\n"
      "  --tsm-root, --sev-guest, --nvml-library  the hardware interfaces (defaults\n"
      "             /sys/kernel/config/tsm/report, /dev/sev-guest, libnvidia-ml.so.1)\n"
      "  --executor where models run: auto (default: the GPU when one is present, else\n"
      "             the CPU; --gpu nvidia-cc makes it cuda), cpu, or cuda (fails without\n"
      "             a device)\n"
      "  --pcie-mode how batches cross to the executor: driver (the CC GPU driver encrypts;\n"
      "             default with --gpu nvidia-cc), emulated (AES-256-GCM in 2 MiB chunks by\n"
      "             CPU threads, decrypted on the executor side) or off (plaintext; the\n"
      "             default otherwise)\n"
      "  --run-threads model runs one batch may split into on the CPU executor, side by\n"
      "             side (default: the hardware threads, up to 8; 1: one run per batch)\n");
}

bool ParseTee(const std::string& text, TeeMode* tee) {
  if (text == "sim")
    *tee = TeeMode::kSim;
  else if (text == "sev-snp")
    *tee = TeeMode::kSevSnp;
  else if (text == "tdx")
    *tee = TeeMode::kTdx;
  else
    return false;
  return true;
}

bool ParseGpu(const std::string& text, GpuMode* gpu) {
  if (text == "sim")
    *gpu = GpuMode::kSim;
  else if (text == "nvidia-cc")
    *gpu = GpuMode::kNvidiaCc;
  else if (text == "none")
    *gpu = GpuMode::kNone;
  else
    return false;
  return true;
}

// The command line: the enclave's options and what decides the rest of them.
struct CommandLine {
  EnclaveOptions options;
  int fd = -1;
  int threads = 2;
  int run_threads = 0;  // 0: the CPU executor's default
  std::string executor_name = "auto";
  bool gpu_given = false;
  bool pcie_mode_given = false;
  bool help = false;
};

// An integer flag from `minimum` to `maximum`, refused with `error` otherwise.
FlagSpec RangeFlag(std::string name, int* value, int minimum, int maximum, std::string error) {
  return {std::move(name), CustomFlag{[=](const std::string& text) {
            if (!absl::SimpleAtoi(text, value) || *value < minimum || *value > maximum) {
              return absl::InvalidArgumentError(error);
            }
            return absl::OkStatus();
          }}};
}

// The flags, filling `line`.
std::vector<FlagSpec> Specs(CommandLine& line) {
  EnclaveOptions& options = line.options;
  return {
      RangeFlag("--fd", &line.fd, 0, INT_MAX, "--fd needs a file descriptor number"),
      {"--tee", CustomFlag{[&](const std::string& text) {
         if (ParseTee(text, &options.tee)) return absl::OkStatus();
         return absl::InvalidArgumentError(
             absl::StrCat("--tee must be sim, sev-snp or tdx, not '", text, "'"));
       }}},
      {"--gpu", CustomFlag{[&](const std::string& text) {
         if (!ParseGpu(text, &options.gpu)) {
           return absl::InvalidArgumentError(
               absl::StrCat("--gpu must be sim, nvidia-cc or none, not '", text, "'"));
         }
         line.gpu_given = true;
         return absl::OkStatus();
       }}},
      {"--tsm-root", StringFlag{&options.tsm_root}},
      {"--sev-guest", StringFlag{&options.sev_guest_device}},
      {"--nvml-library", StringFlag{&options.nvml_library}},
      {"--executor", CustomFlag{[&](const std::string& text) {
         if (text != "auto" && text != "cpu" && text != "cuda") {
           return absl::InvalidArgumentError(
               absl::StrCat("--executor must be auto, cpu or cuda, not '", text, "'"));
         }
         line.executor_name = text;
         return absl::OkStatus();
       }}},
      {"--pcie-mode", CustomFlag{[&](const std::string& text) {
         absl::StatusOr<pcie::PcieMode> mode = pcie::ParsePcieMode(text);
         if (!mode.ok()) {
           return absl::InvalidArgumentError(
               absl::StrCat("--pcie-mode must be driver, emulated or off, not '", text, "'"));
         }
         options.pcie_mode = *mode;
         line.pcie_mode_given = true;
         return absl::OkStatus();
       }}},
      {"--sim-dir", StringFlag{&options.sim_dir}},
      {"--dev-policy-out", StringFlag{&options.dev_policy_out}},
      // Accepted for symmetry with cloisterd; the enclave keeps no files there.
      {"--data-dir", CustomFlag{[](const std::string&) { return absl::OkStatus(); }}},
      RangeFlag("--run-threads", &line.run_threads, 1, 64,
                "--run-threads needs a number from 1 to 64"),
      RangeFlag("--threads", &line.threads, 1, 64, "--threads needs a number from 1 to 64"),
      {"--help", SwitchFlag{&line.help, /*stop=*/true}},
      {"-h", SwitchFlag{&line.help, /*stop=*/true}},
  };
}

// Reads argv into `line`. The exit status when the program ends here: --help, or bad usage
// (one line on stderr; the usage too after an unknown flag).
std::optional<int> ParseCommandLine(int argc, char** argv, CommandLine& line) {
  bool unknown_flag = false;
  const FlagSyntax syntax{.inline_values = false, .unknown_flag = [&](const std::string& arg) {
                            unknown_flag = true;
                            return "unknown flag " + arg;
                          }};
  absl::Status parsed =
      ParseFlags(std::vector<std::string>(argv + 1, argv + argc), Specs(line), syntax);
  if (!parsed.ok()) {
    std::fprintf(stderr, "cloister-enclave: %s\n", std::string(parsed.message()).c_str());
    if (unknown_flag) Usage();
    return 2;
  }
  if (line.help) {
    Usage();
    return 0;
  }
  return std::nullopt;
}

// Fills the defaults that depend on other flags and refuses combinations that cannot work;
// the exit status when it refuses.
std::optional<int> CheckOptions(CommandLine& line) {
  EnclaveOptions& options = line.options;
  const bool sim_tee = options.tee == TeeMode::kSim;
  if (!line.gpu_given) options.gpu = sim_tee ? GpuMode::kSim : GpuMode::kNone;
  if (!line.pcie_mode_given) {
    options.pcie_mode =
        options.gpu == GpuMode::kNvidiaCc ? pcie::PcieMode::kDriver : pcie::PcieMode::kOff;
  }
  // Refuse at once, before anything else, when the GPUs asked for cannot give evidence.
  if (options.gpu == GpuMode::kNvidiaCc) {
    attest::HardwareOptions gpu_check;
    gpu_check.gpu = attest::HardwareGpu::kNvidiaCc;
    gpu_check.nvml_library = options.nvml_library;
    absl::Status ready = attest::CheckGpuReady(gpu_check);
    if (!ready.ok()) {
      std::fprintf(stderr, "cloister-enclave: --gpu nvidia-cc: %s\n",
                   std::string(ready.message()).c_str());
      return 1;
    }
  }
  if (sim_tee && options.gpu == GpuMode::kNvidiaCc) {
    std::fprintf(stderr, "cloister-enclave: --gpu nvidia-cc needs --tee sev-snp or tdx\n");
    return 2;
  }
  if (!sim_tee && options.gpu == GpuMode::kSim) {
    std::fprintf(stderr, "cloister-enclave: --gpu sim needs --tee sim\n");
    return 2;
  }
  if (!sim_tee && !options.dev_policy_out.empty()) {
    std::fprintf(stderr, "cloister-enclave: --dev-policy-out needs --tee sim\n");
    return 2;
  }
  if (line.fd < 0 || (sim_tee && options.sim_dir.empty())) {
    Usage();
    return 2;
  }
  return std::nullopt;
}

// Finds the executor the models run on and sizes the CPU threads for it; exit status 1 when
// there is none.
std::optional<int> ChooseExecutor(CommandLine& line) {
  EnclaveOptions& options = line.options;
  // A confidential GPU is there to run the models: with --gpu nvidia-cc the CUDA executor is
  // required, not merely preferred.
  if (line.executor_name == "auto" && options.gpu == GpuMode::kNvidiaCc) {
    line.executor_name = "cuda";
  }
  absl::StatusOr<const runtime::Executor*> executor = runtime::FindExecutor(line.executor_name);
  if (!executor.ok()) {
    std::fprintf(stderr, "cloister-enclave: --executor %s: %s\n", line.executor_name.c_str(),
                 std::string(executor.status().message()).c_str());
    return 1;
  }
  options.load_options.executor = *executor;
  // Each boundary thread runs one batch at a time, which on the CPU may split into run_threads
  // single-threaded runs side by side; they all share the cores. A device runs a batch at once.
  if ((*executor)->name() == "cpu") {
    options.run_threads = line.run_threads > 0 ? line.run_threads : DefaultRunThreads();
    options.load_options.threads = runtime::BlasThreadsFor(line.threads * options.run_threads);
    // An LLM's steps use the cores the batches share.
    options.generation.threads = options.run_threads;
  }
  Log(LogLevel::kInfo, "executor",
      {{"name", std::string((*executor)->name())},
       {"blas_threads", options.load_options.threads},
       {"run_threads", options.run_threads}});
  // The operator's statistics show the device's memory when models run on one.
  if (!absl::IsUnimplemented((*executor)->DeviceMemoryUsage().status())) {
    options.device_memory = [chosen = *executor]() -> absl::StatusOr<DeviceMemoryInfo> {
      absl::StatusOr<runtime::Executor::DeviceMemory> usage = chosen->DeviceMemoryUsage();
      if (!usage.ok()) return usage.status();
      return DeviceMemoryInfo{usage->total_size, usage->used_size};
    };
  }
  return std::nullopt;
}

// Measures this binary, makes the enclave and serves the boundary protocol until the host
// closes the socket; the exit status.
int Serve(CommandLine& line) {
  EnclaveOptions& options = line.options;
  absl::StatusOr<Bytes> measurement = attest::MeasureFile("/proc/self/exe");
  if (!measurement.ok()) {
    std::fprintf(stderr, "cloister-enclave: cannot measure own binary: %s\n",
                 std::string(measurement.status().message()).c_str());
    return 1;
  }
  options.measurement = *measurement;
  auto worker = Enclave::Create(std::move(options));
  if (!worker.ok()) {
    std::fprintf(stderr, "cloister-enclave: %s\n", std::string(worker.status().message()).c_str());
    return 1;
  }
  absl::Status status = ServeBoundary(
      line.fd,
      [&](boundary::v1::HostToEnclave call, const std::shared_ptr<FrameSink>& sink) {
        return (*worker)->Handle(std::move(call), sink);
      },
      line.threads);
  if (!status.ok()) {
    Log(LogLevel::kError, "boundary_failed", {{"reason", std::string(status.message())}});
    return 1;
  }
  Log(LogLevel::kInfo, "enclave_stopped");
  return 0;
}

}  // namespace
}  // namespace cloister::enclave

int main(int argc, char** argv) {
  using namespace cloister::enclave;
  cloister::SetLogComponent("enclave");
  cloister::KeepFreedBuffersForReuse();
  cloister::SkipRunTimeDeadlockDetection();
  CommandLine line;
  if (std::optional<int> done = ParseCommandLine(argc, argv, line)) return *done;
  if (std::optional<int> refused = CheckOptions(line)) return *refused;
  ::signal(SIGPIPE, SIG_IGN);
  if (std::optional<int> failed = ChooseExecutor(line)) return *failed;
  return Serve(line);
}
