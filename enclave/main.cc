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
#include "attest/collectors/hardware_collector.h"
#include "attest/measurement.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "enclave/batch_runner.h"
#include "enclave/boundary/boundary_server.h"
#include "enclave/enclave.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/model.h"

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

bool ParseTee(const std::string& text, cloister::enclave::TeeMode* tee) {
  using cloister::enclave::TeeMode;
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

bool ParseGpu(const std::string& text, cloister::enclave::GpuMode* gpu) {
  using cloister::enclave::GpuMode;
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

}  // namespace

int main(int argc, char** argv) {
  using namespace cloister;
  SetLogComponent("enclave");
  KeepFreedBuffersForReuse();
  int fd = -1;
  int threads = 2;
  int run_threads = 0;  // 0: the CPU executor's default
  enclave::EnclaveOptions options;
  bool gpu_given = false;
  std::string executor_name = "auto";
  bool pcie_mode_given = false;
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
    } else if (arg == "--tee") {
      std::string text = value("--tee");
      if (!ParseTee(text, &options.tee)) {
        std::fprintf(stderr, "cloister-enclave: --tee must be sim, sev-snp or tdx, not '%s'\n",
                     text.c_str());
        return 2;
      }
    } else if (arg == "--gpu") {
      std::string text = value("--gpu");
      if (!ParseGpu(text, &options.gpu)) {
        std::fprintf(stderr, "cloister-enclave: --gpu must be sim, nvidia-cc or none, not '%s'\n",
                     text.c_str());
        return 2;
      }
      gpu_given = true;
    } else if (arg == "--tsm-root") {
      options.tsm_root = value("--tsm-root");
    } else if (arg == "--sev-guest") {
      options.sev_guest_device = value("--sev-guest");
    } else if (arg == "--nvml-library") {
      options.nvml_library = value("--nvml-library");
    } else if (arg == "--executor") {
      executor_name = value("--executor");
      if (executor_name != "auto" && executor_name != "cpu" && executor_name != "cuda") {
        std::fprintf(stderr, "cloister-enclave: --executor must be auto, cpu or cuda, not '%s'\n",
                     executor_name.c_str());
        return 2;
      }
    } else if (arg == "--pcie-mode") {
      std::string text = value("--pcie-mode");
      auto mode = enclave::pcie::ParsePcieMode(text);
      if (!mode.ok()) {
        std::fprintf(stderr, "cloister-enclave: --pcie-mode must be driver, emulated or off, not '%s'\n",
                     text.c_str());
        return 2;
      }
      options.pcie_mode = *mode;
      pcie_mode_given = true;
    } else if (arg == "--sim-dir") {
      options.sim_dir = value("--sim-dir");
    } else if (arg == "--dev-policy-out") {
      options.dev_policy_out = value("--dev-policy-out");
    } else if (arg == "--data-dir") {
      value(
          "--data-dir");  // Accepted for symmetry with cloisterd; the enclave keeps no files there.
    } else if (arg == "--run-threads") {
      if (!absl::SimpleAtoi(value("--run-threads"), &run_threads) || run_threads < 1 ||
          run_threads > 64) {
        std::fprintf(stderr, "cloister-enclave: --run-threads needs a number from 1 to 64\n");
        return 2;
      }
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
  const bool sim_tee = options.tee == enclave::TeeMode::kSim;
  if (!gpu_given) options.gpu = sim_tee ? enclave::GpuMode::kSim : enclave::GpuMode::kNone;
  if (!pcie_mode_given) {
    options.pcie_mode = options.gpu == enclave::GpuMode::kNvidiaCc ? enclave::pcie::PcieMode::kDriver
                                                                  : enclave::pcie::PcieMode::kOff;
  }
  // Refuse at once, before anything else, when the GPUs asked for cannot give evidence.
  if (options.gpu == enclave::GpuMode::kNvidiaCc) {
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
  if (sim_tee && options.gpu == enclave::GpuMode::kNvidiaCc) {
    std::fprintf(stderr, "cloister-enclave: --gpu nvidia-cc needs --tee sev-snp or tdx\n");
    return 2;
  }
  if (!sim_tee && options.gpu == enclave::GpuMode::kSim) {
    std::fprintf(stderr, "cloister-enclave: --gpu sim needs --tee sim\n");
    return 2;
  }
  if (!sim_tee && !options.dev_policy_out.empty()) {
    std::fprintf(stderr, "cloister-enclave: --dev-policy-out needs --tee sim\n");
    return 2;
  }
  if (fd < 0 || (sim_tee && options.sim_dir.empty())) {
    Usage();
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);

  // A confidential GPU is there to run the models: with --gpu nvidia-cc the CUDA executor is
  // required, not merely preferred.
  if (executor_name == "auto" && options.gpu == enclave::GpuMode::kNvidiaCc) executor_name = "cuda";
  auto executor = runtime::FindExecutor(executor_name);
  if (!executor.ok()) {
    std::fprintf(stderr, "cloister-enclave: --executor %s: %s\n", executor_name.c_str(),
                 std::string(executor.status().message()).c_str());
    return 1;
  }
  options.load_options.executor = *executor;
  // Each boundary thread runs one batch at a time, which on the CPU may split into run_threads
  // single-threaded runs side by side; they all share the cores. A device runs a batch at once.
  if ((*executor)->name() == "cpu") {
    options.run_threads = run_threads > 0 ? run_threads : enclave::DefaultRunThreads();
    options.load_options.threads = runtime::BlasThreadsFor(threads * options.run_threads);
  }
  Log(LogLevel::kInfo, "executor",
      {{"name", std::string((*executor)->name())},
       {"blas_threads", options.load_options.threads},
       {"run_threads", options.run_threads}});
  // The operator's statistics show the device's memory when models run on one.
  if (!absl::IsUnimplemented((*executor)->DeviceMemoryUsage().status())) {
    options.device_memory = [chosen = *executor]() -> absl::StatusOr<enclave::DeviceMemoryInfo> {
      absl::StatusOr<runtime::Executor::DeviceMemory> usage = chosen->DeviceMemoryUsage();
      if (!usage.ok()) return usage.status();
      return enclave::DeviceMemoryInfo{usage->total_size, usage->used_size};
    };
  }

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
      fd, [&](boundary::v1::HostToEnclave call) { return (*worker)->Handle(std::move(call)); },
      threads);
  if (!status.ok()) {
    Log(LogLevel::kError, "boundary_failed", {{"reason", std::string(status.message())}});
    return 1;
  }
  Log(LogLevel::kInfo, "enclave_stopped");
  return 0;
}
