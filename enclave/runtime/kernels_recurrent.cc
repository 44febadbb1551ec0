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

// Sizes of one LSTM run.
struct LstmDims {
  int64_t seq = 0, batch = 0, input_size = 0, hidden = 0;
  int directions = 1;
};

// Shape of Y_h and Y_c (-1 for unknown sizes).
std::vector<int64_t> LstmStateShape(bool batch_first, int64_t batch, int64_t D, int64_t H) {
  return batch_first ? std::vector<int64_t>{batch, D, H} : std::vector<int64_t>{D, batch, H};
}

// Shape of Y (-1 for unknown sizes).
std::vector<int64_t> LstmOutputShape(bool batch_first, int64_t seq, int64_t batch, int64_t D,
                                     int64_t H) {
  return batch_first ? std::vector<int64_t>{batch, seq, D, H}
                     : std::vector<int64_t>{seq, D, batch, H};
}

// The data of optional input `index`, or null when it is absent; an error when its shape is not
// `shape`.
absl::StatusOr<const float*> OptionalInput(KernelContext& context, int index,
                                           const std::vector<int64_t>& shape, const char* name) {
  if (!context.has_input(index)) return nullptr;
  const Tensor& t = context.input(index);
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeToString(t.shape()),
                                                   ", expected ", ShapeToString(shape)));
  }
  return t.data<float>();
}

// sequence_lens (input 4), checked, or `seq` for every batch item when it is absent.
absl::StatusOr<std::vector<int64_t>> SequenceLengths(KernelContext& context, int64_t batch,
                                                     int64_t seq) {
  std::vector<int64_t> lengths(batch, seq);
  if (!context.has_input(4)) return lengths;
  lengths = ToInt64Vector(context.input(4));
  if (static_cast<int64_t>(lengths.size()) != batch) {
    return absl::InvalidArgumentError("sequence_lens must have one entry per batch item");
  }
  for (int64_t& length : lengths) {
    if (length < 0 || length > seq) {
      return absl::InvalidArgumentError("sequence_lens entries must be within [0, seq]");
    }
  }
  return lengths;
}

// X as [seq, batch, input] from either layout.
std::vector<float> SequenceMajor(const Tensor& x_in, bool batch_first, const LstmDims& n) {
  std::vector<float> x(n.seq * n.batch * n.input_size);
  for (int64_t t = 0; t < n.seq; ++t) {
    for (int64_t b = 0; b < n.batch; ++b) {
      const float* src =
          x_in.data<float>() + (batch_first ? (b * n.seq + t) : (t * n.batch + b)) * n.input_size;
      std::memcpy(&x[(t * n.batch + b) * n.input_size], src, sizeof(float) * n.input_size);
    }
  }
  return x;
}

// The checked inputs and allocated outputs of one run; optional ones are null when absent.
struct LstmRun {
  LstmDims n;
  std::vector<float> x;  // [seq, batch, input]
  const float* w = nullptr;
  const float* r = nullptr;
  const float* bias = nullptr;
  const float* initial_h = nullptr;
  const float* initial_c = nullptr;
  const float* peephole = nullptr;
  std::vector<int64_t> lengths;
  Tensor* y = nullptr;
  Tensor* y_h = nullptr;
  Tensor* y_c = nullptr;
};

// Working buffers that the directions of one run share.
struct LstmScratch {
  std::vector<float> projected, gates, h, c;
};

