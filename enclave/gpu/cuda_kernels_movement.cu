// Data movement kernels of the CUDA executor: strided copies, Gather, Pad and Fill. See
// cuda_kernels.h for each launcher's contract.
#include <cstdint>
#include <cstring>

#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_kernels_internal.cuh"

namespace cloister::gpu {
namespace {

template <typename T>
__global__ void StridedCopyKernel(const T* in, T* out, StridedIndex index, int64_t count) {
  CLOISTER_GRID_LOOP(i, count) {
    out[OperandOffset(index, 2, i)] = in[OperandOffset(index, 0, i)];
  }
}

template <typename Index>
__global__ void GatherKernel(const unsigned char* data, int element_size, const Index* indices,
                             int64_t outer, int64_t axis_count, int64_t inner,
                             int64_t index_count, unsigned char* out, int* error_flag) {
  const int64_t count = outer * index_count * inner;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t k = i % inner;
    const int64_t j = (i / inner) % index_count;
    const int64_t o = i / (inner * index_count);
    int64_t position = static_cast<int64_t>(indices[j]);
    if (position < 0) position += axis_count;
    unsigned char* target = out + i * element_size;
    if (position < 0 || position >= axis_count) {
      for (int b = 0; b < element_size; ++b) target[b] = 0;
      *error_flag = 1;
      continue;
    }
    const unsigned char* source = data + ((o * axis_count + position) * inner + k) * element_size;
    for (int b = 0; b < element_size; ++b) target[b] = source[b];
  }
}

struct PadParams {
  int64_t in_dims[kMaxRank];
  int64_t pads_begin[kMaxRank];
  unsigned char constant[8];
};

template <typename T>
__global__ void PadKernel(const T* in, T* out, PadMode mode, StridedIndex index, PadParams params,
                          int64_t count) {
  T constant;
  memcpy(&constant, params.constant, sizeof(T));
  CLOISTER_GRID_LOOP(i, count) {
    int64_t linear = i;
    int64_t offset = 0;
    bool outside = false;
    for (int d = index.rank - 1; d >= 0; --d) {
      const int64_t coordinate = linear % index.dims[d];
      linear /= index.dims[d];
      const int64_t size = params.in_dims[d];
      int64_t source = coordinate - params.pads_begin[d];
      if (source < 0 || source >= size) {
        if (mode == PadMode::kConstant || size == 0) {
          outside = true;
          break;
        }
        if (mode == PadMode::kEdge) {
          source = source < 0 ? 0 : size - 1;
        } else if (size == 1) {
          source = 0;
        } else {
          const int64_t period = 2 * (size - 1);
          source = source % period;
          if (source < 0) source += period;
          if (source >= size) source = period - source;
        }
      }
      offset += source * index.strides[0][d];
    }
    out[i] = outside ? constant : in[offset];
  }
}

template <typename T>
__global__ void FillKernel(T* out, T value, int64_t count) {
  CLOISTER_GRID_LOOP(i, count) { out[i] = value; }
}

}  // namespace

cudaError_t LaunchStridedCopy(const void* in, void* out, int element_size,
                              const StridedIndex& index, cudaStream_t stream) {
  const int64_t count = IndexCount(index);
  if (count <= 0) return cudaSuccess;
  const unsigned blocks = BlocksFor(count);
  switch (element_size) {
#define CLOISTER_COPY_CASE(size, type)                                                       \
  case size:                                                                                 \
    StridedCopyKernel<type><<<blocks, kThreads, 0, stream>>>(                                \
        static_cast<const type*>(in), static_cast<type*>(out), index, count);                \
    break;
    CLOISTER_COPY_CASE(1, uint8_t)
    CLOISTER_COPY_CASE(2, uint16_t)
    CLOISTER_COPY_CASE(4, uint32_t)
    CLOISTER_COPY_CASE(8, uint64_t)
#undef CLOISTER_COPY_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchGather(const void* data, int element_size, const void* indices,
                         bool indices_int64, int64_t outer, int64_t axis_count, int64_t inner,
                         int64_t index_count, void* out, int* error_flag, cudaStream_t stream) {
  const int64_t count = outer * index_count * inner;
  if (count <= 0) return cudaSuccess;
  const auto* bytes = static_cast<const unsigned char*>(data);
  auto* target = static_cast<unsigned char*>(out);
  if (indices_int64) {
    GatherKernel<int64_t><<<BlocksFor(count), kThreads, 0, stream>>>(
        bytes, element_size, static_cast<const int64_t*>(indices), outer, axis_count, inner,
        index_count, target, error_flag);
  } else {
    GatherKernel<int32_t><<<BlocksFor(count), kThreads, 0, stream>>>(
        bytes, element_size, static_cast<const int32_t*>(indices), outer, axis_count, inner,
        index_count, target, error_flag);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPad(const void* in, void* out, int element_size, PadMode mode,
                      const void* constant_value, const StridedIndex& index,
                      const int64_t* in_dims, const int64_t* pads_begin, cudaStream_t stream) {
  const int64_t count = IndexCount(index);
  if (count <= 0) return cudaSuccess;
  if (index.rank > kMaxRank || element_size > 8) return cudaErrorInvalidValue;
  PadParams params = {};
  for (int d = 0; d < index.rank; ++d) {
    params.in_dims[d] = in_dims[d];
    params.pads_begin[d] = pads_begin[d];
  }
  std::memcpy(params.constant, constant_value, element_size);
  const unsigned blocks = BlocksFor(count);
  switch (element_size) {
#define CLOISTER_PAD_CASE(size, type)                                                     \
  case size:                                                                              \
    PadKernel<type><<<blocks, kThreads, 0, stream>>>(static_cast<const type*>(in),        \
                                                     static_cast<type*>(out), mode, index, \
                                                     params, count);                      \
    break;
    CLOISTER_PAD_CASE(1, uint8_t)
    CLOISTER_PAD_CASE(2, uint16_t)
    CLOISTER_PAD_CASE(4, uint32_t)
    CLOISTER_PAD_CASE(8, uint64_t)
#undef CLOISTER_PAD_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchFill(void* out, int element_size, const void* value, int64_t count,
                       cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const unsigned blocks = BlocksFor(count);
  switch (element_size) {
#define CLOISTER_FILL_CASE(size, type)                                                    \
  case size: {                                                                            \
    type bits;                                                                            \
    std::memcpy(&bits, value, size);                                                      \
    FillKernel<type><<<blocks, kThreads, 0, stream>>>(static_cast<type*>(out), bits, count); \
    break;                                                                                \
  }
    CLOISTER_FILL_CASE(1, uint8_t)
    CLOISTER_FILL_CASE(2, uint16_t)
    CLOISTER_FILL_CASE(4, uint32_t)
    CLOISTER_FILL_CASE(8, uint64_t)
#undef CLOISTER_FILL_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cloister::gpu
