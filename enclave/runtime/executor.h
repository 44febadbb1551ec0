// The Executor is what runs a graph's kernels on one kind of hardware: the CPU executor (BLAS for
// GEMM and convolution, our own loops for the rest) and, in builds with the CUDA toolkit, the
// CUDA executor of enclave/gpu, which offers the same operator set and is checked against it.
//
// A device executor keeps per-run state (a stream and pooled device memory): Model asks it for a
// DeviceRun per idle BufferPool, uploads a run's inputs through it, downloads the outputs, and
// calls Finish() at the end of every run.
//
// Threading: executors are immutable after construction and shared by every model and run. A
// DeviceRun is used by one run at a time. The provider registry is thread-safe.
// Ownership: CpuExecutor() returns a process-wide instance that lives forever; so do the
// executors that providers return.
//
// The registry also holds, beside a device executor, how batches reach the memory it computes
// in (its batch path, enclave/pcie/batch_path.h), so one registration serves both. The runtime
// only keeps that factory and hands it out; it never makes a path itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "enclave/runtime/kernel.h"

namespace cloister::enclave::pcie {
class BatchPath;
struct TransferOptions;
enum class PcieMode;
}  // namespace cloister::enclave::pcie

namespace cloister::runtime {

// One run's state on a device executor.
class DeviceRun {
 public:
  virtual ~DeviceRun() = default;
  // Copies a host tensor into this run's device memory (a device tensor is returned as is).
  virtual absl::StatusOr<Tensor> Upload(const Tensor& tensor) = 0;
  // Copies a device tensor into a new host tensor once the work queued before it is done (a host
  // tensor is returned as is).
  virtual absl::StatusOr<Tensor> Download(const Tensor& tensor) = 0;
  // Waits for all queued work; an error there is a device failure in an earlier kernel.
  virtual absl::Status Synchronize() = 0;
  // Ends a run: waits for the queued work and frees pooled memory that no run used in the last
  // `max_idle_runs` runs. After an error the state must not be reused.
  virtual absl::Status Finish(uint64_t max_idle_runs) = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::string_view name() const = 0;
  // The operators this executor can run.
  virtual const KernelRegistry& kernels() const = 0;
  // A fresh per-run state for executors that compute on a device; nullptr for the CPU.
  virtual absl::StatusOr<std::unique_ptr<DeviceRun>> NewDeviceRun() const { return nullptr; }
  // The memory of the device it computes on, for the operator's statistics; Unimplemented for
  // executors without a device (the CPU).
  struct DeviceMemory {
    uint64_t total_size = 0;
    uint64_t used_size = 0;
  };
  virtual absl::StatusOr<DeviceMemory> DeviceMemoryUsage() const {
    return absl::UnimplementedError("no device memory");
  }
};

// The CPU executor.
const Executor& CpuExecutor();

// Builds (or returns the already built) executor of an optional target, or says why it cannot
// run here (for example "no CUDA device: ...").
using ExecutorProvider = absl::StatusOr<const Executor*> (*)();
// Makes a device executor's batch path for a PCIe mode with the host path's options (chunk size,
// sealing threads, largest transfer, idle buffers, the in-flight test hook); FailedPrecondition
// when the device is not there.
using BatchPathFactory = std::function<absl::StatusOr<std::unique_ptr<enclave::pcie::BatchPath>>(
    enclave::pcie::PcieMode, const enclave::pcie::TransferOptions&)>;
// Makes FindExecutor(name) use `provider`, and FindBatchPathFactory(name) return `batch_path`
// (empty for an executor that computes in host memory). Optional targets (enclave/gpu) call it
// from a static initializer; a second registration of a name replaces the first.
void RegisterExecutorProvider(std::string name, ExecutorProvider provider,
                              BatchPathFactory batch_path = nullptr);

// Looks an executor up by name: "cpu"; a registered name ("cuda"), whose provider's error is
// returned as is; or "auto", the first registered executor that can run here, else the CPU one
// (logging once why the device executor was not taken). NotFound for any other name, listing
// the executors this program was built with.
absl::StatusOr<const Executor*> FindExecutor(std::string_view name);

// The batch path factory registered with the executor named `name` (Executor::name(), so not
// "auto"): empty for "cpu" and for an executor registered without one, whose batches compute in
// host memory. NotFound, as FindExecutor, for a name no executor is registered under.
absl::StatusOr<BatchPathFactory> FindBatchPathFactory(std::string_view name);

// Registration of the CPU kernels, one function per source file.
void RegisterUnaryKernels(KernelRegistry& registry);
void RegisterElementwiseKernels(KernelRegistry& registry);
void RegisterCastKernels(KernelRegistry& registry);
void RegisterConvKernels(KernelRegistry& registry);
void RegisterNeuralKernels(KernelRegistry& registry);
void RegisterMatMulKernels(KernelRegistry& registry);
void RegisterTensorKernels(KernelRegistry& registry);
void RegisterLayoutKernels(KernelRegistry& registry);
void RegisterSliceKernels(KernelRegistry& registry);
void RegisterReduceKernels(KernelRegistry& registry);
void RegisterControlKernels(KernelRegistry& registry);
void RegisterResizeKernels(KernelRegistry& registry);
void RegisterRecurrentKernels(KernelRegistry& registry);
void RegisterMiscKernels(KernelRegistry& registry);

}  // namespace cloister::runtime