class LstmKernel : public Kernel {
 public:
  explicit LstmKernel(LstmAttributes a) : a_(a) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x_in = context.input(0);
    const Tensor& w = context.input(1);
    const Tensor& r = context.input(2);
    if (x_in.rank() != 3) return absl::InvalidArgumentError("X must have rank 3");
    LstmRun run;
    LstmDims& n = run.n;
    n.seq = a_.batch_first ? x_in.dim(1) : x_in.dim(0);
    n.batch = a_.batch_first ? x_in.dim(0) : x_in.dim(1);
    n.input_size = x_in.dim(2);
    n.hidden = a_.hidden;
    n.directions = a_.directions;
    const int64_t H = n.hidden;
    const int D = n.directions;
    if (w.shape() != std::vector<int64_t>{D, 4 * H, n.input_size} ||
        r.shape() != std::vector<int64_t>{D, 4 * H, H}) {
      return absl::InvalidArgumentError(absl::StrCat("W ", ShapeToString(w.shape()), " or R ",
                                                     ShapeToString(r.shape()),
                                                     " does not fit hidden_size ", H));
    }
    run.w = w.data<float>();
    run.r = r.data<float>();
    RETURN_IF_ERROR(Prepare(context, run));
    run.x = SequenceMajor(x_in, a_.batch_first, n);
    LstmScratch s;
    s.projected.resize(n.seq * n.batch * 4 * H);
    s.gates.resize(n.batch * 4 * H);
    s.h.resize(n.batch * H);
    s.c.resize(n.batch * H);
    for (int d = 0; d < D; ++d) RETURN_IF_ERROR(RunDirection(context, run, d, s));
    return absl::OkStatus();
  }

 private:
  // Checks the optional inputs and allocates the outputs (Y zeroed) for `run.n`.
  absl::Status Prepare(KernelContext& context, LstmRun& run) const {
    const LstmDims& n = run.n;
    const int64_t D = n.directions, H = n.hidden;
    ASSIGN_OR_RETURN(run.bias, OptionalInput(context, 3, {D, 8 * H}, "B"));
    const std::vector<int64_t> state_shape = LstmStateShape(a_.batch_first, n.batch, D, H);
    ASSIGN_OR_RETURN(run.initial_h, OptionalInput(context, 5, state_shape, "initial_h"));
    ASSIGN_OR_RETURN(run.initial_c, OptionalInput(context, 6, state_shape, "initial_c"));
    ASSIGN_OR_RETURN(run.peephole, OptionalInput(context, 7, {D, 3 * H}, "P"));
    ASSIGN_OR_RETURN(run.lengths, SequenceLengths(context, n.batch, n.seq));
    const int outputs = static_cast<int>(context.outputs().size());
    if (outputs > 0) {
      ASSIGN_OR_RETURN(run.y,
                       context.Output(0, DataType::kFloat,
                                      LstmOutputShape(a_.batch_first, n.seq, n.batch, D, H)));
    }
    if (outputs > 1) {
      ASSIGN_OR_RETURN(run.y_h, context.Output(1, DataType::kFloat, state_shape));
    }
    if (outputs > 2) {
      ASSIGN_OR_RETURN(run.y_c, context.Output(2, DataType::kFloat, state_shape));
    }
    if (run.y) std::memset(run.y->raw_data(), 0, run.y->size());
    return absl::OkStatus();
  }

  // Offset of batch item b's state for direction d in initial_h/c and Y_h/c.
  int64_t StateOffset(const LstmDims& n, int d, int64_t b) const {
    return a_.batch_first ? (b * n.directions + d) * n.hidden : (d * n.batch + b) * n.hidden;
  }

  // Runs direction d over the whole sequence, writing its part of Y, Y_h and Y_c.
  absl::Status RunDirection(KernelContext& context, const LstmRun& run, int d,
                            LstmScratch& s) const {
    const LstmDims& n = run.n;
    const int64_t H = n.hidden, batch = n.batch, seq = n.seq, D = n.directions;
    const bool reverse = a_.reverse_only || d == 1;
    Project(run, d, s.projected.data());
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t k = 0; k < H; ++k) {
        s.h[b * H + k] = run.initial_h ? run.initial_h[StateOffset(n, d, b) + k] : 0.0f;
        s.c[b * H + k] = run.initial_c ? run.initial_c[StateOffset(n, d, b) + k] : 0.0f;
      }
    }
    const float* peephole = run.peephole ? run.peephole + d * 3 * H : nullptr;
    const float* rd = run.r + d * 4 * H * H;
    for (int64_t step = 0; step < seq; ++step) {
      if (step > 0) RETURN_IF_ERROR(context.CheckDeadline());  // one time step at a time
      const int64_t t = reverse ? seq - 1 - step : step;
      std::memcpy(s.gates.data(), &s.projected[t * batch * 4 * H], sizeof(float) * batch * 4 * H);
      Gemm<float>(false, true, batch, 4 * H, H, 1.0f, s.h.data(), H, rd, H, 1.0f, s.gates.data(),
                  4 * H);
      for (int64_t b = 0; b < batch; ++b) {
        // A sequence of length L occupies steps [0, L); reversed, they are read backwards.
        if (t >= run.lengths[b]) continue;
        UpdateCells(d, H, &s.gates[b * 4 * H], peephole, &s.c[b * H], &s.h[b * H]);
        if (run.y != nullptr) {
          float* dst = run.y->data<float>() + (a_.batch_first ? ((b * seq + t) * D + d) * H
                                                              : ((t * D + d) * batch + b) * H);
          std::memcpy(dst, &s.h[b * H], sizeof(float) * H);
        }
      }
    }
    for (int64_t b = 0; b < batch; ++b) {
      if (run.y_h) {
        std::memcpy(run.y_h->data<float>() + StateOffset(n, d, b), &s.h[b * H], sizeof(float) * H);
      }
      if (run.y_c) {
        std::memcpy(run.y_c->data<float>() + StateOffset(n, d, b), &s.c[b * H], sizeof(float) * H);
      }
    }
    return absl::OkStatus();
  }

  // Input projection of direction d for every step: [seq*batch, 4H] = X * W^T (+ both biases).
  void Project(const LstmRun& run, int d, float* projected) const {
    const LstmDims& n = run.n;
    const int64_t H = n.hidden, rows = n.seq * n.batch;
    Gemm<float>(false, true, rows, 4 * H, n.input_size, 1.0f, run.x.data(), n.input_size,
                run.w + d * 4 * H * n.input_size, n.input_size, 0.0f, projected, 4 * H);
    if (run.bias == nullptr) return;
    const float* wb = run.bias + d * 8 * H;
    const float* rb = wb + 4 * H;
    for (int64_t row = 0; row < rows; ++row) {
      float* p = &projected[row * 4 * H];
      for (int64_t k = 0; k < 4 * H; ++k) p[k] += wb[k] + rb[k];
    }
  }

  // One step of the H cells of one batch item: gates gb [4H] in i, o, f, c order, with the
  // peepholes pi [3H] (i, o, f; null for none), updating the states c and h [H].
  void UpdateCells(int d, int64_t H, const float* gb, const float* pi, float* c, float* h) const {
    const float* po = pi ? pi + H : nullptr;
    const float* pf = pi ? pi + 2 * H : nullptr;
    const GateActivation f = a_.f[d], g = a_.g[d], act_h = a_.h[d];
    const float clip = a_.clip;
    const bool input_forget = a_.input_forget;
    auto clipped = [clip](float v) { return clip > 0 ? std::clamp(v, -clip, clip) : v; };
    for (int64_t k = 0; k < H; ++k) {
      const float c_prev = c[k];
      float i_gate = clipped(gb[k] + (pi ? pi[k] * c_prev : 0.0f));
      float f_gate = clipped(gb[2 * H + k] + (pf ? pf[k] * c_prev : 0.0f));
      const float cell = clipped(gb[3 * H + k]);
      i_gate = f(i_gate);
      f_gate = input_forget ? 1.0f - i_gate : f(f_gate);
      const float c_new = f_gate * c_prev + i_gate * g(cell);
      const float o_gate = f(clipped(gb[H + k] + (po ? po[k] * c_new : 0.0f)));
      c[k] = c_new;
      h[k] = o_gate * act_h(c_new);
    }
  }

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
  std::vector<int64_t> y = LstmOutputShape(a.batch_first, seq, batch, D, H);
  std::vector<int64_t> state = LstmStateShape(a.batch_first, batch, D, H);
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
