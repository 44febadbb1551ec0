// Resize (versions 10, 11, 13, 18) on float tensors: nearest, linear and cubic interpolation,
// separable over any number of axes, with the coordinate-transformation modes, nearest-rounding
// modes, exclude_outside and tf_crop_and_resize extrapolation of the ONNX reference
// implementation. Interpolation weights are computed per axis; each output element is the
// nested weighted sum over its taps, innermost axis first, as the reference nests it.
#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"

namespace cloister::runtime {
namespace {

enum class ResizeMode { kNearest, kLinear, kCubic };
enum class Transform {
  kHalfPixel,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
  kTfCropAndResize,
};
enum class Rounding { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

struct ResizeAttributes {
  ResizeMode mode = ResizeMode::kNearest;
  Transform transform = Transform::kHalfPixel;
  Rounding rounding = Rounding::kRoundPreferFloor;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
  float extrapolation = 0.0f;
};

// The taps of one output coordinate along one axis.
struct AxisTaps {
  bool extrapolate = false;
  int count = 0;
  int64_t index[4];
  float weight[4];
};

// The input coordinate that output coordinate x maps to along an axis; nullopt when
// tf_crop_and_resize maps it outside the input (extrapolation).
std::optional<double> SourceCoordinate(const ResizeAttributes& a, int64_t x, int64_t in,
                                       double scale, double roi_start, double roi_end) {
  const double out = scale * static_cast<double>(in);
  double original = 0;
  switch (a.transform) {
    case Transform::kHalfPixel:
      original = (x + 0.5) / scale - 0.5;
      break;
    case Transform::kPytorchHalfPixel:
      original = out == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
      break;
    case Transform::kAlignCorners:
      original = out == 1 ? 0.0 : x * (in - 1) / (out - 1);
      break;
    case Transform::kAsymmetric:
      original = x / scale;
      break;
    case Transform::kTfHalfPixelForNn:
      original = (x + 0.5) / scale;
      break;
    case Transform::kTfCropAndResize:
      original = out == 1 ? (roi_end - roi_start) * (in - 1) / 2
                          : x * (roi_end - roi_start) * (in - 1) / (out - 1);
      original += roi_start * (in - 1);
      if (original < 0 || original > in - 1) return std::nullopt;
      break;
  }
  return original;
}

// Whether nearest mode takes the upper of the two neighbours at fraction `ratio`.
bool NearestTakesUpper(Rounding rounding, bool integral, double ratio) {
  if (integral) return true;
  switch (rounding) {
    case Rounding::kRoundPreferFloor:
      return ratio > 0.5;
    case Rounding::kRoundPreferCeil:
      return ratio >= 0.5;
    case Rounding::kFloor:
      return false;
    case Rounding::kCeil:
      return true;
  }
  return true;
}

// Fills the mode's coefficients of the neighbours at fraction `ratio`; returns their number.
int TapCoefficients(const ResizeAttributes& a, bool integral, double ratio,
                    double coefficients[4]) {
  switch (a.mode) {
    case ResizeMode::kNearest: {
      const bool upper = NearestTakesUpper(a.rounding, integral, ratio);
      coefficients[0] = upper ? 0 : 1;
      coefficients[1] = upper ? 1 : 0;
      return 2;
    }
    case ResizeMode::kLinear:
      coefficients[0] = 1 - ratio;
      coefficients[1] = ratio;
      return 2;
    case ResizeMode::kCubic: {
      const double A = a.cubic_a, t = ratio, u = 1 - ratio;
      coefficients[0] = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
      coefficients[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
      coefficients[2] = ((A + 2) * u - (A + 3)) * u * u + 1;
      coefficients[3] = ((A * (u + 1) - 5 * A) * (u + 1) + 8 * A) * (u + 1) - 4 * A;
      return 4;
    }
  }
  return 2;
}

AxisTaps ComputeTaps(const ResizeAttributes& a, int64_t x, int64_t in, double scale,
                     double roi_start, double roi_end) {
  AxisTaps taps;
  const std::optional<double> source = SourceCoordinate(a, x, in, scale, roi_start, roi_end);
  if (!source) {
    taps.extrapolate = true;
    return taps;
  }
  const double original = *source;
  const double floor_value = std::floor(original);
  const bool integral = original == floor_value;
  const double ratio = integral ? 1.0 : original - floor_value;
  // The n neighbours nearest to `original`, preferring lower indexes: for a whole coordinate
  // the window ends at it, otherwise it straddles it.
  const int64_t base = static_cast<int64_t>(floor_value) - (integral ? 1 : 0);
  double coefficients[4] = {0, 0, 0, 0};
  const int n = TapCoefficients(a, integral, ratio, coefficients);
  const int64_t first = base - n / 2 + 1;
  double total = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t index = first + i;
    if (a.exclude_outside && (index < 0 || index >= in)) coefficients[i] = 0;
    total += coefficients[i];
  }
  for (int i = 0; i < n; ++i) {
    const double c = a.exclude_outside && total != 0 ? coefficients[i] / total : coefficients[i];
    if (c == 0) continue;
    taps.index[taps.count] = std::clamp<int64_t>(first + i, 0, in - 1);  // edge padding
    taps.weight[taps.count] = static_cast<float>(c);
    ++taps.count;
  }
  return taps;
}

// Output shape, per-axis scales and crop box of one Resize run.
struct ResizeGeometry {
  std::vector<double> scales;
  std::vector<int64_t> out_shape;
  std::vector<double> roi_start, roi_end;
};

class ResizeKernel : public Kernel {
 public:
  ResizeKernel(ResizeAttributes attributes, int version)
      : attributes_(attributes), version_(version) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const int rank = x.rank();
    ASSIGN_OR_RETURN(ResizeGeometry geometry, Geometry(context, x));
    const std::vector<int64_t>& out_shape = geometry.out_shape;
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, out_shape));
    if (y->count() == 0) return absl::OkStatus();
    // Taps per axis and output coordinate.
    std::vector<std::vector<AxisTaps>> taps(rank);
    for (int axis = 0; axis < rank; ++axis) {
      taps[axis].reserve(out_shape[axis]);
      for (int64_t i = 0; i < out_shape[axis]; ++i) {
        taps[axis].push_back(ComputeTaps(attributes_, i, x.dim(axis), geometry.scales[axis],
                                         geometry.roi_start[axis], geometry.roi_end[axis]));
      }
    }
    std::vector<int64_t> strides(rank, 1);
    for (int i = rank - 1; i > 0; --i) strides[i - 1] = strides[i] * x.dim(i);
    const float* in = x.data<float>();
    float* out = y->data<float>();
    std::vector<int64_t> position(rank, 0);
    std::vector<const AxisTaps*> current(rank);
    for (int64_t o = 0; o < y->count(); ++o) {
      for (int axis = 0; axis < rank; ++axis) current[axis] = &taps[axis][position[axis]];
      out[o] = static_cast<float>(Interpolate(in, strides, current, 0, 0));
      for (int axis = rank; axis-- > 0;) {
        if (++position[axis] < out_shape[axis]) break;
        position[axis] = 0;
      }
    }
    return absl::OkStatus();
  }

