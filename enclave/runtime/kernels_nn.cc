// Neural-network CPU kernels: BatchNormalization, InstanceNormalization, LayerNormalization,
// pooling and Softmax/LogSoftmax. Conv and ConvTranspose are in kernels_conv.cc, MatMul and Gemm
// in kernels_matmul.cc.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/parallel.h"
#include "enclave/runtime/simd.h"
#include "enclave/runtime/window.h"

namespace cloister::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// Normalisation.

// y = x * scale[c] + shift[c] over [N, C, rest...].
void ChannelAffine(const float* x, const float* scale, const float* shift, int64_t batch,
                   int64_t channels, int64_t plane, float* y) {
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      const float a = scale[c], b = shift[c];
      const float* in = x + (n * channels + c) * plane;
      float* out = y + (n * channels + c) * plane;
      for (int64_t i = 0; i < plane; ++i) out[i] = in[i] * a + b;
    }
  }
}

class BatchNormKernel : public Kernel {
 public:
  explicit BatchNormKernel(float epsilon) : epsilon_(epsilon) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 2) return absl::InvalidArgumentError("input needs at least 2 dimensions");
    const int64_t channels = x.dim(1);
    for (int i = 1; i <= 4; ++i) {
      if (context.input(i).count() != channels) {
        return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " has ",
                                                       context.input(i).count(), " values for ",
                                                       channels, " channels"));
      }
    }
    std::vector<float> scale(channels), shift(channels);
    const float* gamma = context.input(1).data<float>();
    const float* beta = context.input(2).data<float>();
    const float* mean = context.input(3).data<float>();
    const float* var = context.input(4).data<float>();
    for (int64_t c = 0; c < channels; ++c) {
      scale[c] = gamma[c] / std::sqrt(var[c] + epsilon_);
      shift[c] = beta[c] - mean[c] * scale[c];
    }
    ASSIGN_OR_RETURN(Tensor * y, context.OutputReusingInput(0, 0, DataType::kFloat, x.shape()));
    ChannelAffine(x.data<float>(), scale.data(), shift.data(), x.dim(0), channels,
                  Product(x.shape(), 2, x.rank()), y->data<float>());
    return absl::OkStatus();
  }

 private:
  float epsilon_;
};

