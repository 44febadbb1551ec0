// Reduction and normalisation kernels of the CUDA executor: reductions over strided dims,
// Softmax, LayerNorm and BatchNorm. See cuda_kernels.h for each launcher's contract.
#include <cmath>
#include <cstdint>

#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_kernels_internal.cuh"

namespace cloister::gpu {
namespace {

__global__ void ReduceKernel(ReduceOp op, const float* in, float* out, StridedIndex kept,
                             StridedIndex reduced, int64_t out_count, int64_t reduce_count) {
  CLOISTER_GRID_LOOP(i, out_count) {
    const int64_t base = OperandOffset(kept, 0, i);
    float max_value = -INFINITY;
    if (op == ReduceOp::kLogSumExp) {
      for (int64_t r = 0; r < reduce_count; ++r) {
        max_value = fmaxf(max_value, in[base + OperandOffset(reduced, 0, r)]);
      }
      if (!isfinite(max_value)) max_value = 0.f;
    }
    double accumulator;
    switch (op) {
      case ReduceOp::kMax: accumulator = -INFINITY; break;
      case ReduceOp::kMin: accumulator = INFINITY; break;
      case ReduceOp::kProd: accumulator = 1.0; break;
      default: accumulator = 0.0; break;
    }
    for (int64_t r = 0; r < reduce_count; ++r) {
      const float x = in[base + OperandOffset(reduced, 0, r)];
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean:
        case ReduceOp::kLogSum: accumulator += x; break;
        case ReduceOp::kMax: accumulator = fmax(accumulator, static_cast<double>(x)); break;
        case ReduceOp::kMin: accumulator = fmin(accumulator, static_cast<double>(x)); break;
        case ReduceOp::kProd: accumulator *= x; break;
        case ReduceOp::kL1: accumulator += fabsf(x); break;
        case ReduceOp::kL2:
        case ReduceOp::kSumSquare: accumulator += static_cast<double>(x) * x; break;
        case ReduceOp::kLogSumExp: accumulator += exp(static_cast<double>(x - max_value)); break;
      }
    }
    switch (op) {
      case ReduceOp::kMean:
        accumulator = reduce_count > 0 ? accumulator / reduce_count : NAN;
        break;
      case ReduceOp::kL2: accumulator = sqrt(accumulator); break;
      case ReduceOp::kLogSum: accumulator = log(accumulator); break;
      case ReduceOp::kLogSumExp: accumulator = log(accumulator) + max_value; break;
      default: break;
    }
    out[i] = static_cast<float>(accumulator);
  }
}

__global__ void SoftmaxKernel(const float* in, float* out, int64_t outer, int64_t axis_count,
                              int64_t inner, bool log) {
  const int64_t count = outer * inner;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t o = i / inner;
    const int64_t k = i % inner;
    const float* row = in + o * axis_count * inner + k;
    float* target = out + o * axis_count * inner + k;
    float max_value = -INFINITY;
    for (int64_t j = 0; j < axis_count; ++j) max_value = fmaxf(max_value, row[j * inner]);
    double sum = 0.0;
    for (int64_t j = 0; j < axis_count; ++j) sum += expf(row[j * inner] - max_value);
    const float log_sum = static_cast<float>(::log(sum));
    const float inverse = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < axis_count; ++j) {
      const float shifted = row[j * inner] - max_value;
      target[j * inner] = log ? shifted - log_sum : expf(shifted) * inverse;
    }
  }
}

__global__ void LayerNormKernel(const float* in, const float* scale, const float* bias,
                                float* out, int64_t rows, int64_t row_size, float epsilon) {
  CLOISTER_GRID_LOOP(r, rows) {
    const float* x = in + r * row_size;
    float* y = out + r * row_size;
    double sum = 0.0;
    for (int64_t j = 0; j < row_size; ++j) sum += x[j];
    const float mean = static_cast<float>(sum / row_size);
    double squares = 0.0;
    for (int64_t j = 0; j < row_size; ++j) {
      const float d = x[j] - mean;
      squares += static_cast<double>(d) * d;
    }
    const float inverse = 1.f / sqrtf(static_cast<float>(squares / row_size) + epsilon);
    for (int64_t j = 0; j < row_size; ++j) {
      float value = (x[j] - mean) * inverse * scale[j];
      if (bias != nullptr) value += bias[j];
      y[j] = value;
    }
  }
}

__global__ void BatchNormKernel(const float* in, const float* scale, const float* bias,
                                const float* mean, const float* variance, float* out, int64_t n,
                                int64_t channels, int64_t inner, float epsilon) {
  const int64_t count = n * channels * inner;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t c = (i / inner) % channels;
    out[i] = (in[i] - mean[c]) / sqrtf(variance[c] + epsilon) * scale[c] + bias[c];
  }
}

}  // namespace

cudaError_t LaunchReduce(ReduceOp op, const float* in, float* out, const StridedIndex& kept,
                         const StridedIndex& reduced, cudaStream_t stream) {
  const int64_t out_count = IndexCount(kept);
  if (out_count <= 0) return cudaSuccess;
  ReduceKernel<<<BlocksFor(out_count), kThreads, 0, stream>>>(op, in, out, kept, reduced,
                                                               out_count, IndexCount(reduced));
  return cudaGetLastError();
}

cudaError_t LaunchSoftmax(const float* in, float* out, int64_t outer, int64_t axis_count,
                          int64_t inner, bool log, cudaStream_t stream) {
  const int64_t count = outer * inner;
  if (count <= 0 || axis_count <= 0) return cudaSuccess;
  SoftmaxKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, out, outer, axis_count, inner,
                                                            log);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNorm(const float* in, const float* scale, const float* bias, float* out,
                            int64_t rows, int64_t row_size, float epsilon, cudaStream_t stream) {
  if (rows <= 0 || row_size <= 0) return cudaSuccess;
  LayerNormKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(in, scale, bias, out, rows, row_size,
                                                             epsilon);
  return cudaGetLastError();
}

cudaError_t LaunchBatchNorm(const float* in, const float* scale, const float* bias,
                            const float* mean, const float* variance, float* out, int64_t n,
                            int64_t channels, int64_t inner, float epsilon, cudaStream_t stream) {
  const int64_t count = n * channels * inner;
  if (count <= 0) return cudaSuccess;
  BatchNormKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, scale, bias, mean, variance, out,
                                                              n, channels, inner, epsilon);
  return cudaGetLastError();
}

}  // namespace cloister::gpu
