#include "enclave/runtime/gemm.h"

#include <cblas.h>

#include <cstdint>

namespace cloister::runtime {
namespace {

template <typename T>
void NaiveGemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha,
               const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == T(0) ? T(0) : static_cast<T>(beta * row[j]);
    for (int64_t p = 0; p < k; ++p) {
      const T av = static_cast<T>(alpha * (transpose_a ? a[p * lda + i] : a[i * lda + p]));
      if (av == T(0)) continue;
      if (!transpose_b) {
        const T* brow = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) row[j] = static_cast<T>(row[j] + av * brow[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) row[j] = static_cast<T>(row[j] + av * b[j * ldb + p]);
      }
    }
  }
}

}  // namespace

template <>
void Gemm<float>(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  if (m == 1 && !transpose_a) {
    // A row vector: y = alpha * op(B)^T x + beta y, as a gemv on B.
    cblas_sgemv(CblasRowMajor, transpose_b ? CblasNoTrans : CblasTrans,
                transpose_b ? static_cast<int>(n) : static_cast<int>(k),
                transpose_b ? static_cast<int>(k) : static_cast<int>(n), alpha, b,
                static_cast<int>(ldb), a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

template <>
void Gemm<double>(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0 ? 0.0 : beta * c[i * ldc + j];
    }
    return;
  }
  cblas_dgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

#define CLOISTER_NAIVE_GEMM(T)                                                                \
  template <>                                                                                 \
  void Gemm<T>(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha,  \
               const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) { \
    NaiveGemm<T>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);     \
  }
CLOISTER_NAIVE_GEMM(int32_t)
CLOISTER_NAIVE_GEMM(int64_t)
CLOISTER_NAIVE_GEMM(uint32_t)
CLOISTER_NAIVE_GEMM(uint64_t)
#undef CLOISTER_NAIVE_GEMM

}  // namespace cloister::runtime
