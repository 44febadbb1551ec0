// Device memory and per-run state of the CUDA executor, and the one place that turns CUDA and
// cuBLAS error codes into Status.
//
// Memory rules (see README.md):
//  - A run's device memory comes from its CudaRunState's pool. A buffer that dies goes back to
//    that pool after a cudaMemsetAsync to zero on the run's stream, so memory is scrubbed before
//    any reuse; fresh blocks are zeroed too. Pooled blocks unused for a while are freed.
//  - Constants are uploaded once when a model loads (UploadConstant) and scrubbed and freed when
//    the model's kernels die.
//  - One stream per run state; kernels, copies and scrubs of a run are ordered by it.
//
// Threading: a CudaRunState serves one run at a time (Model keeps one per idle BufferPool); its
// pool is guarded by a mutex because buffers may die on whichever thread drops them.
// Ownership: every device buffer holds a shared reference to its state, so the stream and pool
// outlive all buffers made from them.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/tensor.h"

namespace cloister::gpu {

// OK for cudaSuccess, else Internal "CUDA error in <what>: <name>: <description>".
absl::Status CudaStatus(cudaError_t error, std::string_view what);
// OK for CUBLAS_STATUS_SUCCESS, else Internal naming the call and status.
absl::Status CublasStatus(cublasStatus_t status, std::string_view what);

class CudaRunState : public runtime::internal::BufferReleaser,
                     public std::enable_shared_from_this<CudaRunState> {
 public:
  // A stream, a cuBLAS handle bound to it and an empty pool.
  static absl::StatusOr<std::shared_ptr<CudaRunState>> Create();
  ~CudaRunState() override;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  // A device int that kernels set to 1 on bad data (an index out of range); checked by Finish.
  int* error_flag() const { return error_flag_; }

  // A zeroed-or-scrubbed device block of at least `size` bytes, as a Buffer.
  absl::StatusOr<std::shared_ptr<runtime::internal::Buffer>> Acquire(size_t size);
  // A device tensor of `dtype` and `shape` with unspecified (scrubbed) contents.
  absl::StatusOr<runtime::Tensor> NewTensor(runtime::DataType dtype, std::vector<int64_t> shape);
  // BufferReleaser: scrubs and pools the block.
  void Release(void* data, size_t capacity) override;

  absl::StatusOr<runtime::Tensor> Upload(const runtime::Tensor& host);
  absl::StatusOr<runtime::Tensor> Download(const runtime::Tensor& device);
  absl::Status Synchronize();
  // Waits, reports a kernel's bad-data flag or a failed scrub, and frees blocks idle for more
  // than `max_idle_runs` runs.
  absl::Status Finish(uint64_t max_idle_runs);

 private:
  CudaRunState() = default;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  int* error_flag_ = nullptr;
  struct Block {
    void* data;
    uint64_t last_run;
  };
  absl::Mutex mutex_;
  std::multimap<size_t, Block> free_ ABSL_GUARDED_BY(mutex_);
  uint64_t run_ ABSL_GUARDED_BY(mutex_) = 0;
  bool scrub_failed_ ABSL_GUARDED_BY(mutex_) = false;
};

// The DeviceRun the runtime sees.
class CudaRun : public runtime::DeviceRun {
 public:
  explicit CudaRun(std::shared_ptr<CudaRunState> state) : state_(std::move(state)) {}
  absl::StatusOr<runtime::Tensor> Upload(const runtime::Tensor& tensor) override {
    return state_->Upload(tensor);
  }
  absl::StatusOr<runtime::Tensor> Download(const runtime::Tensor& tensor) override {
    return state_->Download(tensor);
  }
  absl::Status Synchronize() override { return state_->Synchronize(); }
  absl::Status Finish(uint64_t max_idle_runs) override { return state_->Finish(max_idle_runs); }
  CudaRunState& state() const { return *state_; }

 private:
  std::shared_ptr<CudaRunState> state_;
};

// Copies a host constant into its own device allocation (synchronously), scrubbed and freed
// when the last tensor sharing it dies. Used at model load.
absl::StatusOr<runtime::Tensor> UploadConstant(const runtime::Tensor& host);

}  // namespace cloister::gpu
