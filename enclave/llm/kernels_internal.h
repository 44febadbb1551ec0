// Shared between the LLM kernels' files: kernels.cc (the AVX-512 and portable paths and the
// choice between paths) and kernels_avx2.cc (the AVX2 path). Same contracts as the public
// functions of kernels.h.
#pragma once

#include <cstdint>

#include "enclave/llm/kernels.h"

namespace cloister::llm::kernels_internal {

// How far ahead of the weights being multiplied the decode loops prefetch, in bytes.
inline constexpr int kPrefetchAhead = 1024;

void MatMulAvx2(const float* x, int64_t tokens, int64_t x_stride, const WeightMatrix& w,
                int64_t row_begin, int64_t row_end, float* y, int64_t y_stride, bool accumulate);
float DotAvx2(const float* a, const float* b, int64_t size);
void AxpyAvx2(float a, const float* x, float* y, int64_t size);
void SiluMulAvx2(const float* gate, const float* up, int64_t size, float* out);
void AttendPagedAvx2(const float* q, int64_t group, int64_t head_dim,
                     const float* const* key_blocks, const float* const* value_blocks,
                     int32_t block_size, int64_t first, int64_t last, float* scores, float* out);

}  // namespace cloister::llm::kernels_internal