// Training mode (opset 14+): normalises with the batch's own per-channel mean and population
// variance, and outputs the updated running statistics
// running * momentum + batch * (1 - momentum) when those outputs are requested.
class BatchNormTrainingKernel : public Kernel {
 public:
  BatchNormTrainingKernel(float epsilon, float momentum) : epsilon_(epsilon), momentum_(momentum) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 2) return absl::InvalidArgumentError("input needs at least 2 dimensions");
    const int64_t batch = x.dim(0);
    const int64_t channels = x.dim(1);
    const int64_t plane = Product(x.shape(), 2, x.rank());
    for (int i = 1; i <= 4; ++i) {
      if (context.input(i).count() != channels) {
        return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " has ",
                                                       context.input(i).count(), " values for ",
                                                       channels, " channels"));
      }
    }
    const int64_t per_channel = batch * plane;
    if (per_channel == 0)
      return absl::InvalidArgumentError("training mode needs a non-empty batch");
    const float* in = x.data<float>();
    std::vector<double> batch_mean(channels, 0.0), batch_var(channels, 0.0);
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0;
      for (int64_t n = 0; n < batch; ++n) {
        const float* row = in + (n * channels + c) * plane;
        for (int64_t i = 0; i < plane; ++i) sum += row[i];
      }
      const double mean = sum / static_cast<double>(per_channel);
      double squares = 0;
      for (int64_t n = 0; n < batch; ++n) {
        const float* row = in + (n * channels + c) * plane;
        for (int64_t i = 0; i < plane; ++i) squares += (row[i] - mean) * (row[i] - mean);
      }
      batch_mean[c] = mean;
      batch_var[c] = squares / static_cast<double>(per_channel);
    }
    const float* gamma = context.input(1).data<float>();
    const float* beta = context.input(2).data<float>();
    const float* running_mean = context.input(3).data<float>();
    const float* running_var = context.input(4).data<float>();
    std::vector<float> scale(channels), shift(channels);
    for (int64_t c = 0; c < channels; ++c) {
      scale[c] = static_cast<float>(gamma[c] / std::sqrt(batch_var[c] + epsilon_));
      shift[c] = static_cast<float>(beta[c] - batch_mean[c] * scale[c]);
    }
    std::vector<float> new_mean(channels), new_var(channels);
    for (int64_t c = 0; c < channels; ++c) {
      new_mean[c] =
          static_cast<float>(running_mean[c] * momentum_ + batch_mean[c] * (1 - momentum_));
      new_var[c] = static_cast<float>(running_var[c] * momentum_ + batch_var[c] * (1 - momentum_));
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, x.shape()));
    ChannelAffine(in, scale.data(), shift.data(), batch, channels, plane, y->data<float>());
    const std::vector<float>* statistics[2] = {&new_mean, &new_var};
    for (int i = 1; i < static_cast<int>(context.outputs().size()) && i <= 2; ++i) {
      ASSIGN_OR_RETURN(Tensor * out, context.Output(i, DataType::kFloat, {channels}));
      std::copy(statistics[i - 1]->begin(), statistics[i - 1]->end(), out->data<float>());
    }
    return absl::OkStatus();
  }

 private:
  float epsilon_;
  float momentum_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeBatchNorm(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(5, 5));
  for (int i = 0; i < 5; ++i) RETURN_IF_ERROR(RequireType(context, i, IsFloat32));
  ASSIGN_OR_RETURN(float epsilon, context.Float("epsilon", 1e-5f));
  if (context.since_version() < 7) {
    // BatchNormalization-6 trains unless is_test is set.
    ASSIGN_OR_RETURN(int64_t is_test, context.Int("is_test", 0));
    if (is_test == 0) {
      return absl::UnimplementedError("training (is_test=0) is not supported before opset 14");
    }
  }
  if (context.since_version() < 9) {
    ASSIGN_OR_RETURN(int64_t spatial, context.Int("spatial", 1));
    if (spatial != 1) return absl::UnimplementedError("spatial=0 is not supported");
  }
  if (context.since_version() >= 14) {
    ASSIGN_OR_RETURN(int64_t training, context.Int("training_mode", 0));
    if (training != 0) {
      if (context.output_count() > 3) {
        return absl::InvalidArgumentError("training mode has at most 3 outputs");
      }
      ASSIGN_OR_RETURN(float momentum, context.Float("momentum", 0.9f));
      context.SetOutput(0, context.input(0).ShapeOnly());
      std::vector<int64_t> channel_dims = {-1};
      if (context.input(0).rank_known && context.input(0).rank() >= 2) {
        channel_dims[0] = context.input(0).dims[1];
      }
      for (int i = 1; i < context.output_count(); ++i) {
        context.SetOutput(i, DataType::kFloat, channel_dims);
      }
      return MakeKernel<BatchNormTrainingKernel>(epsilon, momentum);
    }
  }
  for (int i = 1; i < context.output_count(); ++i) {
    if (!context.node().output(i).empty()) {
      return absl::UnimplementedError("training outputs (running statistics) are not supported");
    }
    context.SetOutputUnranked(i, DataType::kFloat);
  }
  ValueInfo info = context.input(0).ShapeOnly();
  context.SetOutput(0, std::move(info));
  return MakeKernel<BatchNormKernel>(epsilon);
}

class InstanceNormKernel : public Kernel {
 public:
  explicit InstanceNormKernel(float epsilon) : epsilon_(epsilon) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
    const int64_t batch = x.dim(0), channels = x.dim(1);
    const int64_t plane = Product(x.shape(), 2, x.rank());
    if (context.input(1).count() != channels || context.input(2).count() != channels) {
      return absl::InvalidArgumentError("scale and bias must have one value per channel");
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, x.shape()));
    const float* scale = context.input(1).data<float>();
    const float* bias = context.input(2).data<float>();
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t c = 0; c < channels; ++c) {
        const float* in = x.data<float>() + (n * channels + c) * plane;
        float* out = y->data<float>() + (n * channels + c) * plane;
        double sum = 0, sum_sq = 0;
        for (int64_t i = 0; i < plane; ++i) sum += in[i];
        const double mean = sum / plane;
        for (int64_t i = 0; i < plane; ++i) sum_sq += (in[i] - mean) * (in[i] - mean);
        const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / plane + epsilon_));
        const float a = scale[c] * inv;
        const float b = bias[c] - static_cast<float>(mean) * a;
        for (int64_t i = 0; i < plane; ++i) out[i] = in[i] * a + b;
      }
    }
    return absl::OkStatus();
  }

 private:
  float epsilon_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeInstanceNorm(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(3, 3));
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(RequireType(context, i, IsFloat32));
  ASSIGN_OR_RETURN(float epsilon, context.Float("epsilon", 1e-5f));
  ValueInfo info = context.input(0).ShapeOnly();
  context.SetOutput(0, std::move(info));
  return MakeKernel<InstanceNormKernel>(epsilon);
}

