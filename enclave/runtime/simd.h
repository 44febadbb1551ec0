// Portable SIMD helpers for the CPU kernels, written with GCC/Clang vector extensions so they
// compile to AVX2 with -march=x86-64-v3 (and to SSE or scalar code elsewhere) without
// intrinsics: vectorised exp, erf, tanh and sigmoid (float32, about 1e-7 relative error except
// near zero crossings, where the error is absolute ~1e-7) and float sums and maxima.
// Threading: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cloister::runtime::simd {

inline constexpr int kWidth = 8;
typedef float Vec __attribute__((vector_size(kWidth * sizeof(float))));
typedef int32_t IVec __attribute__((vector_size(kWidth * sizeof(int32_t))));

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }
inline Vec Splat(float x) { return Vec{} + x; }

// The math below is written once for any float vector type V (Vec here; a wider one in a file
// built for AVX-512, which declares its IntVector): IntOf<V> is the int32 vector of V's width,
// the type of V's comparison masks.
template <typename V>
struct IntVector;
template <>
struct IntVector<Vec> {
  using type = IVec;
};
template <typename V>
using IntOf = typename IntVector<V>::type;

template <typename V>
inline V SplatAs(float x) {
  return V{} + x;
}
template <typename V>
inline V Select(IntOf<V> mask, V a, V b) {
  return mask ? a : b;
}
template <typename V>
inline V Min(V a, V b) {
  return a < b ? a : b;
}
template <typename V>
inline V Max(V a, V b) {
  return a > b ? a : b;
}
template <typename V>
inline V Abs(V a) {
  return a < 0 ? -a : a;
}

template <typename V>
inline V Floor(V x) {
  const V truncated = __builtin_convertvector(__builtin_convertvector(x, IntOf<V>), V);
  return truncated > x ? truncated - 1.0f : truncated;
}

// e^x with a Cephes-style polynomial; inputs are clamped to the float range.
template <typename V>
inline V Exp(V x) {
  x = Min(Max(x, SplatAs<V>(-87.3365f)), SplatAs<V>(88.0f));
  // n = x / ln 2 rounded to the nearest integer: adding and taking away 1.5 * 2^23 leaves it
  // (|x / ln 2| < 128), in two operations where a floor takes five.
  const V n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V y = SplatAs<V>(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  IntOf<V> bits = (__builtin_convertvector(n, IntOf<V>) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

template <typename V>
inline V Sigmoid(V x) {
  return 1.0f / (1.0f + Exp(-x));
}

template <typename V>
inline V Tanh(V x) {
  const V a = Abs(x);
  // Large |x|: 1 - 2 / (e^{2|x|} + 1); small |x|: odd Taylor series (no cancellation).
  const V large = 1.0f - 2.0f / (Exp(a + a) + 1.0f);
  const V x2 = x * x;
  const V small =
      a * (1.0f +
           x2 * (-0.333333333f + x2 * (0.133333333f + x2 * (-0.0539682540f + x2 * 0.0218694885f))));
  const V magnitude = Select(a < 0.125f, small, large);
  return Select(x < 0, -magnitude, magnitude);
}

template <typename V>
inline V Erf(V x) {
  const V a = Abs(x);
  // |x| >= 0.5: Abramowitz-Stegun 7.1.26 (absolute error < 1.5e-7).
  const V t = 1.0f / (1.0f + 0.3275911f * a);
  V poly = SplatAs<V>(1.061405429f);
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  const V large = 1.0f - poly * t * Exp(-a * a);
  // |x| < 0.5: Maclaurin series, accurate in relative terms near zero.
  const V x2 = a * a;
  const V small =
      a *
      (1.1283791671f +
       x2 * (-0.3761263890f + x2 * (0.1128379167f + x2 * (-0.0268661706f + x2 * 0.0052239776f))));
  const V magnitude = Select(a < 0.5f, small, large);
  return Select(x < 0, -magnitude, magnitude);
}

// Gelu (the exact, erf form): x / 2 * (1 + erf(x / sqrt 2)).
template <typename V>
inline V Gelu(V x) {
  return 0.5f * x * (1.0f + Erf(x * 0.70710678118654752f));
}

// Applies `f` (Vec -> Vec) to n floats; the tail goes through a padded vector.
template <typename F>
inline void Map(const float* in, float* out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Store(out + i, f(Load(in + i)));
  if (i < n) {
    float buffer[kWidth] = {};
    std::memcpy(buffer, in + i, sizeof(float) * (n - i));
    Store(buffer, f(Load(buffer)));
    std::memcpy(out + i, buffer, sizeof(float) * (n - i));
  }
}

inline float HorizontalSum(Vec v) {
  float total = 0;
  for (int i = 0; i < kWidth; ++i) total += v[i];
  return total;
}

// Sum of n floats with 2 x 8 independent lanes (vectorises; order differs from a serial sum).
inline float Sum(const float* p, int64_t n) {
  Vec a = Splat(0.0f), b = Splat(0.0f);
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    a += Load(p + i);
    b += Load(p + i + kWidth);
  }
  float total = HorizontalSum(a + b);
  for (; i < n; ++i) total += p[i];
  return total;
}

inline float MaxOf(const float* p, int64_t n) {
  float best = -INFINITY;
  int64_t i = 0;
  if (n >= kWidth) {
    Vec m = Load(p);
    for (i = kWidth; i + kWidth <= n; i += kWidth) m = Max(m, Load(p + i));
    for (int k = 0; k < kWidth; ++k) best = m[k] > best ? m[k] : best;
  }
  for (; i < n; ++i) best = p[i] > best ? p[i] : best;
  return best;
}

}  // namespace cloister::runtime::simd
