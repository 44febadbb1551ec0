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

std::vector<State> Analyzer::RowNode::AllMixed(const char* what) const {
  return All(Mixed(absl::StrCat(label, " ", what)));
}

bool Analyzer::RowNode::OthersSame(size_t from) const {
  for (size_t i = from; i < in.size(); ++i) {
    if (in[i].kind != State::kSame) return false;
  }
  return true;
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

  if (!any_rows) return ApplyShapeArithmetic(node, in);
  // Rows on an axis past a value's known rank: inference and rules disagree; refuse.
  for (size_t i = 0; i < in.size(); ++i) {
    const int rank = Rank(node.input(i));
    if (in[i].kind == State::kRows && (in[i].axis < 0 || (rank >= 0 && in[i].axis >= rank))) {
      return mixed("has rows on an axis outside its input's rank");
    }
  }

  // The families take disjoint sets of operators: the one that knows the operator decides.
  const RowNode row_node{node, in, label, outputs, Rank(node.input(0)), in[0]};
  using Rule = std::optional<std::vector<State>> (Analyzer::*)(const RowNode&) const;
  for (Rule rule : {&Analyzer::ApplyElementwise, &Analyzer::ApplyPerItem,
                    &Analyzer::ApplyNormalization, &Analyzer::ApplyReduction,
                    &Analyzer::ApplyAxisChange, &Analyzer::ApplyCopy, &Analyzer::ApplyGather,
                    &Analyzer::ApplyShape, &Analyzer::ApplyMatrix, &Analyzer::ApplyRecurrent}) {
    std::optional<std::vector<State>> states = (this->*rule)(row_node);
    if (states.has_value()) return *std::move(states);
  }
  return mixed("has no rule for rows (the model's requests run one by one)");
}

std::optional<std::vector<State>> Analyzer::ApplyElementwise(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  if (UnaryOperators().count(op)) {
    // CastLike reads only the element type of its second input.
    if (first.kind != State::kRows || !(op == "CastLike" || row_node.OthersSame(1))) {
      return row_node.AllMixed("combines rows with a non-constant parameter");
    }
    return row_node.All(first);
  }
  if (op == "QuantizeLinear" || op == "DequantizeLinear") {
    if (first.kind != State::kRows || !row_node.OthersSame(1) || row_node.rank < 0) {
      return row_node.AllMixed("quantizes rows with a non-constant scale");
    }
    const ValueInfo* scale = Info(node.input(1));
    const bool per_axis = scale == nullptr || !scale->rank_known || scale->rank() > 0;
    if (per_axis && Normalize(IntAttribute(node, "axis", 1), row_node.rank) == first.axis) {
      return row_node.AllMixed("quantizes along the row axis");
    }
    return row_node.All(first);
  }
  if (BroadcastOperators().count(op)) {
    return row_node.All(Broadcast(node, row_node.in, row_node.label));
  }
  return std::nullopt;
}

std::optional<std::vector<State>> Analyzer::ApplyPerItem(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  if (!PerItemOperators().count(op)) return std::nullopt;
  if (first.kind != State::kRows || first.axis != 0 || !row_node.OthersSame(1)) {
    return row_node.AllMixed("runs over items that are not the rows");
  }
  if (op == "BatchNormalization" && IntAttribute(node, "training_mode", 0) != 0) {
    return row_node.AllMixed("computes batch statistics over the rows");
  }
  std::vector<State> states = row_node.All(Rows(0));
  // MaxPool's indices count positions in the whole tensor, rows before included; a
  // BatchNormalization's extra outputs are running statistics over the batch.
  for (size_t o = 1; o < row_node.outputs; ++o) {
    states[o] = Mixed(absl::StrCat(row_node.label, " output ", o, " depends on the other rows"));
  }
  return states;
}

