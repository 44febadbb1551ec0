#include "enclave/llm/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace cloister::llm {
namespace {

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

// Sums each of 16 registers and returns the 16 sums as one register (lane i = sum of acc[i]).
CLOISTER_AVX512 inline float Reduce(__m512 v) { return _mm512_reduce_add_ps(v); }

// R weight rows x T tokens, all columns.
template <DType kType, int R, int T>
CLOISTER_AVX512 void Block(const float* x, int64_t x_stride, const WeightMatrix& w, int64_t row,
                           float* y, int64_t y_stride, bool accumulate) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.row(row + r);
  const int64_t cols = w.cols;
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * x_stride + k);
    for (int r = 0; r < R; ++r) {
      __m512 wv = Load16<kType>(rows[r], k);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  if (k < cols) {
    __mmask16 mask = static_cast<__mmask16>((1u << (cols - k)) - 1);
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_maskz_loadu_ps(mask, x + t * x_stride + k);
    for (int r = 0; r < R; ++r) {
      __m512 wv = LoadMasked<kType>(rows[r], k, mask);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* out = y + t * y_stride + row;
    for (int r = 0; r < R; ++r) {
      float sum = Reduce(acc[r][t]);
      out[r] = accumulate ? out[r] + sum : sum;
    }
  }
}

template <DType kType, int R>
CLOISTER_AVX512 void RowsForTokens(const float* x, int64_t tokens, int64_t x_stride,
                                   const WeightMatrix& w, int64_t row, float* y, int64_t y_stride,
                                   bool accumulate) {
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    Block<kType, R, 4>(x + t * x_stride, x_stride, w, row, y + t * y_stride, y_stride, accumulate);
  }
  const float* xt = x + t * x_stride;
  float* yt = y + t * y_stride;
  switch (tokens - t) {
    case 3:
      Block<kType, R, 3>(xt, x_stride, w, row, yt, y_stride, accumulate);
      break;
    case 2:
      Block<kType, R, 2>(xt, x_stride, w, row, yt, y_stride, accumulate);
      break;
    case 1:
      Block<kType, R, 1>(xt, x_stride, w, row, yt, y_stride, accumulate);
      break;
    default:
      break;
  }
}

template <DType kType>
CLOISTER_AVX512 void MatMulAvx512(const float* x, int64_t tokens, int64_t x_stride,
                                  const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                                  float* y, int64_t y_stride, bool accumulate) {
  if (tokens == 1) {
    int64_t r = row_begin;
    for (; r + 8 <= row_end; r += 8) Block<kType, 8, 1>(x, x_stride, w, r, y, y_stride, accumulate);
    for (; r < row_end; ++r) Block<kType, 1, 1>(x, x_stride, w, r, y, y_stride, accumulate);
    return;
  }
  // Rows in blocks that stay in L2 while every token passes over them; tokens in blocks so
  // their activations stay in cache as well.
  constexpr int64_t kRowBlock = 64;
  constexpr int64_t kTokenBlock = 64;
  for (int64_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const int64_t re = std::min(row_end, rb + kRowBlock);
    for (int64_t tb = 0; tb < tokens; tb += kTokenBlock) {
      const int64_t tn = std::min(tokens - tb, kTokenBlock);
      const float* xb = x + tb * x_stride;
      float* yb = y + tb * y_stride;
      int64_t r = rb;
      for (; r + 4 <= re; r += 4) RowsForTokens<kType, 4>(xb, tn, x_stride, w, r, yb, y_stride, accumulate);
      for (; r < re; ++r) RowsForTokens<kType, 1>(xb, tn, x_stride, w, r, yb, y_stride, accumulate);
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

// ---- portable -----------------------------------------------------------------------------

float WeightAt(const WeightMatrix& w, int64_t r, int64_t k) {
  const uint8_t* row = w.row(r);
  switch (w.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return Bf16ToFloat(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return F16ToFloat(h);
    }
  }
  return 0;
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

}  // namespace

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

void RowToFloat(const WeightMatrix& w, int64_t row, float* out) {
  for (int64_t k = 0; k < w.cols; ++k) out[k] = WeightAt(w, row, k);
}

void MatMul(const float* x, int64_t tokens, int64_t x_stride, const WeightMatrix& w,
            int64_t row_begin, int64_t row_end, float* y, int64_t y_stride, bool accumulate) {
  if (tokens <= 0 || row_begin >= row_end) return;
  if (HaveAvx512()) {
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
  MatMulPortable(x, tokens, x_stride, w, row_begin, row_end, y, y_stride, accumulate);
}

float Dot(const float* a, const float* b, int64_t size) {
  if (HaveAvx512()) return DotAvx512(a, b, size);
  float sum = 0;
  for (int64_t i = 0; i < size; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float a, const float* x, float* y, int64_t size) {
  if (HaveAvx512()) return AxpyAvx512(a, x, y, size);
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

void SiluMul(const float* gate, const float* up, int64_t size, float* out) {
  for (int64_t i = 0; i < size; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace cloister::llm
