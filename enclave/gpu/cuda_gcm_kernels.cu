#include <algorithm>

#include "enclave/gpu/cuda_gcm_kernels.h"

namespace cloister::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void PowerTableKernel(gcm::KeyMaterial key, gcm::U128* powers, uint64_t entries) {
  for (uint64_t k = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; k < entries;
       k += uint64_t{gridDim.x} * blockDim.x) {
    powers[k] = k == 0 ? gcm::U128{} : gcm::PowerOfH(key, k);
  }
}

// Grid: y over chunks, x over each chunk's 16-byte blocks. Every thread XORs the GHASH terms of
// its blocks; the block's threads combine theirs and XOR the result into the chunk's sum.
__global__ void __launch_bounds__(kThreads)
    BlocksKernel(gcm::Transfer t, gcm::KeyMaterial key, const gcm::U128* powers,
                 const uint32_t* te0_table, const uint8_t* sbox_table, unsigned long long* sums) {
  __shared__ uint32_t te0[256];
  __shared__ uint8_t sbox[256];
  __shared__ gcm::U128 warp_sums[kThreads / 32];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    te0[i] = te0_table[i];
    sbox[i] = sbox_table[i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (uint32_t chunk = blockIdx.y; chunk < t.chunks; chunk += gridDim.y) {
    const uint64_t blocks = (gcm::ChunkLength(t, chunk) + 15) / 16;
    gcm::U128 sum;
    for (uint64_t block = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; block < blocks;
         block += uint64_t{gridDim.x} * blockDim.x) {
      sum = gcm::Xor(sum, gcm::ProcessBlock(t, key, powers, te0, sbox, chunk, block));
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum.hi ^= __shfl_xor_sync(0xffffffffu, sum.hi, offset);
      sum.lo ^= __shfl_xor_sync(0xffffffffu, sum.lo, offset);
    }
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      gcm::U128 total;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w)
        total = gcm::Xor(total, warp_sums[w]);
      atomicXor(&sums[2 * uint64_t{chunk}], static_cast<unsigned long long>(total.hi));
      atomicXor(&sums[2 * uint64_t{chunk} + 1], static_cast<unsigned long long>(total.lo));
    }
    __syncthreads();
  }
}

__global__ void FinishKernel(gcm::Transfer t, gcm::KeyMaterial key, const gcm::U128* powers,
                             const uint32_t* te0, const uint8_t* sbox,
                             const unsigned long long* sums, unsigned int* failures) {
  for (uint32_t chunk = blockIdx.x * blockDim.x + threadIdx.x; chunk < t.chunks;
       chunk += gridDim.x * blockDim.x) {
    const gcm::U128 sum{sums[2 * uint64_t{chunk}], sums[2 * uint64_t{chunk} + 1]};
    if (!gcm::FinishChunk(t, key, powers, te0, sbox, chunk, sum)) {
      atomicAdd(&failures[0], 1u);
      atomicMin(&failures[1], chunk);
    }
  }
}

}  // namespace

cudaError_t LaunchGcmPowerTable(const gcm::KeyMaterial& key, gcm::U128* powers, uint64_t entries,
                                cudaStream_t stream) {
  if (entries == 0) return cudaSuccess;
  const uint64_t grid = std::min<uint64_t>((entries + kThreads - 1) / kThreads, 4096);
  PowerTableKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(key, powers, entries);
  return cudaGetLastError();
}

cudaError_t LaunchGcm(const gcm::Transfer& t, const gcm::KeyMaterial& key, const gcm::U128* powers,
                      const uint32_t* te0, const uint8_t* sbox, unsigned long long* sums,
                      unsigned int* failures, cudaStream_t stream) {
  if (t.chunks == 0) return cudaSuccess;
  cudaError_t error = cudaMemsetAsync(sums, 0, sizeof(unsigned long long) * 2 * t.chunks, stream);
  if (error != cudaSuccess) return error;
  error = cudaMemsetAsync(failures, 0, sizeof(unsigned int), stream);
  if (error != cudaSuccess) return error;
  error = cudaMemsetAsync(failures + 1, 0xff, sizeof(unsigned int), stream);
  if (error != cudaSuccess) return error;
  const uint64_t chunk_blocks = (std::min(t.size, t.chunk_size) + 15) / 16;
  const unsigned x = static_cast<unsigned>(
      std::clamp<uint64_t>((chunk_blocks + kThreads - 1) / kThreads, 1, 1024));
  const unsigned y = std::min<unsigned>(t.chunks, 65535);
  BlocksKernel<<<dim3(x, y), kThreads, 0, stream>>>(t, key, powers, te0, sbox, sums);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const unsigned finish_grid = (t.chunks + kThreads - 1) / kThreads;
  FinishKernel<<<finish_grid, kThreads, 0, stream>>>(t, key, powers, te0, sbox, sums, failures);
  return cudaGetLastError();
}

}  // namespace cloister::gpu
