// The LLM kernels' AVX2 (+FMA, F16C) path (kernels.h): matrix products over the 16-row panels,
// attention over the paged cache, and the vector helpers, for CPUs without AVX-512. kernels.cc
// chooses the path at run time.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "enclave/llm/kernels.h"
#include "enclave/llm/kernels_internal.h"

namespace cloister::llm::kernels_internal {

// ---- AVX2 ---------------------------------------------------------------------------------

#define CLOISTER_AVX2 __attribute__((target("avx2,fma,f16c")))

// One column of a panel, its 16 rows as two 8-lane vectors. BF16 widens with one load and two
// unpacks against zero, which leaves rows {0-3, 8-11} in lo and {4-7, 12-15} in hi; the stores
// put them back in order (kSwizzled) once per tile rather than once per column.
template <DType kType>
inline constexpr bool kSwizzled = kType == DType::kBF16;

template <DType kType>
CLOISTER_AVX2 inline void LoadColumn(const uint8_t* column, __m256& lo, __m256& hi) {
  if constexpr (kType == DType::kF32) {
    lo = _mm256_loadu_ps(reinterpret_cast<const float*>(column));
    hi = _mm256_loadu_ps(reinterpret_cast<const float*>(column) + 8);
  } else if constexpr (kType == DType::kBF16) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column));
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), bits));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), bits));
  } else {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(column)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(column) + 1));
  }
}

// The AVX-512 PanelBlock in 8-lane halves: P panels x T tokens, acc[p][t] two vectors. With 16
// registers the tiles are one panel by up to six tokens, or four panels for decode.
template <DType kType, int P, int T>
CLOISTER_AVX2 void PanelBlockAvx2(const float* x, int64_t x_stride, const WeightMatrix& w,
                                  int64_t panel, int64_t k0, int64_t k1, float* y, int64_t y_stride,
                                  int64_t row_end, bool accumulate) {
  __m256 acc[P][T][2];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[p][t][0] = acc[p][t][1] = _mm256_setzero_ps();
  const size_t element = DTypeSize(kType);
  const uint8_t* base[P];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) base[p] = w.panel(panel + p) + k0 * kPanelRows * element;
  for (int64_t k = k0; k < k1; ++k) {
    __m256 lo[P], hi[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if constexpr (T == 1) {
        _mm_prefetch(reinterpret_cast<const char*>(base[p]) + kPrefetchAhead, _MM_HINT_T0);
      }
      LoadColumn<kType>(base[p], lo[p], hi[p]);
      base[p] += kPanelRows * element;
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + t * x_stride + k);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        acc[p][t][0] = _mm256_fmadd_ps(lo[p], xb, acc[p][t][0]);
        acc[p][t][1] = _mm256_fmadd_ps(hi[p], xb, acc[p][t][1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    const int64_t row = (panel + p) * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, row_end - row);
    if (valid <= 0) break;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      __m256 lo = acc[p][t][0], hi = acc[p][t][1];
      if constexpr (kSwizzled<kType>) {
        const __m256 a = lo;
        lo = _mm256_permute2f128_ps(a, hi, 0x20);
        hi = _mm256_permute2f128_ps(a, hi, 0x31);
      }
      if (valid == kPanelRows) {
        if (accumulate) {
          lo = _mm256_add_ps(lo, _mm256_loadu_ps(out));
          hi = _mm256_add_ps(hi, _mm256_loadu_ps(out + 8));
        }
        _mm256_storeu_ps(out, lo);
        _mm256_storeu_ps(out + 8, hi);
      } else {
        alignas(32) float rows[kPanelRows];
        _mm256_store_ps(rows, lo);
        _mm256_store_ps(rows + 8, hi);
        for (int64_t i = 0; i < valid; ++i) out[i] = accumulate ? out[i] + rows[i] : rows[i];
      }
    }
  }
}