class LayerNormKernel : public Kernel {
 public:
  LayerNormKernel(int64_t axis, float epsilon) : axis_(axis), epsilon_(epsilon) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, x.rank()));
    const int64_t rows = Product(x.shape(), 0, axis);
    const int64_t width = Product(x.shape(), axis, x.rank());
    const Tensor& scale = context.input(1);
    const Tensor* bias = context.has_input(2) ? &context.input(2) : nullptr;
    // Scale and bias broadcast to the normalised shape; we support the full-size and scalar forms.
    if ((scale.count() != width && scale.count() != 1) ||
        (bias && bias->count() != width && bias->count() != 1)) {
      return absl::InvalidArgumentError("scale and bias must match the normalised dimensions");
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, x.shape()));
    std::vector<int64_t> stat_shape = x.shape();
    for (int i = axis; i < x.rank(); ++i) stat_shape[i] = 1;
    Tensor* mean_out = nullptr;
    Tensor* inv_out = nullptr;
    if (context.outputs().size() > 1) {
      ASSIGN_OR_RETURN(mean_out, context.Output(1, DataType::kFloat, stat_shape));
    }
    if (context.outputs().size() > 2) {
      ASSIGN_OR_RETURN(inv_out, context.Output(2, DataType::kFloat, stat_shape));
    }
    const float* s = scale.data<float>();
    const float* b = bias ? bias->data<float>() : nullptr;
    const bool full_scale = scale.count() != 1, full_bias = b && bias->count() != 1;
    // Rows are independent: ranges of them go to the run's workers.
    ForRanges(context, rows, width * 3, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        const float* in = x.data<float>() + r * width;
        float* out = y->data<float>() + r * width;
        const float mean = simd::Sum(in, width) / static_cast<float>(width);
        const float inv =
            1.0f / std::sqrt(SquaredDeviation(in, width, mean) / static_cast<float>(width) +
                             epsilon_);
        if (full_scale && (b == nullptr || full_bias)) {
          NormalizeRow(in, width, mean, inv, s, b, out);
        } else {
          for (int64_t i = 0; i < width; ++i) {
            const float normal = (in[i] - mean) * inv;
            out[i] = normal * s[full_scale ? i : 0] + (b ? b[full_bias ? i : 0] : 0.0f);
          }
        }
        if (mean_out) mean_out->data<float>()[r] = static_cast<float>(mean);
        if (inv_out) inv_out->data<float>()[r] = static_cast<float>(inv);
      }
    });
    return absl::OkStatus();
  }

 private:
  // The sum of (in[i] - mean)^2 over a row.
  static float SquaredDeviation(const float* in, int64_t width, float mean) {
    simd::Vec acc = simd::Splat(0.0f);
    int64_t i = 0;
    for (; i + simd::kWidth <= width; i += simd::kWidth) {
      const simd::Vec d = simd::Load(in + i) - mean;
      acc += d * d;
    }
    float total = simd::HorizontalSum(acc);
    for (; i < width; ++i) total += (in[i] - mean) * (in[i] - mean);
    return total;
  }

  // out = (in - mean) * inv * scale + bias (bias may be null), scale and bias of the row's width.
  static void NormalizeRow(const float* in, int64_t width, float mean, float inv,
                           const float* scale, const float* bias, float* out) {
    int64_t i = 0;
    for (; i + simd::kWidth <= width; i += simd::kWidth) {
      simd::Vec v = (simd::Load(in + i) - mean) * inv * simd::Load(scale + i);
      if (bias != nullptr) v += simd::Load(bias + i);
      simd::Store(out + i, v);
    }
    for (; i < width; ++i) out[i] = (in[i] - mean) * inv * scale[i] + (bias ? bias[i] : 0.0f);
  }

  int64_t axis_;
  float epsilon_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeLayerNorm(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 3));
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(RequireType(context, i, IsFloat32));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", -1));
  ASSIGN_OR_RETURN(float epsilon, context.Float("epsilon", 1e-5f));
  ASSIGN_OR_RETURN(int64_t stash_type, context.Int("stash_type", 1));
  if (stash_type != 1) return absl::UnimplementedError("stash_type other than float");
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    ASSIGN_OR_RETURN(int normalized, NormalizeAxis(axis, x.rank()));
    context.SetOutput(0, DataType::kFloat, x.dims);
    std::vector<int64_t> stat = x.dims;
    for (int i = normalized; i < x.rank(); ++i) stat[i] = 1;
    for (int i = 1; i < context.output_count(); ++i) context.SetOutput(i, DataType::kFloat, stat);
  } else {
    for (int i = 0; i < context.output_count(); ++i) {
      context.SetOutputUnranked(i, DataType::kFloat);
    }
  }
  return MakeKernel<LayerNormKernel>(axis, epsilon);
}

