// Neural-network CPU kernels: Conv (im2col + BLAS, direct depthwise), ConvTranspose,
// BatchNormalization, InstanceNormalization, LayerNormalization, pooling, Softmax/LogSoftmax,
// MatMul and Gemm.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/activation.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/gemm.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/plan.h"
#include "enclave/runtime/simd.h"
#include "enclave/runtime/window.h"

namespace cloister::runtime {
namespace {

using internal::Buffer;

bool IsFloat32(DataType t) { return t == DataType::kFloat; }

std::vector<int64_t> SpatialOf(const std::vector<int64_t>& dims) {
  return std::vector<int64_t>(dims.begin() + 2, dims.end());
}

// ---------------------------------------------------------------------------------------------
// Conv.

// Writes the im2col matrix of one group: rows (channel, kd, kh, kw), columns output positions.
void Im2Col(const float* input, int64_t channels, const WindowGeometry& g, float* columns) {
  const int64_t od_n = g.output[0], oh_n = g.output[1], ow_n = g.output[2];
  const int64_t plane = g.input_count();
  const int64_t outputs = g.output_count();
  int64_t row = 0;
  for (int64_t c = 0; c < channels; ++c) {
    const float* x = input + c * plane;
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw, ++row) {
          float* out = columns + row * outputs;
          // Valid output-w range for this kw: 0 <= ow*sw - pw + kw*dw < W.
          const int64_t shift_w = kw * g.dilation[2] - g.pad_begin[2];
          int64_t ow_lo = 0;
          while (ow_lo < ow_n && ow_lo * g.stride[2] + shift_w < 0) ++ow_lo;
          int64_t ow_hi = ow_n;
          while (ow_hi > ow_lo && (ow_hi - 1) * g.stride[2] + shift_w >= g.input[2]) --ow_hi;
          for (int64_t od = 0; od < od_n; ++od) {
            const int64_t id = od * g.stride[0] - g.pad_begin[0] + kd * g.dilation[0];
            for (int64_t oh = 0; oh < oh_n; ++oh) {
              float* dst = out + (od * oh_n + oh) * ow_n;
              const int64_t ih = oh * g.stride[1] - g.pad_begin[1] + kh * g.dilation[1];
              if (id < 0 || id >= g.input[0] || ih < 0 || ih >= g.input[1]) {
                std::memset(dst, 0, sizeof(float) * ow_n);
                continue;
              }
              const float* src = x + (id * g.input[1] + ih) * g.input[2];
              for (int64_t ow = 0; ow < ow_lo; ++ow) dst[ow] = 0.0f;
              if (g.stride[2] == 1) {
                std::memcpy(dst + ow_lo, src + ow_lo + shift_w, sizeof(float) * (ow_hi - ow_lo));
              } else {
                for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
                  dst[ow] = src[ow * g.stride[2] + shift_w];
                }
              }
              for (int64_t ow = ow_hi; ow < ow_n; ++ow) dst[ow] = 0.0f;
            }
          }
        }
      }
    }
  }
}

// One input channel to one output channel (depthwise), 2-D or 1-D geometry. The channel is first
// copied into a zero-padded plane (`padded`, at least PaddedPlaneSize() floats) so that the tap
// loops need no bounds checks; each output vector is accumulated in registers over all taps.
int64_t PaddedWidth(const WindowGeometry& g) {
  return std::max(g.input[2] + g.pad_begin[2],
                  (g.output[2] - 1) * g.stride[2] + (g.kernel[2] - 1) * g.dilation[2] + 1) +
         simd::kWidth;
}
int64_t PaddedHeight(const WindowGeometry& g) {
  return std::max(g.input[1] + g.pad_begin[1],
                  (g.output[1] - 1) * g.stride[1] + (g.kernel[1] - 1) * g.dilation[1] + 1);
}

void DepthwiseChannel(const float* x, const float* w, float bias, const WindowGeometry& g,
                      float* padded, float* y) {
  const int64_t H = g.input[1], W = g.input[2];
  const int64_t KH = g.kernel[1], KW = g.kernel[2];
  const int64_t OH = g.output[1], OW = g.output[2];
  const int64_t sh = g.stride[1], sw = g.stride[2];
  const int64_t dh = g.dilation[1], dw = g.dilation[2];
  const int64_t ph = g.pad_begin[1], pw = g.pad_begin[2];
  const int64_t PW = PaddedWidth(g), PH = PaddedHeight(g);
  std::memset(padded, 0, sizeof(float) * PW * PH);
  for (int64_t h = 0; h < H; ++h)
    std::memcpy(padded + (h + ph) * PW + pw, x + h * W, sizeof(float) * W);
  for (int64_t oh = 0; oh < OH; ++oh) {
    float* out = y + oh * OW;
    const float* base = padded + oh * sh * PW;
    int64_t ow = 0;
    if (sw == 1) {
      for (; ow + simd::kWidth <= OW; ow += simd::kWidth) {
        simd::Vec acc = simd::Splat(bias);
        for (int64_t kh = 0; kh < KH; ++kh) {
          const float* row = base + kh * dh * PW + ow;
          const float* taps = w + kh * KW;
          for (int64_t kw = 0; kw < KW; ++kw) acc += taps[kw] * simd::Load(row + kw * dw);
        }
        simd::Store(out + ow, acc);
      }
    }
    for (; ow < OW; ++ow) {
      float acc = bias;
      for (int64_t kh = 0; kh < KH; ++kh) {
        const float* row = base + kh * dh * PW + ow * sw;
        for (int64_t kw = 0; kw < KW; ++kw) acc += w[kh * KW + kw] * row[kw * dw];
      }
      out[ow] = acc;
    }
  }
}

