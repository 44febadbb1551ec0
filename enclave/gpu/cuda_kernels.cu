// The CUDA executor's own kernels: simple grid-stride loops with 64-bit indices, one thread per
// output element. See cuda_kernels.h for each launcher's contract.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "enclave/gpu/cuda_kernels.h"

namespace cloister::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// Blocks for `count` work items (at least one; callers skip count == 0).
unsigned BlocksFor(int64_t count) {
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

int64_t IndexCount(const StridedIndex& index) {
  int64_t count = 1;
  for (int d = 0; d < index.rank; ++d) count *= index.dims[d];
  return count;
}

#define CLOISTER_GRID_LOOP(i, count)                                                     \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

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

__device__ __forceinline__ float ApplyUnary(UnaryOp op, float x, float alpha, float beta) {
  switch (op) {
    case UnaryOp::kRelu: return x > 0.f ? x : 0.f;
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return fabsf(x);
    case UnaryOp::kSign: return x > 0.f ? 1.f : (x < 0.f ? -1.f : 0.f);
    case UnaryOp::kSigmoid: return 1.f / (1.f + expf(-x));
    case UnaryOp::kTanh: return tanhf(x);
    case UnaryOp::kErf: return erff(x);
    case UnaryOp::kSqrt: return sqrtf(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kLog: return logf(x);
    case UnaryOp::kSin: return sinf(x);
    case UnaryOp::kCos: return cosf(x);
    case UnaryOp::kTan: return tanf(x);
    case UnaryOp::kAsin: return asinf(x);
    case UnaryOp::kAcos: return acosf(x);
    case UnaryOp::kAtan: return atanf(x);
    case UnaryOp::kSinh: return sinhf(x);
    case UnaryOp::kCosh: return coshf(x);
    case UnaryOp::kAsinh: return asinhf(x);
    case UnaryOp::kAcosh: return acoshf(x);
    case UnaryOp::kAtanh: return atanhf(x);
    case UnaryOp::kFloor: return floorf(x);
    case UnaryOp::kCeil: return ceilf(x);
    case UnaryOp::kRound: return rintf(x);  // half to even, as ONNX Round
    case UnaryOp::kReciprocal: return 1.f / x;
    case UnaryOp::kSoftsign: return x / (1.f + fabsf(x));
    case UnaryOp::kSoftplus: return x > 20.f ? x : log1pf(expf(x));
    case UnaryOp::kHardSwish: return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
    case UnaryOp::kHardSigmoid: return fminf(fmaxf(alpha * x + beta, 0.f), 1.f);
    case UnaryOp::kLeakyRelu: return x >= 0.f ? x : alpha * x;
    case UnaryOp::kElu: return x >= 0.f ? x : alpha * (expf(x) - 1.f);
    case UnaryOp::kCelu: return fmaxf(0.f, x) + fminf(0.f, alpha * (expf(x / alpha) - 1.f));
    case UnaryOp::kSelu: return x > 0.f ? beta * x : beta * (alpha * expf(x) - alpha);
    case UnaryOp::kThresholdedRelu: return x > alpha ? x : 0.f;
    case UnaryOp::kGelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case UnaryOp::kGeluTanh:
      return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case UnaryOp::kClip: return x < alpha ? alpha : (x > beta ? beta : x);
    case UnaryOp::kIdentity: return x;
  }
  return x;
}

__global__ void UnaryKernel(UnaryOp op, float alpha, float beta, const float* in, float* out,
                            int64_t count) {
  CLOISTER_GRID_LOOP(i, count) { out[i] = ApplyUnary(op, in[i], alpha, beta); }
}

template <typename T>
__device__ __forceinline__ T PowOf(T a, T b) {
  return static_cast<T>(pow(static_cast<double>(a), static_cast<double>(b)));
}
__device__ __forceinline__ float PowOf(float a, float b) { return powf(a, b); }

template <typename T>
__device__ __forceinline__ T DivOf(T a, T b) {
  return b == T(0) ? T(0) : a / b;  // integer division by zero: 0 rather than a trap
}
__device__ __forceinline__ float DivOf(float a, float b) { return a / b; }
__device__ __forceinline__ double DivOf(double a, double b) { return a / b; }

template <typename T>
__global__ void ArithmeticKernel(BinaryOp op, const T* a, const T* b, T* out, StridedIndex index,
                                 int64_t count) {
  CLOISTER_GRID_LOOP(i, count) {
    const T x = a[OperandOffset(index, 0, i)];
    const T y = b[OperandOffset(index, 1, i)];
    T result;
    switch (op) {
      case BinaryOp::kAdd: result = x + y; break;
      case BinaryOp::kSub: result = x - y; break;
      case BinaryOp::kMul: result = x * y; break;
      case BinaryOp::kDiv: result = DivOf(x, y); break;
      case BinaryOp::kPow: result = PowOf(x, y); break;
      case BinaryOp::kPRelu: result = x < T(0) ? x * y : x; break;
      case BinaryOp::kMax: result = x > y ? x : y; break;
      case BinaryOp::kMin: result = x < y ? x : y; break;
      default: result = T(0); break;
    }
    out[OperandOffset(index, 2, i)] = result;
  }
}

template <typename T>
__global__ void CompareKernel(BinaryOp op, const T* a, const T* b, bool* out, StridedIndex index,
                              int64_t count) {
  CLOISTER_GRID_LOOP(i, count) {
    const T x = a[OperandOffset(index, 0, i)];
    const T y = b[OperandOffset(index, 1, i)];
    bool result;
    switch (op) {
      case BinaryOp::kEqual: result = x == y; break;
      case BinaryOp::kLess: result = x < y; break;
      case BinaryOp::kGreater: result = x > y; break;
      case BinaryOp::kLessOrEqual: result = x <= y; break;
      case BinaryOp::kGreaterOrEqual: result = x >= y; break;
      case BinaryOp::kAnd: result = (x != T(0)) && (y != T(0)); break;
      case BinaryOp::kOr: result = (x != T(0)) || (y != T(0)); break;
      case BinaryOp::kXor: result = (x != T(0)) != (y != T(0)); break;
      default: result = false; break;
    }
    out[OperandOffset(index, 2, i)] = result;
  }
}

bool IsComparison(BinaryOp op) {
  return op == BinaryOp::kEqual || op == BinaryOp::kLess || op == BinaryOp::kGreater ||
         op == BinaryOp::kLessOrEqual || op == BinaryOp::kGreaterOrEqual ||
         op == BinaryOp::kAnd || op == BinaryOp::kOr || op == BinaryOp::kXor;
}

template <typename T>
cudaError_t BinaryFor(BinaryOp op, const void* a, const void* b, void* out,
                      const StridedIndex& index, int64_t count, cudaStream_t stream) {
  if (IsComparison(op)) {
    CompareKernel<T><<<BlocksFor(count), kThreads, 0, stream>>>(
        op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<bool*>(out), index,
        count);
  } else {
    ArithmeticKernel<T><<<BlocksFor(count), kThreads, 0, stream>>>(
        op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), index,
        count);
  }
  return cudaGetLastError();
}

template <int kSize>
struct Bytes {
  unsigned char value[kSize];
};

template <typename T>
__global__ void WhereKernel(const bool* cond, const T* x, const T* y, T* out, StridedIndex index,
                            int64_t count) {
  CLOISTER_GRID_LOOP(i, count) {
    out[i] = cond[OperandOffset(index, 0, i)] ? x[OperandOffset(index, 1, i)]
                                              : y[OperandOffset(index, 2, i)];
  }
}

template <typename T>
__global__ void StridedCopyKernel(const T* in, T* out, StridedIndex index, int64_t count) {
  CLOISTER_GRID_LOOP(i, count) {
    out[OperandOffset(index, 2, i)] = in[OperandOffset(index, 0, i)];
  }
}

template <typename From, typename To>
__device__ __forceinline__ To Convert(From value) {
  return static_cast<To>(value);
}
template <>
__device__ __forceinline__ bool Convert<float, bool>(float value) { return value != 0.f; }
template <>
__device__ __forceinline__ bool Convert<double, bool>(double value) { return value != 0.0; }

template <typename From, typename To>
__global__ void CastKernel(const From* in, To* out, int64_t count) {
  CLOISTER_GRID_LOOP(i, count) { out[i] = Convert<From, To>(in[i]); }
}
template <typename To>
__global__ void CastFromHalfKernel(const __half* in, To* out, int64_t count) {
  CLOISTER_GRID_LOOP(i, count) { out[i] = Convert<float, To>(__half2float(in[i])); }
}
template <typename From>
__global__ void CastToHalfKernel(const From* in, __half* out, int64_t count) {
  CLOISTER_GRID_LOOP(i, count) { out[i] = __float2half_rn(static_cast<float>(in[i])); }
}

template <typename From>
cudaError_t CastFrom(DeviceType to, const From* in, void* out, int64_t count,
                     cudaStream_t stream) {
  const unsigned blocks = BlocksFor(count);
  switch (to) {
#define CLOISTER_CAST_CASE(tag, type)                                                        \
  case DeviceType::tag:                                                                      \
    CastKernel<From, type><<<blocks, kThreads, 0, stream>>>(in, static_cast<type*>(out),     \
                                                            count);                          \
    break;
    CLOISTER_CAST_CASE(kFloat, float)
    CLOISTER_CAST_CASE(kDouble, double)
    CLOISTER_CAST_CASE(kInt8, int8_t)
    CLOISTER_CAST_CASE(kInt16, int16_t)
    CLOISTER_CAST_CASE(kInt32, int32_t)
    CLOISTER_CAST_CASE(kInt64, int64_t)
    CLOISTER_CAST_CASE(kUint8, uint8_t)
    CLOISTER_CAST_CASE(kUint16, uint16_t)
    CLOISTER_CAST_CASE(kUint32, uint32_t)
    CLOISTER_CAST_CASE(kUint64, uint64_t)
    CLOISTER_CAST_CASE(kBool, bool)
#undef CLOISTER_CAST_CASE
    case DeviceType::kHalf:
      CastToHalfKernel<From><<<blocks, kThreads, 0, stream>>>(in, static_cast<__half*>(out),
                                                              count);
      break;
  }
  return cudaGetLastError();
}

cudaError_t CastFromHalf(DeviceType to, const __half* in, void* out, int64_t count,
                         cudaStream_t stream) {
  const unsigned blocks = BlocksFor(count);
  switch (to) {
#define CLOISTER_CAST_CASE(tag, type)                                                         \
  case DeviceType::tag:                                                                       \
    CastFromHalfKernel<type><<<blocks, kThreads, 0, stream>>>(in, static_cast<type*>(out),    \
                                                              count);                         \
    break;
    CLOISTER_CAST_CASE(kFloat, float)
    CLOISTER_CAST_CASE(kDouble, double)
    CLOISTER_CAST_CASE(kInt8, int8_t)
    CLOISTER_CAST_CASE(kInt16, int16_t)
    CLOISTER_CAST_CASE(kInt32, int32_t)
    CLOISTER_CAST_CASE(kInt64, int64_t)
    CLOISTER_CAST_CASE(kUint8, uint8_t)
    CLOISTER_CAST_CASE(kUint16, uint16_t)
    CLOISTER_CAST_CASE(kUint32, uint32_t)
    CLOISTER_CAST_CASE(kUint64, uint64_t)
    CLOISTER_CAST_CASE(kBool, bool)
#undef CLOISTER_CAST_CASE
    case DeviceType::kHalf:
      return cudaMemcpyAsync(out, in, count * sizeof(__half), cudaMemcpyDeviceToDevice, stream);
  }
  return cudaGetLastError();
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

__device__ __forceinline__ int64_t OutSpatialCount(const WindowGeometry& g) {
  return g.out_dims[0] * g.out_dims[1] * g.out_dims[2];
}
__device__ __forceinline__ int64_t InSpatialCount(const WindowGeometry& g) {
  return g.in_dims[0] * g.in_dims[1] * g.in_dims[2];
}

__global__ void ConvDirectKernel(const float* in, const float* weight, const float* bias,
                                 float* out, WindowGeometry g) {
  const int64_t out_spatial = OutSpatialCount(g);
  const int64_t in_spatial = InSpatialCount(g);
  const int64_t count = g.batch * g.out_channels * out_spatial;
  const int64_t group_in = g.in_channels / g.groups;
  const int64_t group_out = g.out_channels / g.groups;
  const int64_t kernel_size = g.kernel[0] * g.kernel[1] * g.kernel[2];
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t p = i % out_spatial;
    const int64_t m = (i / out_spatial) % g.out_channels;
    const int64_t n = i / (out_spatial * g.out_channels);
    const int64_t o2 = p % g.out_dims[2];
    const int64_t o1 = (p / g.out_dims[2]) % g.out_dims[1];
    const int64_t o0 = p / (g.out_dims[2] * g.out_dims[1]);
    const int64_t group = m / group_out;
    float sum = bias != nullptr ? bias[m] : 0.f;
    for (int64_t c = 0; c < group_in; ++c) {
      const float* plane = in + (n * g.in_channels + group * group_in + c) * in_spatial;
      const float* w = weight + (m * group_in + c) * kernel_size;
      for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
        const int64_t x0 = o0 * g.strides[0] - g.pads_begin[0] + k0 * g.dilations[0];
        if (x0 < 0 || x0 >= g.in_dims[0]) continue;
        for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
          const int64_t x1 = o1 * g.strides[1] - g.pads_begin[1] + k1 * g.dilations[1];
          if (x1 < 0 || x1 >= g.in_dims[1]) continue;
          for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
            const int64_t x2 = o2 * g.strides[2] - g.pads_begin[2] + k2 * g.dilations[2];
            if (x2 < 0 || x2 >= g.in_dims[2]) continue;
            sum += plane[(x0 * g.in_dims[1] + x1) * g.in_dims[2] + x2] *
                   w[(k0 * g.kernel[1] + k1) * g.kernel[2] + k2];
          }
        }
      }
    }
    out[i] = sum;
  }
}

