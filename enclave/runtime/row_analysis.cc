#include "enclave/runtime/row_analysis.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/fusion.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/plan.h"
#include "enclave/runtime/row_analysis_internal.h"

namespace cloister::runtime {
namespace row_analysis_internal {
namespace {

// Operators that compute on shape vectors (ApplyShapeArithmetic).
const std::unordered_set<std::string_view>& ShapeArithmeticOperators() {
  static const auto* const kOperators = new std::unordered_set<std::string_view>{
      "Identity", "Cast", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice",
      "Add",      "Sub",  "Mul",    "Div",    "Max",       "Min"};
  return *kOperators;
}

const std::unordered_set<std::string_view>& UnaryOperators() {
  static const auto* const kOperators = new std::unordered_set<std::string_view>{
      "Abs",       "Acos",     "Acosh",       "Asin",      "Asinh",      "Atan",
      "Atanh",     "Ceil",     "Cos",         "Cosh",      "Elu",        "Erf",
      "Exp",       "Floor",    "HardSigmoid", "HardSwish", "IsInf",      "IsNaN",
      "LeakyRelu", "Log",      "Neg",         "Not",       "Reciprocal", "Relu",
      "Round",     "Selu",     "Sigmoid",     "Sign",      "Sin",        "Sinh",
      "Softplus",  "Softsign", "Sqrt",        "Tan",       "Tanh",       "ThresholdedRelu",
      "Celu",      "Gelu",     "Mish",        "Shrink",    "Identity",   "Cast",
      "CastLike",  "Clip",     "Dropout",     "BitwiseNot"};
  return *kOperators;
}

const std::unordered_set<std::string_view>& BroadcastOperators() {
  static const auto* const kOperators = new std::unordered_set<std::string_view>{"Add",
                                                                                 "Sub",
                                                                                 "Mul",
                                                                                 "Div",
                                                                                 "Pow",
                                                                                 "Mod",
                                                                                 "Max",
                                                                                 "Min",
                                                                                 "Sum",
                                                                                 "Mean",
                                                                                 "Equal",
                                                                                 "Greater",
                                                                                 "GreaterOrEqual",
                                                                                 "Less",
                                                                                 "LessOrEqual",
                                                                                 "And",
                                                                                 "Or",
                                                                                 "Xor",
                                                                                 "Where",
                                                                                 "BitShift",
                                                                                 "BitwiseAnd",
                                                                                 "BitwiseOr",
                                                                                 "BitwiseXor",
                                                                                 "PRelu"};
  return *kOperators;
}

// Operators that compute each item of axis 0 (an image, a sequence) from that item alone.
const std::unordered_set<std::string_view>& PerItemOperators() {
  static const auto* const kOperators =
      new std::unordered_set<std::string_view>{"Conv",
                                               "ConvTranspose",
                                               "ConvInteger",
                                               "AveragePool",
                                               "LpPool",
                                               "GlobalAveragePool",
                                               "GlobalMaxPool",
                                               "GlobalLpPool",
                                               "LRN",
                                               "MaxPool",
                                               "InstanceNormalization",
                                               "DepthToSpace",
                                               "SpaceToDepth",
                                               "GroupNormalization",
                                               "BatchNormalization"};
  return *kOperators;
}

const std::unordered_set<std::string_view>& ReduceOperators() {
  static const auto* const kOperators = new std::unordered_set<std::string_view>{
      "ReduceMean", "ReduceSum", "ReduceMax",    "ReduceMin",       "ReduceProd",
      "ReduceL1",   "ReduceL2",  "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
  return *kOperators;
}

const std::unordered_set<std::string_view>& RankKeepingOperators() {
  static const auto* const kOperators = new std::unordered_set<std::string_view>{
      "Softmax",         "LogSoftmax", "Hardmax", "LayerNormalization",
      "LpNormalization", "Transpose",  "Concat",  "Split",
      "Slice",           "Tile",       "Pad",     "TopK",
      "CumSum",          "Trilu"};
  return *kOperators;
}

}  // namespace

std::optional<std::vector<int64_t>> Analyzer::Ints(const std::string& name) const {
  const ValueInfo* info = Info(name);
  if (info == nullptr || !info->constant.has_value() || !IsIndexType(info->constant->dtype())) {
    return std::nullopt;
  }
  return ToInt64Vector(*info->constant);
}

std::optional<std::vector<float>> Analyzer::Floats(const std::string& name) const {
  const ValueInfo* info = Info(name);
  if (info == nullptr || !info->constant.has_value() ||
      info->constant->dtype() != DataType::kFloat) {
    return std::nullopt;
  }
  const float* data = info->constant->data<float>();
  return std::vector<float>(data, data + info->constant->count());
}

std::optional<std::vector<Element>> Analyzer::ElementsOf(const std::string& name,
                                                         const State& state) const {
  if (state.has_elements) return state.elements;
  if (state.kind != State::kSame) return std::nullopt;
  if (auto values = Ints(name); values.has_value()) {
    if (Rank(name) > 1) return std::nullopt;
    std::vector<Element> elements;
    for (int64_t v : *values) elements.push_back(Known(v));
    return elements;
  }
  const ValueInfo* info = Info(name);
  if (info == nullptr || !info->rank_known || info->rank() > 1 || !IsNumeric(info->dtype) ||
      IsFloat(info->dtype)) {
    return std::nullopt;
  }
  if (info->rank() == 0) return std::vector<Element>(1);
  if (info->dims[0] < 0) return std::nullopt;
  return std::vector<Element>(info->dims[0]);
}

State Analyzer::Get(const std::string& name) const {
  if (name.empty()) return Same();  // an absent optional input
  const ValueInfo* info = Info(name);
  if (info != nullptr && info->constant.has_value()) return Same();
  auto it = states_.find(name);
  if (it == states_.end()) return Mixed(absl::StrCat("value '", name, "' has no known producer"));
  return it->second;
}

std::string Label(const onnx::NodeProto& node) {
  return absl::StrCat("node '", node.name().empty() ? node.output(0) : node.name(), "' (",
                      node.op_type(), ")");
}

std::vector<State> Analyzer::Apply(const onnx::NodeProto& node,
                                   const std::vector<State>& in) const {
  const size_t outputs = static_cast<size_t>(node.output_size());
  const std::string label = Label(node);
  auto all = [&](State state) { return std::vector<State>(outputs, std::move(state)); };
  auto mixed = [&](const char* what) { return all(Mixed(absl::StrCat(label, " ", what))); };

  // Values a subgraph reads from this scope count as inputs too.
  bool implicit_same = true;
  std::string implicit_why;
  for (const std::string& name : ImplicitInputs(node)) {
    const State state = Get(name);
    if (state.kind != State::kSame) {
      implicit_same = false;
      if (state.kind == State::kMixed && implicit_why.empty()) implicit_why = state.why;
    }
  }
  bool all_same = implicit_same;
  bool any_rows = false;
  for (const State& state : in) {
    if (state.kind == State::kMixed) return all(state);  // keep the first cause
    all_same = all_same && state.kind == State::kSame;
    any_rows = any_rows || state.kind == State::kRows;
  }
  if (all_same) {
    // Keep the elements of shape vectors computed from other shape vectors: a reshape target
    // may put a copied dimension (0) or a computed one first.
    const bool vectors = std::any_of(in.begin(), in.end(), IsVector);
    if (vectors && ShapeArithmeticOperators().count(node.op_type())) {
      std::vector<State> computed = ApplyShapeArithmetic(node, in);
      if (!computed.empty() && computed[0].kind != State::kMixed) return computed;
    }
    return all(Same());
  }
  if (!implicit_why.empty()) return all(Mixed(implicit_why));
  if (!implicit_same) return mixed("reads rows inside a subgraph");

  const std::string& op = node.op_type();
  if (!any_rows) return ApplyShapeArithmetic(node, in);
  // Rows on an axis past a value's known rank: inference and rules disagree; refuse.
  for (size_t i = 0; i < in.size(); ++i) {
    const int rank = Rank(node.input(i));
    if (in[i].kind == State::kRows && (in[i].axis < 0 || (rank >= 0 && in[i].axis >= rank))) {
      return mixed("has rows on an axis outside its input's rank");
    }
  }

  auto others_same = [&](size_t from) {
    for (size_t i = from; i < in.size(); ++i) {
      if (in[i].kind != State::kSame) return false;
    }
    return true;
  };
  const int rank = Rank(node.input(0));
  const State& first = in[0];

  if (UnaryOperators().count(op)) {
    // CastLike reads only the element type of its second input.
    if (first.kind != State::kRows || !(op == "CastLike" || others_same(1))) {
      return mixed("combines rows with a non-constant parameter");
    }
    return all(first);
  }
  if (op == "QuantizeLinear" || op == "DequantizeLinear") {
    if (first.kind != State::kRows || !others_same(1) || rank < 0) {
      return mixed("quantizes rows with a non-constant scale");
    }
    const ValueInfo* scale = Info(node.input(1));
    const bool per_axis = scale == nullptr || !scale->rank_known || scale->rank() > 0;
    if (per_axis && Normalize(IntAttribute(node, "axis", 1), rank) == first.axis) {
      return mixed("quantizes along the row axis");
    }
    return all(first);
  }
  if (BroadcastOperators().count(op)) return all(Broadcast(node, in, label));
  if (PerItemOperators().count(op)) {
    if (first.kind != State::kRows || first.axis != 0 || !others_same(1)) {
      return mixed("runs over items that are not the rows");
    }
    if (op == "BatchNormalization" && IntAttribute(node, "training_mode", 0) != 0) {
      return mixed("computes batch statistics over the rows");
    }
    std::vector<State> states = all(Rows(0));
    // MaxPool's indices count positions in the whole tensor, rows before included; a
    // BatchNormalization's extra outputs are running statistics over the batch.
    for (size_t o = 1; o < outputs; ++o) {
      states[o] = Mixed(absl::StrCat(label, " output ", o, " depends on the other rows"));
    }
    return states;
  }
  if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
    if (first.kind != State::kRows || rank < 0) return mixed("normalizes rows of unknown rank");
    const int axis = Normalize(IntAttribute(node, "axis", opset_ >= 13 ? -1 : 1), rank);
    // Before opset 13 the operator flattens axes [axis, rank) into one and normalizes over it.
    const bool mixes = opset_ >= 13 ? axis == first.axis : first.axis >= axis;
    if (mixes) return mixed("normalizes over the row axis");
    return all(first);
  }
  if (op == "LayerNormalization") {
    if (first.kind != State::kRows || rank < 0 || !others_same(1)) {
      return mixed("normalizes rows with non-constant parameters");
    }
    if (first.axis >= Normalize(IntAttribute(node, "axis", -1), rank)) {
      return mixed("normalizes over the row axis");
    }
    return all(first);
  }
  if (op == "LpNormalization") {
    if (first.kind != State::kRows || rank < 0) return mixed("normalizes rows of unknown rank");
    if (Normalize(IntAttribute(node, "axis", -1), rank) == first.axis) {
      return mixed("normalizes over the row axis");
    }
    return all(first);
  }
  if (op == "MeanVarianceNormalization") {
    const std::vector<int64_t> axes =
        IntsAttribute(node, "axes").value_or(std::vector<int64_t>{0, 2, 3});
    if (first.kind != State::kRows || rank < 0) return mixed("normalizes rows of unknown rank");
    for (int64_t axis : axes) {
      if (Normalize(axis, rank) == first.axis) return mixed("normalizes over the row axis");
    }
    return all(first);
  }
  if (ReduceOperators().count(op) || op == "ArgMax" || op == "ArgMin") {
    if (first.kind != State::kRows || rank < 0) return mixed("reduces rows of unknown rank");
    std::vector<int64_t> axes;
    const bool arg = op == "ArgMax" || op == "ArgMin";
    if (arg) {
      axes = {IntAttribute(node, "axis", 0)};
    } else if (node.input_size() >= 2 && !node.input(1).empty()) {
      auto values = Ints(node.input(1));
      if (!values.has_value()) return mixed("reduces over axes that are not constant");
      axes = *values;
    } else {
      axes = IntsAttribute(node, "axes").value_or(std::vector<int64_t>{});
    }
    if (axes.empty()) {
      if (IntAttribute(node, "noop_with_empty_axes", 0) != 0) return all(first);
      return mixed("reduces over every axis, the rows included");
    }
    int before = 0;
    for (int64_t axis : axes) {
      const int normalized = Normalize(axis, rank);
      if (normalized == first.axis) return mixed("reduces over the row axis");
      if (normalized < first.axis) ++before;
    }
    return all(Rows(IntAttribute(node, "keepdims", 1) != 0 ? first.axis : first.axis - before));
  }
  if (op == "TopK" || op == "CumSum") {
    if (first.kind != State::kRows || rank < 0 || !others_same(1)) {
      return mixed("works along a non-constant axis");
    }
    int64_t axis = IntAttribute(node, "axis", -1);
    if (op == "CumSum") {
      auto values = Ints(node.input(1));
      if (!values.has_value() || values->size() != 1)
        return mixed("works along a non-constant axis");
      axis = (*values)[0];
    }
    if (Normalize(axis, rank) == first.axis) return mixed("works along the row axis");
    return all(first);
  }
  if (op == "Transpose") {
    if (first.kind != State::kRows || rank < 0) return mixed("transposes rows of unknown rank");
    std::vector<int64_t> perm = IntsAttribute(node, "perm").value_or(std::vector<int64_t>{});
    if (perm.empty()) {
      for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
    }
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] == first.axis) return all(Rows(static_cast<int>(i)));
    }
    return mixed("has a permutation without the row axis");
  }
  if (op == "Reshape") return all(Reshape(node, in, label));
  if (op == "Flatten") {
    const int64_t axis = IntAttribute(node, "axis", 1);
    if (first.kind == State::kRows && first.axis == 0 && rank > 0 && Normalize(axis, rank) == 1) {
      return all(Rows(0));
    }
    return mixed("flattens the row axis together with others");
  }
  if (op == "Squeeze" || op == "Unsqueeze") {
    if (!others_same(1)) return mixed("changes axes that are only known per run");
    if (first.kind != State::kRows || rank < 0) {
      return mixed("changes the axes of rows of unknown rank");
    }
    const std::optional<std::vector<int64_t>> axes = IntsParameter(node, 1, "axes");
    if (!axes.has_value() || axes->empty()) {
      return mixed("squeezes every axis of size 1, which may be the row axis");
    }
    if (op == "Squeeze") {
      int before = 0;
      for (int64_t axis : *axes) {
        const int normalized = Normalize(axis, rank);
        if (normalized == first.axis) return mixed("squeezes the row axis");
        if (normalized < first.axis) ++before;
      }
      return all(Rows(first.axis - before));
    }
    const int out_rank = rank + static_cast<int>(axes->size());
    std::vector<bool> inserted(out_rank, false);
    for (int64_t axis : *axes) {
      const int normalized = Normalize(axis, out_rank);
      if (normalized < 0 || normalized >= out_rank) return mixed("has an axis out of range");
      inserted[normalized] = true;
    }
    int seen = 0;
    for (int p = 0; p < out_rank; ++p) {
      if (inserted[p]) continue;
      if (seen++ == first.axis) return all(Rows(p));
    }
    return mixed("has an axis out of range");
  }
  if (op == "Concat") {
    if (rank < 0) return mixed("concatenates rows of unknown rank");
    for (const State& state : in) {
      if (state.kind != State::kRows || state.axis != first.axis) {
        return mixed("concatenates rows with values that have none");
      }
    }
    if (Normalize(IntAttribute(node, "axis", 0), rank) == first.axis) {
      return mixed("concatenates along the row axis");
    }
    return all(first);
  }
  if (op == "Split") {
    if (first.kind != State::kRows || rank < 0 || !others_same(1)) {
      return mixed("splits rows by non-constant sizes");
    }
    if (Normalize(IntAttribute(node, "axis", 0), rank) == first.axis) {
      return mixed("splits along the row axis");
    }
    return all(first);
  }
  if (op == "Slice") return all(Slice(node, in, label));
  if (op == "Gather") {
    const int indices_rank = Rank(node.input(1));
    if (rank < 0 || indices_rank < 0) return mixed("gathers from values of unknown rank");
    const int axis = Normalize(IntAttribute(node, "axis", 0), rank);
    if (first.kind == State::kRows && in[1].kind == State::kSame) {
      if (axis == first.axis) return mixed("gathers along the row axis");
      return all(Rows(first.axis < axis ? first.axis : first.axis + indices_rank - 1));
    }
    if (first.kind == State::kSame && in[1].kind == State::kRows) {
      return all(Rows(axis + in[1].axis));  // a lookup table indexed by rows
    }
    return mixed("gathers rows with row-dependent indices");
  }
  if (op == "GatherElements") {
    if (first.kind == State::kRows && in[1].kind == State::kRows && in[1].axis == first.axis &&
        rank >= 0 && Normalize(IntAttribute(node, "axis", 0), rank) != first.axis) {
      return all(first);
    }
    return mixed("gathers elements across rows");
  }
  if (op == "GatherND") {
    if (first.kind == State::kRows && first.axis == 0 && in[1].kind == State::kRows &&
        in[1].axis == 0 && IntAttribute(node, "batch_dims", 0) >= 1) {
      return all(Rows(0));
    }
    return mixed("gathers across rows");
  }
  if (op == "Expand") return all(Expand(node, in, label));
  if (op == "Tile") {
    auto repeats = node.input_size() >= 2 ? Ints(node.input(1)) : std::nullopt;
    if (first.kind != State::kRows || !repeats.has_value() ||
        first.axis >= static_cast<int>(repeats->size()) || (*repeats)[first.axis] != 1) {
      return mixed("repeats the row axis");
    }
    return all(first);
  }
  if (op == "Pad") {
    if (first.kind != State::kRows || rank < 0 || !others_same(1)) {
      return mixed("pads rows with non-constant amounts");
    }
    const std::optional<std::vector<int64_t>> pads = IntsParameter(node, 1, "pads");
    std::vector<int64_t> axes;
    if (node.input_size() >= 4 && !node.input(3).empty()) {
      auto values = Ints(node.input(3));
      if (!values.has_value()) return mixed("pads non-constant axes");
      axes = *values;
    } else {
      for (int i = 0; i < rank; ++i) axes.push_back(i);
    }
    if (!pads.has_value() || pads->size() != 2 * axes.size())
      return mixed("pads by unknown amounts");
    for (size_t i = 0; i < axes.size(); ++i) {
      if (Normalize(axes[i], rank) == first.axis &&
          ((*pads)[i] != 0 || (*pads)[i + axes.size()] != 0)) {
        return mixed("pads the row axis");
      }
    }
    return all(first);
  }
  if (op == "Shape") {
    if (first.kind != State::kRows || rank < 0) return mixed("takes the shape of unknown rank");
    const ValueInfo* info = Info(node.input(0));
    int start = 0;
    int end = rank;
    if (opset_ >= 15) {
      start = std::clamp(Normalize(IntAttribute(node, "start", 0), rank), 0, rank);
      end = std::clamp(Normalize(IntAttribute(node, "end", rank), rank), 0, rank);
    }
    // The rank may come from the analysis alone (inference left the value unranked): then no
    // dimension is known, and the ones other than the rows are "same".
    const bool dims_known = info != nullptr && info->rank_known;
    std::vector<Element> elements;
    for (int i = start; i < end; ++i) {
      if (i == first.axis) {
        elements.push_back({Element::kRows});
      } else if (dims_known && info->dims[i] >= 0) {
        elements.push_back(Known(info->dims[i]));
      } else {
        elements.push_back({Element::kSame});
      }
    }
    return all(ShapeOf(std::move(elements), false));
  }
  if (op == "MatMul") return all(MatMul(node, in, label));
  if (op == "Gemm") {
    if (first.kind != State::kRows || !others_same(1)) return mixed("multiplies rows by rows");
    const int wanted = IntAttribute(node, "transA", 0) != 0 ? 1 : 0;
    if (first.axis != wanted) return mixed("contracts over the row axis");
    if (node.input_size() >= 3 && !node.input(2).empty()) {
      const ValueInfo* bias = Info(node.input(2));
      if (bias == nullptr || !bias->rank_known) return mixed("adds a bias of unknown shape");
      if (bias->rank() == 2 && bias->dims[0] != 1) return mixed("adds a bias along the rows");
    }
    return all(Rows(0));
  }
  if (op == "OneHot") {
    if (first.kind != State::kRows || rank < 0 || !others_same(1)) {
      return mixed("encodes rows with non-constant depth or values");
    }
    const int position = Normalize(IntAttribute(node, "axis", -1), rank + 1);
    return all(Rows(position <= first.axis ? first.axis + 1 : first.axis));
  }
  if (op == "Trilu") {
    if (first.kind != State::kRows || rank < 0 || first.axis >= rank - 2 || !others_same(1)) {
      return mixed("masks a matrix that spans the rows");
    }
    return all(first);
  }
  if (op == "Resize" || op == "Upsample") return all(Resize(node, in, label));
  if (op == "LSTM") {
    // Each sequence of the batch runs through the layer alone: X [seq, batch, input] (or
    // [batch, seq, input] with layout 1), states [directions, batch, hidden] (or batch first),
    // sequence_lens [batch]; weights, biases and peepholes are the same for every row.
    const bool batch_first = IntAttribute(node, "layout", 0) != 0;
    const int x_axis = batch_first ? 0 : 1;
    if (first.kind != State::kRows || first.axis != x_axis) {
      return mixed("runs its sequences over an axis that is not the rows");
    }
    for (size_t i = 1; i < in.size(); ++i) {
      if (node.input(i).empty()) continue;              // absent optional input
      const bool per_row = i == 4 || i == 5 || i == 6;  // sequence_lens, initial_h, initial_c
      const int row_axis = i == 4 || batch_first ? 0 : 1;
      const bool fits = per_row ? in[i].kind == State::kRows && in[i].axis == row_axis
                                : in[i].kind == State::kSame;
      if (!fits) return mixed("takes a per-row input that does not hold the rows");
    }
    std::vector<State> states = all(Rows(batch_first ? 0 : 1));  // Y_h and Y_c
    if (outputs > 0) states[0] = Rows(batch_first ? 0 : 2);      // Y [seq, directions, batch, h]
    return states;
  }
  return mixed("has no rule for rows (the model's requests run one by one)");
}