std::optional<std::vector<State>> Analyzer::ApplyNormalization(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
    if (first.kind != State::kRows || rank < 0) {
      return row_node.AllMixed("normalizes rows of unknown rank");
    }
    const int axis = Normalize(IntAttribute(node, "axis", opset_ >= 13 ? -1 : 1), rank);
    // Before opset 13 the operator flattens axes [axis, rank) into one and normalizes over it.
    const bool mixes = opset_ >= 13 ? axis == first.axis : first.axis >= axis;
    if (mixes) return row_node.AllMixed("normalizes over the row axis");
    return row_node.All(first);
  }
  if (op == "LayerNormalization") {
    if (first.kind != State::kRows || rank < 0 || !row_node.OthersSame(1)) {
      return row_node.AllMixed("normalizes rows with non-constant parameters");
    }
    if (first.axis >= Normalize(IntAttribute(node, "axis", -1), rank)) {
      return row_node.AllMixed("normalizes over the row axis");
    }
    return row_node.All(first);
  }
  if (op == "LpNormalization") {
    if (first.kind != State::kRows || rank < 0) {
      return row_node.AllMixed("normalizes rows of unknown rank");
    }
    if (Normalize(IntAttribute(node, "axis", -1), rank) == first.axis) {
      return row_node.AllMixed("normalizes over the row axis");
    }
    return row_node.All(first);
  }
  if (op == "MeanVarianceNormalization") {
    const std::vector<int64_t> axes =
        IntsAttribute(node, "axes").value_or(std::vector<int64_t>{0, 2, 3});
    if (first.kind != State::kRows || rank < 0) {
      return row_node.AllMixed("normalizes rows of unknown rank");
    }
    for (int64_t axis : axes) {
      if (Normalize(axis, rank) == first.axis) {
        return row_node.AllMixed("normalizes over the row axis");
      }
    }
    return row_node.All(first);
  }
  return std::nullopt;
}

std::optional<std::vector<State>> Analyzer::ApplyReduction(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (ReduceOperators().count(op) || op == "ArgMax" || op == "ArgMin") {
    if (first.kind != State::kRows || rank < 0) {
      return row_node.AllMixed("reduces rows of unknown rank");
    }
    std::vector<int64_t> axes;
    const bool arg = op == "ArgMax" || op == "ArgMin";
    if (arg) {
      axes = {IntAttribute(node, "axis", 0)};
    } else if (node.input_size() >= 2 && !node.input(1).empty()) {
      auto values = Ints(node.input(1));
      if (!values.has_value()) return row_node.AllMixed("reduces over axes that are not constant");
      axes = *values;
    } else {
      axes = IntsAttribute(node, "axes").value_or(std::vector<int64_t>{});
    }
    if (axes.empty()) {
      if (IntAttribute(node, "noop_with_empty_axes", 0) != 0) return row_node.All(first);
      return row_node.AllMixed("reduces over every axis, the rows included");
    }
    int before = 0;
    for (int64_t axis : axes) {
      const int normalized = Normalize(axis, rank);
      if (normalized == first.axis) return row_node.AllMixed("reduces over the row axis");
      if (normalized < first.axis) ++before;
    }
    return row_node.All(
        Rows(IntAttribute(node, "keepdims", 1) != 0 ? first.axis : first.axis - before));
  }
  if (op == "TopK" || op == "CumSum") {
    if (first.kind != State::kRows || rank < 0 || !row_node.OthersSame(1)) {
      return row_node.AllMixed("works along a non-constant axis");
    }
    int64_t axis = IntAttribute(node, "axis", -1);
    if (op == "CumSum") {
      auto values = Ints(node.input(1));
      if (!values.has_value() || values->size() != 1) {
        return row_node.AllMixed("works along a non-constant axis");
      }
      axis = (*values)[0];
    }
    if (Normalize(axis, rank) == first.axis) return row_node.AllMixed("works along the row axis");
    return row_node.All(first);
  }
  return std::nullopt;
}

std::optional<std::vector<State>> Analyzer::ApplyAxisChange(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (op == "Transpose") {
    if (first.kind != State::kRows || rank < 0) {
      return row_node.AllMixed("transposes rows of unknown rank");
    }
    std::vector<int64_t> perm = IntsAttribute(node, "perm").value_or(std::vector<int64_t>{});
    if (perm.empty()) {
      for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
    }
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] == first.axis) return row_node.All(Rows(static_cast<int>(i)));
    }
    return row_node.AllMixed("has a permutation without the row axis");
  }
  if (op == "Reshape") return row_node.All(Reshape(node, row_node.in, row_node.label));
  if (op == "Flatten") {
    const int64_t axis = IntAttribute(node, "axis", 1);
    if (first.kind == State::kRows && first.axis == 0 && rank > 0 && Normalize(axis, rank) == 1) {
      return row_node.All(Rows(0));
    }
    return row_node.AllMixed("flattens the row axis together with others");
  }
  if (op == "Squeeze" || op == "Unsqueeze") return ApplySqueeze(row_node);
  if (op == "OneHot") {
    if (first.kind != State::kRows || rank < 0 || !row_node.OthersSame(1)) {
      return row_node.AllMixed("encodes rows with non-constant depth or values");
    }
    const int position = Normalize(IntAttribute(node, "axis", -1), rank + 1);
    return row_node.All(Rows(position <= first.axis ? first.axis + 1 : first.axis));
  }
  return std::nullopt;
}

