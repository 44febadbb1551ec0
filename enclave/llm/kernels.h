// The LLM engine's CPU kernels: matrix products against weights kept as F32, BF16 or F16
// (converted to float32 in registers, accumulated in float32), RMSNorm, RoPE, SiLU gating and
// attention over a paged KV cache. AVX-512 code is chosen at run time where the CPU has it;
// otherwise portable loops (compiled for the library's -march baseline) give the same results
// up to float32 rounding order.
// Threading: every function is pure over its arguments; callers split rows between threads.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "enclave/llm/safetensors.h"

namespace cloister::llm {

// A row-major [rows, cols] weight matrix (Hugging Face Linear layout: [out, in]).
struct WeightMatrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  size_t row_size() const { return static_cast<size_t>(cols) * DTypeSize(dtype); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_size();
  }
};

inline float Bf16ToFloat(uint16_t value) {
  uint32_t bits = static_cast<uint32_t>(value) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
float F16ToFloat(uint16_t value);

// Whether the AVX-512 kernels run on this CPU.
bool HaveAvx512();

// y[t * y_stride + r] (=|+=) sum_k x[t * x_stride + k] * w[r][k] for t in [0, tokens) and
// r in [row_begin, row_end).
void MatMul(const float* x, int64_t tokens, int64_t x_stride, const WeightMatrix& w,
            int64_t row_begin, int64_t row_end, float* y, int64_t y_stride, bool accumulate);

// out = x * rsqrt(mean(x^2) + eps) * weight, in float32 (Hugging Face's LlamaRMSNorm).
void RmsNorm(const float* x, const float* weight, int64_t size, float eps, float* out);

// Rotate-half RoPE on one head in place: x[i], x[i + half] rotated by angle i (cos, sin given).
void ApplyRope(float* head, const float* cos, const float* sin, int64_t half);

// out[i] = silu(gate[i]) * up[i].
void SiluMul(const float* gate, const float* up, int64_t size, float* out);

float Dot(const float* a, const float* b, int64_t size);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t size);

// Converts a row of `count` weights to float32.
void RowToFloat(const WeightMatrix& w, int64_t row, float* out);

}  // namespace cloister::llm