__global__ void Im2ColKernel(const float* in, float* col, WindowGeometry g, int64_t image,
                             int64_t channel_begin) {
  const int64_t out_spatial = OutSpatialCount(g);
  const int64_t in_spatial = InSpatialCount(g);
  const int64_t group_in = g.in_channels / g.groups;
  const int64_t kernel_size = g.kernel[0] * g.kernel[1] * g.kernel[2];
  const int64_t count = group_in * kernel_size * out_spatial;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t p = i % out_spatial;
    const int64_t row = i / out_spatial;
    const int64_t k = row % kernel_size;
    const int64_t c = row / kernel_size;
    const int64_t k2 = k % g.kernel[2];
    const int64_t k1 = (k / g.kernel[2]) % g.kernel[1];
    const int64_t k0 = k / (g.kernel[2] * g.kernel[1]);
    const int64_t o2 = p % g.out_dims[2];
    const int64_t o1 = (p / g.out_dims[2]) % g.out_dims[1];
    const int64_t o0 = p / (g.out_dims[2] * g.out_dims[1]);
    const int64_t x0 = o0 * g.strides[0] - g.pads_begin[0] + k0 * g.dilations[0];
    const int64_t x1 = o1 * g.strides[1] - g.pads_begin[1] + k1 * g.dilations[1];
    const int64_t x2 = o2 * g.strides[2] - g.pads_begin[2] + k2 * g.dilations[2];
    float value = 0.f;
    if (x0 >= 0 && x0 < g.in_dims[0] && x1 >= 0 && x1 < g.in_dims[1] && x2 >= 0 &&
        x2 < g.in_dims[2]) {
      value = in[(image * g.in_channels + channel_begin + c) * in_spatial +
                 (x0 * g.in_dims[1] + x1) * g.in_dims[2] + x2];
    }
    col[i] = value;
  }
}

