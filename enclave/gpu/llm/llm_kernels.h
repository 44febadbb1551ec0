// Launchers for the CUDA LLM engine's kernels (llm_kernels.cu): embedding rows, RMSNorm, bias
// plus rotate-half RoPE plus the paged KV write, attention over the paged cache, SiLU gating,
// element conversions, the argmax of logits rows, row gathers and block scrubs. Activations are
// float32; weights may be F32, F16 or BF16. Each launcher queues its kernel on `stream` and
// returns the launch's cudaError_t.
//
// Indices (token ids, positions, block numbers) are checked on the host before a step is
// queued; the kernels trust them. Plain C++ (no absl), so that nvcc compiles it alone.
// Threading: stateless; kernels of one engine are ordered by its stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define CLOISTER_LLM_HOST_DEVICE __host__ __device__
#else
#define CLOISTER_LLM_HOST_DEVICE
#endif

namespace cloister::gpu::llm {

enum class ElementType : int { kF32, kF16, kBf16 };

// The KV cache: for every layer, keys of all blocks then values of all blocks; a block holds
// [kv_heads][block_size][head_dim] floats (`block_floats` of them).
struct CacheGeometry {
  float* base = nullptr;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int64_t block_floats = 0;
  CLOISTER_LLM_HOST_DEVICE float* keys(int64_t layer) const { return base + (layer * 2) * num_blocks * block_floats; }
  CLOISTER_LLM_HOST_DEVICE float* values(int64_t layer) const { return base + (layer * 2 + 1) * num_blocks * block_floats; }
};

// Where each token of a step lies: its position and the offset of its sequence's block table
// in `block_tables`.
struct StepIndex {
  const int32_t* positions = nullptr;
  const int32_t* table_offsets = nullptr;
  const int32_t* block_tables = nullptr;
};

// out[t] (hidden floats) = table[ids[t]] as float.
cudaError_t EmbedRows(const void* table, ElementType type, const int32_t* ids, int64_t tokens,
                      int64_t hidden, float* out, cudaStream_t stream);

// out[i] = x[rows ? rows[i] : i] * rsqrt(mean(x^2) + eps) * weight, for i in [0, count).
cudaError_t RmsNormRows(const float* x, const int32_t* rows, int64_t count, int64_t hidden,
                        const float* weight, float eps, float* out, cudaStream_t stream);

// On each token's qkv row (q heads, then k heads, then v heads, head_dim each): adds `bias`
// (may be null), rotates q and k heads by the token's position (inv_freq: head_dim / 2
// frequencies) and writes k and v into the cache at the token's slot of layer `layer`.
cudaError_t BiasRopeStore(float* qkv, int64_t tokens, int32_t heads, const float* bias,
                          const float* inv_freq, StepIndex index, CacheGeometry cache,
                          int64_t layer, cudaStream_t stream);

// Causal attention of every token's q heads over positions [first, position] of its sequence,
// first = max(0, position - window + 1) with a window (0: none). q is read from the qkv rows
// and scaled by `scale`; out[t] holds heads * head_dim floats.
cudaError_t PagedAttention(const float* qkv, int64_t tokens, int32_t heads, float scale,
                           int32_t window, StepIndex index, CacheGeometry cache, int64_t layer,
                           float* out, cudaStream_t stream);

// out[t][i] = silu(gate_up[t][i]) * gate_up[t][ffn + i].
cudaError_t SiluMul(const float* gate_up, int64_t tokens, int64_t ffn, float* out,
                    cudaStream_t stream);

cudaError_t ConvertToFloat(const void* in, ElementType type, int64_t count, float* out,
                           cudaStream_t stream);
// Rounds to nearest even; `type` is kF16 or kBf16.
cudaError_t ConvertFromFloat(const float* in, int64_t count, ElementType type, void* out,
                             cudaStream_t stream);

// For each row r with argmax[r] != 0: ids[r] = the first index of the largest of logits[r]
// (NaN as -infinity, +infinity as the largest float); other rows get -1.
cudaError_t ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, const int32_t* argmax,
                       int32_t* ids, cudaStream_t stream);

// out[i] = in[rows[i]] for i in [0, count), `width` floats per row.
cudaError_t GatherRows(const float* in, const int32_t* rows, int64_t count, int64_t width,
                       float* out, cudaStream_t stream);

// Zeroes block `block` of every layer's keys and values.
cudaError_t ScrubCacheBlock(CacheGeometry cache, int64_t layers, int32_t block,
                            cudaStream_t stream);

// Reads `words` 16-byte words of `data` (grid-stride, 16-byte loads) and writes one partial
// sum per block into `partials` (at least `blocks` words), so the reads cannot be elided: the
// device's memory read bandwidth probe.
cudaError_t ReadAll(const void* data, int64_t words, int blocks, uint32_t* partials,
                    cudaStream_t stream);

}  // namespace cloister::gpu::llm
