// Convolution and pooling kernels of the CUDA executor: direct convolution, im2col (for the
// cuBLAS path), channel bias and max/average pooling. See cuda_kernels.h for each launcher's
// contract.
#include <cmath>
#include <cstdint>

#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_kernels_internal.cuh"

namespace cloister::gpu {
namespace {

__device__ __forceinline__ int64_t OutSpatialCount(const WindowGeometry& g) {
  return g.out_dims[0] * g.out_dims[1] * g.out_dims[2];
}
__device__ __forceinline__ int64_t InSpatialCount(const WindowGeometry& g) {
  return g.in_dims[0] * g.in_dims[1] * g.in_dims[2];
}

__global__ void ConvDirectKernel(const float* in, const float* weight, const float* bias,
                                 float* out, WindowGeometry g) {
  const int64_t out_spatial = OutSpatialCount(g);
  const int64_t in_spatial = InSpatialCount(g);
  const int64_t count = g.batch * g.out_channels * out_spatial;
  const int64_t group_in = g.in_channels / g.groups;
  const int64_t group_out = g.out_channels / g.groups;
  const int64_t kernel_size = g.kernel[0] * g.kernel[1] * g.kernel[2];
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t p = i % out_spatial;
    const int64_t m = (i / out_spatial) % g.out_channels;
    const int64_t n = i / (out_spatial * g.out_channels);
    const int64_t o2 = p % g.out_dims[2];
    const int64_t o1 = (p / g.out_dims[2]) % g.out_dims[1];
    const int64_t o0 = p / (g.out_dims[2] * g.out_dims[1]);
    const int64_t group = m / group_out;
    float sum = bias != nullptr ? bias[m] : 0.f;
    for (int64_t c = 0; c < group_in; ++c) {
      const float* plane = in + (n * g.in_channels + group * group_in + c) * in_spatial;
      const float* w = weight + (m * group_in + c) * kernel_size;
      for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
        const int64_t x0 = o0 * g.strides[0] - g.pads_begin[0] + k0 * g.dilations[0];
        if (x0 < 0 || x0 >= g.in_dims[0]) continue;
        for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
          const int64_t x1 = o1 * g.strides[1] - g.pads_begin[1] + k1 * g.dilations[1];
          if (x1 < 0 || x1 >= g.in_dims[1]) continue;
          for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
            const int64_t x2 = o2 * g.strides[2] - g.pads_begin[2] + k2 * g.dilations[2];
            if (x2 < 0 || x2 >= g.in_dims[2]) continue;
            sum += plane[(x0 * g.in_dims[1] + x1) * g.in_dims[2] + x2] *
                   w[(k0 * g.kernel[1] + k1) * g.kernel[2] + k2];
          }
        }
      }
    }
    out[i] = sum;
  }
}

__global__ void Im2ColKernel(const float* in, float* col, WindowGeometry g, int64_t image,
                             int64_t channel_begin) {
  const int64_t out_spatial = OutSpatialCount(g);
  const int64_t in_spatial = InSpatialCount(g);
  const int64_t group_in = g.in_channels / g.groups;
  const int64_t kernel_size = g.kernel[0] * g.kernel[1] * g.kernel[2];
  const int64_t count = group_in * kernel_size * out_spatial;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t p = i % out_spatial;
    const int64_t row = i / out_spatial;
    const int64_t k = row % kernel_size;
    const int64_t c = row / kernel_size;
    const int64_t k2 = k % g.kernel[2];
    const int64_t k1 = (k / g.kernel[2]) % g.kernel[1];
    const int64_t k0 = k / (g.kernel[2] * g.kernel[1]);
    const int64_t o2 = p % g.out_dims[2];
    const int64_t o1 = (p / g.out_dims[2]) % g.out_dims[1];
    const int64_t o0 = p / (g.out_dims[2] * g.out_dims[1]);
    const int64_t x0 = o0 * g.strides[0] - g.pads_begin[0] + k0 * g.dilations[0];
    const int64_t x1 = o1 * g.strides[1] - g.pads_begin[1] + k1 * g.dilations[1];
    const int64_t x2 = o2 * g.strides[2] - g.pads_begin[2] + k2 * g.dilations[2];
    float value = 0.f;
    if (x0 >= 0 && x0 < g.in_dims[0] && x1 >= 0 && x1 < g.in_dims[1] && x2 >= 0 &&
        x2 < g.in_dims[2]) {
      value = in[(image * g.in_channels + channel_begin + c) * in_spatial +
                 (x0 * g.in_dims[1] + x1) * g.in_dims[2] + x2];
    }
    col[i] = value;
  }
}