__global__ void AddChannelBiasKernel(float* out, const float* bias, int64_t n, int64_t channels,
                                     int64_t inner) {
  const int64_t count = n * channels * inner;
  CLOISTER_GRID_LOOP(i, count) { out[i] += bias[(i / inner) % channels]; }
}

__global__ void PoolKernel(const float* in, float* out, WindowGeometry g, bool max_pool,
                           bool count_include_pad) {
  const int64_t out_spatial = OutSpatialCount(g);
  const int64_t in_spatial = InSpatialCount(g);
  const int64_t count = g.batch * g.in_channels * out_spatial;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t p = i % out_spatial;
    const int64_t plane_index = i / out_spatial;
    const float* plane = in + plane_index * in_spatial;
    const int64_t o2 = p % g.out_dims[2];
    const int64_t o1 = (p / g.out_dims[2]) % g.out_dims[1];
    const int64_t o0 = p / (g.out_dims[2] * g.out_dims[1]);
    float best = -INFINITY;
    double sum = 0.0;
    int64_t in_range = 0;
    int64_t window = 0;
    for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
      const int64_t x0 = o0 * g.strides[0] - g.pads_begin[0] + k0 * g.dilations[0];
      for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
        const int64_t x1 = o1 * g.strides[1] - g.pads_begin[1] + k1 * g.dilations[1];
        for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
          const int64_t x2 = o2 * g.strides[2] - g.pads_begin[2] + k2 * g.dilations[2];
          // The window counted with padding stops at the padded input's end.
          const bool in_padded =
              x0 < g.in_dims[0] + g.pads_end[0] && x1 < g.in_dims[1] + g.pads_end[1] &&
              x2 < g.in_dims[2] + g.pads_end[2];
          if (x0 < 0 || x0 >= g.in_dims[0] || x1 < 0 || x1 >= g.in_dims[1] || x2 < 0 ||
              x2 >= g.in_dims[2]) {
            if (in_padded) ++window;
            continue;
          }
          ++window;
          const float value = plane[(x0 * g.in_dims[1] + x1) * g.in_dims[2] + x2];
          best = fmaxf(best, value);
          sum += value;
          ++in_range;
        }
      }
    }
    if (max_pool) {
      out[i] = best;
    } else {
      const int64_t divisor = count_include_pad ? window : in_range;
      out[i] = divisor > 0 ? static_cast<float>(sum / divisor) : 0.f;
    }
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