// A per-channel affine map y = x * scale[c] + shift[c] described by a node that follows a
// kernel with `channels` output channels along axis 1 of a rank-`rank` output: BatchNormalization,
// or Add/Sub/Mul/Div by a constant that varies only along the channel axis. False otherwise.
bool ChannelAffineOf(const NodeContext& next, int64_t channels, int rank, int channel_axis,
                     std::vector<float>& scale, std::vector<float>& shift) {
  scale.assign(channels, 1.0f);
  shift.assign(channels, 0.0f);
  if (next.output_count() != 1 || next.input(0).dtype != DataType::kFloat) return false;
  // Expands a constant that varies at most along the channel axis to one value per channel.
  auto per_channel = [&](const Tensor* c, std::vector<float>& out) {
    if (c == nullptr || c->dtype() != DataType::kFloat || c->rank() > rank) return false;
    const float* data = c->data<float>();
    if (c->count() == 1) {
      out.assign(channels, data[0]);
      return true;
    }
    const int offset = rank - c->rank();
    for (int d = 0; d < c->rank(); ++d) {
      const int axis = d + offset;
      if (c->dim(d) != (axis == channel_axis ? channels : 1)) return false;
    }
    out.assign(data, data + channels);
    return true;
  };
  const std::string& op = next.op_type();
  if (op == "BatchNormalization") {
    if (next.since_version() < 9 || next.input_count() != 5) return false;
    // Training mode normalises with the batch's statistics, not the constant ones.
    if (next.since_version() >= 14) {
      auto training = next.Int("training_mode", 0);
      if (!training.ok() || *training != 0) return false;
    }
    // BatchNormalization parameters are plain [C] vectors.
    const float* params[4];
    for (int i = 0; i < 4; ++i) {
      const Tensor* p = next.constant_input(i + 1);
      if (p == nullptr || p->dtype() != DataType::kFloat || p->count() != channels) return false;
      params[i] = p->data<float>();
    }
    const float *gamma = params[0], *beta = params[1], *mean = params[2], *var = params[3];
    if (channel_axis != 1) return false;
    auto epsilon = next.Float("epsilon", 1e-5f);
    if (!epsilon.ok()) return false;
    for (int64_t c = 0; c < channels; ++c) {
      scale[c] = gamma[c] / std::sqrt(var[c] + *epsilon);
      shift[c] = beta[c] - mean[c] * scale[c];
    }
    return true;
  }
  // Before opset 7 a constant operand may be aligned to another axis (`broadcast`/`axis`).
  if (next.input_count() != 2 || next.since_version() < 7) return false;
  std::vector<float> values;
  if (!per_channel(next.constant_input(1), values)) return false;
  if (op == "Add") {
    shift = values;
  } else if (op == "Sub") {
    for (int64_t c = 0; c < channels; ++c) shift[c] = -values[c];
  } else if (op == "Mul") {
    scale = values;
  } else if (op == "Div") {
    for (int64_t c = 0; c < channels; ++c) {
      if (values[c] == 0.0f) return false;
      scale[c] = 1.0f / values[c];
    }
  } else {
    return false;
  }
  return true;
}

class ConvKernel : public Kernel {
 public:
  // `weights` and `bias` are set when they are constants (then fusion can fold into them).
  ConvKernel(WindowAttributes attributes, int64_t group, std::optional<Tensor> weights,
             std::optional<Tensor> bias)
      : attributes_(std::move(attributes)),
        group_(group),
        weights_(std::move(weights)),
        bias_(std::move(bias)) {}

  std::unique_ptr<Kernel> FuseNext(const NodeContext& next) const override {
    if (!weights_.has_value()) return nullptr;
    const int64_t maps = weights_->dim(0);
    auto fused = std::make_unique<ConvKernel>(*this);
    if (auto activation = Activation::FromNode(next)) {
      if (activation_.kind != Activation::Kind::kNone || !post_scale_.empty()) return nullptr;
      fused->activation_ = *activation;
      return fused;
    }
    std::vector<float> scale, shift;
    if (!ChannelAffineOf(next, maps, weights_->rank(), 1, scale, shift)) return nullptr;
    if (activation_.kind == Activation::Kind::kNone) {
      // Fold into the weights and bias: conv(x, w*s) + b*s + t.
      Tensor weights = weights_->Clone();
      const int64_t per_map = weights.count() / maps;
      float* w = weights.data<float>();
      for (int64_t m = 0; m < maps; ++m) {
        for (int64_t i = 0; i < per_map; ++i) w[m * per_map + i] *= scale[m];
      }
      auto bias = Tensor::Create(DataType::kFloat, {maps});
      if (!bias.ok()) return nullptr;
      float* b = bias->data<float>();
      for (int64_t m = 0; m < maps; ++m) {
        const float old = bias_.has_value() ? bias_->data<float>()[m] : 0.0f;
        b[m] = old * scale[m] + shift[m];
      }
      fused->weights_ = std::move(weights);
      fused->bias_ = std::move(bias).value();
    } else {
      if (fused->post_scale_.empty()) {
        fused->post_scale_.assign(maps, 1.0f);
        fused->post_shift_.assign(maps, 0.0f);
      }
      for (int64_t m = 0; m < maps; ++m) {
        fused->post_scale_[m] *= scale[m];
        fused->post_shift_[m] = fused->post_shift_[m] * scale[m] + shift[m];
      }
    }
    return fused;
  }

