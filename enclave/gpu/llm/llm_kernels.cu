#include "enclave/gpu/llm/llm_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>

namespace cloister::gpu::llm {
namespace {

constexpr int kThreads = 256;
constexpr int kAttentionThreads = 128;
constexpr int kAttentionChunk = 64;  // positions scored per round (at most kAttentionThreads)
constexpr int kMaxHeadDim = 256;     // two output dims per attention thread

__device__ inline float LoadElement(const void* p, ElementType type, int64_t i) {
  switch (type) {
    case ElementType::kF32:
      return static_cast<const float*>(p)[i];
    case ElementType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// Sum and maximum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. `shared` holds 32 floats.
__device__ float BlockSum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    value = lane < warps ? shared[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  value = shared[0];
  __syncthreads();
  return value;
}

__device__ float BlockMax(float value, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    value = lane < warps ? shared[lane] : -INFINITY;
    for (int offset = 16; offset > 0; offset >>= 1) {
      value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  value = shared[0];
  __syncthreads();
  return value;
}

int GridFor(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? (blocks < 1 ? 1 : blocks) : 65535);
}

__global__ void EmbedKernel(const void* table, ElementType type, const int32_t* ids,
                            int64_t hidden, float* out) {
  const int64_t t = blockIdx.x;
  const int64_t row = ids[t];
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[t * hidden + i] = LoadElement(table, type, row * hidden + i);
  }
}

__global__ void RmsNormKernel(const float* x, const int32_t* rows, int64_t hidden,
                              const float* weight, float eps, float* out) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  const float* in = x + (rows ? rows[i] : i) * hidden;
  float squares = 0.0f;
  for (int64_t k = threadIdx.x; k < hidden; k += blockDim.x) squares += in[k] * in[k];
  const float total = BlockSum(squares, shared);
  const float inverse = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
  for (int64_t k = threadIdx.x; k < hidden; k += blockDim.x) {
    out[i * hidden + k] = weight[k] * (in[k] * inverse);
  }
}

__global__ void BiasRopeStoreKernel(float* qkv, int32_t heads, const float* bias,
                                    const float* inv_freq, StepIndex index, CacheGeometry cache,
                                    int64_t layer) {
  const int64_t t = blockIdx.x;
  const int32_t head_dim = cache.head_dim;
  const int32_t kv_heads = cache.kv_heads;
  const int64_t width = static_cast<int64_t>(heads + 2 * kv_heads) * head_dim;
  float* row = qkv + t * width;
  if (bias != nullptr) {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) row[i] += bias[i];
    __syncthreads();
  }
  const int32_t half = head_dim / 2;
  const int32_t position = index.positions[t];
  const float angle_position = static_cast<float>(position);
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(heads + kv_heads) * half; i += blockDim.x) {
    const int64_t head = i / half;
    const int32_t k = static_cast<int32_t>(i % half);
    float* p = row + head * head_dim;
    const float angle = angle_position * inv_freq[k];
    const float c = cosf(angle);
    const float s = sinf(angle);
    const float x1 = p[k];
    const float x2 = p[k + half];
    p[k] = x1 * c - x2 * s;
    p[k + half] = x2 * c + x1 * s;
  }
  __syncthreads();
  const int32_t block = index.block_tables[index.table_offsets[t] + position / cache.block_size];
  const int32_t slot = position % cache.block_size;
  float* keys = cache.keys(layer) + block * cache.block_floats;
  float* values = cache.values(layer) + block * cache.block_floats;
  const float* k_row = row + static_cast<int64_t>(heads) * head_dim;
  const float* v_row = k_row + static_cast<int64_t>(kv_heads) * head_dim;
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(kv_heads) * head_dim; i += blockDim.x) {
    const int64_t g = i / head_dim;
    const int64_t d = i % head_dim;
    const int64_t at = (g * cache.block_size + slot) * head_dim + d;
    keys[at] = k_row[i];
    values[at] = v_row[i];
  }
}

