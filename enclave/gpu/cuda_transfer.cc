#include "enclave/gpu/cuda_transfer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/random.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_gcm.h"
#include "enclave/pcie/chunk_cipher.h"

namespace cloister::gpu {

namespace pcie = enclave::pcie;
using pcie::PcieMode;

namespace {

absl::Status CheckTransferSize(size_t size, size_t limit) {
  if (size <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("PCIe transfer of ", size, " bytes exceeds the limit of ", limit));
}

}  // namespace

namespace internal {

// Blocks of one kind (pinned host or device), reused by size and zeroed whenever a lease ends.
struct CudaPool : std::enable_shared_from_this<CudaPool> {
  CudaPool(bool device, size_t max_idle, size_t max_size)
      : device(device), max_idle(max_idle), max_size(max_size) {}
  ~CudaPool() {
    for (auto& [capacity, data] : idle) Free(data);
  }

  absl::StatusOr<CudaBuffer> Acquire(size_t size) {
    RETURN_IF_ERROR(CheckTransferSize(size, max_size));
    CudaBuffer buffer;
    {
      absl::MutexLock lock(&mutex);
      auto it = idle.lower_bound(std::max<size_t>(size, 1));
      if (it != idle.end()) {
        buffer.capacity_ = it->first;
        buffer.data_ = it->second;
        idle.erase(it);
      }
    }
    if (buffer.data_ == nullptr) {
      const size_t granule = size_t{64} << 10;
      const size_t capacity = (std::max<size_t>(size, 1) + granule - 1) / granule * granule;
      void* data = nullptr;
      const cudaError_t error = device ? cudaMalloc(&data, capacity)
                                       : cudaHostAlloc(&data, capacity, cudaHostAllocDefault);
      if (error != cudaSuccess) {
        cudaGetLastError();
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", capacity, " bytes of ",
                                                         device ? "device" : "pinned host",
                                                         " memory: ", cudaGetErrorString(error)));
      }
      absl::Status zeroed = Zero(data, capacity);
      if (!zeroed.ok()) {
        Free(data);
        return zeroed;
      }
      buffer.data_ = static_cast<uint8_t*>(data);
      buffer.capacity_ = capacity;
    }
    buffer.pool_ = shared_from_this();
    buffer.size_ = size;
    return buffer;
  }

  void Return(uint8_t* data, size_t capacity) {
    // A block that cannot be zeroed is not reused.
    if (!Zero(data, capacity).ok()) {
      Free(data);
      return;
    }
    absl::MutexLock lock(&mutex);
    if (idle.size() < max_idle) {
      idle.emplace(capacity, data);
      return;
    }
    auto smallest = idle.begin();
    if (smallest->first < capacity) {
      Free(smallest->second);
      idle.erase(smallest);
      idle.emplace(capacity, data);
      return;
    }
    Free(data);
  }

  absl::Status Zero(void* data, size_t capacity) {
    if (device) return CudaStatus(cudaMemset(data, 0, capacity), "scrubbing device memory");
    std::memset(data, 0, capacity);
    asm volatile("" : : "r"(data) : "memory");  // the stores must happen
    return absl::OkStatus();
  }

  void Free(void* data) {
    if (device) {
      cudaFree(data);
    } else {
      cudaFreeHost(data);
    }
  }

  const bool device;
  const size_t max_idle;
  const size_t max_size;
  absl::Mutex mutex;
  std::multimap<size_t, uint8_t*> idle ABSL_GUARDED_BY(mutex);
};

}  // namespace internal

CudaBuffer::CudaBuffer(CudaBuffer&& other) noexcept { *this = std::move(other); }

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void CudaBuffer::Release() {
  if (pool_ == nullptr) return;
  pool_->Return(data_, capacity_);
  pool_.reset();
  data_ = nullptr;
  size_ = capacity_ = 0;
}