// ---------------------------------------------------------------------------------------------
// Pooling.

enum class PoolKind { kMax, kAverage };

// Position `index` of a row-major input plane in column-major order.
int64_t ColumnMajorIndex(const WindowGeometry& g, int64_t index) {
  const int64_t w = index % g.input[2];
  const int64_t h = (index / g.input[2]) % g.input[1];
  const int64_t d = index / (g.input[2] * g.input[1]);
  return (w * g.input[1] + h) * g.input[0] + d;
}

// Taps of the window starting at (d0, h0, w0) within the padded input (ceil_mode windows may
// run past it): the count_include_pad divisor.
int64_t PaddedWindowSize(const WindowGeometry& g, int64_t d0, int64_t h0, int64_t w0) {
  int64_t size = 1;
  const int64_t starts[3] = {d0, h0, w0};
  for (int a = 0; a < 3; ++a) {
    const int64_t lo = starts[a];
    const int64_t hi =
        std::min(lo + (g.kernel[a] - 1) * g.dilation[a] + 1, g.input[a] + g.pad_end[a]);
    size *= (hi - lo + g.dilation[a] - 1) / g.dilation[a];
  }
  return size;
}

class PoolKernel : public Kernel {
 public:
  PoolKernel(PoolKind kind, WindowAttributes attributes, bool count_include_pad,
             int64_t storage_order)
      : kind_(kind),
        attributes_(std::move(attributes)),
        count_include_pad_(count_include_pad),
        storage_order_(storage_order) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
    ASSIGN_OR_RETURN(WindowGeometry g,
                     ComputeWindow(attributes_, SpatialOf(x.shape()), attributes_.kernel_shape));
    std::vector<int64_t> out_shape = {x.dim(0), x.dim(1)};
    for (int64_t d : g.OutputDims()) out_shape.push_back(d);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, out_shape));
    int64_t* indices = nullptr;
    if (context.outputs().size() > 1) {
      ASSIGN_OR_RETURN(Tensor * index_tensor, context.Output(1, DataType::kInt64, out_shape));
      indices = index_tensor->data<int64_t>();
    }
    const int64_t planes = x.dim(0) * x.dim(1);
    const int64_t in_plane = g.input_count(), out_plane = g.output_count();
    const float* xd = x.data<float>();
    float* yd = y->data<float>();
    // Planes are independent: ranges of them go to the run's workers.
    const int64_t plane_cost = out_plane * g.kernel_count();
    if (indices == nullptr && g.dilation == std::array<int64_t, 3>{1, 1, 1}) {
      ForRanges(context, planes, plane_cost,
                [&](int64_t first, int64_t last) { DenseWindows(g, xd, first, last, yd); });
      return absl::OkStatus();
    }
    ForRanges(context, planes, plane_cost, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p) {
        TestedWindows(g, xd + p * in_plane, yd + p * out_plane,
                      indices != nullptr ? indices + p * out_plane : nullptr, p * in_plane);
      }
    });
    return absl::OkStatus();
  }

  // The windows of one plane, testing every tap against the input (dilated windows or indices
  // wanted). `indices` (null for none) gets each maximum's position plus `index_base`.
  void TestedWindows(const WindowGeometry& g, const float* in, float* out, int64_t* indices,
                     int64_t index_base) const {
    int64_t o = 0;
    for (int64_t od = 0; od < g.output[0]; ++od) {
      for (int64_t oh = 0; oh < g.output[1]; ++oh) {
        for (int64_t ow = 0; ow < g.output[2]; ++ow, ++o) {
          const int64_t d0 = od * g.stride[0] - g.pad_begin[0];
          const int64_t h0 = oh * g.stride[1] - g.pad_begin[1];
          const int64_t w0 = ow * g.stride[2] - g.pad_begin[2];
          float best = -std::numeric_limits<float>::infinity();
          int64_t best_index = -1;
          double sum = 0;
          int64_t counted = 0;
          for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
            const int64_t id = d0 + kd * g.dilation[0];
            if (id < 0 || id >= g.input[0]) continue;
            for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
              const int64_t ih = h0 + kh * g.dilation[1];
              if (ih < 0 || ih >= g.input[1]) continue;
              for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                const int64_t iw = w0 + kw * g.dilation[2];
                if (iw < 0 || iw >= g.input[2]) continue;
                const int64_t at = (id * g.input[1] + ih) * g.input[2] + iw;
                const float v = in[at];
                if (kind_ == PoolKind::kMax) {
                  if (v > best || best_index < 0) {
                    best = v;
                    best_index = at;
                  }
                } else {
                  sum += v;
                  ++counted;
                }
              }
            }
          }
          if (kind_ == PoolKind::kMax) {
            out[o] = best;
            if (indices != nullptr) {
              int64_t flat = best_index;
              if (storage_order_ == 1 && best_index >= 0) flat = ColumnMajorIndex(g, best_index);
              indices[o] = index_base + flat;
            }
          } else {
            const int64_t divisor = count_include_pad_ ? PaddedWindowSize(g, d0, h0, w0) : counted;
            out[o] = divisor > 0 ? static_cast<float>(sum / divisor) : 0.0f;
          }
        }
      }
    }
  }

  // Undilated windows of planes [first, last): clip each window to the input once instead of
  // testing every tap.
  void DenseWindows(const WindowGeometry& g, const float* xd, int64_t first, int64_t last,
                    float* yd) const {
    const int64_t in_plane = g.input_count(), out_plane = g.output_count();
    for (int64_t p = first; p < last; ++p) {
      const float* in = xd + p * in_plane;
      float* out = yd + p * out_plane;
      int64_t o = 0;
      for (int64_t od = 0; od < g.output[0]; ++od) {
        const int64_t d0 = od * g.stride[0] - g.pad_begin[0];
        const int64_t ds = std::max<int64_t>(d0, 0), de = std::min(d0 + g.kernel[0], g.input[0]);
        for (int64_t oh = 0; oh < g.output[1]; ++oh) {
          const int64_t h0 = oh * g.stride[1] - g.pad_begin[1];
          const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + g.kernel[1], g.input[1]);
          for (int64_t ow = 0; ow < g.output[2]; ++ow, ++o) {
            const int64_t w0 = ow * g.stride[2] - g.pad_begin[2];
            const int64_t ws = std::max<int64_t>(w0, 0),
                          we = std::min(w0 + g.kernel[2], g.input[2]);
            if (kind_ == PoolKind::kMax) {
              float best = -std::numeric_limits<float>::infinity();
              for (int64_t id = ds; id < de; ++id) {
                for (int64_t ih = hs; ih < he; ++ih) {
                  const float* row = in + (id * g.input[1] + ih) * g.input[2];
                  for (int64_t iw = ws; iw < we; ++iw) best = row[iw] > best ? row[iw] : best;
                }
              }
              out[o] = best;
            } else {
              float sum = 0;
              for (int64_t id = ds; id < de; ++id) {
                for (int64_t ih = hs; ih < he; ++ih) {
                  const float* row = in + (id * g.input[1] + ih) * g.input[2];
                  for (int64_t iw = ws; iw < we; ++iw) sum += row[iw];
                }
              }
              int64_t divisor = (de - ds) * (he - hs) * (we - ws);
              if (count_include_pad_) {
                divisor = (std::min(d0 + g.kernel[0], g.input[0] + g.pad_end[0]) - d0) *
                          (std::min(h0 + g.kernel[1], g.input[1] + g.pad_end[1]) - h0) *
                          (std::min(w0 + g.kernel[2], g.input[2] + g.pad_end[2]) - w0);
              }
              out[o] = divisor > 0 ? sum / static_cast<float>(divisor) : 0.0f;
            }
          }
        }
      }
    }
  }

 private:
  PoolKind kind_;
  WindowAttributes attributes_;
  bool count_include_pad_;
  int64_t storage_order_;
};

