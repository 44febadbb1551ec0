// The AVX-512 inner loop of PackedGemm; this file alone is compiled with -mavx512f, and its
// functions run only after PackedGemmSupported() said yes. It uses no inline function or
// template that other files use too (no <algorithm>, simd.h's math only on its own 16-lane
// vector type), so that no AVX-512 copy of shared code can be picked by the linker for them.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "enclave/runtime/packed_gemm.h"
#include "enclave/runtime/simd.h"

namespace cloister::runtime {
namespace {
// 16 floats: one AVX-512 register, and its comparison mask type for simd.h's math.
typedef float Lanes16 __attribute__((vector_size(64)));
typedef int32_t IntLanes16 __attribute__((vector_size(64)));
}  // namespace

namespace simd {
template <>
struct IntVector<Lanes16> {
  using type = IntLanes16;
};
}  // namespace simd

namespace internal {
namespace {

constexpr int kRows = 12;  // rows per tile: 12 x 2 vectors of sums, 24 of the 32 registers

// Panel rows the prefetch runs ahead of the multiply-adds: the weights come cold from L3 on a
// panel's first tile.
constexpr int64_t kPrefetchAhead = 8;

int64_t Smaller(int64_t a, int64_t b) { return a < b ? a : b; }

template <PackedEpilogue E>
__m512 Finish(__m512 sums) {
  if constexpr (E == PackedEpilogue::kGelu) {
    return static_cast<__m512>(simd::Gelu(static_cast<Lanes16>(sums)));
  } else {
    return sums;
  }
}

// C tile [R rows, the panel's 32 columns] = A rows [R, k] * panel (+ bias), then E;
// `low_mask`/`high_mask` select the panel's columns that exist.
template <int R, PackedEpilogue E>
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
    _mm512_mask_storeu_ps(c + r * ldc, low_mask, Finish<E>(low[r]));
    _mm512_mask_storeu_ps(c + r * ldc + 16, high_mask, Finish<E>(high[r]));
  }
}

// The last `rows` rows (fewer than kRows).
template <int R, PackedEpilogue E>
void TailTile(int rows, int64_t k, const float* a, int64_t lda, const float* panel,
              const float* bias, __mmask16 low_mask, __mmask16 high_mask, float* c,
              int64_t ldc) {
  if constexpr (R > 0) {
    if (rows == R) return Tile<R, E>(k, a, lda, panel, bias, low_mask, high_mask, c, ldc);
    TailTile<R - 1, E>(rows, k, a, lda, panel, bias, low_mask, high_mask, c, ldc);
  }
}

__mmask16 ColumnMask(int64_t columns) {
  if (columns >= 16) return 0xffff;
  if (columns <= 0) return 0;
  return static_cast<__mmask16>((1u << columns) - 1);
}

// Rows of A per chunk: a chunk (at most 240 x k floats, 960 KiB for k = 1024) stays in the
// core's L2 while every panel of B goes past it.
constexpr int64_t kChunkRows = 20 * kRows;

// The leading dimension of a chunk's copy (when the caller asks for one): a cache line (16
// floats) past k, so that the rows of a tile spread over L1's sets; two lines where one would
// land on a multiple of 2 KiB again (k = 496 read at lda 512).
int64_t PaddedLeadingDimension(int64_t k) {
  const int64_t padded = k + 16;
  return padded % 512 == 0 ? padded + 16 : padded;
}

// Rows [0, m) of C, for one chunk of rows.
template <PackedEpilogue E>
void MultiplyChunk(int64_t m, const float* a, int64_t lda, const PackedWeights& b,
                   const float* bias, float* c, int64_t ldc) {
  const int64_t k = b.k(), n = b.n();
  for (int64_t p = 0; p < b.panels(); ++p) {
    const int64_t column = p * PackedWeights::kPanel;
    const int64_t columns = Smaller(PackedWeights::kPanel, n - column);
    const __mmask16 low_mask = ColumnMask(columns), high_mask = ColumnMask(columns - 16);
    const float* panel = b.panel(p);
    const float* panel_bias = bias ? bias + column : nullptr;
    int64_t row = 0;
    for (; row + kRows <= m; row += kRows) {
      Tile<kRows, E>(k, a + row * lda, lda, panel, panel_bias, low_mask, high_mask,
                     c + row * ldc + column, ldc);
    }
    if (row < m) {
      TailTile<kRows - 1, E>(static_cast<int>(m - row), k, a + row * lda, lda, panel, panel_bias,
                             low_mask, high_mask, c + row * ldc + column, ldc);
    }
  }
}

template <PackedEpilogue E>
void Multiply(int64_t m, const float* a, int64_t lda, const PackedWeights& b, const float* bias,
              float* c, int64_t ldc, float* scratch) {
  const int64_t k = b.k();
  for (int64_t first = 0; first < m; first += kChunkRows) {
    const int64_t rows = Smaller(kChunkRows, m - first);
    const float* chunk = a + first * lda;
    int64_t chunk_lda = lda;
    if (scratch != nullptr) {
      chunk_lda = PaddedLeadingDimension(k);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(scratch + r * chunk_lda, chunk + r * lda, sizeof(float) * k);
      }
      chunk = scratch;
    }
    MultiplyChunk<E>(rows, chunk, chunk_lda, b, bias, c + first * ldc, ldc);
  }
}

}  // namespace

void PackedGemmAvx512(int64_t m, const float* a, int64_t lda, const PackedWeights& b,
                      const float* bias, float* c, int64_t ldc, PackedEpilogue epilogue,
                      float* scratch) {
  if (epilogue == PackedEpilogue::kGelu) {
    Multiply<PackedEpilogue::kGelu>(m, a, lda, b, bias, c, ldc, scratch);
  } else {
    Multiply<PackedEpilogue::kNone>(m, a, lda, b, bias, c, ldc, scratch);
  }
}

int64_t PackedGemmScratchFloats(int64_t m, int64_t k) {
  return Smaller(m, kChunkRows) * PaddedLeadingDimension(k);
}

}  // namespace internal
}  // namespace cloister::runtime