  // Activation and post-activation affine map on `count` channels starting at `first`.
  void Epilogue(float* y, int64_t first, int64_t count, int64_t plane) const {
    if (activation_.kind == Activation::Kind::kNone && post_scale_.empty()) return;
    for (int64_t m = first; m < first + count; ++m) {
      float* out = y + (m - first) * plane;
      activation_.Apply(out, plane);
      if (!post_scale_.empty()) {
        const float a = post_scale_[m], b = post_shift_[m];
        for (int64_t i = 0; i < plane; ++i) out[i] = out[i] * a + b;
      }
    }
  }

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const Tensor& w = weights_.has_value() ? *weights_ : context.input(1);
    const Tensor* b =
        bias_.has_value() ? &*bias_ : (context.has_input(2) ? &context.input(2) : nullptr);
    if (x.rank() < 3 || w.rank() != x.rank()) {
      return absl::InvalidArgumentError(absl::StrCat("input shape ", ShapeToString(x.shape()),
                                                     " and weight shape ", ShapeToString(w.shape()),
                                                     " do not fit"));
    }
    const int64_t batch = x.dim(0), channels = x.dim(1), maps = w.dim(0);
    if (channels != w.dim(1) * group_ || maps % group_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat("input has ", channels, " channels; weights ",
                                                     ShapeToString(w.shape()), " with group ",
                                                     group_, " need ", w.dim(1) * group_));
    }
    if (b != nullptr && (b->rank() != 1 || b->dim(0) != maps)) {
      return absl::InvalidArgumentError(absl::StrCat("bias shape ", ShapeToString(b->shape()),
                                                     " does not match ", maps, " maps"));
    }
    WindowAttributes attributes = attributes_;
    std::vector<int64_t> kernel = SpatialOf(w.shape());
    if (!attributes.kernel_shape.empty() && attributes.kernel_shape != kernel) {
      return absl::InvalidArgumentError("kernel_shape does not match the weights");
    }
    ASSIGN_OR_RETURN(WindowGeometry g, ComputeWindow(attributes, SpatialOf(x.shape()), kernel));
    std::vector<int64_t> out_shape = {batch, maps};
    for (int64_t d : g.OutputDims()) out_shape.push_back(d);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, out_shape));

    const int64_t cg = channels / group_, mg = maps / group_;
    const int64_t in_plane = g.input_count(), out_plane = g.output_count();
    const int64_t k = cg * g.kernel_count();
    const float* xd = x.data<float>();
    const float* wd = w.data<float>();
    const float* bd = b ? b->data<float>() : nullptr;
    float* yd = y->data<float>();

    const bool depthwise = cg == 1 && mg == 1 && g.input[0] == 1 && g.kernel[0] == 1;
    const bool pointwise = g.kernel_count() == 1 && g.stride == std::array<int64_t, 3>{1, 1, 1} &&
                           g.pad_begin == std::array<int64_t, 3>{0, 0, 0} &&
                           g.pad_end == std::array<int64_t, 3>{0, 0, 0};
    std::shared_ptr<Buffer> columns;
    if (depthwise) {
      ASSIGN_OR_RETURN(columns, context.Scratch(sizeof(float) * PaddedWidth(g) * PaddedHeight(g)));
    } else if (!pointwise) {
      ASSIGN_OR_RETURN(columns, context.Scratch(sizeof(float) * k * out_plane));
    }
    for (int64_t n = 0; n < batch; ++n) {
      if (n > 0) RETURN_IF_ERROR(context.CheckDeadline());  // one image at a time
      for (int64_t grp = 0; grp < group_; ++grp) {
        const float* xg = xd + (n * channels + grp * cg) * in_plane;
        const float* wg = wd + grp * mg * k;
        float* yg = yd + (n * maps + grp * mg) * out_plane;
        if (depthwise) {
          DepthwiseChannel(xg, wg, bd ? bd[grp] : 0.0f, g, static_cast<float*>(columns->data()),
                           yg);
          Epilogue(yg, grp, 1, out_plane);
          continue;
        }
        const float* col = xg;
        if (!pointwise) {
          Im2Col(xg, cg, g, static_cast<float*>(columns->data()));
          col = static_cast<const float*>(columns->data());
        }
        float beta = 0.0f;
        if (bd != nullptr) {
          for (int64_t m = 0; m < mg; ++m) {
            std::fill(yg + m * out_plane, yg + (m + 1) * out_plane, bd[grp * mg + m]);
          }
          beta = 1.0f;
        }
        Gemm<float>(false, false, mg, out_plane, k, 1.0f, wg, k, col, out_plane, beta, yg,
                    out_plane);
        Epilogue(yg, grp * mg, mg, out_plane);
      }
    }
    if (columns) context.pool().Release(std::move(columns));
    return absl::OkStatus();
  }

 private:
  WindowAttributes attributes_;
  int64_t group_;
  std::optional<Tensor> weights_;
  std::optional<Tensor> bias_;
  Activation activation_;
  std::vector<float> post_scale_, post_shift_;  // per output channel, after the activation
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeConvKernel(NodeContext& context,
                                                       WindowAttributes attributes, int64_t group) {
  std::optional<Tensor> weights, bias;
  if (const Tensor* w = context.constant_input(1)) weights = *w;
  if (const Tensor* b = context.constant_input(2)) bias = *b;
  return MakeKernel<ConvKernel>(std::move(attributes), group, std::move(weights), std::move(bias));
}

