// Launch geometry and indexing shared by the CUDA executor's kernel files (cuda_kernels_*.cu):
// simple grid-stride loops with 64-bit indices, one thread per output element. Device code:
// included only by nvcc-compiled files; the launchers' plain C++ header is cuda_kernels.h.
// Threading: stateless.
#pragma once

#include <cstdint>

#include "enclave/gpu/cuda_kernels.h"

namespace cloister::gpu::cuda_kernels_internal {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 4096;

// Blocks for `count` work items (at least one; callers skip count == 0).
inline unsigned BlocksFor(int64_t count) {
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

inline int64_t IndexCount(const StridedIndex& index) {
  int64_t count = 1;
  for (int d = 0; d < index.rank; ++d) count *= index.dims[d];
  return count;
}

// Offset of operand `operand` for linear iteration index `linear`.
__device__ __forceinline__ int64_t OperandOffset(const StridedIndex& index, int operand,
                                                 int64_t linear) {
  int64_t offset = index.offsets[operand];
  for (int d = index.rank - 1; d >= 0; --d) {
    const int64_t dim = index.dims[d];
    const int64_t coordinate = linear % dim;
    linear /= dim;
    offset += coordinate * index.strides[operand][d];
  }
  return offset;
}

}  // namespace cloister::gpu::cuda_kernels_internal

namespace cloister::gpu {
// The kernel files use these unqualified.
using cuda_kernels_internal::BlocksFor;
using cuda_kernels_internal::IndexCount;
using cuda_kernels_internal::kThreads;
using cuda_kernels_internal::OperandOffset;
}  // namespace cloister::gpu

// Runs the body for every i in [0, count) this thread owns in the grid.
#define CLOISTER_GRID_LOOP(i, count)                                                     \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
