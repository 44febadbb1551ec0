// The LLM engine's CPU kernels: matrix products against weights kept as F32, BF16 or F16
// (converted to float32 in registers, accumulated in float32), RMSNorm, RoPE, SiLU gating and
// attention over a paged KV cache. The instruction-set path is chosen once per process: AVX-512
// where the CPU has it, else AVX2 (with FMA and F16C), else portable loops (compiled for the
// library's -march baseline); all give the same results up to float32 rounding order.
// CLOISTER_LLM_ISA=avx512|avx2|portable forces a path: one the CPU lacks falls back to the best
// it has, and an unknown value is ignored; both are logged as a warning.
// Threading: every function is pure over its arguments; callers split rows between threads.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "absl/status/status.h"

#include "enclave/llm/safetensors.h"

namespace cloister::llm {

// A [rows, cols] weight matrix (Hugging Face Linear layout: [out, in]) in the engine's packed
// layout: rows in panels of kPanelRows, each panel column-major, so that element (r, k) lies at
// index (r / 16) * 16 * cols + k * 16 + r % 16. A matrix product then reads 16 output rows'
// weights for one input column with one vector load. Rows are padded with zeros to a whole
// panel.
inline constexpr int64_t kPanelRows = 16;

struct WeightMatrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  static int64_t PaddedRows(int64_t rows) { return (rows + kPanelRows - 1) / kPanelRows * kPanelRows; }
  size_t element_size() const { return DTypeSize(dtype); }
  // The packed index of element (r, k).
  size_t Index(int64_t r, int64_t k) const {
    return static_cast<size_t>(r / kPanelRows) * kPanelRows * cols + k * kPanelRows + r % kPanelRows;
  }
  const uint8_t* panel(int64_t p) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(p) * kPanelRows * cols * element_size();
  }
};

inline float Bf16ToFloat(uint16_t value) {
  uint32_t bits = static_cast<uint32_t>(value) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
float F16ToFloat(uint16_t value);
// The element of type `dtype` at `p` (unaligned) as float32.
float ElementToFloat(DType dtype, const uint8_t* p);

// Whether the AVX-512 kernels run on this CPU.
bool HaveAvx512();
// Whether the AVX2 kernels (AVX2, FMA, F16C) run on this CPU.
bool HaveAvx2();

// The active path: "avx512", "avx2" or "portable".
const char* KernelIsa();

// Test hook: switches the path as CLOISTER_LLM_ISA does, with the same fallback when the CPU
// lacks it (KernelIsa() tells which one runs); InvalidArgument for an unknown name. Not safe
// while other threads run kernels.
absl::Status SetKernelIsaForTest(std::string_view isa);

// y[t * y_stride + r] (=|+=) sum_k x[t * x_stride + k] * w[r][k] for t in [0, tokens) and
// r in [row_begin, row_end); row_begin must be a multiple of kPanelRows.
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

// Causal attention of `group` query heads (q: group x head_dim, already scaled) that share one
// KV head, over positions [first, last] of a paged cache: position pos lies in
// key_blocks[pos / block_size] (and value_blocks) at slot pos % block_size, head_dim floats.
// `scores` has room for group x (last - first + 1) floats; out receives group x head_dim.
// Softmax in float32 with the maximum subtracted, as transformers' eager attention.
void AttendPaged(const float* q, int64_t group, int64_t head_dim, const float* const* key_blocks,
                 const float* const* value_blocks, int32_t block_size, int64_t first,
                 int64_t last, float* scores, float* out);

// Converts row `row` (cols weights) to float32.
void RowToFloat(const WeightMatrix& w, int64_t row, float* out);

// Packs a row-major [rows, cols] block of `source` (dtype `from`) into `w`'s storage at rows
// [row_offset, row_offset + rows), converting to w.dtype (the same type or float32).
void PackRows(const uint8_t* source, DType from, int64_t rows, int64_t row_offset, uint8_t* packed,
              const WeightMatrix& w);

}  // namespace cloister::llm