 private:
  // The checked roi, scales or sizes of this run and the output shape they give.
  absl::StatusOr<ResizeGeometry> Geometry(KernelContext& context, const Tensor& x) const {
    const int rank = x.rank();
    const int scales_input = version_ < 11 ? 1 : 2;
    const int sizes_input = 3;
    ResizeGeometry geometry;
    geometry.scales.assign(rank, 1.0);
    geometry.out_shape.resize(rank);
    geometry.roi_start.assign(rank, 0.0);
    geometry.roi_end.assign(rank, 1.0);
    if (version_ >= 11 && context.has_input(1) && context.input(1).count() > 0) {
      const Tensor& roi = context.input(1);
      if (roi.count() != 2 * rank || roi.dtype() != DataType::kFloat) {
        return absl::InvalidArgumentError("roi must hold 2 * rank floats");
      }
      for (int i = 0; i < rank; ++i) {
        geometry.roi_start[i] = roi.data<float>()[i];
        geometry.roi_end[i] = roi.data<float>()[i + rank];
      }
    }
    const bool have_sizes =
        context.has_input(sizes_input) && context.input(sizes_input).count() > 0;
    const bool have_scales =
        context.has_input(scales_input) && context.input(scales_input).count() > 0;
    if (have_sizes == have_scales) {
      return absl::InvalidArgumentError("exactly one of scales and sizes must be given");
    }
    if (have_sizes) {
      RETURN_IF_ERROR(FromSizes(context.input(sizes_input), x, geometry));
    } else {
      RETURN_IF_ERROR(FromScales(context.input(scales_input), x, geometry));
    }
    return geometry;
  }