RowIndependence Analyzer::Run(const onnx::GraphProto& graph, const std::vector<int>& order) {
  std::unordered_set<std::string> initializers;
  for (const auto& initializer : graph.initializer()) initializers.insert(initializer.name());
  for (const auto& input : graph.input()) {
    if (initializers.count(input.name())) continue;
    const ValueInfo* info = Info(input.name());
    if (Rank(input.name()) == 0) {
      states_[input.name()] =
          Mixed(absl::StrCat("input '", input.name(), "' is a scalar, without rows"));
    } else if (info != nullptr && info->rank_known && info->dims[0] >= 0) {
      // Requests put together would have more rows than the model accepts.
      states_[input.name()] = Mixed(
          absl::StrCat("input '", input.name(), "' has a fixed row count (", info->dims[0], ")"));
    } else {
      states_[input.name()] = Rows(0);
    }
  }
  for (int index : order) {
    const onnx::NodeProto& node = graph.node(index);
    std::vector<State> in;
    for (const std::string& name : node.input()) in.push_back(Get(name));
    std::vector<State> out = Apply(node, in);
    // Operators whose outputs have their first input's rank, for values whose rank inference
    // left open (a reshape or expand to a computed shape upstream).
    const std::string& op = node.op_type();
    if ((UnaryOperators().count(op) || PerItemOperators().count(op) ||
         RankKeepingOperators().count(op)) &&
        node.input_size() > 0) {
      for (State& state : out) {
        if (state.rank < 0) state.rank = Rank(node.input(0));
      }
    }
    for (int o = 0; o < node.output_size(); ++o) {
      if (!node.output(o).empty()) states_[node.output(o)] = std::move(out[o]);
    }
  }
  for (const auto& output : graph.output()) {
    const State state = Get(output.name());
    switch (state.kind) {
      case State::kRows:
        if (state.axis == 0) continue;
        return {false,
                absl::StrCat("output '", output.name(), "' holds its rows on axis ", state.axis)};
      case State::kSame:
        return {false,
                absl::StrCat("output '", output.name(), "' does not depend on the input rows")};
      case State::kShape:
        return {false, absl::StrCat("output '", output.name(), "' is computed from the row count")};
      case State::kMixed:
        return {false, state.why};
    }
  }
  return {true, ""};
}

}  // namespace row_analysis_internal

RowIndependence AnalyzeRowIndependence(
    const onnx::GraphProto& graph, const std::vector<int>& order, int opset,
    const std::function<const ValueInfo*(const std::string&)>& info) {
  return row_analysis_internal::Analyzer(opset, info).Run(graph, order);
}

}  // namespace cloister::runtime
