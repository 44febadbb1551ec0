#include "enclave/llm/kernels.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/log.h"
#include "enclave/llm/kernels_internal.h"
#include "enclave/llm/str_cat.h"

namespace cloister::llm {
namespace {

using kernels_internal::kPrefetchAhead;

#define CLOISTER_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

// ---- AVX-512 ------------------------------------------------------------------------------

template <DType kType>
CLOISTER_AVX512 inline __m512 Load16(const uint8_t* row, int64_t k) {
  if constexpr (kType == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == DType::kBF16) {
    __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  } else {
    __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
    return _mm512_cvtph_ps(half);
  }
}

template <DType kType>
CLOISTER_AVX512 inline __m512 LoadMasked(const uint8_t* row, int64_t k, __mmask16 mask) {
  if constexpr (kType == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == DType::kBF16) {
    __m256i half = _mm256_maskz_loadu_epi16(mask, row + 2 * k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  } else {
    __m256i half = _mm256_maskz_loadu_epi16(mask, row + 2 * k);
    return _mm512_cvtph_ps(half);
  }
}


// P panels (16 rows each) x T tokens over columns [k0, k1): acc[p][t] holds 16 output rows of
// token t. One vector load of weights per panel and column, one broadcast per token and column.
template <DType kType, int P, int T>
CLOISTER_AVX512 void PanelBlock(const float* x, int64_t x_stride, const WeightMatrix& w,
                                int64_t panel, int64_t k0, int64_t k1, float* y, int64_t y_stride,
                                int64_t row_end, bool accumulate) {
  __m512 acc[P][T];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
  const size_t element = DTypeSize(kType);
  const uint8_t* base[P];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) base[p] = w.panel(panel + p) + k0 * kPanelRows * element;
  for (int64_t k = k0; k < k1; ++k) {
    __m512 wv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      // Decode streams each weight once: ask for it well ahead of its use.
      if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(base[p]) + kPrefetchAhead, _MM_HINT_T0);
      wv[p] = Load16<kType>(base[p], 0);
      base[p] += kPanelRows * element;
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[t * x_stride + k]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[p][t] = _mm512_fmadd_ps(wv[p], xb, acc[p][t]);
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    const int64_t row = (panel + p) * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, row_end - row);
    if (valid <= 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      __m512 v = acc[p][t];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, v);
    }
  }
}

template <DType kType, int P>
CLOISTER_AVX512 void PanelsForTokens(const float* x, int64_t tokens, int64_t x_stride,
                                     const WeightMatrix& w, int64_t panel, int64_t k0, int64_t k1,
                                     float* y, int64_t y_stride, int64_t row_end,
                                     bool accumulate) {
  int64_t t = 0;
  for (; t + 8 <= tokens; t += 8) {
    PanelBlock<kType, P, 8>(x + t * x_stride, x_stride, w, panel, k0, k1, y + t * y_stride,
                            y_stride, row_end, accumulate);
  }
  if (tokens - t >= 4) {
    PanelBlock<kType, P, 4>(x + t * x_stride, x_stride, w, panel, k0, k1, y + t * y_stride,
                            y_stride, row_end, accumulate);
    t += 4;
  }
  if (tokens - t >= 2) {
    PanelBlock<kType, P, 2>(x + t * x_stride, x_stride, w, panel, k0, k1, y + t * y_stride,
                            y_stride, row_end, accumulate);
    t += 2;
  }
  if (tokens - t >= 1) {
    PanelBlock<kType, P, 1>(x + t * x_stride, x_stride, w, panel, k0, k1, y + t * y_stride,
                            y_stride, row_end, accumulate);
  }
}

template <DType kType>
CLOISTER_AVX512 void MatMulAvx512(const float* x, int64_t tokens, int64_t x_stride,
                                  const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                                  float* y, int64_t y_stride, bool accumulate) {
  const int64_t first = row_begin / kPanelRows;
  const int64_t last = (row_end + kPanelRows - 1) / kPanelRows;  // exclusive
  if (tokens == 1) {
    // Decode: memory-bound; four panels give four independent FMA chains.
    int64_t p = first;
    for (; p + 4 <= last; p += 4) PanelBlock<kType, 4, 1>(x, x_stride, w, p, 0, w.cols, y, y_stride, row_end, accumulate);
    for (; p < last; ++p) PanelBlock<kType, 1, 1>(x, x_stride, w, p, 0, w.cols, y, y_stride, row_end, accumulate);
    return;
  }
  // Columns in slices whose two-panel weights stay in L1 while every token passes over them;
  // the first slice writes y, the later ones add to it.
  constexpr int64_t kColumnSlice = 384;
  for (int64_t p = first; p < last; p += 2) {
    const bool pair = p + 2 <= last;
    for (int64_t k0 = 0; k0 < w.cols; k0 += kColumnSlice) {
      const int64_t k1 = std::min(w.cols, k0 + kColumnSlice);
      const bool add = accumulate || k0 > 0;
      if (pair) {
        PanelsForTokens<kType, 2>(x, tokens, x_stride, w, p, k0, k1, y, y_stride, row_end, add);
      } else {
        PanelsForTokens<kType, 1>(x, tokens, x_stride, w, p, k0, k1, y, y_stride, row_end, add);
      }
    }
  }
}

