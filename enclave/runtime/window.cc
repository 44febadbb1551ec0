#include "enclave/runtime/window.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::runtime {

absl::StatusOr<WindowAttributes> WindowAttributes::Read(const NodeContext& context,
                                                        bool allow_dilations, bool allow_ceil) {
  WindowAttributes attributes;
  ASSIGN_OR_RETURN(attributes.auto_pad, context.String("auto_pad", "NOTSET"));
  if (attributes.auto_pad != "NOTSET" && attributes.auto_pad != "VALID" &&
      attributes.auto_pad != "SAME_UPPER" && attributes.auto_pad != "SAME_LOWER") {
    return absl::InvalidArgumentError(
        absl::StrCat("auto_pad '", attributes.auto_pad, "' is not valid"));
  }
  ASSIGN_OR_RETURN(attributes.kernel_shape, context.Ints("kernel_shape", std::vector<int64_t>{}));
  ASSIGN_OR_RETURN(attributes.strides, context.Ints("strides", std::vector<int64_t>{}));
  ASSIGN_OR_RETURN(attributes.pads, context.Ints("pads", std::vector<int64_t>{}));
  if (allow_dilations) {
    ASSIGN_OR_RETURN(attributes.dilations, context.Ints("dilations", std::vector<int64_t>{}));
  } else if (context.has_attribute("dilations")) {
    return absl::InvalidArgumentError("attribute 'dilations' is not valid at this version");
  }
  if (allow_ceil) {
    ASSIGN_OR_RETURN(int64_t ceil_mode, context.Int("ceil_mode", 0));
    attributes.ceil_mode = ceil_mode != 0;
  }
  return attributes;
}

std::vector<int64_t> WindowGeometry::OutputDims() const {
  return std::vector<int64_t>(output.begin() + (kMaxSpatial - spatial_rank), output.end());
}

namespace {

// An error when an attribute given on the node has other than `expected` values.
absl::Status CheckLength(const std::vector<int64_t>& values, int expected, std::string_view name) {
  if (!values.empty() && static_cast<int>(values.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat("attribute '", std::string(name), "' has ",
                                                   values.size(), " values, expected ", expected));
  }
  return absl::OkStatus();
}

// Axis `a` (of the three) with explicit pads: pads `i` and `i + rank` of the attributes, the
// output size rounded down, or up with ceil_mode.
absl::Status PadExplicitly(const WindowAttributes& attributes, int i, int rank, int a,
                           int64_t extent, WindowGeometry& geometry) {
  const int64_t in = geometry.input[a];
  if (!attributes.pads.empty()) {
    geometry.pad_begin[a] = attributes.pads[i];
    geometry.pad_end[a] = attributes.pads[i + rank];
  }
  if (geometry.pad_begin[a] < 0 || geometry.pad_end[a] < 0) {
    return absl::InvalidArgumentError("pads must not be negative");
  }
  if (in < 0) {
    geometry.output[a] = -1;
    return absl::OkStatus();
  }
  const int64_t span = in + geometry.pad_begin[a] + geometry.pad_end[a] - extent;
  if (span < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("window of extent ", extent, " is larger than the padded input ",
                     in + geometry.pad_begin[a] + geometry.pad_end[a]));
  }
  int64_t out;
  if (attributes.ceil_mode) {
    out = (span + geometry.stride[a] - 1) / geometry.stride[a] + 1;
    // The last window must start inside the input or the leading padding.
    if ((out - 1) * geometry.stride[a] >= in + geometry.pad_begin[a]) --out;
  } else {
    out = span / geometry.stride[a] + 1;
  }
  geometry.output[a] = out;
  return absl::OkStatus();
}

// Axis `a` with auto_pad VALID: no padding.
absl::Status PadNone(int a, int64_t extent, WindowGeometry& geometry) {
  const int64_t in = geometry.input[a];
  if (in < 0) {
    geometry.output[a] = -1;
    return absl::OkStatus();
  }
  if (in < extent) {
    return absl::InvalidArgumentError(
        absl::StrCat("window of extent ", extent, " is larger than the input ", in));
  }
  geometry.output[a] = (in - extent) / geometry.stride[a] + 1;
  return absl::OkStatus();
}

// Axis `a` with auto_pad SAME_UPPER or SAME_LOWER: the output size is the input's divided by the
// stride, rounded up, and the padding that needs is split with the odd one at the end (upper)
// or the beginning (lower).
void PadSame(bool upper, int a, int64_t extent, WindowGeometry& geometry) {
  const int64_t in = geometry.input[a];
  if (in < 0) {
    geometry.output[a] = -1;
    return;
  }
  const int64_t out = (in + geometry.stride[a] - 1) / geometry.stride[a];
  const int64_t total = std::max<int64_t>(0, (out - 1) * geometry.stride[a] + extent - in);
  const int64_t small = total / 2;
  geometry.pad_begin[a] = upper ? small : total - small;
  geometry.pad_end[a] = total - geometry.pad_begin[a];
  geometry.output[a] = out;
}

}  // namespace

absl::StatusOr<WindowGeometry> ComputeWindow(const WindowAttributes& attributes,
                                             const std::vector<int64_t>& input_spatial,
                                             const std::vector<int64_t>& kernel_spatial) {
  const int rank = static_cast<int>(input_spatial.size());
  if (rank < 1 || rank > kMaxSpatial) {
    return absl::UnimplementedError(
        absl::StrCat(rank, " spatial dimensions are not supported (1 to 3)"));
  }
  if (static_cast<int>(kernel_spatial.size()) != rank) {
    return absl::InvalidArgumentError(absl::StrCat("kernel has ", kernel_spatial.size(),
                                                   " spatial dimensions, input has ", rank));
  }
  RETURN_IF_ERROR(CheckLength(attributes.strides, rank, "strides"));
  RETURN_IF_ERROR(CheckLength(attributes.dilations, rank, "dilations"));
  RETURN_IF_ERROR(CheckLength(attributes.pads, 2 * rank, "pads"));

  WindowGeometry geometry;
  geometry.spatial_rank = rank;
  const int offset = kMaxSpatial - rank;
  for (int i = 0; i < rank; ++i) {
    const int a = offset + i;
    geometry.input[a] = input_spatial[i];
    geometry.kernel[a] = kernel_spatial[i];
    if (!attributes.strides.empty()) geometry.stride[a] = attributes.strides[i];
    if (!attributes.dilations.empty()) geometry.dilation[a] = attributes.dilations[i];
    if (geometry.kernel[a] <= 0 || geometry.stride[a] <= 0 || geometry.dilation[a] <= 0) {
      return absl::InvalidArgumentError("kernel sizes, strides and dilations must be positive");
    }
    const int64_t extent = geometry.dilation[a] * (geometry.kernel[a] - 1) + 1;
    if (attributes.auto_pad == "NOTSET") {
      RETURN_IF_ERROR(PadExplicitly(attributes, i, rank, a, extent, geometry));
    } else if (attributes.auto_pad == "VALID") {
      RETURN_IF_ERROR(PadNone(a, extent, geometry));
    } else {  // SAME_UPPER / SAME_LOWER
      PadSame(attributes.auto_pad == "SAME_UPPER", a, extent, geometry);
    }
  }
  return geometry;
}

}  // namespace cloister::runtime
