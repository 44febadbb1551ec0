#include "enclave/runtime/packed_gemm.h"

#include <algorithm>
#include <vector>

#include "base/secret_bytes.h"

namespace cloister::runtime {
namespace {

// Whether rows `lda` floats apart alias in L1 (lda * 4 a multiple of 2 KiB: L1's set is picked
// by address bits 6-11, so the 12 rows of a tile fall in at most 2 of its sets, 6 or more rows
// to a set of 8 ways, and evict each other and the weights on every step of the sum).
bool RowsAliasInL1(int64_t lda) { return (lda * static_cast<int64_t>(sizeof(float))) % 2048 == 0; }

}  // namespace

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
  if (!RowsAliasInL1(lda)) {
    internal::PackedGemmAvx512(m, a, lda, b, bias, c, ldc, epilogue, nullptr);
    return;
  }
  // Activations (a tenant's plaintext): the copy is wiped before the call returns.
  thread_local std::vector<float> scratch;
  const size_t floats = static_cast<size_t>(internal::PackedGemmScratchFloats(m, b.k()));
  if (scratch.size() < floats) scratch.resize(floats);
  internal::PackedGemmAvx512(m, a, lda, b, bias, c, ldc, epilogue, scratch.data());
  SecureWipe(scratch.data(), sizeof(float) * floats);
#else
  (void)m, (void)a, (void)lda, (void)b, (void)bias, (void)c, (void)ldc, (void)epilogue;
#endif
}

}  // namespace cloister::runtime