CLOISTER_AVX512 float DotAvx512(const float* a, const float* b, int64_t size) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= size; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i + 16 <= size; i += 16) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  }
  if (i < size) {
    __mmask16 mask = static_cast<__mmask16>((1u << (size - i)) - 1);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i),
                           acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

CLOISTER_AVX512 void AxpyAvx512(float a, const float* x, float* y, int64_t size) {
  __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= size; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  for (; i < size; ++i) y[i] += a * x[i];
}

// exp(x) for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 polynomial
// (relative error about 2e-7, within two float32 ulps), 2^n by the exponent bits. Inputs below
// -87.3 give 0, above 88.7 give +inf, as expf does.
CLOISTER_AVX512 inline __m512 Exp16(__m512 x) {
  const __m512 clamped = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512 result = _mm512_scalef_ps(p, n);
  // Below the clamp the true value underflows to zero.
  return _mm512_mask_mov_ps(result, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ),
                            _mm512_setzero_ps());
}

CLOISTER_AVX512 void SoftmaxRowAvx512(float* values, int64_t size, float maximum) {
  const __m512 m = _mm512_set1_ps(maximum);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= size; i += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(values + i), m));
    _mm512_storeu_ps(values + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < size) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (size - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(
        mask, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, values + i), m)));
    _mm512_mask_storeu_ps(values + i, mask, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (i = 0; i + 16 <= size; i += 16) {
    _mm512_storeu_ps(values + i, _mm512_mul_ps(_mm512_loadu_ps(values + i), inverse));
  }
  for (; i < size; ++i) values[i] *= _mm512_cvtss_f32(inverse);
}

CLOISTER_AVX512 void SiluMulAvx512(const float* gate, const float* up, int64_t size, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= size; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 sigmoid = _mm512_div_ps(one, _mm512_add_ps(one, Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_loadu_ps(up + i)));
  }
  for (; i < size; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

CLOISTER_AVX512 void AttendPagedAvx512(const float* q, int64_t group, int64_t head_dim,
                                       const float* const* key_blocks,
                                       const float* const* value_blocks, int32_t block_size,
                                       int64_t first, int64_t last, float* scores, float* out) {
  const int64_t span = last - first + 1;
  const int64_t vectors = head_dim / 16;  // head_dim is a multiple of 16 on this path
  constexpr int kMaxGroup = 16;
  float maxima[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) maxima[h] = -INFINITY;
  for (int64_t pos = first; pos <= last; ++pos) {
    const float* key = key_blocks[pos / block_size] + (pos % block_size) * head_dim;
    for (int64_t h = 0; h < group; ++h) {
      const float* qh = q + h * head_dim;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(key));
      for (int64_t v = 1; v < vectors; ++v) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * v), _mm512_loadu_ps(key + 16 * v), acc);
      }
      const float s = _mm512_reduce_add_ps(acc);
      scores[h * span + (pos - first)] = s;
      maxima[h] = std::max(maxima[h], s);
    }
  }
  for (int64_t h = 0; h < group; ++h) SoftmaxRowAvx512(scores + h * span, span, maxima[h]);
  for (int64_t h = 0; h < group; ++h) {
    const float* sh = scores + h * span;
    float* oh = out + h * head_dim;
    int64_t v = 0;
    // Up to 8 vectors (head_dim 128) of the output stay in registers over all positions.
    for (; v < vectors; v += 8) {
      const int64_t n = std::min<int64_t>(8, vectors - v);
      __m512 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t pos = first; pos <= last; ++pos) {
        const float* value = value_blocks[pos / block_size] + (pos % block_size) * head_dim + 16 * v;
        const __m512 p = _mm512_set1_ps(sh[pos - first]);
        for (int i = 0; i < 8; ++i) {
          if (i < n) acc[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(value + 16 * i), acc[i]);
        }
      }
      for (int i = 0; i < n; ++i) _mm512_storeu_ps(oh + 16 * (v + i), acc[i]);
    }
  }
}