absl::StatusOr<std::unique_ptr<Kernel>> MakeConv(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 3));
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(RequireType(context, i, IsFloat32));
  ASSIGN_OR_RETURN(WindowAttributes attributes, WindowAttributes::Read(context, true, false));
  ASSIGN_OR_RETURN(int64_t group, context.Int("group", 1));
  if (group < 1) return absl::InvalidArgumentError("group must be positive");
  const ValueInfo& x = context.input(0);
  const ValueInfo& w = context.input(1);
  if (x.rank_known && (x.rank() < 3 || x.rank() > 5)) {
    return absl::UnimplementedError(
        absl::StrCat("input of rank ", x.rank(), " is not supported (1 to 3 spatial dims)"));
  }
  if (x.rank_known && w.rank_known) {
    if (w.rank() != x.rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight shape ", ShapeToString(w.dims), " does not fit input ", ShapeToString(x.dims)));
    }
    if (x.dims[1] >= 0 && w.dims[1] >= 0 && x.dims[1] != w.dims[1] * group) {
      return absl::InvalidArgumentError(absl::StrCat("input has ", x.dims[1], " channels; weights ",
                                                     ShapeToString(w.dims), " with group ", group,
                                                     " need ", w.dims[1] * group));
    }
    if (w.dims[0] >= 0 && w.dims[0] % group != 0) {
      return absl::InvalidArgumentError("output channels are not divisible by group");
    }
    std::vector<int64_t> kernel = SpatialOf(w.dims);
    bool kernel_known = std::all_of(kernel.begin(), kernel.end(), [](int64_t d) { return d > 0; });
    if (!attributes.kernel_shape.empty()) {
      if (kernel_known && attributes.kernel_shape != kernel) {
        return absl::InvalidArgumentError("kernel_shape does not match the weights");
      }
      kernel = attributes.kernel_shape;
      kernel_known = true;
    }
    if (kernel_known) {
      ASSIGN_OR_RETURN(WindowGeometry g, ComputeWindow(attributes, SpatialOf(x.dims), kernel));
      std::vector<int64_t> dims = {x.dims[0], w.dims[0]};
      for (int64_t d : g.OutputDims()) dims.push_back(d);
      context.SetOutput(0, DataType::kFloat, dims);
      return MakeConvKernel(context, std::move(attributes), group);
    }
  }
  context.SetOutputUnranked(0, DataType::kFloat);
  return MakeConvKernel(context, std::move(attributes), group);
}

// ConvTranspose: gemm into columns, then col2im scatter-add.
class ConvTransposeKernel : public Kernel {
 public:
  ConvTransposeKernel(WindowAttributes attributes, int64_t group,
                      std::vector<int64_t> output_padding, std::vector<int64_t> output_shape)
      : attributes_(std::move(attributes)),
        group_(group),
        output_padding_(std::move(output_padding)),
        output_shape_(std::move(output_shape)) {}

