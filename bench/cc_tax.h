// `cloister-bench cc-tax`: what confidential computing costs a serving batch on the enclave's
// PCIe path. Batches of N single-row requests run through the enclave's own batch path
// (enclave/batch_runner.h RunBatch: gather into one staging buffer, one transfer to the
// executor's side, one Model::Run over the N rows, one transfer back) with a batch path in
// mode `off` (a plain copy) and one in mode `emulated` (AES-256-GCM both ways, see
// enclave/pcie/transfer_path.h), in the same sitting on the same model instance and inputs. The
// two modes alternate run by run (their order flips every iteration). Throughput is requests
// per second at the median batch time; ratio = rps_emulated / rps_off. Before timing, one batch
// in each mode is checked to give the same outputs. The path is the one the enclave takes for
// the executor: into device memory for a device executor with a path of its own (--executor
// cuda: the GPU decrypts in mode emulated), else the host path (pcie/batch_path.h).
//
// Threading: runs on the calling thread (OpenBLAS and the TransferPath use their own threads).
// Ownership: plain values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/runtime_vs_ort.h"

namespace cloister::bench {

struct CcTaxOptions {
  std::string models_dir;
  std::vector<std::string> models = {"cls", "bert_mini"};  // names from BenchModels()
  std::vector<int> batches = {1, 4, 16, 64};               // requests per batch, one row each
  int iterations = 10;                                     // timed batches per mode
  int warmup = 1;                                          // untimed batches per mode
  int threads = 1;                                         // BLAS threads of the model
  int transfer_threads = 0;      // the TransferPaths' threads; 0: their default
  std::string executor = "cpu";  // runtime::FindExecutor name: cpu, cuda, auto
  uint64_t seed = 20261130;
  bool json = false;
};

struct CcTaxResult {
  std::string model;
  std::string executor;  // the executor's name (cpu, cuda)
  bool executor_memory_on_device = false;  // the batches crossed into device memory
  int batch = 0;
  Timing off;                       // milliseconds per batch, mode off
  Timing emulated;                  // milliseconds per batch, mode emulated
  double emulated_transfer_ms = 0;  // median time in the two transfers per batch, emulated
  double off_transfer_ms = 0;       // the same in mode off (plain copies)
  uint64_t transfer_size = 0;       // bytes moved per batch, both directions
  double rps_off() const { return batch * 1e3 / off.median_ms; }
  double rps_emulated() const { return batch * 1e3 / emulated.median_ms; }
  double ratio() const { return rps_emulated() / rps_off(); }
  // The ratio the transfer times alone predict: off's batch time against the same with off's
  // transfers replaced by emulated ones. Far less noisy than ratio() on a busy machine, since
  // it only depends on the transfers, which are a small part of each batch.
  double transfer_ratio() const {
    return off.median_ms / (off.median_ms - off_transfer_ms + emulated_transfer_ms);
  }
};

// The target: emulated at least this fraction of off's throughput at batch kCcTaxTargetBatch
// and above.
inline constexpr double kCcTaxTargetRatio = 0.95;
inline constexpr int kCcTaxTargetBatch = 16;

// InvalidArgument naming the flag for an unknown flag, a bad value or an unknown model.
absl::StatusOr<CcTaxOptions> ParseCcTaxFlags(const std::vector<std::string>& args,
                                             CcTaxOptions defaults);
std::string CcTaxUsage();

// One JSON object on one line: model, batch, rps_off, rps_emulated, ratio, and the extras
// executor, executor_memory (host or device), off_ms, emulated_ms (median batch times),
// off_transfer_ms, emulated_transfer_ms, transfer_ratio, transfer_size, iterations.
std::string CcTaxJsonLine(const CcTaxResult& result);
// An aligned table and one line with the verdict against the target.
std::string CcTaxTable(const std::vector<CcTaxResult>& results);

// Runs every model and batch size. With --json one JSON line per case to `out` as it finishes;
// without, progress to `log` and the table to `out` at the end. Errors name the model and batch.
absl::StatusOr<std::vector<CcTaxResult>> RunCcTax(const CcTaxOptions& options, std::FILE* out,
                                                  std::FILE* log);

}  // namespace cloister::bench
