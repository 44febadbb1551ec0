// Elementwise kernels of the CUDA executor: unary functions, broadcasting binary arithmetic,
// comparison and logic, Where and Cast. See cuda_kernels.h for each launcher's contract.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_kernels_internal.cuh"

namespace cloister::gpu {
namespace {

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


template <typename T>
__global__ void WhereKernel(const bool* cond, const T* x, const T* y, T* out, StridedIndex index,
                            int64_t count) {
  CLOISTER_GRID_LOOP(i, count) {
    out[i] = cond[OperandOffset(index, 0, i)] ? x[OperandOffset(index, 1, i)]
                                              : y[OperandOffset(index, 2, i)];
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

}  // namespace cloister::gpu