cudaError_t LaunchUnary(UnaryOp op, float alpha, float beta, const float* in, float* out,
                        int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  UnaryKernel<<<BlocksFor(count), kThreads, 0, stream>>>(op, alpha, beta, in, out, count);
  return cudaGetLastError();
}

cudaError_t LaunchBinary(BinaryOp op, DeviceType type, const void* a, const void* b, void* out,
                         const StridedIndex& index, cudaStream_t stream) {
  const int64_t count = IndexCount(index);
  if (count <= 0) return cudaSuccess;
  switch (type) {
    case DeviceType::kFloat: return BinaryFor<float>(op, a, b, out, index, count, stream);
    case DeviceType::kDouble: return BinaryFor<double>(op, a, b, out, index, count, stream);
    case DeviceType::kInt32: return BinaryFor<int32_t>(op, a, b, out, index, count, stream);
    case DeviceType::kInt64: return BinaryFor<int64_t>(op, a, b, out, index, count, stream);
    case DeviceType::kBool:
      if (!IsComparison(op)) return cudaErrorInvalidValue;
      return BinaryFor<bool>(op, a, b, out, index, count, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchWhere(const bool* cond, const void* x, const void* y, void* out,
                        int element_size, const StridedIndex& index, cudaStream_t stream) {
  const int64_t count = IndexCount(index);
  if (count <= 0) return cudaSuccess;
  const unsigned blocks = BlocksFor(count);
  switch (element_size) {
#define CLOISTER_WHERE_CASE(size, type)                                                     \
  case size:                                                                                \
    WhereKernel<type><<<blocks, kThreads, 0, stream>>>(cond, static_cast<const type*>(x),   \
                                                       static_cast<const type*>(y),         \
                                                       static_cast<type*>(out), index, count); \
    break;
    CLOISTER_WHERE_CASE(1, uint8_t)
    CLOISTER_WHERE_CASE(2, uint16_t)
    CLOISTER_WHERE_CASE(4, uint32_t)
    CLOISTER_WHERE_CASE(8, uint64_t)
#undef CLOISTER_WHERE_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

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

cudaError_t LaunchCast(DeviceType from, DeviceType to, const void* in, void* out, int64_t count,
                       cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  switch (from) {
#define CLOISTER_FROM_CASE(tag, type) \
  case DeviceType::tag: return CastFrom<type>(to, static_cast<const type*>(in), out, count, stream);
    CLOISTER_FROM_CASE(kFloat, float)
    CLOISTER_FROM_CASE(kDouble, double)
    CLOISTER_FROM_CASE(kInt8, int8_t)
    CLOISTER_FROM_CASE(kInt16, int16_t)
    CLOISTER_FROM_CASE(kInt32, int32_t)
    CLOISTER_FROM_CASE(kInt64, int64_t)
    CLOISTER_FROM_CASE(kUint8, uint8_t)
    CLOISTER_FROM_CASE(kUint16, uint16_t)
    CLOISTER_FROM_CASE(kUint32, uint32_t)
    CLOISTER_FROM_CASE(kUint64, uint64_t)
    CLOISTER_FROM_CASE(kBool, bool)
#undef CLOISTER_FROM_CASE
    case DeviceType::kHalf:
      return CastFromHalf(to, static_cast<const __half*>(in), out, count, stream);
  }
  return cudaErrorInvalidValue;
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

cudaError_t LaunchConvDirect(const float* in, const float* weight, const float* bias, float* out,
                             const WindowGeometry& geometry, cudaStream_t stream) {
  const int64_t count = geometry.batch * geometry.out_channels * geometry.out_dims[0] *
                        geometry.out_dims[1] * geometry.out_dims[2];
  if (count <= 0) return cudaSuccess;
  if (geometry.groups <= 0 || geometry.in_channels % geometry.groups != 0 ||
      geometry.out_channels % geometry.groups != 0) {
    return cudaErrorInvalidValue;
  }
  ConvDirectKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, weight, bias, out, geometry);
  return cudaGetLastError();
}

cudaError_t LaunchIm2Col(const float* in, float* col, const WindowGeometry& geometry,
                         int64_t image, int64_t channel_begin, cudaStream_t stream) {
  if (geometry.groups <= 0 || geometry.in_channels % geometry.groups != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t count = geometry.in_channels / geometry.groups * geometry.kernel[0] *
                        geometry.kernel[1] * geometry.kernel[2] * geometry.out_dims[0] *
                        geometry.out_dims[1] * geometry.out_dims[2];
  if (count <= 0) return cudaSuccess;
  Im2ColKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, col, geometry, image,
                                                           channel_begin);
  return cudaGetLastError();
}

cudaError_t LaunchAddChannelBias(float* out, const float* bias, int64_t n, int64_t channels,
                                 int64_t inner, cudaStream_t stream) {
  const int64_t count = n * channels * inner;
  if (count <= 0) return cudaSuccess;
  AddChannelBiasKernel<<<BlocksFor(count), kThreads, 0, stream>>>(out, bias, n, channels, inner);
  return cudaGetLastError();
}

cudaError_t LaunchPool(const float* in, float* out, const WindowGeometry& geometry, bool max_pool,
                       bool count_include_pad, cudaStream_t stream) {
  const int64_t count = geometry.batch * geometry.in_channels * geometry.out_dims[0] *
                        geometry.out_dims[1] * geometry.out_dims[2];
  if (count <= 0) return cudaSuccess;
  PoolKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, out, geometry, max_pool,
                                                         count_include_pad);
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