  // Output shape and scales from the sizes input.
  static absl::Status FromSizes(const Tensor& size_tensor, const Tensor& x,
                                ResizeGeometry& geometry) {
    const int rank = x.rank();
    std::vector<int64_t> sizes = ToInt64Vector(size_tensor);
    if (static_cast<int>(sizes.size()) != rank) {
      return absl::InvalidArgumentError("sizes must have one entry per dimension");
    }
    for (int i = 0; i < rank; ++i) {
      if (sizes[i] < 0 || x.dim(i) == 0) {
        return absl::InvalidArgumentError("sizes must be non-negative and the input non-empty");
      }
      geometry.out_shape[i] = sizes[i];
      geometry.scales[i] = static_cast<double>(sizes[i]) / x.dim(i);
    }
    return absl::OkStatus();
  }

  // Scales and output shape from the scales input (and the crop box).
  absl::Status FromScales(const Tensor& scale_tensor, const Tensor& x,
                          ResizeGeometry& geometry) const {
    const int rank = x.rank();
    if (scale_tensor.count() != rank || scale_tensor.dtype() != DataType::kFloat) {
      return absl::InvalidArgumentError("scales must hold one float per dimension");
    }
    for (int i = 0; i < rank; ++i) {
      geometry.scales[i] = scale_tensor.data<float>()[i];
      if (!(geometry.scales[i] > 0)) return absl::InvalidArgumentError("scales must be positive");
      double extent = attributes_.transform == Transform::kTfCropAndResize
                          ? geometry.roi_end[i] - geometry.roi_start[i]
                          : 1.0;
      geometry.out_shape[i] = static_cast<int64_t>(x.dim(i) * extent * geometry.scales[i]);
    }
    return absl::OkStatus();
  }

  double Interpolate(const float* in, const std::vector<int64_t>& strides,
                     const std::vector<const AxisTaps*>& taps, int axis, int64_t offset) const {
    if (axis == static_cast<int>(taps.size())) return in[offset];
    const AxisTaps& t = *taps[axis];
    if (t.extrapolate) return attributes_.extrapolation;
    double sum = 0;
    for (int i = 0; i < t.count; ++i) {
      sum += t.weight[i] *
             Interpolate(in, strides, taps, axis + 1, offset + t.index[i] * strides[axis]);
    }
    return sum;
  }

  ResizeAttributes attributes_;
  int version_;
};

absl::StatusOr<Transform> ParseTransform(const std::string& name) {
  if (name == "half_pixel") return Transform::kHalfPixel;
  if (name == "pytorch_half_pixel") return Transform::kPytorchHalfPixel;
  if (name == "align_corners") return Transform::kAlignCorners;
  if (name == "asymmetric") return Transform::kAsymmetric;
  if (name == "tf_half_pixel_for_nn") return Transform::kTfHalfPixelForNn;
  if (name == "tf_crop_and_resize") return Transform::kTfCropAndResize;
  return absl::InvalidArgumentError(
      absl::StrCat("coordinate_transformation_mode '", name, "' is not supported"));
}