// One block per (token, q head): online softmax over chunks of positions, so any context fits.
__global__ void PagedAttentionKernel(const float* qkv, int32_t heads, float scale, int32_t window,
                                     StepIndex index, CacheGeometry cache, int64_t layer,
                                     float* out) {
  __shared__ float q[kMaxHeadDim];
  __shared__ float scores[kAttentionChunk];
  __shared__ float shared[32];
  const int64_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int32_t head_dim = cache.head_dim;
  const int32_t group = heads / cache.kv_heads;
  const int32_t g = h / group;
  const int64_t width = static_cast<int64_t>(heads + 2 * cache.kv_heads) * head_dim;
  const float* q_row = qkv + t * width + static_cast<int64_t>(h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q[d] = q_row[d] * scale;
  const int32_t position = index.positions[t];
  const int32_t first = window > 0 ? max(0, position - window + 1) : 0;
  const int32_t* table = index.block_tables + index.table_offsets[t];
  const float* keys = cache.keys(layer) + (static_cast<int64_t>(g) * cache.block_size) * head_dim;
  const float* values = cache.values(layer) + (static_cast<int64_t>(g) * cache.block_size) * head_dim;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int d0 = threadIdx.x;
  const int d1 = threadIdx.x + blockDim.x;
  float maximum = -INFINITY;
  float total = 0.0f;
  float acc0 = 0.0f;
  float acc1 = 0.0f;
  __syncthreads();
  for (int32_t start = first; start <= position; start += kAttentionChunk) {
    const int32_t n = min(kAttentionChunk, position - start + 1);
    for (int32_t j = warp; j < n; j += warps) {
      const int32_t p = start + j;
      const float* k = keys + table[p / cache.block_size] * cache.block_floats +
                       static_cast<int64_t>(p % cache.block_size) * head_dim;
      float partial = 0.0f;
      for (int d = lane; d < head_dim; d += 32) partial += q[d] * k[d];
      for (int offset = 16; offset > 0; offset >>= 1) {
        partial += __shfl_xor_sync(0xffffffffu, partial, offset);
      }
      if (lane == 0) scores[j] = partial;
    }
    __syncthreads();
    const float chunk_max = BlockMax(threadIdx.x < n ? scores[threadIdx.x] : -INFINITY, shared);
    const float next = fmaxf(maximum, chunk_max);
    const float correction = maximum == -INFINITY ? 0.0f : expf(maximum - next);
    if (threadIdx.x < n) scores[threadIdx.x] = expf(scores[threadIdx.x] - next);
    __syncthreads();
    const float chunk_sum = BlockSum(threadIdx.x < n ? scores[threadIdx.x] : 0.0f, shared);
    total = total * correction + chunk_sum;
    maximum = next;
    acc0 *= correction;
    acc1 *= correction;
    for (int32_t j = 0; j < n; ++j) {
      const int32_t p = start + j;
      const float* v = values + table[p / cache.block_size] * cache.block_floats +
                       static_cast<int64_t>(p % cache.block_size) * head_dim;
      const float weight = scores[j];
      if (d0 < head_dim) acc0 += weight * v[d0];
      if (d1 < head_dim) acc1 += weight * v[d1];
    }
    __syncthreads();  // scores are rewritten by the next round
  }
  float* o = out + (t * heads + h) * static_cast<int64_t>(head_dim);
  if (d0 < head_dim) o[d0] = acc0 / total;
  if (d1 < head_dim) o[d1] = acc1 / total;
}

__global__ void SiluMulKernel(const float* gate_up, int64_t tokens, int64_t ffn, float* out) {
  const int64_t count = tokens * ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / ffn;
    const int64_t j = i % ffn;
    const float gate = gate_up[t * 2 * ffn + j];
    const float up = gate_up[t * 2 * ffn + ffn + j];
    out[i] = gate / (1.0f + expf(-gate)) * up;
  }
}

__global__ void ToFloatKernel(const void* in, ElementType type, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = LoadElement(in, type, i);
  }
}

__global__ void FromFloatKernel(const float* in, int64_t count, ElementType type, void* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (type == ElementType::kF16) {
      static_cast<__half*>(out)[i] = __float2half_rn(in[i]);
    } else {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(in[i]);
    }
  }
}

__global__ void ArgmaxKernel(const float* logits, int64_t vocab, const int32_t* argmax,
                             int32_t* ids) {
  __shared__ float best_value[kThreads];
  __shared__ int32_t best_id[kThreads];
  const int64_t r = blockIdx.x;
  if (argmax[r] == 0) {
    if (threadIdx.x == 0) ids[r] = -1;
    return;
  }
  const float* row = logits + r * vocab;
  float value = -INFINITY;
  int32_t id = INT_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = row[i];
    v = isnan(v) ? -INFINITY : fminf(v, FLT_MAX);
    if (v > value || (v == value && i < id)) {
      value = v;
      id = static_cast<int32_t>(i);
    }
  }
  best_value[threadIdx.x] = value;
  best_id[threadIdx.x] = id;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      const float other = best_value[threadIdx.x + stride];
      const int32_t other_id = best_id[threadIdx.x + stride];
      if (other > best_value[threadIdx.x] ||
          (other == best_value[threadIdx.x] && other_id < best_id[threadIdx.x])) {
        best_value[threadIdx.x] = other;
        best_id[threadIdx.x] = other_id;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[r] = best_id[0];
}

