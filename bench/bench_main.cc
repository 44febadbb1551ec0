// cloister-bench: benchmarks that compare Cloister side by side with peers in one run (DESIGN.md
// section 9).
//
//   cloister-bench runtime-vs-ort [--json] [--model NAME] [--threads N] [--iterations N] ...
//   cloister-bench coalescing [--json] [--payloads BYTES,...] [--iterations N] ...
//   cloister-bench cc-tax [--json] [--models cls,bert_mini] [--batches 1,4,16,64] ...
//   cloister-bench broker-efficiency [--json] [--batch N] [--callers N] [--requests N] ...
//   cloister-bench scheduler-overhead [--json] [--latency-requests N] [--producers N] ...
//   cloister-bench fairness [--json] [--duration-ms N] [--executor cls|spin] ...
//   cloister-bench noisy-neighbour [--json] [--rate N] [--duration-ms N] [--loads N] ...
//   cloister-bench chaos [--json] [--check] [--duration-s N] [--kills N] [--tenants N] ...
//   cloister-bench llm-vs-llamacpp [--json] [--models tiny,synthetic] [--threads 1,2] ...
//   cloister-bench llm-cuda [--json] [--models synthetic-1b] [--sequences 1,32] ...
//   cloister-bench llm-fairness [--json] [--duration-ms N] [--light-weight N] ...
//   cloister-bench llm-cc-tax [--json] [--concurrency 1,8,32] [--requests N] ...
//   cloister-bench llm-broker-efficiency [--json] [--concurrency N] [--max-tokens N] ...
//   cloister-bench llm-noisy-neighbour [--json] [--rate N] [--duration-ms N] ...
//   cloister-bench proxy-overhead [--json] [--concurrency 1,16] [--max-tokens N] ...
//
// OpenBLAS picks its kernels when it loads, from the CPU model, and falls back to generic SSE3
// kernels in VMs whose CPU it does not recognise (see deploy/README.md). The deployed enclave sets
// OPENBLAS_CORETYPE; so that the benchmark measures the runtime as deployed, cloister-bench sets it
// too (SkylakeX on AVX-512 hosts, Haswell on AVX2 hosts) and re-executes itself, unless the
// variable is already set.
//
// Exit status: 0 when the benchmark ran (whether or not it met its target), 1 on bad usage or a
// failure while running, 2 when a peer runtime (node, onnxruntime-node, node-llama-cpp) or, for
// llm-cuda, a device is not there.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/malloc_tuning.h"
#include "base/mutex_tuning.h"
#include "bench/broker_efficiency.h"
#include "bench/cc_tax.h"
#include "bench/chaos.h"
#include "bench/coalescing.h"
#include "bench/llm_broker_efficiency.h"
#include "bench/llm_cc_tax.h"
#include "bench/llm_cuda.h"
#include "bench/llm_fairness.h"
#include "bench/llm_noisy_neighbour.h"
#include "bench/llm_vs_llamacpp.h"
#include "bench/ort_peer.h"
#include "bench/proxy_overhead.h"
#include "bench/runtime_vs_ort.h"
#include "bench/scheduler_overhead.h"
#include "bench/tenant_isolation.h"
#include "cblas.h"

namespace cloister::bench {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitPeerMissing = 2;

// Sets OPENBLAS_CORETYPE for this CPU and restarts the program so that OpenBLAS sees it; returns
// (without restarting) when it is set already, the CPU has no AVX2, or the restart fails.
void ChooseBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
  if (core == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  ::execv("/proc/self/exe", argv);
  absl::FPrintF(stderr, "cloister-bench: could not restart with OPENBLAS_CORETYPE=%s\n", core);
}

void PrintUsage(std::FILE* to) {
  absl::FPrintF(to, "usage: cloister-bench SUBCOMMAND [flags]\nsubcommands:\n");
  absl::FPrintF(to, "  runtime-vs-ort   %s", RuntimeVsOrtUsage());
  absl::FPrintF(to, "  coalescing       %s", CoalescingUsage());
  absl::FPrintF(to, "  cc-tax           %s", CcTaxUsage());
  absl::FPrintF(to, "  broker-efficiency %s", BrokerEfficiencyUsage());
  absl::FPrintF(to, "  scheduler-overhead %s", SchedulerOverheadUsage());
  absl::FPrintF(to, "  fairness         %s", FairnessUsage());
  absl::FPrintF(to, "  noisy-neighbour  %s", NoisyNeighbourUsage());
  absl::FPrintF(to, "  chaos            %s", ChaosUsage());
  absl::FPrintF(to, "  llm-vs-llamacpp  %s", LlmVsLlamaCppUsage());
  absl::FPrintF(to, "  llm-cuda         %s", LlmCudaUsage());
  absl::FPrintF(to, "  llm-fairness     %s", LlmFairnessUsage());
  absl::FPrintF(to, "  llm-cc-tax       %s", LlmCcTaxUsage());
  absl::FPrintF(to, "  llm-broker-efficiency %s", LlmBrokerEfficiencyUsage());
  absl::FPrintF(to, "  llm-noisy-neighbour %s", LlmNoisyNeighbourUsage());
  absl::FPrintF(to, "  proxy-overhead   %s", ProxyOverheadUsage());
}

int LlmNoisyNeighbourMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", LlmNoisyNeighbourUsage());
    return 0;
  }
  LlmNoisyNeighbourOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  auto options = ParseLlmNoisyNeighbourFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-noisy-neighbour: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto result = RunLlmNoisyNeighbour(*options, stdout, stderr);
  if (!result.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-noisy-neighbour: %s\n", result.status().message());
    return kExitFailure;
  }
  return 0;
}

int LlmBrokerEfficiencyMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", LlmBrokerEfficiencyUsage());
    return 0;
  }
  LlmBrokerEfficiencyOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  defaults.cloisterd = CLOISTER_BENCH_CLOISTERD;
  auto options = ParseLlmBrokerEfficiencyFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-broker-efficiency: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto result = RunLlmBrokerEfficiency(*options, stdout, stderr);
  if (!result.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-broker-efficiency: %s\n", result.status().message());
    return kExitFailure;
  }
  return 0;
}

int ProxyOverheadMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", ProxyOverheadUsage());
    return 0;
  }
  ProxyOverheadOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  defaults.cloisterd = CLOISTER_BENCH_CLOISTERD;
  defaults.cloister = CLOISTER_BENCH_CLI;
  auto options = ParseProxyOverheadFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench proxy-overhead: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto lines = RunProxyOverhead(*options, stdout, stderr);
  if (!lines.ok()) {
    absl::FPrintF(stderr, "cloister-bench proxy-overhead: %s\n", lines.status().message());
    return kExitFailure;
  }
  return 0;
}

int LlmCcTaxMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", LlmCcTaxUsage());
    return 0;
  }
  LlmCcTaxOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  auto options = ParseLlmCcTaxFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-cc-tax: %s (see --help)\n", options.status().message());
    return kExitFailure;
  }
  auto lines = RunLlmCcTax(*options, stdout, stderr);
  if (!lines.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-cc-tax: %s\n", lines.status().message());
    return kExitFailure;
  }
  return 0;
}

int LlmFairnessMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", LlmFairnessUsage());
    return 0;
  }
  LlmFairnessOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  auto options = ParseLlmFairnessFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-fairness: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto result = RunLlmFairness(*options, stdout, stderr);
  if (!result.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-fairness: %s\n", result.status().message());
    return kExitFailure;
  }
  return 0;
}

int LlmVsLlamaCppMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", LlmVsLlamaCppUsage());
    return 0;
  }
  LlmVsLlamaCppOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  defaults.cache_dir = CLOISTER_BENCH_LLM_CACHE_DIR;
  const char* llama_dir = std::getenv("CLOISTER_LLAMA_DIR");
  defaults.llama_dir =
      llama_dir != nullptr && *llama_dir != '\0' ? llama_dir : CLOISTER_BENCH_LLAMA_DIR;
  defaults.peer_script = CLOISTER_BENCH_LLAMA_PEER_SCRIPT;
  defaults.generator_script = CLOISTER_BENCH_LLM_GENERATOR;
  auto options = ParseLlmVsLlamaCppFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-vs-llamacpp: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto report = RunLlmVsLlamaCpp(*options, stdout, stderr);
  if (!report.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-vs-llamacpp: %s\n", report.status().message());
    return report.status().code() == absl::StatusCode::kFailedPrecondition ? kExitPeerMissing
                                                                           : kExitFailure;
  }
  return 0;
}

int LlmCudaMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", LlmCudaUsage());
    return 0;
  }
  LlmCudaOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  defaults.cache_dir = CLOISTER_BENCH_LLM_CACHE_DIR;
  defaults.generator_script = CLOISTER_BENCH_LLM_GENERATOR;
  auto options = ParseLlmCudaFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-cuda: %s (see --help)\n", options.status().message());
    return kExitFailure;
  }
  auto lines = RunLlmCuda(*options, stdout, stderr);
  if (!lines.ok()) {
    absl::FPrintF(stderr, "cloister-bench llm-cuda: %s\n", lines.status().message());
    const absl::StatusCode code = lines.status().code();
    return code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kNotFound
               ? kExitPeerMissing
               : kExitFailure;
  }
  return 0;
}

int SchedulerOverheadMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", SchedulerOverheadUsage());
    return 0;
  }
  auto options = ParseSchedulerOverheadFlags(args, SchedulerOverheadOptions{});
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench scheduler-overhead: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto results = RunSchedulerOverhead(*options, stdout, stderr);
  if (!results.ok()) {
    absl::FPrintF(stderr, "cloister-bench scheduler-overhead: %s\n", results.status().message());
    return kExitFailure;
  }
  return 0;
}

int FairnessMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", FairnessUsage());
    return 0;
  }
  FairnessOptions defaults;
  defaults.executor.models_dir = CLOISTER_BENCH_MODELS_DIR;
  auto options = ParseFairnessFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench fairness: %s (see --help)\n", options.status().message());
    return kExitFailure;
  }
  auto result = RunFairness(*options, stdout, stderr);
  if (!result.ok()) {
    absl::FPrintF(stderr, "cloister-bench fairness: %s\n", result.status().message());
    return kExitFailure;
  }
  return 0;
}

int NoisyNeighbourMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", NoisyNeighbourUsage());
    return 0;
  }
  NoisyNeighbourOptions defaults;
  defaults.executor.models_dir = CLOISTER_BENCH_MODELS_DIR;
  auto options = ParseNoisyNeighbourFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench noisy-neighbour: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto result = RunNoisyNeighbour(*options, stdout, stderr);
  if (!result.ok()) {
    absl::FPrintF(stderr, "cloister-bench noisy-neighbour: %s\n", result.status().message());
    return kExitFailure;
  }
  return 0;
}

int CoalescingMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", CoalescingUsage());
    return 0;
  }
  auto options = ParseCoalescingFlags(args, CoalescingOptions{});
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench coalescing: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto results = RunCoalescing(*options, stdout, stderr);
  if (!results.ok()) {
    absl::FPrintF(stderr, "cloister-bench coalescing: %s\n", results.status().message());
    return kExitFailure;
  }
  return 0;
}

int CcTaxMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", CcTaxUsage());
    return 0;
  }
  CcTaxOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  defaults.threads = std::max(1u, std::thread::hardware_concurrency());
  auto options = ParseCcTaxFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench cc-tax: %s (see --help)\n", options.status().message());
    return kExitFailure;
  }
  if (!options->json) {
    absl::FPrintF(stderr, "OpenBLAS %s kernels, %d threads, %d iterations per mode\n",
                  openblas_get_corename(), options->threads, options->iterations);
  }
  auto results = RunCcTax(*options, stdout, stderr);
  if (!results.ok()) {
    absl::FPrintF(stderr, "cloister-bench cc-tax: %s\n", results.status().message());
    return kExitFailure;
  }
  return 0;
}

int BrokerEfficiencyMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", BrokerEfficiencyUsage());
    return 0;
  }
  BrokerEfficiencyOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  defaults.cloisterd = CLOISTER_BENCH_CLOISTERD;
  auto options = ParseBrokerEfficiencyFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench broker-efficiency: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  for (const std::string& model : options->models) {
    options->model = model;
    auto result = RunBrokerEfficiency(*options, stdout, stderr);
    if (!result.ok()) {
      absl::FPrintF(stderr, "cloister-bench broker-efficiency: %s: %s\n", model,
                    result.status().message());
      return kExitFailure;
    }
  }
  return 0;
}

// With --check, exit 1 also when the run missed its target (lost, duplicated or misrouted
// requests, missing kills, no recovery).
int ChaosMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    absl::FPrintF(stdout, "%s", ChaosUsage());
    return 0;
  }
  ChaosOptions defaults;
  defaults.cloisterd = CLOISTER_BENCH_CLOISTERD;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  auto options = ParseChaosFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench chaos: %s (see --help)\n", options.status().message());
    return kExitFailure;
  }
  auto result = RunChaos(*options, stdout, stderr);
  if (!result.ok()) {
    absl::FPrintF(stderr, "cloister-bench chaos: %s\n", result.status().message());
    return kExitFailure;
  }
  if (options->check) {
    if (absl::Status met = CheckChaosResult(*options, *result); !met.ok()) {
      absl::FPrintF(stderr, "cloister-bench chaos: target missed: %s\n", met.message());
      return kExitFailure;
    }
  }
  return 0;
}