  absl::StatusOr<WindowGeometry> Geometry(const std::vector<int64_t>& input_spatial,
                                          const std::vector<int64_t>& kernel) const {
    const int rank = static_cast<int>(input_spatial.size());
    if (rank < 1 || rank > kMaxSpatial || static_cast<int>(kernel.size()) != rank) {
      return absl::InvalidArgumentError("unsupported spatial rank");
    }
    WindowGeometry g;
    g.spatial_rank = rank;
    const int offset = kMaxSpatial - rank;
    for (int i = 0; i < rank; ++i) {
      const int a = offset + i;
      // In the transposed view, `input` is the conv output (our input) and `output` is ours.
      g.output[a] = input_spatial[i];
      g.kernel[a] = kernel[i];
      if (!attributes_.strides.empty()) g.stride[a] = attributes_.strides[i];
      if (!attributes_.dilations.empty()) g.dilation[a] = attributes_.dilations[i];
      const int64_t extent = g.dilation[a] * (g.kernel[a] - 1) + 1;
      const int64_t out_pad = output_padding_.empty() ? 0 : output_padding_[i];
      if (!output_shape_.empty()) {
        g.input[a] = output_shape_[output_shape_.size() - rank + i];
        // Negative totals (a requested shape larger than the natural one) extend the end; the
        // halving rounds down as in the ONNX reference.
        const int64_t total = g.stride[a] * (input_spatial[i] - 1) + out_pad + extent - g.input[a];
        const int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);
        g.pad_begin[a] = attributes_.auto_pad == "SAME_UPPER" ? half : total - half;
        g.pad_end[a] = total - g.pad_begin[a];
      } else {
        if (attributes_.auto_pad == "SAME_UPPER" || attributes_.auto_pad == "SAME_LOWER") {
          const int64_t target = input_spatial[i] * g.stride[a];
          const int64_t total = g.stride[a] * (input_spatial[i] - 1) + out_pad + extent - target;
          g.pad_begin[a] = attributes_.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
          g.pad_end[a] = total - g.pad_begin[a];
        } else if (!attributes_.pads.empty() && attributes_.auto_pad != "VALID") {
          g.pad_begin[a] = attributes_.pads[i];
          g.pad_end[a] = attributes_.pads[i + rank];
        }
        g.input[a] =
            g.stride[a] * (input_spatial[i] - 1) + out_pad + extent - g.pad_begin[a] - g.pad_end[a];
      }
      if (g.input[a] <= 0 || g.stride[a] <= 0 || g.dilation[a] <= 0) {
        return absl::InvalidArgumentError("ConvTranspose output would be empty");
      }
    }
    return g;
  }

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const Tensor& w = context.input(1);
    const Tensor* b = context.has_input(2) ? &context.input(2) : nullptr;
    if (x.rank() < 3 || w.rank() != x.rank() || x.dim(1) != w.dim(0) || x.dim(1) % group_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat("input shape ", ShapeToString(x.shape()),
                                                     " and weight shape ", ShapeToString(w.shape()),
                                                     " do not fit"));
    }
    const int64_t batch = x.dim(0), channels = x.dim(1);
    const int64_t mg = w.dim(1), maps = mg * group_, cg = channels / group_;
    if (b != nullptr && b->count() != maps) {
      return absl::InvalidArgumentError("bias does not match the output channels");
    }
    ASSIGN_OR_RETURN(WindowGeometry g, Geometry(SpatialOf(x.shape()), SpatialOf(w.shape())));
    std::vector<int64_t> out_shape = {batch, maps};
    for (int i = kMaxSpatial - g.spatial_rank; i < kMaxSpatial; ++i)
      out_shape.push_back(g.input[i]);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, out_shape));
    const int64_t in_plane = g.output_count();  // our input positions
    const int64_t out_plane = g.input_count();  // our output positions
    const int64_t k = mg * g.kernel_count();
    ASSIGN_OR_RETURN(auto columns, context.Scratch(sizeof(float) * k * in_plane));
    float* col = static_cast<float*>(columns->data());
    const float* xd = x.data<float>();
    const float* wd = w.data<float>();
    float* yd = y->data<float>();
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t grp = 0; grp < group_; ++grp) {
        // columns[k, positions] = W_g^T [k, cg] * X_g [cg, positions]
        Gemm<float>(true, false, k, in_plane, cg, 1.0f, wd + grp * cg * k, k,
                    xd + (n * channels + grp * cg) * in_plane, in_plane, 0.0f, col, in_plane);
        float* yg = yd + (n * maps + grp * mg) * out_plane;
        for (int64_t m = 0; m < mg; ++m) {
          float* plane = yg + m * out_plane;
          std::fill(plane, plane + out_plane, b ? b->data<float>()[grp * mg + m] : 0.0f);
        }
        int64_t row = 0;
        for (int64_t m = 0; m < mg; ++m) {
          float* plane = yg + m * out_plane;
          for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
            for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
              for (int64_t kw = 0; kw < g.kernel[2]; ++kw, ++row) {
                const float* src = col + row * in_plane;
                for (int64_t od = 0; od < g.output[0]; ++od) {
                  const int64_t id = od * g.stride[0] - g.pad_begin[0] + kd * g.dilation[0];
                  if (id < 0 || id >= g.input[0]) continue;
                  for (int64_t oh = 0; oh < g.output[1]; ++oh) {
                    const int64_t ih = oh * g.stride[1] - g.pad_begin[1] + kh * g.dilation[1];
                    if (ih < 0 || ih >= g.input[1]) continue;
                    for (int64_t ow = 0; ow < g.output[2]; ++ow) {
                      const int64_t iw = ow * g.stride[2] - g.pad_begin[2] + kw * g.dilation[2];
                      if (iw < 0 || iw >= g.input[2]) continue;
                      plane[(id * g.input[1] + ih) * g.input[2] + iw] +=
                          src[(od * g.output[1] + oh) * g.output[2] + ow];
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
    context.pool().Release(std::move(columns));
    return absl::OkStatus();
  }

 private:
  WindowAttributes attributes_;
  int64_t group_;
  std::vector<int64_t> output_padding_;
  std::vector<int64_t> output_shape_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeConvTranspose(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 3));
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(RequireType(context, i, IsFloat32));
  ASSIGN_OR_RETURN(WindowAttributes attributes, WindowAttributes::Read(context, true, false));
  ASSIGN_OR_RETURN(int64_t group, context.Int("group", 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> output_padding,
                   context.Ints("output_padding", std::vector<int64_t>{}));
  ASSIGN_OR_RETURN(std::vector<int64_t> output_shape,
                   context.Ints("output_shape", std::vector<int64_t>{}));
  if (group < 1) return absl::InvalidArgumentError("group must be positive");
  context.SetOutputUnranked(0, DataType::kFloat);
  if (context.input(0).rank_known) {
    context.SetOutput(0, DataType::kFloat, std::vector<int64_t>(context.input(0).rank(), -1));
  }
  return MakeKernel<ConvTransposeKernel>(std::move(attributes), group, std::move(output_padding),
                                         std::move(output_shape));
}

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
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = x.data<float>() + r * width;
      float* out = y->data<float>() + r * width;
      const float mean = simd::Sum(in, width) / static_cast<float>(width);
      for (int64_t i = 0; i < width; ++i) out[i] = (in[i] - mean) * (in[i] - mean);
      const float variance = simd::Sum(out, width) / static_cast<float>(width);
      const float inv = 1.0f / std::sqrt(variance + epsilon_);
      const bool full_scale = scale.count() != 1, full_bias = b && bias->count() != 1;
      for (int64_t i = 0; i < width; ++i) {
        const float normal = (in[i] - mean) * inv;
        out[i] = normal * s[full_scale ? i : 0] + (b ? b[full_bias ? i : 0] : 0.0f);
      }
      if (mean_out) mean_out->data<float>()[r] = static_cast<float>(mean);
      if (inv_out) inv_out->data<float>()[r] = static_cast<float>(inv);
    }
    return absl::OkStatus();
  }

 private:
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
    if (indices == nullptr && g.dilation == std::array<int64_t, 3>{1, 1, 1}) {
      DenseWindows(g, xd, planes, yd);
      return absl::OkStatus();
    }
    for (int64_t p = 0; p < planes; ++p) {
      const float* in = xd + p * in_plane;
      float* out = yd + p * out_plane;
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
                if (storage_order_ == 1 && best_index >= 0) {
                  // Column-major position within the plane.
                  const int64_t w = best_index % g.input[2];
                  const int64_t h = (best_index / g.input[2]) % g.input[1];
                  const int64_t d = best_index / (g.input[2] * g.input[1]);
                  flat = (w * g.input[1] + h) * g.input[0] + d;
                }
                indices[p * out_plane + o] = p * in_plane + flat;
              }
            } else {
              int64_t divisor = counted;
              if (count_include_pad_) {
                // Window clipped to the padded input (ceil_mode windows may run past it).
                divisor = 1;
                const int64_t starts[3] = {d0, h0, w0};
                for (int a = 0; a < 3; ++a) {
                  const int64_t lo = starts[a];
                  const int64_t hi = std::min(lo + (g.kernel[a] - 1) * g.dilation[a] + 1,
                                              g.input[a] + g.pad_end[a]);
                  divisor *= (hi - lo + g.dilation[a] - 1) / g.dilation[a];
                }
              }
              out[o] = divisor > 0 ? static_cast<float>(sum / divisor) : 0.0f;
            }
          }
        }
      }
    }
    return absl::OkStatus();
  }

  // Undilated windows: clip each window to the input once instead of testing every tap.
  void DenseWindows(const WindowGeometry& g, const float* xd, int64_t planes, float* yd) const {
    const int64_t in_plane = g.input_count(), out_plane = g.output_count();
    for (int64_t p = 0; p < planes; ++p) {
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
    for (int64_t p = 0; p < planes; ++p) {
      const float* row = in + p * plane;
      if (kind_ == PoolKind::kAverage) {
        out[p] = plane > 0 ? simd::Sum(row, plane) / static_cast<float>(plane) : 0.0f;
      } else {
        out[p] = simd::MaxOf(row, plane);
      }
    }
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
      for (int64_t o = 0; o < outer; ++o) {
        const float* src = in + o * width;
        float* dst = out + o * width;
        const simd::Vec max_value = simd::Splat(simd::MaxOf(src, width));
        if (log_) {
          simd::Map(src, dst, width, [&](simd::Vec v) { return simd::Exp(v - max_value); });
          const float log_sum = std::log(simd::Sum(dst, width));
          for (int64_t j = 0; j < width; ++j) dst[j] = src[j] - max_value[0] - log_sum;
        } else {
          simd::Map(src, dst, width, [&](simd::Vec v) { return simd::Exp(v - max_value); });
          const float scale = 1.0f / simd::Sum(dst, width);
          for (int64_t j = 0; j < width; ++j) dst[j] *= scale;
        }
      }
      return absl::OkStatus();
    }
    DispatchFloat(x.dtype(), [&](auto tag) {
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

// ---------------------------------------------------------------------------------------------
// MatMul and Gemm.

absl::StatusOr<std::vector<int64_t>> MatMulShape(std::vector<int64_t> a, std::vector<int64_t> b) {
  if (a.empty() || b.empty()) return absl::InvalidArgumentError("MatMul inputs cannot be scalars");
  const bool a_vector = a.size() == 1, b_vector = b.size() == 1;
  if (a_vector) a.insert(a.begin(), 1);
  if (b_vector) b.push_back(1);
  const int64_t ka = a[a.size() - 1], kb = b[b.size() - 2];
  if (ka >= 0 && kb >= 0 && ka != kb) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner dimensions differ: ", ShapeToString(a), " x ", ShapeToString(b)));
  }
  std::vector<int64_t> batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  ASSIGN_OR_RETURN(std::vector<int64_t> out, BroadcastShapes(batch_a, batch_b));
  if (!a_vector) out.push_back(a[a.size() - 2]);
  if (!b_vector) out.push_back(b[b.size() - 1]);
  return out;
}

class MatMulKernel : public Kernel {
 public:
  // `columns` is the output's last dimension when B is a constant (else -1).
  explicit MatMulKernel(int64_t columns) : columns_(columns) {}

  // Fuses a following Add of a constant row vector (bias) and then an activation.
  std::unique_ptr<Kernel> FuseNext(const NodeContext& next) const override {
    if (columns_ <= 0 || next.input(0).dtype != DataType::kFloat) return nullptr;
    auto fused = std::make_unique<MatMulKernel>(*this);
    if (auto activation = Activation::FromNode(next)) {
      if (activation_.kind != Activation::Kind::kNone) return nullptr;
      fused->activation_ = *activation;
      return fused;
    }
    if (next.op_type() != "Add" || next.since_version() < 7 || next.input_count() != 2 ||
        !bias_.empty() || activation_.kind != Activation::Kind::kNone) {
      return nullptr;
    }
    const Tensor* c = next.constant_input(1);
    if (c == nullptr || c->dtype() != DataType::kFloat || c->count() != columns_) return nullptr;
    for (int d = 0; d + 1 < c->rank(); ++d) {
      if (c->dim(d) != 1) return nullptr;
    }
    // The bias must not raise the output rank.
    if (!next.input(0).rank_known || c->rank() > next.input(0).rank()) return nullptr;
    fused->bias_.assign(c->data<float>(), c->data<float>() + columns_);
    return fused;
  }

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    ASSIGN_OR_RETURN(std::vector<int64_t> out_shape, MatMulShape(a.shape(), b.shape()));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, a.dtype(), out_shape));
    const bool has_bias = !bias_.empty();
    if (has_bias) {
      if (out_shape.empty() || out_shape.back() != static_cast<int64_t>(bias_.size())) {
        return absl::InternalError("fused bias does not match the output");
      }
      float* yd = y->data<float>();
      const int64_t n = out_shape.back();
      for (int64_t row = 0; row < y->count() / std::max<int64_t>(n, 1); ++row) {
        std::memcpy(yd + row * n, bias_.data(), sizeof(float) * n);
      }
    }
    std::vector<int64_t> as = a.shape(), bs = b.shape();
    if (as.size() == 1) as.insert(as.begin(), 1);
    if (bs.size() == 1) bs.push_back(1);
    const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    std::vector<int64_t> batch_a(as.begin(), as.end() - 2), batch_b(bs.begin(), bs.end() - 2);
    ASSIGN_OR_RETURN(std::vector<int64_t> batch, BroadcastShapes(batch_a, batch_b));
    const int64_t batches = Product(batch, 0, batch.size());
    const int64_t a_batches = Product(batch_a, 0, batch_a.size());
    const int64_t b_batches = Product(batch_b, 0, batch_b.size());
    // One product can be large: the run's deadline is checked between blocks of rows and
    // between batch items once they add up to a block's work.
    auto deadline = [&context] { return context.CheckDeadline(); };
    absl::Status status;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const T* ad = a.data<T>();
      const T* bd = b.data<T>();
      T* yd = y->data<T>();
      const T beta = has_bias ? T(1) : T(0);
      if (b_batches == 1) {
        // Weights shared by every batch (then the batch dims are A's): one tall multiply.
        status = GemmInRowBlocks<T>(false, false, a_batches * m, n, k, T(1), ad, k, bd, n, beta, yd,
                                    n, deadline);
        return;
      }
      // General broadcast over batch dims: walk the output batch index.
      const size_t rank = batch.size();
      std::vector<int64_t> index(rank, 0);
      int64_t unchecked = 0;  // multiply-adds since the last deadline check
      for (int64_t i = 0; i < batches; ++i) {
        if (unchecked >= kRowBlockMultiplyAdds) {
          status = deadline();
          if (!status.ok()) return;
          unchecked = 0;
        }
        unchecked += m * n * k;
        int64_t ai = 0, bi = 0, a_stride = 1, b_stride = 1;
        for (size_t d = rank; d-- > 0;) {
          const size_t da = d + batch_a.size() - rank, db = d + batch_b.size() - rank;
          if (d >= rank - batch_a.size()) {
            if (batch_a[da] != 1) ai += index[d] * a_stride;
            a_stride *= batch_a[da];
          }
          if (d >= rank - batch_b.size()) {
            if (batch_b[db] != 1) bi += index[d] * b_stride;
            b_stride *= batch_b[db];
          }
        }
        status = GemmInRowBlocks<T>(false, false, m, n, k, T(1), ad + ai * m * k, k,
                                    bd + bi * k * n, n, beta, yd + i * m * n, n, deadline);
        if (!status.ok()) return;
        for (size_t d = rank; d-- > 0;) {
          if (++index[d] < batch[d]) break;
          index[d] = 0;
        }
      }
    };
    if (!DispatchGemm(a.dtype(), run)) {
      return absl::InternalError("MatMul dispatched on an unchecked type");
    }
    RETURN_IF_ERROR(status);
    if (activation_.kind != Activation::Kind::kNone) {
      activation_.Apply(y->data<float>(), y->count());
    }
    return absl::OkStatus();
  }

 private:
  int64_t columns_;
  std::vector<float> bias_;
  Activation activation_;
};