__global__ void AddChannelBiasKernel(float* out, const float* bias, int64_t n, int64_t channels,
                                     int64_t inner) {
  const int64_t count = n * channels * inner;
  CLOISTER_GRID_LOOP(i, count) { out[i] += bias[(i / inner) % channels]; }
}

__global__ void PoolKernel(const float* in, float* out, WindowGeometry g, bool max_pool,
                           bool count_include_pad) {
  const int64_t out_spatial = OutSpatialCount(g);
  const int64_t in_spatial = InSpatialCount(g);
  const int64_t count = g.batch * g.in_channels * out_spatial;
  CLOISTER_GRID_LOOP(i, count) {
    const int64_t p = i % out_spatial;
    const int64_t plane_index = i / out_spatial;
    const float* plane = in + plane_index * in_spatial;
    const int64_t o2 = p % g.out_dims[2];
    const int64_t o1 = (p / g.out_dims[2]) % g.out_dims[1];
    const int64_t o0 = p / (g.out_dims[2] * g.out_dims[1]);
    float best = -INFINITY;
    double sum = 0.0;
    int64_t in_range = 0;
    int64_t window = 0;
    for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0) {
      const int64_t x0 = o0 * g.strides[0] - g.pads_begin[0] + k0 * g.dilations[0];
      for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
        const int64_t x1 = o1 * g.strides[1] - g.pads_begin[1] + k1 * g.dilations[1];
        for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
          const int64_t x2 = o2 * g.strides[2] - g.pads_begin[2] + k2 * g.dilations[2];
          // The window counted with padding stops at the padded input's end.
          const bool in_padded =
              x0 < g.in_dims[0] + g.pads_end[0] && x1 < g.in_dims[1] + g.pads_end[1] &&
              x2 < g.in_dims[2] + g.pads_end[2];
          if (x0 < 0 || x0 >= g.in_dims[0] || x1 < 0 || x1 >= g.in_dims[1] || x2 < 0 ||
              x2 >= g.in_dims[2]) {
            if (in_padded) ++window;
            continue;
          }
          ++window;
          const float value = plane[(x0 * g.in_dims[1] + x1) * g.in_dims[2] + x2];
          best = fmaxf(best, value);
          sum += value;
          ++in_range;
        }
      }
    }
    if (max_pool) {
      out[i] = best;
    } else {
      const int64_t divisor = count_include_pad ? window : in_range;
      out[i] = divisor > 0 ? static_cast<float>(sum / divisor) : 0.f;
    }
  }
}

}  // namespace

cudaError_t LaunchConvDirect(const float* in, const float* weight, const float* bias, float* out,
                             const WindowGeometry& geometry, cudaStream_t stream) {
  const int64_t count = geometry.batch * geometry.out_channels * geometry.out_dims[0] *
                        geometry.out_dims[1] * geometry.out_dims[2];
  if (count <= 0) return cudaSuccess;
  if (geometry.groups <= 0 || geometry.in_channels % geometry.groups != 0 ||
      geometry.out_channels % geometry.groups != 0) {
    return cudaErrorInvalidValue;
  }
  ConvDirectKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, weight, bias, out, geometry);
  return cudaGetLastError();
}

cudaError_t LaunchIm2Col(const float* in, float* col, const WindowGeometry& geometry,
                         int64_t image, int64_t channel_begin, cudaStream_t stream) {
  if (geometry.groups <= 0 || geometry.in_channels % geometry.groups != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t count = geometry.in_channels / geometry.groups * geometry.kernel[0] *
                        geometry.kernel[1] * geometry.kernel[2] * geometry.out_dims[0] *
                        geometry.out_dims[1] * geometry.out_dims[2];
  if (count <= 0) return cudaSuccess;
  Im2ColKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, col, geometry, image,
                                                           channel_begin);
  return cudaGetLastError();
}

cudaError_t LaunchAddChannelBias(float* out, const float* bias, int64_t n, int64_t channels,
                                 int64_t inner, cudaStream_t stream) {
  const int64_t count = n * channels * inner;
  if (count <= 0) return cudaSuccess;
  AddChannelBiasKernel<<<BlocksFor(count), kThreads, 0, stream>>>(out, bias, n, channels, inner);
  return cudaGetLastError();
}

cudaError_t LaunchPool(const float* in, float* out, const WindowGeometry& geometry, bool max_pool,
                       bool count_include_pad, cudaStream_t stream) {
  const int64_t count = geometry.batch * geometry.in_channels * geometry.out_dims[0] *
                        geometry.out_dims[1] * geometry.out_dims[2];
  if (count <= 0) return cudaSuccess;
  PoolKernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, out, geometry, max_pool,
                                                         count_include_pad);
  return cudaGetLastError();
}

}  // namespace cloister::gpu