absl::StatusOr<Rounding> ParseRounding(const std::string& name) {
  if (name == "round_prefer_floor") return Rounding::kRoundPreferFloor;
  if (name == "round_prefer_ceil") return Rounding::kRoundPreferCeil;
  if (name == "floor") return Rounding::kFloor;
  if (name == "ceil") return Rounding::kCeil;
  return absl::InvalidArgumentError(absl::StrCat("nearest_mode '", name, "' is not valid"));
}

// The attributes that Resize-11 added: coordinate transformation, nearest rounding, cubic
// coefficient, exclude_outside and extrapolation value.
absl::Status ReadResize11Attributes(NodeContext& context, ResizeAttributes& a) {
  ASSIGN_OR_RETURN(std::string transform,
                   context.String("coordinate_transformation_mode", "half_pixel"));
  ASSIGN_OR_RETURN(a.transform, ParseTransform(transform));
  ASSIGN_OR_RETURN(std::string rounding, context.String("nearest_mode", "round_prefer_floor"));
  ASSIGN_OR_RETURN(a.rounding, ParseRounding(rounding));
  ASSIGN_OR_RETURN(a.cubic_a, context.Float("cubic_coeff_a", -0.75f));
  ASSIGN_OR_RETURN(int64_t exclude, context.Int("exclude_outside", 0));
  a.exclude_outside = exclude != 0;
  ASSIGN_OR_RETURN(a.extrapolation, context.Float("extrapolation_value", 0.0f));
  return absl::OkStatus();
}

// Refuses the Resize-18 attributes that this kernel does not implement.
absl::Status CheckResize18Attributes(NodeContext& context) {
  ASSIGN_OR_RETURN(int64_t antialias, context.Int("antialias", 0));
  if (antialias != 0) return absl::UnimplementedError("antialias is not supported");
  if (context.has_attribute("axes")) return absl::UnimplementedError("axes is not supported");
  ASSIGN_OR_RETURN(std::string policy, context.String("keep_aspect_ratio_policy", "stretch"));
  if (policy != "stretch") {
    return absl::UnimplementedError("keep_aspect_ratio_policy other than stretch");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Kernel>> MakeResize(NodeContext& context) {
  const int version = context.since_version();
  RETURN_IF_ERROR(context.ExpectInputs(version < 11 ? 2 : 1, version < 11 ? 2 : 4));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t == DataType::kFloat; }));
  ResizeAttributes a;
  ASSIGN_OR_RETURN(std::string mode, context.String("mode", "nearest"));
  if (mode == "nearest") {
    a.mode = ResizeMode::kNearest;
  } else if (mode == "linear") {
    a.mode = ResizeMode::kLinear;
  } else if (mode == "cubic" && version >= 11) {
    a.mode = ResizeMode::kCubic;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' is not supported"));
  }
  if (version < 11) {
    // Resize-10 behaves like Upsample: asymmetric coordinates, nearest rounds down.
    a.transform = Transform::kAsymmetric;
    a.rounding = Rounding::kFloor;
  } else {
    RETURN_IF_ERROR(ReadResize11Attributes(context, a));
  }
  if (version >= 18) RETURN_IF_ERROR(CheckResize18Attributes(context));
  const int sizes_input = 3;
  if (context.has_input(sizes_input)) {
    RETURN_IF_ERROR(
        RequireType(context, sizes_input, [](DataType t) { return t == DataType::kInt64; }));
  }
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    std::vector<int64_t> dims(x.rank(), -1);
    if (const Tensor* sizes = context.constant_input(sizes_input);
        sizes && sizes->count() == x.rank()) {
      dims = ToInt64Vector(*sizes);
    }
    context.SetOutput(0, DataType::kFloat, dims);
  } else {
    context.SetOutputUnranked(0, DataType::kFloat);
  }
  return MakeKernel<ResizeKernel>(a, version);
}

}  // namespace

void RegisterResizeKernels(KernelRegistry& registry) {
  registry.Register("Resize", {10, 11, 13, 18}, MakeResize);
}

}  // namespace cloister::runtime