std::vector<State> Analyzer::ApplySqueeze(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (!row_node.OthersSame(1)) return row_node.AllMixed("changes axes that are only known per run");
  if (first.kind != State::kRows || rank < 0) {
    return row_node.AllMixed("changes the axes of rows of unknown rank");
  }
  const std::optional<std::vector<int64_t>> axes = IntsParameter(node, 1, "axes");
  if (!axes.has_value() || axes->empty()) {
    return row_node.AllMixed("squeezes every axis of size 1, which may be the row axis");
  }
  if (node.op_type() == "Squeeze") {
    int before = 0;
    for (int64_t axis : *axes) {
      const int normalized = Normalize(axis, rank);
      if (normalized == first.axis) return row_node.AllMixed("squeezes the row axis");
      if (normalized < first.axis) ++before;
    }
    return row_node.All(Rows(first.axis - before));
  }
  const int out_rank = rank + static_cast<int>(axes->size());
  std::vector<bool> inserted(out_rank, false);
  for (int64_t axis : *axes) {
    const int normalized = Normalize(axis, out_rank);
    if (normalized < 0 || normalized >= out_rank) {
      return row_node.AllMixed("has an axis out of range");
    }
    inserted[normalized] = true;
  }
  int seen = 0;
  for (int p = 0; p < out_rank; ++p) {
    if (inserted[p]) continue;
    if (seen++ == first.axis) return row_node.All(Rows(p));
  }
  return row_node.AllMixed("has an axis out of range");
}

std::optional<std::vector<State>> Analyzer::ApplyCopy(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (op == "Concat") {
    if (rank < 0) return row_node.AllMixed("concatenates rows of unknown rank");
    for (const State& state : row_node.in) {
      if (state.kind != State::kRows || state.axis != first.axis) {
        return row_node.AllMixed("concatenates rows with values that have none");
      }
    }
    if (Normalize(IntAttribute(node, "axis", 0), rank) == first.axis) {
      return row_node.AllMixed("concatenates along the row axis");
    }
    return row_node.All(first);
  }
  if (op == "Split") {
    if (first.kind != State::kRows || rank < 0 || !row_node.OthersSame(1)) {
      return row_node.AllMixed("splits rows by non-constant sizes");
    }
    if (Normalize(IntAttribute(node, "axis", 0), rank) == first.axis) {
      return row_node.AllMixed("splits along the row axis");
    }
    return row_node.All(first);
  }
  if (op == "Slice") return row_node.All(Slice(node, row_node.in, row_node.label));
  if (op == "Expand") return row_node.All(Expand(node, row_node.in, row_node.label));
  if (op == "Tile") {
    auto repeats = node.input_size() >= 2 ? Ints(node.input(1)) : std::nullopt;
    if (first.kind != State::kRows || !repeats.has_value() ||
        first.axis >= static_cast<int>(repeats->size()) || (*repeats)[first.axis] != 1) {
      return row_node.AllMixed("repeats the row axis");
    }
    return row_node.All(first);
  }
  if (op == "Pad") return ApplyPad(row_node);
  if (op == "Resize" || op == "Upsample") {
    return row_node.All(Resize(node, row_node.in, row_node.label));
  }
  return std::nullopt;
}

std::vector<State> Analyzer::ApplyPad(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (first.kind != State::kRows || rank < 0 || !row_node.OthersSame(1)) {
    return row_node.AllMixed("pads rows with non-constant amounts");
  }
  const std::optional<std::vector<int64_t>> pads = IntsParameter(node, 1, "pads");
  std::vector<int64_t> axes;
  if (node.input_size() >= 4 && !node.input(3).empty()) {
    auto values = Ints(node.input(3));
    if (!values.has_value()) return row_node.AllMixed("pads non-constant axes");
    axes = *values;
  } else {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
  }
  if (!pads.has_value() || pads->size() != 2 * axes.size()) {
    return row_node.AllMixed("pads by unknown amounts");
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    if (Normalize(axes[i], rank) == first.axis &&
        ((*pads)[i] != 0 || (*pads)[i + axes.size()] != 0)) {
      return row_node.AllMixed("pads the row axis");
    }
  }
  return row_node.All(first);
}