int RuntimeVsOrtMain(const std::vector<std::string>& args) {
  RuntimeVsOrtOptions defaults;
  defaults.models_dir = CLOISTER_BENCH_MODELS_DIR;
  const char* ort_dir = std::getenv("CLOISTER_ORT_DIR");
  defaults.ort_dir = ort_dir != nullptr && *ort_dir != '\0' ? ort_dir : CLOISTER_BENCH_ORT_DIR;
  defaults.peer_script = CLOISTER_BENCH_PEER_SCRIPT;
  defaults.threads = std::max(1u, std::thread::hardware_concurrency());

  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      absl::FPrintF(stdout, "%s", RuntimeVsOrtUsage());
      return 0;
    }
  }
  auto options = ParseRuntimeVsOrtFlags(args, defaults);
  if (!options.ok()) {
    absl::FPrintF(stderr, "cloister-bench runtime-vs-ort: %s (see --help)\n",
                  options.status().message());
    return kExitFailure;
  }
  auto peer = OrtPeer::Start(
      {.node = options->node, .script = options->peer_script, .modules_dir = options->ort_dir});
  if (!peer.ok()) {
    absl::FPrintF(stderr, "cloister-bench runtime-vs-ort: %s\n", peer.status().message());
    return kExitPeerMissing;
  }
  if (!options->json) {
    absl::FPrintF(
        stderr, "onnxruntime-node %s, OpenBLAS %s kernels, %d threads, %d iterations per side\n",
        (*peer)->version(), openblas_get_corename(), options->threads, options->iterations);
  }
  auto results = RunRuntimeVsOrt(*options, **peer, stdout, stderr);
  if (!results.ok()) {
    absl::FPrintF(stderr, "cloister-bench runtime-vs-ort: %s\n", results.status().message());
    return kExitFailure;
  }
  return 0;
}

}  // namespace
}  // namespace cloister::bench

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    cloister::bench::PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? cloister::bench::kExitFailure : 0;
  }
  cloister::bench::ChooseBlasKernels(argv);
  // The allocator settings of cloisterd and cloister-enclave (base/malloc_tuning.h), for both
  // sides of every comparison: the runtime called directly, and the SDK callers standing in for
  // a tenant's client, which on this machine share the CPUs with the appliance.
  cloister::KeepFreedBuffersForReuse();
  cloister::SkipRunTimeDeadlockDetection();
  const std::string subcommand = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (subcommand == "runtime-vs-ort") return cloister::bench::RuntimeVsOrtMain(args);
  if (subcommand == "coalescing") return cloister::bench::CoalescingMain(args);
  if (subcommand == "cc-tax") return cloister::bench::CcTaxMain(args);
  if (subcommand == "broker-efficiency") return cloister::bench::BrokerEfficiencyMain(args);
  if (subcommand == "scheduler-overhead") return cloister::bench::SchedulerOverheadMain(args);
  if (subcommand == "fairness") return cloister::bench::FairnessMain(args);
  if (subcommand == "noisy-neighbour") return cloister::bench::NoisyNeighbourMain(args);
  if (subcommand == "chaos") return cloister::bench::ChaosMain(args);
  if (subcommand == "llm-vs-llamacpp") return cloister::bench::LlmVsLlamaCppMain(args);
  if (subcommand == "llm-cuda") return cloister::bench::LlmCudaMain(args);
  if (subcommand == "llm-fairness") return cloister::bench::LlmFairnessMain(args);
  if (subcommand == "llm-cc-tax") return cloister::bench::LlmCcTaxMain(args);
  if (subcommand == "llm-broker-efficiency") {
    return cloister::bench::LlmBrokerEfficiencyMain(args);
  }
  if (subcommand == "llm-noisy-neighbour") return cloister::bench::LlmNoisyNeighbourMain(args);
  if (subcommand == "proxy-overhead") return cloister::bench::ProxyOverheadMain(args);
  absl::FPrintF(stderr, "cloister-bench: unknown subcommand %s (see --help)\n", subcommand);
  return cloister::bench::kExitFailure;
}
