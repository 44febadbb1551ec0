// LSTM (versions 7 and 14) on float tensors: forward, reverse and bidirectional, optional bias,
// sequence lengths, initial states, peepholes, clip, input_forget, batch-first layout (14), and
// the Sigmoid/Tanh/Relu/HardSigmoid/LeakyRelu activations. The input projection for all time
// steps is one GEMM per direction; each step adds one GEMM with the recurrent weights.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/gemm.h"
#include "enclave/runtime/kernel_util.h"

namespace cloister::runtime {
namespace {

struct GateActivation {
  enum class Kind { kSigmoid, kTanh, kRelu, kHardSigmoid, kLeakyRelu } kind;
  float alpha = 0, beta = 0;
  float operator()(float x) const {
    switch (kind) {
      case Kind::kSigmoid:
        return 1.0f / (1.0f + std::exp(-x));
      case Kind::kTanh:
        return std::tanh(x);
      case Kind::kRelu:
        return x > 0 ? x : 0;
      case Kind::kHardSigmoid:
        return std::clamp(alpha * x + beta, 0.0f, 1.0f);
      case Kind::kLeakyRelu:
        return x >= 0 ? x : alpha * x;
    }
    return x;
  }
};

absl::StatusOr<GateActivation> ParseActivation(const std::string& name, float alpha, float beta,
                                               bool has_alpha, bool has_beta) {
  if (name == "Sigmoid") return GateActivation{GateActivation::Kind::kSigmoid};
  if (name == "Tanh") return GateActivation{GateActivation::Kind::kTanh};
  if (name == "Relu") return GateActivation{GateActivation::Kind::kRelu};
  if (name == "HardSigmoid") {
    return GateActivation{GateActivation::Kind::kHardSigmoid, has_alpha ? alpha : 0.2f,
                          has_beta ? beta : 0.5f};
  }
  if (name == "LeakyRelu") {
    return GateActivation{GateActivation::Kind::kLeakyRelu, has_alpha ? alpha : 0.01f, 0};
  }
  return absl::UnimplementedError(absl::StrCat("activation '", name, "' is not supported"));
}

struct LstmAttributes {
  int64_t hidden = 0;
  int directions = 1;
  bool reverse_only = false;
  bool batch_first = false;
  bool input_forget = false;
  float clip = 0;                   // 0 = no clip
  GateActivation f[2], g[2], h[2];  // per direction
};

class LstmKernel : public Kernel {
 public:
  explicit LstmKernel(LstmAttributes a) : a_(a) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x_in = context.input(0);
    const Tensor& w = context.input(1);
    const Tensor& r = context.input(2);
    if (x_in.rank() != 3) return absl::InvalidArgumentError("X must have rank 3");
    const int64_t seq = a_.batch_first ? x_in.dim(1) : x_in.dim(0);
    const int64_t batch = a_.batch_first ? x_in.dim(0) : x_in.dim(1);
    const int64_t input_size = x_in.dim(2);
    const int64_t H = a_.hidden;
    const int D = a_.directions;
    if (w.shape() != std::vector<int64_t>{D, 4 * H, input_size} ||
        r.shape() != std::vector<int64_t>{D, 4 * H, H}) {
      return absl::InvalidArgumentError(absl::StrCat("W ", ShapeToString(w.shape()), " or R ",
                                                     ShapeToString(r.shape()),
                                                     " does not fit hidden_size ", H));
    }
    auto optional = [&](int index, std::vector<int64_t> shape,
                        const char* name) -> absl::StatusOr<const float*> {
      if (!context.has_input(index)) return nullptr;
      const Tensor& t = context.input(index);
      if (t.shape() != shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " has shape ", ShapeToString(t.shape()), ", expected ", ShapeToString(shape)));
      }
      return t.data<float>();
    };
    ASSIGN_OR_RETURN(const float* bias, optional(3, {D, 8 * H}, "B"));
    std::vector<int64_t> state_shape =
        a_.batch_first ? std::vector<int64_t>{batch, D, H} : std::vector<int64_t>{D, batch, H};
    ASSIGN_OR_RETURN(const float* initial_h, optional(5, state_shape, "initial_h"));
    ASSIGN_OR_RETURN(const float* initial_c, optional(6, state_shape, "initial_c"));
    ASSIGN_OR_RETURN(const float* peephole, optional(7, {D, 3 * H}, "P"));
    std::vector<int64_t> lengths(batch, seq);
    if (context.has_input(4)) {
      lengths = ToInt64Vector(context.input(4));
      if (static_cast<int64_t>(lengths.size()) != batch) {
        return absl::InvalidArgumentError("sequence_lens must have one entry per batch item");
      }
      for (int64_t& length : lengths) {
        if (length < 0 || length > seq) {
          return absl::InvalidArgumentError("sequence_lens entries must be within [0, seq]");
        }
      }
    }
    // X as [seq, batch, input].
    std::vector<float> x(seq * batch * input_size);
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t b = 0; b < batch; ++b) {
        const float* src =
            x_in.data<float>() + (a_.batch_first ? (b * seq + t) : (t * batch + b)) * input_size;
        std::memcpy(&x[(t * batch + b) * input_size], src, sizeof(float) * input_size);
      }
    }
    std::vector<int64_t> y_shape = a_.batch_first ? std::vector<int64_t>{batch, seq, D, H}
                                                  : std::vector<int64_t>{seq, D, batch, H};
    const int outputs = static_cast<int>(context.outputs().size());
    Tensor* y = nullptr;
    Tensor* y_h = nullptr;
    Tensor* y_c = nullptr;
    if (outputs > 0) {
      ASSIGN_OR_RETURN(y, context.Output(0, DataType::kFloat, y_shape));
    }
    if (outputs > 1) {
      ASSIGN_OR_RETURN(y_h, context.Output(1, DataType::kFloat, state_shape));
    }
    if (outputs > 2) {
      ASSIGN_OR_RETURN(y_c, context.Output(2, DataType::kFloat, state_shape));
    }
    if (y) std::memset(y->raw_data(), 0, y->size());

    std::vector<float> projected(seq * batch * 4 * H), gates(batch * 4 * H);
    std::vector<float> h(batch * H), c(batch * H);
    for (int d = 0; d < D; ++d) {
      const bool reverse = a_.reverse_only || d == 1;
      // Input projection for every step: [seq*batch, 4H] = X * W^T (+ both biases).
      Gemm<float>(false, true, seq * batch, 4 * H, input_size, 1.0f, x.data(), input_size,
                  w.data<float>() + d * 4 * H * input_size, input_size, 0.0f, projected.data(),
                  4 * H);
      if (bias != nullptr) {
        const float* wb = bias + d * 8 * H;
        const float* rb = wb + 4 * H;
        for (int64_t row = 0; row < seq * batch; ++row) {
          float* p = &projected[row * 4 * H];
          for (int64_t k = 0; k < 4 * H; ++k) p[k] += wb[k] + rb[k];
        }
      }
      auto state_offset = [&](int64_t b) {
        return a_.batch_first ? (b * D + d) * H : (d * batch + b) * H;
      };
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t k = 0; k < H; ++k) {
          h[b * H + k] = initial_h ? initial_h[state_offset(b) + k] : 0.0f;
          c[b * H + k] = initial_c ? initial_c[state_offset(b) + k] : 0.0f;
        }
      }
      const float* pi = peephole ? peephole + d * 3 * H : nullptr;
      const float* po = pi ? pi + H : nullptr;
      const float* pf = pi ? pi + 2 * H : nullptr;
      const float* rd = r.data<float>() + d * 4 * H * H;
      for (int64_t step = 0; step < seq; ++step) {
        if (step > 0) RETURN_IF_ERROR(context.CheckDeadline());  // one time step at a time
        const int64_t t = reverse ? seq - 1 - step : step;
        std::memcpy(gates.data(), &projected[t * batch * 4 * H], sizeof(float) * batch * 4 * H);
        Gemm<float>(false, true, batch, 4 * H, H, 1.0f, h.data(), H, rd, H, 1.0f, gates.data(),
                    4 * H);
        for (int64_t b = 0; b < batch; ++b) {
          // A sequence of length L occupies steps [0, L); reversed, they are read backwards.
          if (t >= lengths[b]) continue;
          float* gb = &gates[b * 4 * H];
          for (int64_t k = 0; k < H; ++k) {
            auto clipped = [&](float v) {
              return a_.clip > 0 ? std::clamp(v, -a_.clip, a_.clip) : v;
            };
            const float c_prev = c[b * H + k];
            float i_gate = clipped(gb[k] + (pi ? pi[k] * c_prev : 0.0f));
            float f_gate = clipped(gb[2 * H + k] + (pf ? pf[k] * c_prev : 0.0f));
            const float cell = clipped(gb[3 * H + k]);
            i_gate = a_.f[d](i_gate);
            f_gate = a_.input_forget ? 1.0f - i_gate : a_.f[d](f_gate);
            const float c_new = f_gate * c_prev + i_gate * a_.g[d](cell);
            const float o_gate = a_.f[d](clipped(gb[H + k] + (po ? po[k] * c_new : 0.0f)));
            c[b * H + k] = c_new;
            h[b * H + k] = o_gate * a_.h[d](c_new);
          }
          if (y != nullptr) {
            float* dst = y->data<float>() + (a_.batch_first ? ((b * seq + t) * D + d) * H
                                                            : ((t * D + d) * batch + b) * H);
            std::memcpy(dst, &h[b * H], sizeof(float) * H);
          }
        }
      }
      for (int64_t b = 0; b < batch; ++b) {
        if (y_h) std::memcpy(y_h->data<float>() + state_offset(b), &h[b * H], sizeof(float) * H);
        if (y_c) std::memcpy(y_c->data<float>() + state_offset(b), &c[b * H], sizeof(float) * H);
      }
    }
    return absl::OkStatus();
  }

 private:
  LstmAttributes a_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeLstm(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(3, 8));
  for (int i : {0, 1, 2, 3, 5, 6, 7}) {
    RETURN_IF_ERROR(RequireType(context, i, [](DataType t) { return t == DataType::kFloat; }));
  }
  RETURN_IF_ERROR(RequireType(context, 4, IsIndexType));
  LstmAttributes a;
  ASSIGN_OR_RETURN(a.hidden, context.Int("hidden_size"));
  if (a.hidden <= 0) return absl::InvalidArgumentError("hidden_size must be positive");
  ASSIGN_OR_RETURN(std::string direction, context.String("direction", "forward"));
  if (direction == "bidirectional") {
    a.directions = 2;
  } else if (direction == "reverse") {
    a.reverse_only = true;
  } else if (direction != "forward") {
    return absl::InvalidArgumentError(absl::StrCat("direction '", direction, "' is not valid"));
  }
  ASSIGN_OR_RETURN(float clip, context.Float("clip", 0.0f));
  if (clip < 0) return absl::InvalidArgumentError("clip must be positive");
  a.clip = clip;
  ASSIGN_OR_RETURN(int64_t input_forget, context.Int("input_forget", 0));
  a.input_forget = input_forget != 0;
  if (context.since_version() >= 14) {
    ASSIGN_OR_RETURN(int64_t layout, context.Int("layout", 0));
    a.batch_first = layout != 0;
  }
  std::vector<std::string> names;
  for (const auto& attribute : context.node().attribute()) {
    if (attribute.name() == "activations")
      names.assign(attribute.strings().begin(), attribute.strings().end());
  }
  if (names.empty()) names = {"Sigmoid", "Tanh", "Tanh"};
  if (static_cast<int>(names.size()) != 3 * a.directions) {
    return absl::InvalidArgumentError("activations must list 3 functions per direction");
  }
  ASSIGN_OR_RETURN(std::vector<float> alphas,
                   context.Floats("activation_alpha", std::vector<float>{}));
  ASSIGN_OR_RETURN(std::vector<float> betas,
                   context.Floats("activation_beta", std::vector<float>{}));
  for (int d = 0; d < a.directions; ++d) {
    GateActivation* slots[3] = {&a.f[d], &a.g[d], &a.h[d]};
    for (int k = 0; k < 3; ++k) {
      const size_t index = d * 3 + k;
      ASSIGN_OR_RETURN(
          *slots[k], ParseActivation(names[index], index < alphas.size() ? alphas[index] : 0,
                                     index < betas.size() ? betas[index] : 0, index < alphas.size(),
                                     index < betas.size()));
    }
  }
  const ValueInfo& x = context.input(0);
  int64_t seq = -1, batch = -1;
  if (x.rank_known && x.rank() == 3) {
    seq = a.batch_first ? x.dims[1] : x.dims[0];
    batch = a.batch_first ? x.dims[0] : x.dims[1];
  }
  const int64_t D = a.directions, H = a.hidden;
  std::vector<int64_t> y = a.batch_first ? std::vector<int64_t>{batch, seq, D, H}
                                         : std::vector<int64_t>{seq, D, batch, H};
  std::vector<int64_t> state =
      a.batch_first ? std::vector<int64_t>{batch, D, H} : std::vector<int64_t>{D, batch, H};
  for (int i = 0; i < context.output_count(); ++i) {
    context.SetOutput(i, DataType::kFloat, i == 0 ? y : state);
  }
  return MakeKernel<LstmKernel>(a);
}

}  // namespace

void RegisterRecurrentKernels(KernelRegistry& registry) {
  registry.Register("LSTM", {7, 14}, MakeLstm);
}

}  // namespace cloister::runtime