std::optional<std::vector<State>> Analyzer::ApplyGather(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const std::vector<State>& in = row_node.in;
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (op == "Gather") {
    const int indices_rank = Rank(node.input(1));
    if (rank < 0 || indices_rank < 0) {
      return row_node.AllMixed("gathers from values of unknown rank");
    }
    const int axis = Normalize(IntAttribute(node, "axis", 0), rank);
    if (first.kind == State::kRows && in[1].kind == State::kSame) {
      if (axis == first.axis) return row_node.AllMixed("gathers along the row axis");
      return row_node.All(Rows(first.axis < axis ? first.axis : first.axis + indices_rank - 1));
    }
    if (first.kind == State::kSame && in[1].kind == State::kRows) {
      return row_node.All(Rows(axis + in[1].axis));  // a lookup table indexed by rows
    }
    return row_node.AllMixed("gathers rows with row-dependent indices");
  }
  if (op == "GatherElements") {
    if (first.kind == State::kRows && in[1].kind == State::kRows && in[1].axis == first.axis &&
        rank >= 0 && Normalize(IntAttribute(node, "axis", 0), rank) != first.axis) {
      return row_node.All(first);
    }
    return row_node.AllMixed("gathers elements across rows");
  }
  if (op == "GatherND") {
    if (first.kind == State::kRows && first.axis == 0 && in[1].kind == State::kRows &&
        in[1].axis == 0 && IntAttribute(node, "batch_dims", 0) >= 1) {
      return row_node.All(Rows(0));
    }
    return row_node.AllMixed("gathers across rows");
  }
  return std::nullopt;
}

std::optional<std::vector<State>> Analyzer::ApplyShape(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (node.op_type() != "Shape") return std::nullopt;
  if (first.kind != State::kRows || rank < 0) {
    return row_node.AllMixed("takes the shape of unknown rank");
  }
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
  return row_node.All(ShapeOf(std::move(elements), false));
}

std::optional<std::vector<State>> Analyzer::ApplyMatrix(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::string& op = node.op_type();
  const State& first = row_node.first;
  const int rank = row_node.rank;
  if (op == "MatMul") return row_node.All(MatMul(node, row_node.in, row_node.label));
  if (op == "Gemm") {
    if (first.kind != State::kRows || !row_node.OthersSame(1)) {
      return row_node.AllMixed("multiplies rows by rows");
    }
    const int wanted = IntAttribute(node, "transA", 0) != 0 ? 1 : 0;
    if (first.axis != wanted) return row_node.AllMixed("contracts over the row axis");
    if (node.input_size() >= 3 && !node.input(2).empty()) {
      const ValueInfo* bias = Info(node.input(2));
      if (bias == nullptr || !bias->rank_known) {
        return row_node.AllMixed("adds a bias of unknown shape");
      }
      if (bias->rank() == 2 && bias->dims[0] != 1) {
        return row_node.AllMixed("adds a bias along the rows");
      }
    }
    return row_node.All(Rows(0));
  }
  if (op == "Trilu") {
    if (first.kind != State::kRows || rank < 0 || first.axis >= rank - 2 ||
        !row_node.OthersSame(1)) {
      return row_node.AllMixed("masks a matrix that spans the rows");
    }
    return row_node.All(first);
  }
  return std::nullopt;
}

std::optional<std::vector<State>> Analyzer::ApplyRecurrent(const RowNode& row_node) const {
  const onnx::NodeProto& node = row_node.node;
  const std::vector<State>& in = row_node.in;
  const State& first = row_node.first;
  if (node.op_type() != "LSTM") return std::nullopt;
  // Each sequence of the batch runs through the layer alone: X [seq, batch, input] (or
  // [batch, seq, input] with layout 1), states [directions, batch, hidden] (or batch first),
  // sequence_lens [batch]; weights, biases and peepholes are the same for every row.
  const bool batch_first = IntAttribute(node, "layout", 0) != 0;
  const int x_axis = batch_first ? 0 : 1;
  if (first.kind != State::kRows || first.axis != x_axis) {
    return row_node.AllMixed("runs its sequences over an axis that is not the rows");
  }
  for (size_t i = 1; i < in.size(); ++i) {
    if (node.input(i).empty()) continue;              // absent optional input
    const bool per_row = i == 4 || i == 5 || i == 6;  // sequence_lens, initial_h, initial_c
    const int row_axis = i == 4 || batch_first ? 0 : 1;
    const bool fits =
        per_row ? in[i].kind == State::kRows && in[i].axis == row_axis : in[i].kind == State::kSame;
    if (!fits) return row_node.AllMixed("takes a per-row input that does not hold the rows");
  }
  std::vector<State> states = row_node.All(Rows(batch_first ? 0 : 1));  // Y_h and Y_c
  if (row_node.outputs > 0) states[0] = Rows(batch_first ? 0 : 2);  // Y [seq, directions, batch, h]
  return states;
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