template <DType kType>
CLOISTER_AVX2 void MatMulAvx2Typed(const float* x, int64_t tokens, int64_t x_stride,
                              const WeightMatrix& w, int64_t row_begin, int64_t row_end, float* y,
                              int64_t y_stride, bool accumulate) {
  const int64_t first = row_begin / kPanelRows;
  const int64_t last = (row_end + kPanelRows - 1) / kPanelRows;  // exclusive
  if (tokens == 1) {
    // Decode: memory-bound; four panels give eight independent FMA chains.
    int64_t p = first;
    for (; p + 4 <= last; p += 4) {
      PanelBlockAvx2<kType, 4, 1>(x, x_stride, w, p, 0, w.cols, y, y_stride, row_end, accumulate);
    }
    for (; p < last; ++p) {
      PanelBlockAvx2<kType, 1, 1>(x, x_stride, w, p, 0, w.cols, y, y_stride, row_end, accumulate);
    }
    return;
  }
  // The same column slices as the AVX-512 path: one panel's slice stays in L1 while every
  // token passes over it, six tokens at a time.
  constexpr int64_t kColumnSlice = 384;
  // Tiles by token count.
  constexpr decltype(&PanelBlockAvx2<kType, 1, 1>) kTiles[] = {
      nullptr, PanelBlockAvx2<kType, 1, 1>, PanelBlockAvx2<kType, 1, 2>,
      PanelBlockAvx2<kType, 1, 3>, PanelBlockAvx2<kType, 1, 4>, PanelBlockAvx2<kType, 1, 5>,
      PanelBlockAvx2<kType, 1, 6>};
  for (int64_t p = first; p < last; ++p) {
    for (int64_t k0 = 0; k0 < w.cols; k0 += kColumnSlice) {
      const int64_t k1 = std::min(w.cols, k0 + kColumnSlice);
      const bool add = accumulate || k0 > 0;
      int64_t t = 0;
      for (; t + 6 <= tokens; t += 6) {
        kTiles[6](x + t * x_stride, x_stride, w, p, k0, k1, y + t * y_stride, y_stride, row_end,
                  add);
      }
      if (t < tokens) {
        kTiles[tokens - t](x + t * x_stride, x_stride, w, p, k0, k1, y + t * y_stride, y_stride,
                           row_end, add);
      }
    }
  }
}

CLOISTER_AVX2 inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane j of the result is the sum of v[j]'s lanes.
CLOISTER_AVX2 inline __m256 Sum8x8(const __m256* v) {
  const __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // ab holds v[0..3]'s sums of lanes 0-3 in its low half and of lanes 4-7 in its high half.
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

// All ones in the first n (0..8) lanes.
CLOISTER_AVX2 inline __m256i FirstLanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

CLOISTER_AVX2 float DotAvx2(const float* a, const float* b, int64_t size) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= size; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= size; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  if (i < size) {
    const __m256i mask = FirstLanes(size - i);
    acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mask), _mm256_maskload_ps(b + i, mask), acc1);
  }
  return Sum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

CLOISTER_AVX2 void AxpyAvx2(float a, const float* x, float* y, int64_t size) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < size; ++i) y[i] += a * x[i];
}

// Exp16 in 8 lanes. 2^n is built from exponent bits in two factors, since n reaches 128 near
// the upper clamp.
CLOISTER_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 clamped =
      _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.7f)), _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), clamped);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i whole = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(whole, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 scale1 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(whole, half), bias), 23));
  const __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, scale0), scale1);
  // Below the clamp the true value underflows to zero.
  return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ), result);
}

CLOISTER_AVX2 void SoftmaxRowAvx2(float* values, int64_t size) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= size; i += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(values + i));
  __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
  float maximum = std::max(_mm_cvtss_f32(t4), _mm_cvtss_f32(_mm_movehdup_ps(t4)));
  for (; i < size; ++i) maximum = std::max(maximum, values[i]);

  const __m256 m = _mm256_set1_ps(maximum);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= size; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(values + i), m));
    _mm256_storeu_ps(values + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < size) {
    const __m256i mask = FirstLanes(size - i);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(mask),
                                   Exp8(_mm256_sub_ps(_mm256_maskload_ps(values + i, mask), m)));
    _mm256_maskstore_ps(values + i, mask, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float inverse = 1.0f / Sum8(sum);
  const __m256 scale = _mm256_set1_ps(inverse);
  for (i = 0; i + 8 <= size; i += 8) {
    _mm256_storeu_ps(values + i, _mm256_mul_ps(_mm256_loadu_ps(values + i), scale));
  }
  for (; i < size; ++i) values[i] *= inverse;
}

