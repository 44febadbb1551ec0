// Row-major matrix multiply for the kernels: C = alpha * op(A) * op(B) + beta * C.
// float and double go to BLAS (OpenBLAS sgemm/dgemm); integer types use a plain triple loop.
// Threading: BLAS's own threads; the function itself is reentrant.
#pragma once

#include <cstdint>

#include "enclave/runtime/tensor.h"

namespace cloister::runtime {

template <typename T>
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Runs `f` with a value of the element type of `dtype` when Gemm has that type (float, double,
// int32, int64, uint32, uint64); false otherwise (see dispatch.h for the other type sets).
template <typename F>
bool DispatchGemm(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat:
      f(float{});
      return true;
    case DataType::kDouble:
      f(double{});
      return true;
    case DataType::kInt32:
      f(int32_t{});
      return true;
    case DataType::kInt64:
      f(int64_t{});
      return true;
    case DataType::kUint32:
      f(uint32_t{});
      return true;
    case DataType::kUint64:
      f(uint64_t{});
      return true;
    default:
      return false;
  }
}

}  // namespace cloister::runtime