struct CudaTransferPath::State {
  CudaTransferOptions options;
  std::shared_ptr<internal::CudaPool> host_pool;
  std::shared_ptr<internal::CudaPool> device_pool;
  std::unique_ptr<pcie::ChunkCipher> cipher;  // emulated only
  std::unique_ptr<CudaGcm> gcm;               // emulated only
  pcie::TransferCounters counters;
  std::atomic<uint64_t> to_device_transfers{0}, to_host_transfers{0};
  std::atomic<uint64_t> to_device_size{0}, to_host_size{0};
  std::atomic<uint64_t> authentication_failures{0};
};

namespace {

using pcie::kToDeviceDirection;
using pcie::kToHostDirection;

}  // namespace

CudaTransferPath::CudaTransferPath(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaTransferPath::~CudaTransferPath() = default;

absl::StatusOr<std::unique_ptr<CudaTransferPath>> CudaTransferPath::Create(
    PcieMode mode, CudaTransferOptions options) {
  if (options.chunk_size < pcie::kMinChunkSize || options.chunk_size > pcie::kMaxChunkSize ||
      options.chunk_size % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PCIe chunk size ", options.chunk_size,
                                                   " is not a multiple of 16 in 4 KiB..64 MiB"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError("PCIe thread count must not be negative");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device for the GPU PCIe path");
  }
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  const CudaTransferOptions& o = state->options;
  state->host_pool = std::make_shared<internal::CudaPool>(
      false, o.max_idle_buffers, pcie::SealedSize(o.max_transfer_size, o.chunk_size));
  state->device_pool = std::make_shared<internal::CudaPool>(
      true, o.max_idle_buffers, pcie::SealedSize(o.max_transfer_size, o.chunk_size));
  if (mode == PcieMode::kEmulated) {
    const int threads =
        o.threads > 0 ? o.threads
                      : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    // Stands in for the session key a CC GPU agrees with its driver; it lives only in this
    // process and in the device's key schedule.
    SecretBytes key = crypto::RandomSecret(32);
    ASSIGN_OR_RETURN(state->cipher, pcie::ChunkCipher::Create(key.span(), o.chunk_size, threads));
    ASSIGN_OR_RETURN(state->gcm, CudaGcm::Create(key.span(), o.chunk_size));
  }
  std::unique_ptr<CudaTransferPath> path(new CudaTransferPath(std::move(state)));
  path->mode_ = mode;
  return path;
}

int CudaTransferPath::threads() const {
  return state_->cipher ? state_->cipher->threads() : 1;
}

absl::StatusOr<CudaBuffer> CudaTransferPath::AcquireHostStaging(size_t size) {
  RETURN_IF_ERROR(CheckTransferSize(size, state_->options.max_transfer_size));
  return state_->host_pool->Acquire(size);
}

absl::StatusOr<CudaBuffer> CudaTransferPath::AcquireDeviceStaging(size_t size) {
  RETURN_IF_ERROR(CheckTransferSize(size, state_->options.max_transfer_size));
  return state_->device_pool->Acquire(size);
}

absl::StatusOr<CudaBuffer> CudaTransferPath::ToDevice(ByteSpan host) {
  pcie::GatherPiece whole;
  return Send(host.size(), pcie::WholePiece(host, whole), host);
}

absl::StatusOr<CudaBuffer> CudaTransferPath::GatherToDevice(
    size_t size, std::span<const pcie::GatherPiece> pieces) {
  RETURN_IF_ERROR(CheckTransferSize(size, state_->options.max_transfer_size));
  RETURN_IF_ERROR(pcie::CheckGatherPieces(size, pieces));
  if (mode_ == PcieMode::kEmulated) return Send(size, pieces, {});
  ASSIGN_OR_RETURN(CudaBuffer staging, state_->host_pool->Acquire(size));
  for (const pcie::GatherPiece& piece : pieces) {
    if (piece.size > 0) std::memcpy(staging.data() + piece.offset, piece.source, piece.size);
  }
  return Send(size, {}, staging.view());
}

absl::StatusOr<CudaBuffer> CudaTransferPath::Send(size_t size,
                                                  std::span<const pcie::GatherPiece> pieces,
                                                  ByteSpan contiguous) {
  State& s = *state_;
  RETURN_IF_ERROR(CheckTransferSize(size, s.options.max_transfer_size));
  const cudaStream_t stream = cudaStreamPerThread;
  ASSIGN_OR_RETURN(CudaBuffer destination, s.device_pool->Acquire(size));
  if (mode_ == PcieMode::kEmulated) {
    ASSIGN_OR_RETURN(const uint64_t counter, s.counters.Next(kToDeviceDirection));
    const size_t sealed_size = pcie::SealedSize(size, s.options.chunk_size);
    ASSIGN_OR_RETURN(CudaBuffer sealed, s.host_pool->Acquire(sealed_size));
    RETURN_IF_ERROR(s.cipher->Seal(kToDeviceDirection, counter, size, pieces, sealed.span()));
    if (s.options.in_flight_hook_for_test) s.options.in_flight_hook_for_test(sealed.span());
    ASSIGN_OR_RETURN(CudaBuffer bounce, s.device_pool->Acquire(sealed_size));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(bounce.data(), sealed.data(), sealed_size, cudaMemcpyHostToDevice, stream),
        "copy to the device"));
    absl::Status opened = s.gcm->Open(kToDeviceDirection, counter, bounce.data(),
                                      destination.data(), size, stream, "to the device");
    if (!opened.ok()) {
      if (opened.code() == absl::StatusCode::kDataLoss) {
        s.authentication_failures.fetch_add(1, std::memory_order_relaxed);
      }
      return opened;
    }
  } else if (size > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(destination.data(), contiguous.data(), size,
                                               cudaMemcpyHostToDevice, stream),
                               "copy to the device"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "copy to the device"));
  }
  s.to_device_transfers.fetch_add(1, std::memory_order_relaxed);
  s.to_device_size.fetch_add(size, std::memory_order_relaxed);
  return destination;
}