// ---- portable -----------------------------------------------------------------------------

float WeightAt(const WeightMatrix& w, int64_t r, int64_t k) {
  return ElementToFloat(w.dtype, static_cast<const uint8_t*>(w.data) + w.Index(r, k) * w.element_size());
}

void MatMulPortable(const float* x, int64_t tokens, int64_t x_stride, const WeightMatrix& w,
                    int64_t row_begin, int64_t row_end, float* y, int64_t y_stride,
                    bool accumulate) {
  std::vector<float> row(w.cols);
  for (int64_t r = row_begin; r < row_end; ++r) {
    RowToFloat(w, r, row.data());
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x + t * x_stride;
      float sum = 0;
      for (int64_t k = 0; k < w.cols; ++k) sum += row[k] * xt[k];
      float& out = y[t * y_stride + r];
      out = accumulate ? out + sum : sum;
    }
  }
}

// ---- choosing the path ---------------------------------------------------------------------

// Ordered: a CPU with one path has every path before it.
enum class Isa { kPortable, kAvx2, kAvx512 };
constexpr const char* kIsaNames[] = {"portable", "avx2", "avx512"};

Isa BestIsa() { return HaveAvx512() ? Isa::kAvx512 : HaveAvx2() ? Isa::kAvx2 : Isa::kPortable; }

absl::StatusOr<Isa> ParseIsa(std::string_view name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kIsaNames[i]) return static_cast<Isa>(i);
  }
  return absl::InvalidArgumentError(
      Cat("unknown kernel ISA '", name, "' (expected avx512, avx2 or portable)"));
}

Isa IsaFromEnvironment() {
  const Isa best = BestIsa();
  const char* value = std::getenv("CLOISTER_LLM_ISA");
  if (value == nullptr || *value == '\0') return best;
  absl::StatusOr<Isa> wanted = ParseIsa(value);
  if (!wanted.ok()) {
    Log(LogLevel::kWarning, "llm_kernel_isa_unknown",
        {{"CLOISTER_LLM_ISA", value},
         {"reason", std::string(wanted.status().message())},
         {"using", kIsaNames[static_cast<int>(best)]}});
    return best;
  }
  if (*wanted > best) {
    Log(LogLevel::kWarning, "llm_kernel_isa_unavailable",
        {{"CLOISTER_LLM_ISA", value}, {"using", kIsaNames[static_cast<int>(best)]}});
    return best;
  }
  return *wanted;
}

std::atomic<Isa>& ActiveIsa() {
  static std::atomic<Isa> isa{IsaFromEnvironment()};
  return isa;
}

Isa CurrentIsa() { return ActiveIsa().load(std::memory_order_relaxed); }

}  // namespace

float ElementToFloat(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Bf16ToFloat(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return F16ToFloat(h);
    }
  }
  return 0;
}

float F16ToFloat(uint16_t value) {
  uint32_t sign = (value & 0x8000u) << 16;
  uint32_t exponent = (value >> 10) & 0x1f;
  uint32_t mantissa = value & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      bits = sign | ((127 - 15 + 1 - shift) << 23) | (mantissa << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512dq");
  return have;
}

bool HaveAvx2() {
  // F16C through cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool have = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return have;
}

const char* KernelIsa() { return kIsaNames[static_cast<int>(CurrentIsa())]; }

absl::Status SetKernelIsaForTest(std::string_view isa) {
  absl::StatusOr<Isa> wanted = ParseIsa(isa);
  if (!wanted.ok()) return wanted.status();
  ActiveIsa().store(std::min(*wanted, BestIsa()), std::memory_order_relaxed);
  return absl::OkStatus();
}

void RowToFloat(const WeightMatrix& w, int64_t row, float* out) {
  for (int64_t k = 0; k < w.cols; ++k) out[k] = WeightAt(w, row, k);
}

void PackRows(const uint8_t* source, DType from, int64_t rows, int64_t row_offset, uint8_t* packed,
              const WeightMatrix& w) {
  const size_t in_size = DTypeSize(from);
  const size_t out_size = w.element_size();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = source + static_cast<size_t>(r) * w.cols * in_size;
    for (int64_t k = 0; k < w.cols; ++k) {
      uint8_t* out = packed + w.Index(row_offset + r, k) * out_size;
      if (from == w.dtype) {
        std::memcpy(out, in + k * in_size, in_size);
      } else {
        const float f = ElementToFloat(from, in + k * in_size);
        std::memcpy(out, &f, sizeof(f));
      }
    }
  }
}

