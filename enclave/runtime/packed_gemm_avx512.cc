// The AVX-512 inner loop of PackedGemm; this file alone is compiled with -mavx512f, and its
// functions run only after PackedGemmSupported() said yes.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "enclave/runtime/packed_gemm.h"

namespace cloister::runtime::internal {
namespace {

constexpr int kRows = 12;  // rows per tile: 12 x 2 vectors of sums, 24 of the 32 registers

// Panel rows the prefetch runs ahead of the multiply-adds: the weights come cold from L3 on a
// panel's first tile.
constexpr int64_t kPrefetchAhead = 8;

// C tile [R rows, the panel's 32 columns] = A rows [R, k] * panel (+ bias); `low`/`high`
// mask the panel's columns that exist.
template <int R>
void Tile(int64_t k, const float* a, int64_t lda, const float* panel, const float* bias,
          __mmask16 low_mask, __mmask16 high_mask, float* c, int64_t ldc) {
  __m512 low[R], high[R];
  const __m512 low_start = bias ? _mm512_maskz_loadu_ps(low_mask, bias) : _mm512_setzero_ps();
  const __m512 high_start =
      bias ? _mm512_maskz_loadu_ps(high_mask, bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    low[r] = low_start;
    high[r] = high_start;
  }
  constexpr int64_t kPanel = PackedWeights::kPanel;
  for (int64_t i = 0; i < k; ++i) {
    const float* row = panel + i * kPanel;
    _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchAhead * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchAhead * kPanel + 16), _MM_HINT_T0);
    const __m512 b_low = _mm512_loadu_ps(row);
    const __m512 b_high = _mm512_loadu_ps(row + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      low[r] = _mm512_fmadd_ps(x, b_low, low[r]);
      high[r] = _mm512_fmadd_ps(x, b_high, high[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, low_mask, low[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, high_mask, high[r]);
  }
}

// The last `rows` rows (fewer than kRows).
template <int R>
void TailTile(int rows, int64_t k, const float* a, int64_t lda, const float* panel,
              const float* bias, __mmask16 low_mask, __mmask16 high_mask, float* c,
              int64_t ldc) {
  if constexpr (R > 0) {
    if (rows == R) return Tile<R>(k, a, lda, panel, bias, low_mask, high_mask, c, ldc);
    TailTile<R - 1>(rows, k, a, lda, panel, bias, low_mask, high_mask, c, ldc);
  }
}

__mmask16 ColumnMask(int64_t columns) {
  if (columns >= 16) return 0xffff;
  if (columns <= 0) return 0;
  return static_cast<__mmask16>((1u << columns) - 1);
}

}  // namespace

void PackedGemmAvx512(int64_t m, const float* a, int64_t lda, const PackedWeights& b,
                      const float* bias, float* c, int64_t ldc) {
  const int64_t k = b.k(), n = b.n();
  for (int64_t p = 0; p < b.panels(); ++p) {
    const int64_t column = p * PackedWeights::kPanel;
    const int64_t columns = std::min(PackedWeights::kPanel, n - column);
    const __mmask16 low_mask = ColumnMask(columns), high_mask = ColumnMask(columns - 16);
    const float* panel = b.panel(p);
    const float* panel_bias = bias ? bias + column : nullptr;
    int64_t row = 0;
    for (; row + kRows <= m; row += kRows) {
      Tile<kRows>(k, a + row * lda, lda, panel, panel_bias, low_mask, high_mask,
                  c + row * ldc + column, ldc);
    }
    if (row < m) {
      TailTile<kRows - 1>(static_cast<int>(m - row), k, a + row * lda, lda, panel, panel_bias,
                          low_mask, high_mask, c + row * ldc + column, ldc);
    }
  }
}

}  // namespace cloister::runtime::internal