absl::StatusOr<CudaBuffer> CudaTransferPath::ToHost(const uint8_t* device, size_t size) {
  State& s = *state_;
  RETURN_IF_ERROR(CheckTransferSize(size, s.options.max_transfer_size));
  const cudaStream_t stream = cudaStreamPerThread;
  ASSIGN_OR_RETURN(CudaBuffer destination, s.host_pool->Acquire(size));
  if (mode_ == PcieMode::kEmulated) {
    ASSIGN_OR_RETURN(const uint64_t counter, s.counters.Next(kToHostDirection));
    const size_t sealed_size = pcie::SealedSize(size, s.options.chunk_size);
    ASSIGN_OR_RETURN(CudaBuffer bounce, s.device_pool->Acquire(sealed_size));
    RETURN_IF_ERROR(s.gcm->Seal(kToHostDirection, counter, device, size, bounce.data(), stream));
    ASSIGN_OR_RETURN(CudaBuffer sealed, s.host_pool->Acquire(sealed_size));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(sealed.data(), bounce.data(), sealed_size, cudaMemcpyDeviceToHost, stream),
        "copy to the host"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "copy to the host"));
    if (s.options.in_flight_hook_for_test) s.options.in_flight_hook_for_test(sealed.span());
    absl::Status opened =
        s.cipher->Open(kToHostDirection, counter, sealed.view(), destination.span(), "to the host");
    if (!opened.ok()) {
      destination.Release();
      s.authentication_failures.fetch_add(1, std::memory_order_relaxed);
      return opened;
    }
  } else if (size > 0) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(destination.data(), device, size, cudaMemcpyDeviceToHost, stream),
        "copy to the host"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "copy to the host"));
  }
  s.to_host_transfers.fetch_add(1, std::memory_order_relaxed);
  s.to_host_size.fetch_add(size, std::memory_order_relaxed);
  return destination;
}

CudaTransferPath::Stats CudaTransferPath::stats() const {
  Stats stats;
  stats.to_device_transfers = state_->to_device_transfers.load();
  stats.to_host_transfers = state_->to_host_transfers.load();
  stats.to_device_size = state_->to_device_size.load();
  stats.to_host_size = state_->to_host_size.load();
  stats.authentication_failures = state_->authentication_failures.load();
  return stats;
}

}  // namespace cloister::gpu