KernelFactory PoolFactory(PoolKind kind) {
  return [kind](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsFloat32));
    const int version = context.since_version();
    const bool dilations = kind == PoolKind::kMax ? version >= 10 : version >= 19;
    const bool ceil = version >= 10;
    ASSIGN_OR_RETURN(WindowAttributes attributes, WindowAttributes::Read(context, dilations, ceil));
    if (attributes.kernel_shape.empty()) {
      return absl::InvalidArgumentError("missing attribute 'kernel_shape'");
    }
    int64_t count_include_pad = 0, storage_order = 0;
    if (kind == PoolKind::kAverage) {
      ASSIGN_OR_RETURN(count_include_pad, context.Int("count_include_pad", 0));
    } else {
      ASSIGN_OR_RETURN(storage_order, context.Int("storage_order", 0));
    }
    if (kind == PoolKind::kAverage && context.output_count() > 1) {
      return absl::InvalidArgumentError("AveragePool has one output");
    }
    const ValueInfo& x = context.input(0);
    if (x.rank_known) {
      if (x.rank() != static_cast<int>(attributes.kernel_shape.size()) + 2) {
        return absl::InvalidArgumentError(absl::StrCat("kernel_shape has ",
                                                       attributes.kernel_shape.size(),
                                                       " dims for input rank ", x.rank()));
      }
      ASSIGN_OR_RETURN(WindowGeometry g,
                       ComputeWindow(attributes, SpatialOf(x.dims), attributes.kernel_shape));
      std::vector<int64_t> dims = {x.dims[0], x.dims[1]};
      for (int64_t d : g.OutputDims()) dims.push_back(d);
      context.SetOutput(0, DataType::kFloat, dims);
      if (context.output_count() > 1) context.SetOutput(1, DataType::kInt64, dims);
    } else {
      context.SetOutputUnranked(0, DataType::kFloat);
      if (context.output_count() > 1) context.SetOutputUnranked(1, DataType::kInt64);
    }
    return MakeKernel<PoolKernel>(kind, std::move(attributes), count_include_pad != 0,
                                  storage_order);
  };
}