bool IsMatMulType(DataType t) {
  return t == DataType::kFloat || t == DataType::kDouble || t == DataType::kInt32 ||
         t == DataType::kInt64 || t == DataType::kUint32 || t == DataType::kUint64;
}

absl::StatusOr<std::unique_ptr<Kernel>> MakeMatMul(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMatMulType));
  RETURN_IF_ERROR(RequireSameType(context, 0, 1));
  const ValueInfo& a = context.input(0);
  const ValueInfo& b = context.input(1);
  if (a.rank_known && b.rank_known) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, MatMulShape(a.dims, b.dims));
    context.SetOutput(0, a.dtype, dims);
  } else {
    context.SetOutputUnranked(0, a.dtype);
  }
  const Tensor* weights = context.constant_input(1);
  const int64_t columns = weights != nullptr && weights->rank() >= 2 ? weights->shape().back() : -1;
  return MakeKernel<MatMulKernel>(columns);
}

class GemmKernel : public Kernel {
 public:
  GemmKernel(float alpha, float beta, bool trans_a, bool trans_b)
      : alpha_(alpha), beta_(beta), trans_a_(trans_a), trans_b_(trans_b) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    if (a.rank() != 2 || b.rank() != 2) {
      return absl::InvalidArgumentError("A and B must be matrices");
    }
    const int64_t m = trans_a_ ? a.dim(1) : a.dim(0);
    const int64_t k = trans_a_ ? a.dim(0) : a.dim(1);
    const int64_t kb = trans_b_ ? b.dim(1) : b.dim(0);
    const int64_t n = trans_b_ ? b.dim(0) : b.dim(1);
    if (k != kb) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inner dimensions differ: ", ShapeToString(a.shape()), " x ", ShapeToString(b.shape())));
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, a.dtype(), {m, n}));
    const Tensor* c = context.has_input(2) ? &context.input(2) : nullptr;
    if (c != nullptr) {
      auto shape = BroadcastShapes(c->shape(), {m, n});
      if (!shape.ok() || *shape != std::vector<int64_t>{m, n}) {
        return absl::InvalidArgumentError(absl::StrCat("C of shape ", ShapeToString(c->shape()),
                                                       " does not broadcast to [", m, ",", n, "]"));
      }
    }
    absl::Status status;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      T* yd = y->data<T>();
      T beta = T(0);
      if (c != nullptr && beta_ != 0.0f) {
        // Broadcast C into Y, then accumulate.
        const T* cd = c->data<T>();
        const std::vector<int64_t>& cs = c->shape();
        const int64_t rows = cs.size() == 2 ? cs[0] : 1;
        const int64_t cols = cs.empty() ? 1 : cs.back();
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            yd[i * n + j] = cd[(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
          }
        }
        beta = static_cast<T>(beta_);
      }
      status = GemmInRowBlocks<T>(trans_a_, trans_b_, m, n, k, static_cast<T>(alpha_), a.data<T>(),
                                  a.dim(1), b.data<T>(), b.dim(1), beta, yd, n,
                                  [&context] { return context.CheckDeadline(); });
    };
    if (!DispatchGemm(a.dtype(), run)) {
      return absl::InternalError("Gemm dispatched on an unchecked type");
    }
    return status;
  }

 private:
  float alpha_, beta_;
  bool trans_a_, trans_b_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeGemm(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(context.since_version() >= 11 ? 2 : 3, 3));
  RETURN_IF_ERROR(RequireType(context, 0, IsMatMulType));
  RETURN_IF_ERROR(RequireSameType(context, 0, 1));
  RETURN_IF_ERROR(RequireSameType(context, 0, 2));
  ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1.0f));
  ASSIGN_OR_RETURN(float beta, context.Float("beta", 1.0f));
  ASSIGN_OR_RETURN(int64_t trans_a, context.Int("transA", 0));
  ASSIGN_OR_RETURN(int64_t trans_b, context.Int("transB", 0));
  const ValueInfo& a = context.input(0);
  const ValueInfo& b = context.input(1);
  if ((a.rank_known && a.rank() != 2) || (b.rank_known && b.rank() != 2)) {
    return absl::InvalidArgumentError("A and B must be matrices");
  }
  const int64_t m = a.rank_known ? a.dims[trans_a ? 1 : 0] : -1;
  const int64_t n = b.rank_known ? b.dims[trans_b ? 0 : 1] : -1;
  if (a.rank_known && b.rank_known) {
    const int64_t ka = a.dims[trans_a ? 0 : 1], kb = b.dims[trans_b ? 1 : 0];
    if (ka >= 0 && kb >= 0 && ka != kb) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inner dimensions differ: ", ShapeToString(a.dims), " x ", ShapeToString(b.dims)));
    }
  }
  if (context.since_version() < 7) {
    // Gemm-6 broadcasts C only when the node says so; otherwise C is exactly [M, N].
    ASSIGN_OR_RETURN(int64_t broadcast, context.Int("broadcast", 0));
    const ValueInfo& c = context.input(2);
    if (broadcast == 0 && c.rank_known && m >= 0 && n >= 0 &&
        c.dims != std::vector<int64_t>{m, n}) {
      return absl::InvalidArgumentError(absl::StrCat("C of shape ", ShapeToString(c.dims),
                                                     " needs broadcast=1 for an output of shape ",
                                                     ShapeToString({m, n})));
    }
  }
  context.SetOutput(0, a.dtype, {m, n});
  return MakeKernel<GemmKernel>(alpha, beta, trans_a != 0, trans_b != 0);
}

}  // namespace

