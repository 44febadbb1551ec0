#include "enclave/gpu/cuda_device.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"

namespace cloister::gpu {
namespace {

using runtime::DataType;
using runtime::Tensor;
using runtime::internal::Buffer;
using runtime::internal::MemoryKind;

constexpr size_t kGranularity = 256;

size_t RoundUp(size_t size) {
  const size_t rounded = (size + kGranularity - 1) / kGranularity * kGranularity;
  return rounded == 0 ? kGranularity : rounded;
}

// Frees constants: scrub, then free (both synchronous, on the legacy stream).
class ConstantReleaser : public runtime::internal::BufferReleaser {
 public:
  void Release(void* data, size_t capacity) override {
    if (data == nullptr) return;
    absl::Status scrubbed = CudaStatus(cudaMemset(data, 0, RoundUp(capacity)), "cudaMemset");
    if (!scrubbed.ok()) {
      // Unscrubbed memory is never returned to the allocator: keep it (a leak, not a leak of
      // plaintext to the next owner).
      Log(LogLevel::kError, "cuda_scrub_failed", {{"error", std::string(scrubbed.message())}});
      return;
    }
    (void)cudaDeviceSynchronize();
    (void)cudaFree(data);
  }
};

}  // namespace

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error in ", std::string(what), ": ",
                                          cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error)));
}

absl::Status CublasStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error in ", std::string(what), ": ",
                                          cublasGetStatusName(status), ": ",
                                          cublasGetStatusString(status)));
}

absl::StatusOr<std::shared_ptr<CudaRunState>> CudaRunState::Create() {
  std::shared_ptr<CudaRunState> state(new CudaRunState());
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&state->stream_, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags"));
  RETURN_IF_ERROR(CublasStatus(cublasCreate(&state->blas_), "cublasCreate"));
  RETURN_IF_ERROR(CublasStatus(cublasSetStream(state->blas_, state->stream_), "cublasSetStream"));
  // Plain FP32 arithmetic (no TF32), so results stay within the CPU comparison tolerance.
  RETURN_IF_ERROR(
      CublasStatus(cublasSetMathMode(state->blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  void* flag = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&flag, sizeof(int)), "cudaMalloc"));
  state->error_flag_ = static_cast<int*>(flag);
  RETURN_IF_ERROR(CudaStatus(cudaMemset(flag, 0, sizeof(int)), "cudaMemset"));
  return state;
}

CudaRunState::~CudaRunState() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  {
    absl::MutexLock lock(&mutex_);
    for (auto& [capacity, block] : free_) (void)cudaFree(block.data);  // already scrubbed
    free_.clear();
  }
  if (error_flag_ != nullptr) (void)cudaFree(error_flag_);
  if (blas_ != nullptr) (void)cublasDestroy(blas_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::StatusOr<std::shared_ptr<Buffer>> CudaRunState::Acquire(size_t size) {
  const size_t rounded = RoundUp(size);
  {
    absl::MutexLock lock(&mutex_);
    auto it = free_.lower_bound(rounded);
    // Reuse only when the waste is bounded, as the host pool does.
    if (it != free_.end() && it->first <= rounded * 2 + 4096) {
      const size_t capacity = it->first;
      void* data = it->second.data;
      free_.erase(it);
      return std::make_shared<Buffer>(data, capacity, MemoryKind::kDevice, shared_from_this());
    }
  }
  void* data = nullptr;
  cudaError_t error = cudaMalloc(&data, rounded);
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the non-sticky error
    return absl::ResourceExhaustedError(
        absl::StrCat("out of device memory for ", rounded, " bytes"));
  }
  RETURN_IF_ERROR(CudaStatus(error, "cudaMalloc"));
  // Fresh device memory may hold data freed earlier by this process: zero it before use.
  error = cudaMemsetAsync(data, 0, rounded, stream_);
  if (error != cudaSuccess) {
    (void)cudaFree(data);
    return CudaStatus(error, "cudaMemsetAsync");
  }
  return std::make_shared<Buffer>(data, rounded, MemoryKind::kDevice, shared_from_this());
}