class GlobalPoolKernel : public Kernel {
 public:
  explicit GlobalPoolKernel(PoolKind kind) : kind_(kind) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
    std::vector<int64_t> shape(x.rank(), 1);
    shape[0] = x.dim(0);
    shape[1] = x.dim(1);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, shape));
    const int64_t planes = x.dim(0) * x.dim(1);
    const int64_t plane = Product(x.shape(), 2, x.rank());
    const float* in = x.data<float>();
    float* out = y->data<float>();
    ForRanges(context, planes, plane, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p) {
        const float* row = in + p * plane;
        if (kind_ == PoolKind::kAverage) {
          out[p] = plane > 0 ? simd::Sum(row, plane) / static_cast<float>(plane) : 0.0f;
        } else {
          out[p] = simd::MaxOf(row, plane);
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  PoolKind kind_;
};

KernelFactory GlobalPoolFactory(PoolKind kind) {
  return [kind](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsFloat32));
    const ValueInfo& x = context.input(0);
    if (x.rank_known) {
      if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
      std::vector<int64_t> dims(x.rank(), 1);
      dims[0] = x.dims[0];
      dims[1] = x.dims[1];
      context.SetOutput(0, DataType::kFloat, dims);
    } else {
      context.SetOutputUnranked(0, DataType::kFloat);
    }
    return MakeKernel<GlobalPoolKernel>(kind);
  };
}

// ---------------------------------------------------------------------------------------------
// Softmax and LogSoftmax.

