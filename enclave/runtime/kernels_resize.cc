// Resize (versions 10, 11, 13, 18) on float tensors: nearest, linear and cubic interpolation,
// separable over any number of axes, with the coordinate-transformation modes, nearest-rounding
// modes, exclude_outside and tf_crop_and_resize extrapolation of the ONNX reference
// implementation. Interpolation weights are computed per axis; each output element is the
// nested weighted sum over its taps, innermost axis first, as the reference nests it.
#include <algorithm>
#include <cmath>

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

AxisTaps ComputeTaps(const ResizeAttributes& a, int64_t x, int64_t in, double scale,
                     double roi_start, double roi_end) {
  AxisTaps taps;
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
      if (original < 0 || original > in - 1) {
        taps.extrapolate = true;
        return taps;
      }
      break;
  }
  const double floor_value = std::floor(original);
  const bool integral = original == floor_value;
  const double ratio = integral ? 1.0 : original - floor_value;
  // The n neighbours nearest to `original`, preferring lower indexes: for a whole coordinate
  // the window ends at it, otherwise it straddles it.
  const int64_t base = static_cast<int64_t>(floor_value) - (integral ? 1 : 0);
  double coefficients[4] = {0, 0, 0, 0};
  int n = 2;
  switch (a.mode) {
    case ResizeMode::kNearest: {
      n = 2;
      bool upper = true;
      if (integral) {
        upper = true;
      } else {
        switch (a.rounding) {
          case Rounding::kRoundPreferFloor:
            upper = ratio > 0.5;
            break;
          case Rounding::kRoundPreferCeil:
            upper = ratio >= 0.5;
            break;
          case Rounding::kFloor:
            upper = false;
            break;
          case Rounding::kCeil:
            upper = true;
            break;
        }
      }
      coefficients[0] = upper ? 0 : 1;
      coefficients[1] = upper ? 1 : 0;
      break;
    }
    case ResizeMode::kLinear:
      n = 2;
      coefficients[0] = 1 - ratio;
      coefficients[1] = ratio;
      break;
    case ResizeMode::kCubic: {
      n = 4;
      const double A = a.cubic_a, t = ratio, u = 1 - ratio;
      coefficients[0] = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
      coefficients[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
      coefficients[2] = ((A + 2) * u - (A + 3)) * u * u + 1;
      coefficients[3] = ((A * (u + 1) - 5 * A) * (u + 1) + 8 * A) * (u + 1) - 4 * A;
      break;
    }
  }
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

class ResizeKernel : public Kernel {
 public:
  ResizeKernel(ResizeAttributes attributes, int version)
      : attributes_(attributes), version_(version) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const int rank = x.rank();
    const int scales_input = version_ < 11 ? 1 : 2;
    const int sizes_input = 3;
    std::vector<double> scales(rank, 1.0);
    std::vector<int64_t> out_shape(rank);
    std::vector<double> roi_start(rank, 0.0), roi_end(rank, 1.0);
    if (version_ >= 11 && context.has_input(1) && context.input(1).count() > 0) {
      const Tensor& roi = context.input(1);
      if (roi.count() != 2 * rank || roi.dtype() != DataType::kFloat) {
        return absl::InvalidArgumentError("roi must hold 2 * rank floats");
      }
      for (int i = 0; i < rank; ++i) {
        roi_start[i] = roi.data<float>()[i];
        roi_end[i] = roi.data<float>()[i + rank];
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
      std::vector<int64_t> sizes = ToInt64Vector(context.input(sizes_input));
      if (static_cast<int>(sizes.size()) != rank) {
        return absl::InvalidArgumentError("sizes must have one entry per dimension");
      }
      for (int i = 0; i < rank; ++i) {
        if (sizes[i] < 0 || x.dim(i) == 0) {
          return absl::InvalidArgumentError("sizes must be non-negative and the input non-empty");
        }
        out_shape[i] = sizes[i];
        scales[i] = static_cast<double>(sizes[i]) / x.dim(i);
      }
    } else {
      const Tensor& scale_tensor = context.input(scales_input);
      if (scale_tensor.count() != rank || scale_tensor.dtype() != DataType::kFloat) {
        return absl::InvalidArgumentError("scales must hold one float per dimension");
      }
      for (int i = 0; i < rank; ++i) {
        scales[i] = scale_tensor.data<float>()[i];
        if (!(scales[i] > 0)) return absl::InvalidArgumentError("scales must be positive");
        double extent =
            attributes_.transform == Transform::kTfCropAndResize ? roi_end[i] - roi_start[i] : 1.0;
        out_shape[i] = static_cast<int64_t>(x.dim(i) * extent * scales[i]);
      }
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, out_shape));
    if (y->count() == 0) return absl::OkStatus();
    // Taps per axis and output coordinate.
    std::vector<std::vector<AxisTaps>> taps(rank);
    for (int axis = 0; axis < rank; ++axis) {
      taps[axis].reserve(out_shape[axis]);
      for (int64_t i = 0; i < out_shape[axis]; ++i) {
        taps[axis].push_back(
            ComputeTaps(attributes_, i, x.dim(axis), scales[axis], roi_start[axis], roi_end[axis]));
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
    ASSIGN_OR_RETURN(std::string transform,
                     context.String("coordinate_transformation_mode", "half_pixel"));
    if (transform == "half_pixel") {
      a.transform = Transform::kHalfPixel;
    } else if (transform == "pytorch_half_pixel") {
      a.transform = Transform::kPytorchHalfPixel;
    } else if (transform == "align_corners") {
      a.transform = Transform::kAlignCorners;
    } else if (transform == "asymmetric") {
      a.transform = Transform::kAsymmetric;
    } else if (transform == "tf_half_pixel_for_nn") {
      a.transform = Transform::kTfHalfPixelForNn;
    } else if (transform == "tf_crop_and_resize") {
      a.transform = Transform::kTfCropAndResize;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinate_transformation_mode '", transform, "' is not supported"));
    }
    ASSIGN_OR_RETURN(std::string rounding, context.String("nearest_mode", "round_prefer_floor"));
    if (rounding == "round_prefer_floor") {
      a.rounding = Rounding::kRoundPreferFloor;
    } else if (rounding == "round_prefer_ceil") {
      a.rounding = Rounding::kRoundPreferCeil;
    } else if (rounding == "floor") {
      a.rounding = Rounding::kFloor;
    } else if (rounding == "ceil") {
      a.rounding = Rounding::kCeil;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("nearest_mode '", rounding, "' is not valid"));
    }
    ASSIGN_OR_RETURN(a.cubic_a, context.Float("cubic_coeff_a", -0.75f));
    ASSIGN_OR_RETURN(int64_t exclude, context.Int("exclude_outside", 0));
    a.exclude_outside = exclude != 0;
    ASSIGN_OR_RETURN(a.extrapolation, context.Float("extrapolation_value", 0.0f));
  }
  if (version >= 18) {
    ASSIGN_OR_RETURN(int64_t antialias, context.Int("antialias", 0));
    if (antialias != 0) return absl::UnimplementedError("antialias is not supported");
    if (context.has_attribute("axes")) return absl::UnimplementedError("axes is not supported");
    ASSIGN_OR_RETURN(std::string policy, context.String("keep_aspect_ratio_policy", "stretch"));
    if (policy != "stretch") {
      return absl::UnimplementedError("keep_aspect_ratio_policy other than stretch");
    }
  }
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