void RegisterNeuralKernels(KernelRegistry& registry) {
  registry.Register("Conv", {1, 11}, MakeConv);
  registry.Register("ConvTranspose", {1, 11}, MakeConvTranspose);
  registry.Register("BatchNormalization", {6, 7, 9, 14, 15}, MakeBatchNorm);
  registry.Register("InstanceNormalization", {6}, MakeInstanceNorm);
  registry.Register("LayerNormalization", {17}, MakeLayerNorm);
  registry.Register("MaxPool", {1, 8, 10, 11, 12}, PoolFactory(PoolKind::kMax));
  registry.Register("AveragePool", {1, 7, 10, 11}, PoolFactory(PoolKind::kAverage));
  registry.Register("GlobalAveragePool", {1}, GlobalPoolFactory(PoolKind::kAverage));
  registry.Register("GlobalMaxPool", {1}, GlobalPoolFactory(PoolKind::kMax));
  registry.Register("Softmax", {1, 11, 13}, SoftmaxFactory(false));
  registry.Register("LogSoftmax", {1, 11, 13}, SoftmaxFactory(true));
  registry.Register("MatMul", {1, 9, 13}, MakeMatMul);
  registry.Register("Gemm", {6, 7, 9, 11, 13}, MakeGemm);
}

}  // namespace cloister::runtime
