// Convolution CPU kernels: Conv (im2col + BLAS, direct depthwise, with load-time fusion of a
// following per-channel affine map and activation) and ConvTranspose.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/activation.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/gemm.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/plan.h"
#include "enclave/runtime/simd.h"
#include "enclave/runtime/window.h"

namespace cloister::runtime {
namespace {

using internal::Buffer;

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

// `V` output vectors of one row side by side: independent sums, so that their multiply-adds
// overlap instead of waiting on one another (one sum over 25 taps is latency-bound).
template <int V>
inline void DepthwiseVectors(const float* base, const float* w, int64_t KH, int64_t KW,
                             int64_t PW, int64_t dh, int64_t dw, float bias, float* out) {
  simd::Vec acc[V];
  for (int v = 0; v < V; ++v) acc[v] = simd::Splat(bias);
  for (int64_t kh = 0; kh < KH; ++kh) {
    const float* row = base + kh * dh * PW;
    for (int64_t kw = 0; kw < KW; ++kw) {
      const simd::Vec tap = simd::Splat(w[kh * KW + kw]);
      const float* p = row + kw * dw;
      for (int v = 0; v < V; ++v) acc[v] += tap * simd::Load(p + v * simd::kWidth);
    }
  }
  for (int v = 0; v < V; ++v) simd::Store(out + v * simd::kWidth, acc[v]);
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
  constexpr int64_t kBlock = 4 * simd::kWidth;
  for (int64_t oh = 0; oh < OH; ++oh) {
    float* out = y + oh * OW;
    const float* base = padded + oh * sh * PW;
    int64_t ow = 0;
    if (sw == 1) {
      for (; ow + kBlock <= OW; ow += kBlock) {
        DepthwiseVectors<4>(base + ow, w, KH, KW, PW, dh, dw, bias, out + ow);
      }
      for (; ow + simd::kWidth <= OW; ow += simd::kWidth) {
        DepthwiseVectors<1>(base + ow, w, KH, KW, PW, dh, dw, bias, out + ow);
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
    const bool affine = !post_scale_.empty();
    for (int64_t m = first; m < first + count; ++m) {
      activation_.Apply(y + (m - first) * plane, plane, affine, affine ? post_scale_[m] : 1.0f,
                        affine ? post_shift_[m] : 0.0f);
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
    // One unit of work: image n, group grp, with `columns` as its scratch; its matrix product
    // split over `gemm_workers` when the units themselves run one after another.
    auto unit = [&](int64_t u, float* columns, TaskPool* gemm_workers) {
      const int64_t n = u / group_, grp = u % group_;
      const float* xg = xd + (n * channels + grp * cg) * in_plane;
      const float* wg = wd + grp * mg * k;
      float* yg = yd + (n * maps + grp * mg) * out_plane;
      if (depthwise) {
        DepthwiseChannel(xg, wg, bd ? bd[grp] : 0.0f, g, columns, yg);
        Epilogue(yg, grp, 1, out_plane);
        return;
      }
      const float* col = xg;
      if (!pointwise) {
        Im2Col(xg, cg, g, columns);
        col = columns;
      }
      float beta = 0.0f;
      if (bd != nullptr) {
        for (int64_t m = 0; m < mg; ++m) {
          std::fill(yg + m * out_plane, yg + (m + 1) * out_plane, bd[grp * mg + m]);
        }
        beta = 1.0f;
      }
      GemmInRowParts<float>(gemm_workers, false, false, mg, out_plane, k, 1.0f, wg, k, col,
                            out_plane, beta, yg, out_plane, [] { return absl::OkStatus(); })
          .IgnoreError();  // nothing between the parts can fail
      Epilogue(yg, grp * mg, mg, out_plane);
    };
    const size_t scratch_size = depthwise   ? sizeof(float) * PaddedWidth(g) * PaddedHeight(g)
                                : pointwise ? 0
                                            : sizeof(float) * k * out_plane;
    return RunUnits(context, batch * group_, scratch_size, unit);
  }

  // Runs units [0, count) of a convolution (image-major), each with scratch of `scratch_size`
  // bytes, checking the deadline between images: in order on this thread, or split into
  // contiguous ranges over the run's workers (one scratch buffer per worker thread).
  template <typename Unit>
  absl::Status RunUnits(KernelContext& context, int64_t count, size_t scratch_size,
                        const Unit& unit) const {
    TaskPool* workers = context.pool().workers();
    const int64_t parts = workers != nullptr ? std::min<int64_t>(workers->size(), count) : 1;
    const int slots = parts > 1 ? workers->size() : 1;
    // Inline for the usual few threads: a step allocates nothing of its own beyond the pool.
    absl::InlinedVector<std::shared_ptr<Buffer>, 4> scratch(scratch_size > 0 ? slots : 0);
    for (auto& buffer : scratch) {
      ASSIGN_OR_RETURN(buffer, context.Scratch(scratch_size));
    }
    auto columns = [&scratch](int slot) {
      return scratch.empty() ? nullptr : static_cast<float*>(scratch[slot]->data());
    };
    auto range = [&](int64_t begin, int64_t end, float* scratch_columns,
                     TaskPool* inner) -> absl::Status {
      for (int64_t u = begin; u < end; ++u) {
        if (u > begin && u % group_ == 0) RETURN_IF_ERROR(context.CheckDeadline());
        unit(u, scratch_columns, inner);
      }
      return absl::OkStatus();
    };
    absl::Status status;
    if (parts <= 1) {
      status = range(0, count, columns(0), workers);  // one unit: its product is split
    } else {
      status = workers->Run(static_cast<size_t>(parts), [&](size_t task, int slot) {
        const int64_t p = static_cast<int64_t>(task);
        return range(count * p / parts, count * (p + 1) / parts, columns(slot), nullptr);
      });
    }
    for (auto& buffer : scratch) context.pool().Release(std::move(buffer));
    return status;
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

}  // namespace

void RegisterConvKernels(KernelRegistry& registry) {
  registry.Register("Conv", {1, 11}, MakeConv);
  registry.Register("ConvTranspose", {1, 11}, MakeConvTranspose);
}

}  // namespace cloister::runtime
