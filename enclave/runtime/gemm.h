// Row-major matrix multiply for the kernels: C = alpha * op(A) * op(B) + beta * C.
// float and double go to BLAS (OpenBLAS sgemm/dgemm); integer types use a plain triple loop.
// Threading: BLAS's own threads; the function itself is reentrant.
#pragma once

#include <cstdint>

namespace cloister::runtime {

template <typename T>
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace cloister::runtime