CLOISTER_AVX2 void SiluMulAvx2(const float* gate, const float* up, int64_t size, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sigmoid =
        _mm256_div_ps(one, _mm256_add_ps(one, Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
  }
  for (; i < size; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// head_dim a multiple of 8. Scores go eight positions at a time so that one Sum8x8 folds eight
// dot products; then softmax per head, then the weighted values with up to 8 vectors of the
// output (head_dim 64) in registers.
CLOISTER_AVX2 void AttendPagedAvx2(const float* q, int64_t group, int64_t head_dim,
                                   const float* const* key_blocks, const float* const* value_blocks,
                                   int32_t block_size, int64_t first, int64_t last, float* scores,
                                   float* out) {
  const int64_t span = last - first + 1;
  const int64_t vectors = head_dim / 8;
  auto key_at = [&](int64_t pos) {
    return key_blocks[pos / block_size] + (pos % block_size) * head_dim;
  };
  int64_t pos = first;
  for (; pos + 8 <= last + 1; pos += 8) {
    const float* keys[8];
    for (int j = 0; j < 8; ++j) keys[j] = key_at(pos + j);
    for (int64_t h = 0; h < group; ++h) {
      const float* qh = q + h * head_dim;
      __m256 acc[8];
      const __m256 q0 = _mm256_loadu_ps(qh);
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_mul_ps(q0, _mm256_loadu_ps(keys[j]));
      for (int64_t v = 1; v < vectors; ++v) {
        const __m256 qv = _mm256_loadu_ps(qh + 8 * v);
        for (int j = 0; j < 8; ++j) {
          acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[j] + 8 * v), acc[j]);
        }
      }
      _mm256_storeu_ps(scores + h * span + (pos - first), Sum8x8(acc));
    }
  }
  for (; pos <= last; ++pos) {
    const float* key = key_at(pos);
    for (int64_t h = 0; h < group; ++h) {
      const float* qh = q + h * head_dim;
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(key));
      for (int64_t v = 1; v < vectors; ++v) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), _mm256_loadu_ps(key + 8 * v), acc);
      }
      scores[h * span + (pos - first)] = Sum8(acc);
    }
  }
  for (int64_t h = 0; h < group; ++h) SoftmaxRowAvx2(scores + h * span, span);
  for (int64_t h = 0; h < group; ++h) {
    const float* sh = scores + h * span;
    float* oh = out + h * head_dim;
    for (int64_t v = 0; v < vectors; v += 8) {
      const int64_t n = std::min<int64_t>(8, vectors - v);
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t p = first; p <= last; ++p) {
        const float* value = value_blocks[p / block_size] + (p % block_size) * head_dim + 8 * v;
        const __m256 weight = _mm256_set1_ps(sh[p - first]);
        for (int i = 0; i < 8; ++i) {
          if (i < n) acc[i] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * i), acc[i]);
        }
      }
      for (int i = 0; i < n; ++i) _mm256_storeu_ps(oh + 8 * (v + i), acc[i]);
    }
  }
}

void MatMulAvx2(const float* x, int64_t tokens, int64_t x_stride, const WeightMatrix& w,
                int64_t row_begin, int64_t row_end, float* y, int64_t y_stride, bool accumulate) {
  switch (w.dtype) {
    case DType::kF32:
      return MatMulAvx2Typed<DType::kF32>(x, tokens, x_stride, w, row_begin, row_end, y,
                                          y_stride, accumulate);
    case DType::kBF16:
      return MatMulAvx2Typed<DType::kBF16>(x, tokens, x_stride, w, row_begin, row_end, y,
                                           y_stride, accumulate);
    case DType::kF16:
      return MatMulAvx2Typed<DType::kF16>(x, tokens, x_stride, w, row_begin, row_end, y,
                                          y_stride, accumulate);
  }
}

}  // namespace cloister::llm::kernels_internal
