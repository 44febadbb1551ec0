// Sliding-window geometry shared by Conv, ConvTranspose and the pooling kernels: kernel size,
// strides, dilations and pads per spatial axis, with ONNX's auto_pad and ceil_mode rules.
// Internally every window has three spatial axes; 1-D and 2-D inputs get leading axes of size 1.
// Threading: plain values.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "enclave/runtime/kernel.h"

namespace cloister::runtime {

inline constexpr int kMaxSpatial = 3;

// Window attributes as written on the node.
struct WindowAttributes {
  std::string auto_pad = "NOTSET";
  std::vector<int64_t> kernel_shape;  // may be empty for Conv (taken from the weights)
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pads;
  bool ceil_mode = false;

  // Reads the attributes present on the node; `allow_dilations`/`allow_ceil` follow the
  // operator version.
  static absl::StatusOr<WindowAttributes> Read(const NodeContext& context, bool allow_dilations,
                                               bool allow_ceil);
};

// Geometry for concrete input and kernel sizes, padded to three spatial axes.
struct WindowGeometry {
  int spatial_rank = 0;
  std::array<int64_t, kMaxSpatial> input{1, 1, 1};
  std::array<int64_t, kMaxSpatial> kernel{1, 1, 1};
  std::array<int64_t, kMaxSpatial> stride{1, 1, 1};
  std::array<int64_t, kMaxSpatial> dilation{1, 1, 1};
  std::array<int64_t, kMaxSpatial> pad_begin{0, 0, 0};
  std::array<int64_t, kMaxSpatial> pad_end{0, 0, 0};
  std::array<int64_t, kMaxSpatial> output{1, 1, 1};

  int64_t input_count() const { return input[0] * input[1] * input[2]; }
  int64_t output_count() const { return output[0] * output[1] * output[2]; }
  int64_t kernel_count() const { return kernel[0] * kernel[1] * kernel[2]; }
  // The output spatial dims in the caller's rank.
  std::vector<int64_t> OutputDims() const;
};

// Computes the geometry. `input_spatial` may hold -1 (load-time inference): the matching output
// is -1. Errors for wrong attribute lengths, non-positive strides or kernels, or an empty output.
absl::StatusOr<WindowGeometry> ComputeWindow(const WindowAttributes& attributes,
                                             const std::vector<int64_t>& input_spatial,
                                             const std::vector<int64_t>& kernel_spatial);

}  // namespace cloister::runtime