class SoftmaxKernel : public Kernel {
 public:
  SoftmaxKernel(int64_t axis, bool coerce_2d, bool log)
      : axis_(axis), coerce_2d_(coerce_2d), log_(log) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const int rank = std::max(x.rank(), 1);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, rank));
    int64_t outer, width, inner;
    if (coerce_2d_ || x.rank() == 0) {
      outer = Product(x.shape(), 0, axis);
      width = Product(x.shape(), axis, x.rank());
      inner = 1;
    } else {
      outer = Product(x.shape(), 0, axis);
      width = x.dim(axis);
      inner = Product(x.shape(), axis + 1, x.rank());
    }
    ASSIGN_OR_RETURN(Tensor * y, context.OutputReusingInput(0, 0, x.dtype(), x.shape()));
    if (x.dtype() == DataType::kFloat && inner == 1) {
      const float* in = x.data<float>();
      float* out = y->data<float>();
      // Rows are independent (a row is read before it is written): ranges go to the workers.
      ForRanges(context, outer, width * 4, [&](int64_t first, int64_t last) {
        for (int64_t o = first; o < last; ++o) {
          const float* src = in + o * width;
          float* dst = out + o * width;
          const simd::Vec max_value = simd::Splat(simd::MaxOf(src, width));
          if (log_) {
            // The output may be the input (OutputReusingInput): the sum must not overwrite it.
            const float log_sum = std::log(SumOfExp(src, width, max_value));
            for (int64_t j = 0; j < width; ++j) dst[j] = src[j] - max_value[0] - log_sum;
          } else {
            simd::Map(src, dst, width, [&](simd::Vec v) { return simd::Exp(v - max_value); });
            const simd::Vec scale = simd::Splat(1.0f / simd::Sum(dst, width));
            simd::Map(dst, dst, width, [&](simd::Vec v) { return v * scale; });
          }
        }
      });
      return absl::OkStatus();
    }
    FloatTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = y->data<T>();
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          const T* src = in + o * width * inner + i;
          T* dst = out + o * width * inner + i;
          T max_value = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < width; ++j) max_value = std::max(max_value, src[j * inner]);
          T sum = 0;
          if (log_) {
            for (int64_t j = 0; j < width; ++j) sum += std::exp(src[j * inner] - max_value);
            const T log_sum = std::log(sum);
            for (int64_t j = 0; j < width; ++j)
              dst[j * inner] = src[j * inner] - max_value - log_sum;
          } else {
            for (int64_t j = 0; j < width; ++j) {
              const T e = std::exp(src[j * inner] - max_value);
              dst[j * inner] = e;
              sum += e;
            }
            const T scale = T(1) / sum;
            for (int64_t j = 0; j < width; ++j) dst[j * inner] *= scale;
          }
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  // The sum of e^(src[j] - max) over a row, without writing anywhere.
  static float SumOfExp(const float* src, int64_t width, simd::Vec max_value) {
    simd::Vec acc = simd::Splat(0.0f);
    int64_t j = 0;
    for (; j + simd::kWidth <= width; j += simd::kWidth) {
      acc += simd::Exp(simd::Load(src + j) - max_value);
    }
    float total = simd::HorizontalSum(acc);
    for (; j < width; ++j) total += std::exp(src[j] - max_value[0]);
    return total;
  }

  int64_t axis_;
  bool coerce_2d_;
  bool log_;
};

KernelFactory SoftmaxFactory(bool log) {
  return [log](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsFloat));
    const bool coerce = context.since_version() < 13;
    ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", coerce ? 1 : -1));
    const ValueInfo& x = context.input(0);
    if (x.rank_known) RETURN_IF_ERROR(NormalizeAxis(axis, std::max(x.rank(), 1)).status());
    ValueInfo info = x.ShapeOnly();
    context.SetOutput(0, std::move(info));
    return MakeKernel<SoftmaxKernel>(axis, coerce, log);
  };
}

}  // namespace

void RegisterNeuralKernels(KernelRegistry& registry) {
  registry.Register("BatchNormalization", {6, 7, 9, 14, 15}, MakeBatchNorm);
  registry.Register("InstanceNormalization", {6}, MakeInstanceNorm);
  registry.Register("LayerNormalization", {17}, MakeLayerNorm);
  registry.Register("MaxPool", {1, 8, 10, 11, 12}, PoolFactory(PoolKind::kMax));
  registry.Register("AveragePool", {1, 7, 10, 11}, PoolFactory(PoolKind::kAverage));
  registry.Register("GlobalAveragePool", {1}, GlobalPoolFactory(PoolKind::kAverage));
  registry.Register("GlobalMaxPool", {1}, GlobalPoolFactory(PoolKind::kMax));
  registry.Register("Softmax", {1, 11, 13}, SoftmaxFactory(false));
  registry.Register("LogSoftmax", {1, 11, 13}, SoftmaxFactory(true));
}

}  // namespace cloister::runtime
