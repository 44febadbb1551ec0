// Row-major matrix multiply for the kernels: C = alpha * op(A) * op(B) + beta * C.
// float and double go to BLAS (OpenBLAS sgemm/dgemm); integer types use a plain triple loop.
// Threading: BLAS's own threads; the functions are reentrant. GemmInRowParts also splits a
// product over a run's workers (then BLAS is single-threaded: LoadOptions::threads).
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "base/task_pool.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/parallel.h"
#include "enclave/runtime/tensor.h"

namespace cloister::runtime {

template <typename T>
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Multiply-adds per row block of GemmInRowBlocks: a few to a few tens of milliseconds on one
// core. Each block repacks B, so smaller blocks cost throughput: 2^26 made BERT-mini's batch-64
// runs 5 to 9 per cent slower on the CPU executor; 2^28 keeps that within the noise.
inline constexpr int64_t kRowBlockMultiplyAdds = int64_t{1} << 28;

// Gemm over blocks of whole rows of C of about `block_multiply_adds` each, calling `between()`
// (returning absl::Status; the kernels pass their run's deadline check) between two blocks and
// returning its first error, so that one huge product stops at the run's deadline instead of
// running to its end. The rows after the error are left as they were.
template <typename T, typename Between>
absl::Status GemmInRowBlocks(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                             T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
                             T* c, int64_t ldc, Between&& between,
                             int64_t block_multiply_adds = kRowBlockMultiplyAdds) {
  const int64_t rows = std::max<int64_t>(1, block_multiply_adds / std::max<int64_t>(1, n * k));
  if (m <= rows) {
    Gemm<T>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return absl::OkStatus();
  }
  for (int64_t first = 0; first < m; first += rows) {
    if (first > 0) {
      absl::Status status = between();
      if (!status.ok()) return status;
    }
    // Rows of op(A): rows of A, or columns of A when it is transposed.
    const T* block = transpose_a ? a + first : a + first * lda;
    Gemm<T>(transpose_a, transpose_b, std::min(rows, m - first), n, k, alpha, block, lda, b, ldb,
            beta, c + first * ldc, ldc);
  }
  return absl::OkStatus();
}

// Multiply-adds below which a product is not worth splitting over workers (a part's hand-off to
// another thread costs some microseconds).
inline constexpr int64_t kMinPartMultiplyAdds = int64_t{1} << 18;

// The parts a product of m x n x k multiply-adds splits into over `workers` (parallel.h
// PartsFor): at most one per worker and per row, each of at least kMinPartMultiplyAdds.
inline int64_t RowParts(const TaskPool* workers, int64_t m, int64_t n, int64_t k) {
  return PartsFor(workers, m, m * n * k, kMinPartMultiplyAdds);
}

// GemmInRowBlocks with the rows of C split into contiguous parts that run side by side on
// `workers` (RowParts); with no workers, or a product too small to split, it is
// GemmInRowBlocks. `between` must be thread-safe. On an error the parts that had not finished
// leave their later rows as they were.
template <typename T, typename Between>
absl::Status GemmInRowParts(TaskPool* workers, bool transpose_a, bool transpose_b, int64_t m,
                            int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                            int64_t ldb, T beta, T* c, int64_t ldc, Between&& between) {
  return RunInParts(workers, m, RowParts(workers, m, n, k), [&](int64_t first, int64_t last) {
    const T* rows = transpose_a ? a + first : a + first * lda;
    return GemmInRowBlocks<T>(transpose_a, transpose_b, last - first, n, k, alpha, rows, lda, b,
                              ldb, beta, c + first * ldc, ldc, between);
  });
}

// The element types Gemm has (see dispatch.h for the other type sets).
using GemmTypes = ElementTypes<float, double, int32_t, int64_t, uint32_t, uint64_t>;

}  // namespace cloister::runtime
