// `cloister-bench broker-efficiency`: end-to-end serving throughput through the whole appliance
// against calling the runtime directly, on the same model, batch size and input. The broker side
// spawns a real `cloisterd` (which spawns the real cloister-enclave) on a loopback port with a
// fresh data dir, and drives it with the C++ SDK (sdk/client.h): every caller attests and opens
// its own session (one tenant identity for all), the model is uploaded once, then `callers`
// threads call Client::Infer concurrently. Each request carries a whole batch as one tensor
// (cls: x [batch,3,48,192]), so the enclave runs the model once per request on `batch` rows (the
// scheduler may coalesce requests that are queued together into a larger run). The direct side
// loads the same model in this process (threads 0: OpenBLAS's default, as the enclave does) and
// has `direct_callers` threads call Model::Run on the same tensor. The sides alternate in
// `rounds` phases of equal work; throughput is rows per second over all phases of a side and
// ratio = broker / direct. Before timing, the broker's output is compared with the direct one.
//
// Threading: the caller threads are this module's own, joined before each phase ends.
// Ownership: the cloisterd child process and its data dir live for one RunBrokerEfficiency call
// and are removed at its end.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct BrokerEfficiencyOptions {
  std::string models_dir;
  std::string cloisterd;  // the cloisterd binary (cloister-enclave must sit beside it)
  std::vector<std::string> models = {"cls", "bert_mini"};  // run one after the other
  std::string model = "cls";                               // the one RunBrokerEfficiency runs
  int batch = 16;          // rows per request
  int callers = 4;         // concurrent SDK callers
  int direct_callers = 0;  // concurrent Model::Run callers; 0: as many as `callers`
  int requests = 96;       // timed requests per side, over all rounds
  int rounds = 8;          // alternating phases per side
  int warmup = 2;          // untimed requests per caller and side before timing
  // The scheduler's max_batch_size (requests per enclave batch), written to a config file for
  // cloisterd; 0 leaves cloisterd's default.
  int max_batch = 0;
  // Enclave worker processes (cloisterd's `workers:`; each stands in for a device and runs up
  // to two batches at once); 0 leaves cloisterd's default of one.
  int workers = 0;
  uint64_t seed = 20261130;
  bool json = false;
};

struct BrokerEfficiencyResult {
  std::string model;
  int batch = 0;
  int callers = 0;
  int direct_callers = 0;
  int requests = 0;           // timed requests per side
  double broker_seconds = 0;  // wall time of the broker's timed phases
  double direct_seconds = 0;
  double max_abs_diff = 0;  // broker output against direct output on the same input
  int max_batch = 0;        // as in the options
  int workers = 0;          // as in the options
  // CPU time (user + system, from /proc) used during the timed phases: by the enclave workers,
  // cloisterd and this process (the SDK callers) during the broker's, and by this process (the
  // runtime) during the direct ones. Resolution: the kernel's clock tick (10 ms).
  double broker_enclave_cpu_seconds = 0;
  double broker_cloisterd_cpu_seconds = 0;
  double broker_client_cpu_seconds = 0;
  double direct_cpu_seconds = 0;
  double broker_rows_per_s() const { return requests * batch / broker_seconds; }
  double direct_rows_per_s() const { return requests * batch / direct_seconds; }
  double ratio() const { return broker_rows_per_s() / direct_rows_per_s(); }
  // What the ratio can reach when every core is busy on both sides: the direct side's CPU over
  // the sum of the broker side's (enclave, cloisterd and callers share the machine's cores).
  // 0 when the broker side used no measurable CPU.
  double cpu_ceiling() const {
    const double broker_cpu =
        broker_enclave_cpu_seconds + broker_cloisterd_cpu_seconds + broker_client_cpu_seconds;
    return broker_cpu > 0 ? direct_cpu_seconds / broker_cpu : 0;
  }
};

// The target: the broker keeps at least this fraction of the direct throughput at batch 16.
inline constexpr double kBrokerTargetRatio = 0.9;

// InvalidArgument naming the flag for an unknown flag, a bad value, a model other than cls or
// bert_mini, or fewer requests than rounds. `--model M` is `--models M`.
absl::StatusOr<BrokerEfficiencyOptions> ParseBrokerEfficiencyFlags(
    const std::vector<std::string>& args, BrokerEfficiencyOptions defaults);
std::string BrokerEfficiencyUsage();

// One JSON object on one line: ratio, and the extras model, batch, callers, direct_callers,
// requests, broker_rows_per_s, direct_rows_per_s, broker_ms_per_request, direct_ms_per_request,
// max_abs_diff, max_batch, request ("one tensor of `batch` rows"), and CPU milliseconds per
// request: enclave_cpu_ms, cloisterd_cpu_ms and client_cpu_ms (the broker's phases) and
// direct_cpu_ms.
std::string BrokerEfficiencyJsonLine(const BrokerEfficiencyResult& result);
std::string BrokerEfficiencyTable(const BrokerEfficiencyResult& result);

// Errors: cloisterd does not start (with its stderr), attestation, upload or inference fails, or
// the outputs of the two sides differ by more than 1e-3.
absl::StatusOr<BrokerEfficiencyResult> RunBrokerEfficiency(const BrokerEfficiencyOptions& options,
                                                           std::FILE* out, std::FILE* log);

}  // namespace cloister::bench