__global__ void GatherKernel(const float* in, const int32_t* rows, int64_t count, int64_t width,
                             float* out) {
  const int64_t total = count * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = in[rows[i / width] * width + i % width];
  }
}

__global__ void ScrubKernel(CacheGeometry cache, int32_t block) {
  // blockIdx.x: layer * 2 + (0 keys, 1 values)
  float* data = cache.base + (blockIdx.x * cache.num_blocks + block) * cache.block_floats;
  for (int64_t i = threadIdx.x; i < cache.block_floats; i += blockDim.x) data[i] = 0.0f;
}

__global__ void ReadAllKernel(const uint4* data, int64_t words, uint32_t* partials) {
  __shared__ uint32_t sums[kThreads];
  uint32_t sum = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 word = data[i];
    sum += word.x ^ word.y ^ word.z ^ word.w;
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

}  // namespace

cudaError_t ReadAll(const void* data, int64_t words, int blocks, uint32_t* partials,
                    cudaStream_t stream) {
  ReadAllKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(data), words, partials);
  return cudaGetLastError();
}

cudaError_t EmbedRows(const void* table, ElementType type, const int32_t* ids, int64_t tokens,
                      int64_t hidden, float* out, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  EmbedKernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(table, type, ids, hidden, out);
  return cudaGetLastError();
}

cudaError_t RmsNormRows(const float* x, const int32_t* rows, int64_t count, int64_t hidden,
                        const float* weight, float eps, float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(x, rows, hidden, weight,
                                                                        eps, out);
  return cudaGetLastError();
}

cudaError_t BiasRopeStore(float* qkv, int64_t tokens, int32_t heads, const float* bias,
                          const float* inv_freq, StepIndex index, CacheGeometry cache,
                          int64_t layer, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  BiasRopeStoreKernel<<<static_cast<unsigned>(tokens), kAttentionThreads, 0, stream>>>(
      qkv, heads, bias, inv_freq, index, cache, layer);
  return cudaGetLastError();
}

cudaError_t PagedAttention(const float* qkv, int64_t tokens, int32_t heads, float scale,
                           int32_t window, StepIndex index, CacheGeometry cache, int64_t layer,
                           float* out, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (cache.head_dim > kMaxHeadDim || cache.head_dim > 2 * kAttentionThreads) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads));
  PagedAttentionKernel<<<grid, kAttentionThreads, 0, stream>>>(qkv, heads, scale, window, index,
                                                               cache, layer, out);
  return cudaGetLastError();
}

cudaError_t SiluMul(const float* gate_up, int64_t tokens, int64_t ffn, float* out,
                    cudaStream_t stream) {
  if (tokens * ffn == 0) return cudaSuccess;
  SiluMulKernel<<<GridFor(tokens * ffn, kThreads), kThreads, 0, stream>>>(gate_up, tokens, ffn, out);
  return cudaGetLastError();
}

cudaError_t ConvertToFloat(const void* in, ElementType type, int64_t count, float* out,
                           cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ToFloatKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(in, type, count, out);
  return cudaGetLastError();
}

cudaError_t ConvertFromFloat(const float* in, int64_t count, ElementType type, void* out,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (type == ElementType::kF32) return cudaErrorInvalidValue;
  FromFloatKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(in, count, type, out);
  return cudaGetLastError();
}

cudaError_t ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, const int32_t* argmax,
                       int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, argmax, ids);
  return cudaGetLastError();
}

cudaError_t GatherRows(const float* in, const int32_t* rows, int64_t count, int64_t width,
                       float* out, cudaStream_t stream) {
  if (count * width == 0) return cudaSuccess;
  GatherKernel<<<GridFor(count * width, kThreads), kThreads, 0, stream>>>(in, rows, count, width, out);
  return cudaGetLastError();
}

cudaError_t ScrubCacheBlock(CacheGeometry cache, int64_t layers, int32_t block,
                            cudaStream_t stream) {
  ScrubKernel<<<static_cast<unsigned>(layers * 2), kThreads, 0, stream>>>(cache, block);
  return cudaGetLastError();
}

}  // namespace cloister::gpu::llm