void MatMul(const float* x, int64_t tokens, int64_t x_stride, const WeightMatrix& w,
            int64_t row_begin, int64_t row_end, float* y, int64_t y_stride, bool accumulate) {
  if (tokens <= 0 || row_begin >= row_end) return;
  const Isa isa = CurrentIsa();
  if (isa == Isa::kAvx512) {
    switch (w.dtype) {
      case DType::kF32:
        return MatMulAvx512<DType::kF32>(x, tokens, x_stride, w, row_begin, row_end, y, y_stride,
                                         accumulate);
      case DType::kBF16:
        return MatMulAvx512<DType::kBF16>(x, tokens, x_stride, w, row_begin, row_end, y, y_stride,
                                          accumulate);
      case DType::kF16:
        return MatMulAvx512<DType::kF16>(x, tokens, x_stride, w, row_begin, row_end, y, y_stride,
                                         accumulate);
    }
  }
  if (isa == Isa::kAvx2) {
    return kernels_internal::MatMulAvx2(x, tokens, x_stride, w, row_begin, row_end, y, y_stride,
                                        accumulate);
  }
  MatMulPortable(x, tokens, x_stride, w, row_begin, row_end, y, y_stride, accumulate);
}

float Dot(const float* a, const float* b, int64_t size) {
  const Isa isa = CurrentIsa();
  if (isa == Isa::kAvx512) return DotAvx512(a, b, size);
  if (isa == Isa::kAvx2) return kernels_internal::DotAvx2(a, b, size);
  float sum = 0;
  for (int64_t i = 0; i < size; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float a, const float* x, float* y, int64_t size) {
  const Isa isa = CurrentIsa();
  if (isa == Isa::kAvx512) return AxpyAvx512(a, x, y, size);
  if (isa == Isa::kAvx2) return kernels_internal::AxpyAvx2(a, x, y, size);
  for (int64_t i = 0; i < size; ++i) y[i] += a * x[i];
}

void RmsNorm(const float* x, const float* weight, int64_t size, float eps, float* out) {
  // Mean of squares in float32, as transformers computes it (summed in a wider lane order).
  float sum = Dot(x, x, size);
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(size) + eps);
  for (int64_t i = 0; i < size; ++i) out[i] = weight[i] * (x[i] * scale);
}

void ApplyRope(float* head, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = head[i];
    const float b = head[i + half];
    head[i] = a * cos[i] - b * sin[i];
    head[i + half] = b * cos[i] + a * sin[i];
  }
}

void AttendPaged(const float* q, int64_t group, int64_t head_dim, const float* const* key_blocks,
                 const float* const* value_blocks, int32_t block_size, int64_t first,
                 int64_t last, float* scores, float* out) {
  const Isa isa = CurrentIsa();
  if (isa == Isa::kAvx512 && head_dim % 16 == 0 && group <= 16) {
    return AttendPagedAvx512(q, group, head_dim, key_blocks, value_blocks, block_size, first,
                             last, scores, out);
  }
  // Also where AVX-512 cannot take the shape (head_dim a multiple of 8 only, larger groups).
  if (isa != Isa::kPortable && head_dim % 8 == 0) {
    return kernels_internal::AttendPagedAvx2(q, group, head_dim, key_blocks, value_blocks, block_size, first, last,
                           scores, out);
  }
  const int64_t span = last - first + 1;
  for (int64_t h = 0; h < group; ++h) {
    float* sh = scores + h * span;
    float maximum = -INFINITY;
    for (int64_t pos = first; pos <= last; ++pos) {
      const float* key = key_blocks[pos / block_size] + (pos % block_size) * head_dim;
      float s = 0;
      for (int64_t i = 0; i < head_dim; ++i) s += q[h * head_dim + i] * key[i];
      sh[pos - first] = s;
      maximum = std::max(maximum, s);
    }
    float sum = 0;
    for (int64_t i = 0; i < span; ++i) {
      sh[i] = std::exp(sh[i] - maximum);
      sum += sh[i];
    }
    float* oh = out + h * head_dim;
    for (int64_t i = 0; i < head_dim; ++i) oh[i] = 0;
    for (int64_t pos = first; pos <= last; ++pos) {
      const float* value = value_blocks[pos / block_size] + (pos % block_size) * head_dim;
      const float p = sh[pos - first] / sum;
      for (int64_t i = 0; i < head_dim; ++i) oh[i] += p * value[i];
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t size, float* out) {
  const Isa isa = CurrentIsa();
  if (isa == Isa::kAvx512) return SiluMulAvx512(gate, up, size, out);
  if (isa == Isa::kAvx2) return kernels_internal::SiluMulAvx2(gate, up, size, out);
  for (int64_t i = 0; i < size; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace cloister::llm
