#include "enclave/runtime/packed_gemm.h"

#include <algorithm>

namespace cloister::runtime {

PackedWeights::PackedWeights(const float* b, int64_t k, int64_t n, int64_t ldb)
    : k_(k), n_(n), data_(static_cast<size_t>(panels() * k * kPanel), 0.0f) {
  for (int64_t p = 0; p < panels(); ++p) {
    const int64_t first = p * kPanel, columns = std::min(kPanel, n - first);
    float* out = data_.data() + p * k * kPanel;
    for (int64_t row = 0; row < k; ++row) {
      std::copy(b + row * ldb + first, b + row * ldb + first + columns, out + row * kPanel);
    }
  }
}

bool PackedGemmSupported() {
#if defined(CLOISTER_HAVE_AVX512_GEMM)
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
#else
  return false;
#endif
}

void PackedGemm(int64_t m, const float* a, int64_t lda, const PackedWeights& b, const float* bias,
                float* c, int64_t ldc, PackedEpilogue epilogue) {
#if defined(CLOISTER_HAVE_AVX512_GEMM)
  internal::PackedGemmAvx512(m, a, lda, b, bias, c, ldc, epilogue);
#else
  (void)m, (void)a, (void)lda, (void)b, (void)bias, (void)c, (void)ldc, (void)epilogue;
#endif
}

}  // namespace cloister::runtime