absl::StatusOr<Tensor> CudaRunState::NewTensor(DataType dtype, std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(int64_t count, runtime::ElementCount(shape));
  const size_t size = static_cast<size_t>(count) * runtime::ElementSize(dtype);
  if (size == 0) return Tensor(dtype, std::move(shape), nullptr);
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, Acquire(size));
  return Tensor(dtype, std::move(shape), std::move(buffer));
}

void CudaRunState::Release(void* data, size_t capacity) {
  if (data == nullptr) return;
  absl::MutexLock lock(&mutex_);
  // Scrub before the block can serve any other value; ordered after the work that used it.
  if (cudaMemsetAsync(data, 0, capacity, stream_) != cudaSuccess) {
    // Never reuse or free unscrubbed memory; Finish reports the failure.
    scrub_failed_ = true;
    return;
  }
  free_.emplace(capacity, Block{data, run_});
}

absl::StatusOr<Tensor> CudaRunState::Upload(const Tensor& host) {
  if (host.on_device()) return host;
  ASSIGN_OR_RETURN(Tensor device, NewTensor(host.dtype(), host.shape()));
  if (host.size() > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(device.raw_data(), host.raw_data(), host.size(),
                                               cudaMemcpyHostToDevice, stream_),
                               "cudaMemcpyAsync (upload)"));
    // The source is pageable host memory that the caller may free at once: wait for the copy.
    RETURN_IF_ERROR(Synchronize());
  }
  return device;
}

absl::StatusOr<Tensor> CudaRunState::Download(const Tensor& device) {
  if (!device.on_device()) return device;
  ASSIGN_OR_RETURN(Tensor host, Tensor::Create(device.dtype(), device.shape()));
  if (device.size() > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host.raw_data(), device.raw_data(), device.size(),
                                               cudaMemcpyDeviceToHost, stream_),
                               "cudaMemcpyAsync (download)"));
    RETURN_IF_ERROR(Synchronize());
  }
  return host;
}

absl::Status CudaRunState::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(stream_), "a kernel of this run");
}

absl::Status CudaRunState::Finish(uint64_t max_idle_runs) {
  RETURN_IF_ERROR(Synchronize());
  int flag = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(&flag, error_flag_, sizeof(int), cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync (error flag)"));
  RETURN_IF_ERROR(Synchronize());
  std::vector<void*> idle;
  {
    absl::MutexLock lock(&mutex_);
    if (scrub_failed_) return absl::InternalError("scrubbing released device memory failed");
    for (auto it = free_.begin(); it != free_.end();) {
      if (run_ - it->second.last_run > max_idle_runs) {
        idle.push_back(it->second.data);
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
    ++run_;
  }
  for (void* data : idle) RETURN_IF_ERROR(CudaStatus(cudaFree(data), "cudaFree"));
  if (flag != 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(error_flag_, 0, sizeof(int), stream_),
                               "cudaMemsetAsync (error flag)"));
    return absl::InvalidArgumentError("an index input held a value out of range");
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> UploadConstant(const Tensor& host) {
  CLOISTER_CHECK(!host.on_device());
  if (host.size() == 0) return Tensor(host.dtype(), host.shape(), nullptr);
  static const std::shared_ptr<ConstantReleaser> releaser = std::make_shared<ConstantReleaser>();
  void* data = nullptr;
  const size_t rounded = RoundUp(host.size());
  cudaError_t error = cudaMalloc(&data, rounded);
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("out of device memory for a constant of ", host.size(), " bytes"));
  }
  RETURN_IF_ERROR(CudaStatus(error, "cudaMalloc (constant)"));
  auto buffer = std::make_shared<Buffer>(data, rounded, MemoryKind::kDevice, releaser);
  RETURN_IF_ERROR(CudaStatus(cudaMemset(data, 0, rounded), "cudaMemset (constant)"));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(data, host.raw_data(), host.size(), cudaMemcpyHostToDevice),
                             "cudaMemcpy (constant)"));
  return Tensor(host.dtype(), host.shape(), std::move(buffer));
}

}  // namespace cloister::gpu
