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

namespace cloister::runtime {
namespace {

// One element of a shape vector.
struct Element {
  enum Kind { kKnown, kSame, kRows };
  Kind kind = kSame;
  int64_t value = 0;  // kKnown only
};

Element Known(int64_t value) { return {Element::kKnown, value}; }

// What coalescing does to one value (see the header).
struct State {
  enum Kind { kSame, kRows, kShape, kMixed };
  Kind kind = kMixed;
  int axis = 0;  // kRows: the axis holding the rows
  // kShape, and kSame values that are known small integer vectors (a shape's other dimensions).
  std::vector<Element> elements;
  bool has_elements = false;
  bool scalar = false;  // with elements: a rank-0 value
  int rank = -1;        // when inference left a value's rank open and a rule knows it
  std::string why;      // kMixed: the first node that mixed rows
};

State Same() { return State{State::kSame}; }
// Rows on `axis`; `rank` when inference left the value's rank open and the rule knows it.
State Rows(int axis, int rank = -1) {
  State state{State::kRows, axis};
  state.rank = rank;
  return state;
}
State Mixed(std::string why) {
  State state;
  state.why = std::move(why);
  return state;
}
// A shape vector; "same" (keeping its elements) when none of them is the row count.
State ShapeOf(std::vector<Element> elements, bool scalar) {
  const bool has_rows = std::any_of(elements.begin(), elements.end(),
                                    [](const Element& e) { return e.kind == Element::kRows; });
  State state{has_rows ? State::kShape : State::kSame};
  state.elements = std::move(elements);
  state.has_elements = true;
  state.scalar = scalar;
  return state;
}

// Whether the value is a vector of known elements (a shape vector, with or without the rows).
bool IsVector(const State& state) { return state.has_elements; }

// Operators that compute on shape vectors (ApplyShapeArithmetic).
const std::unordered_set<std::string_view>& ShapeArithmeticOperators() {
  static const auto* const kOperators = new std::unordered_set<std::string_view>{
      "Identity", "Cast", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice",
      "Add",      "Sub",  "Mul",    "Div",    "Max",       "Min"};
  return *kOperators;
}

int Normalize(int64_t axis, int rank) { return static_cast<int>(axis < 0 ? axis + rank : axis); }

const onnx::AttributeProto* FindAttribute(const onnx::NodeProto& node, std::string_view name) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.name() == name) return &attribute;
  }
  return nullptr;
}
int64_t IntAttribute(const onnx::NodeProto& node, std::string_view name, int64_t fallback) {
  const onnx::AttributeProto* attribute = FindAttribute(node, name);
  return attribute == nullptr ? fallback : attribute->i();
}
std::optional<std::vector<int64_t>> IntsAttribute(const onnx::NodeProto& node,
                                                  std::string_view name) {
  const onnx::AttributeProto* attribute = FindAttribute(node, name);
  if (attribute == nullptr) return std::nullopt;
  return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
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

class Analyzer {
 public:
  Analyzer(int opset, const std::function<const ValueInfo*(const std::string&)>& info)
      : opset_(opset), info_(info) {}

  RowIndependence Run(const onnx::GraphProto& graph, const std::vector<int>& order);

 private:
  const ValueInfo* Info(const std::string& name) const {
    return name.empty() ? nullptr : info_(name);
  }
  int Rank(const std::string& name) const {
    const ValueInfo* info = Info(name);
    if (info != nullptr && info->rank_known) return info->rank();
    auto it = states_.find(name);
    return it == states_.end() ? -1 : it->second.rank;
  }
  // The constant integers of a value, or nothing when it is not an integer constant.
  std::optional<std::vector<int64_t>> Ints(const std::string& name) const;
  // The constant floats of a value.
  std::optional<std::vector<float>> Floats(const std::string& name) const;
  // Constant integers given as input `index` (newer opsets) or, when that input is absent, as
  // attribute `attribute` (older ones); nothing when the input is not a constant or neither is
  // there.
  std::optional<std::vector<int64_t>> IntsParameter(const onnx::NodeProto& node, int index,
                                                    std::string_view attribute) const {
    if (node.input_size() > index && !node.input(index).empty()) return Ints(node.input(index));
    return IntsAttribute(node, attribute);
  }
  // A Slice's bounds: inputs from opset 10, attributes before.
  struct SliceBounds {
    std::optional<std::vector<int64_t>> starts, ends, axes, steps;
    bool axes_given = false;  // the axes input is there, constant or not
  };
  SliceBounds SliceBoundsOf(const onnx::NodeProto& node) const;
  // A 0-D or 1-D integer value as shape elements: a shape vector's own elements, a constant's
  // numbers, or "same" elements as many as its static size.
  std::optional<std::vector<Element>> ElementsOf(const std::string& name, const State& state) const;
  State Get(const std::string& name) const;

  // The states of `node`'s outputs. `in` holds its explicit inputs' states.
  std::vector<State> Apply(const onnx::NodeProto& node, const std::vector<State>& in) const;
  std::vector<State> ApplyShapeArithmetic(const onnx::NodeProto& node,
                                          const std::vector<State>& in) const;
  State Broadcast(const onnx::NodeProto& node, const std::vector<State>& in,
                  const std::string& label) const;
  State MatMul(const onnx::NodeProto& node, const std::vector<State>& in,
               const std::string& label) const;
  State Reshape(const onnx::NodeProto& node, const std::vector<State>& in,
                const std::string& label) const;
  State Expand(const onnx::NodeProto& node, const std::vector<State>& in,
               const std::string& label) const;
  State Slice(const onnx::NodeProto& node, const std::vector<State>& in,
              const std::string& label) const;
  State Resize(const onnx::NodeProto& node, const std::vector<State>& in,
               const std::string& label) const;

  const int opset_;
  const std::function<const ValueInfo*(const std::string&)>& info_;
  std::unordered_map<std::string, State> states_;
};

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

std::vector<State> Analyzer::ApplyShapeArithmetic(const onnx::NodeProto& node,
                                                  const std::vector<State>& in) const {
  const std::string label = Label(node);
  const size_t outputs = static_cast<size_t>(node.output_size());
  auto result = [&](State state) { return std::vector<State>(outputs, std::move(state)); };
  auto mixed = [&]() { return result(Mixed(absl::StrCat(label, " computes with the row count"))); };
  const std::string& op = node.op_type();
  const State& first = in[0];
  if (op == "Identity" || op == "Cast") {
    if (!IsVector(first)) return mixed();
    if (op == "Cast" && IntAttribute(node, "to", 0) == onnx::TensorProto::BOOL) return mixed();
    return result(first);
  }
  if (op == "ConstantOfShape") {
    // A tensor of constants with the rows on the axis the shape gives the row count.
    int position = -1;
    for (size_t i = 0; i < first.elements.size(); ++i) {
      if (first.elements[i].kind != Element::kRows) continue;
      if (position >= 0) return mixed();
      position = static_cast<int>(i);
    }
    return result(Rows(position, static_cast<int>(first.elements.size())));
  }
  if (op == "Expand") return result(Expand(node, in, label));
  if (op == "Gather") {
    auto indices = Ints(node.input(1));
    if (!IsVector(first) || first.scalar || !indices.has_value()) return mixed();
    const int64_t size = static_cast<int64_t>(first.elements.size());
    std::vector<Element> picked;
    for (int64_t index : *indices) {
      if (index < 0) index += size;
      if (index < 0 || index >= size) return mixed();
      picked.push_back(first.elements[index]);
    }
    return result(ShapeOf(std::move(picked), Rank(node.input(1)) == 0));
  }
  if (op == "Concat") {
    std::vector<Element> joined;
    for (int i = 0; i < node.input_size(); ++i) {
      auto elements = ElementsOf(node.input(i), in[i]);
      if (!elements.has_value() || (IsVector(in[i]) && in[i].scalar)) return mixed();
      joined.insert(joined.end(), elements->begin(), elements->end());
    }
    return result(ShapeOf(std::move(joined), false));
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    const std::optional<std::vector<int64_t>> axes = IntsParameter(node, 1, "axes");
    if (!IsVector(first)) return mixed();
    if (op == "Unsqueeze") {
      if (!first.scalar || axes != std::vector<int64_t>{0}) return mixed();
      return result(ShapeOf(first.elements, false));
    }
    if (first.scalar || first.elements.size() != 1 ||
        (axes.has_value() && *axes != std::vector<int64_t>{0} &&
         *axes != std::vector<int64_t>{-1})) {
      return mixed();
    }
    return result(ShapeOf(first.elements, true));
  }
  if (op == "Slice") {
    if (!IsVector(first) || first.scalar) return mixed();
    const auto [starts, ends, axes, steps, axes_given] = SliceBoundsOf(node);
    if (!starts.has_value() || !ends.has_value() || starts->size() != 1 || ends->size() != 1 ||
        (steps.has_value() && *steps != std::vector<int64_t>{1})) {
      return mixed();
    }
    const int64_t size = static_cast<int64_t>(first.elements.size());
    auto clamp = [&](int64_t index) {
      if (index < 0) index += size;
      return std::clamp<int64_t>(index, 0, size);
    };
    const int64_t begin = clamp((*starts)[0]);
    const int64_t end = std::max(begin, clamp((*ends)[0]));
    return result(ShapeOf(
        std::vector<Element>(first.elements.begin() + begin, first.elements.begin() + end), false));
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Max" || op == "Min") {
    if (in.size() != 2) return mixed();
    auto a = ElementsOf(node.input(0), in[0]);
    auto b = ElementsOf(node.input(1), in[1]);
    if (!a.has_value() || !b.has_value()) return mixed();
    if (a->size() != b->size() && a->size() != 1 && b->size() != 1) return mixed();
    const size_t size = std::max(a->size(), b->size());
    std::vector<Element> combined;
    for (size_t i = 0; i < size; ++i) {
      const Element x = (*a)[a->size() == 1 ? 0 : i];
      const Element y = (*b)[b->size() == 1 ? 0 : i];
      if (x.kind == Element::kKnown && y.kind == Element::kKnown) {
        if (op == "Add") combined.push_back(Known(x.value + y.value));
        if (op == "Sub") combined.push_back(Known(x.value - y.value));
        if (op == "Mul") combined.push_back(Known(x.value * y.value));
        if (op == "Max") combined.push_back(Known(std::max(x.value, y.value)));
        if (op == "Min") combined.push_back(Known(std::min(x.value, y.value)));
        if (op == "Div") {
          if (y.value == 0) return mixed();
          combined.push_back(Known(x.value / y.value));
        }
        continue;
      }
      // The row count passes only through arithmetic that leaves it as it is.
      const bool identity =
          y.kind == Element::kKnown && (((op == "Add" || op == "Sub") && y.value == 0) ||
                                        ((op == "Mul" || op == "Div") && y.value == 1));
      if (x.kind == Element::kRows && identity) {
        combined.push_back(x);
      } else if (x.kind == Element::kRows || y.kind == Element::kRows) {
        return mixed();
      } else {
        combined.push_back({Element::kSame});
      }
    }
    const bool scalar = (IsVector(in[0]) ? in[0].scalar : Rank(node.input(0)) == 0) &&
                        (IsVector(in[1]) ? in[1].scalar : Rank(node.input(1)) == 0);
    return result(ShapeOf(std::move(combined), scalar));
  }
  return mixed();
}

State Analyzer::Broadcast(const onnx::NodeProto& node, const std::vector<State>& in,
                          const std::string& label) const {
  // The output's rank, or the largest of the inputs' when inference left it open.
  int out_rank = Rank(node.output(0));
  if (out_rank < 0) {
    int largest = 0;
    bool known = true;
    for (const std::string& name : node.input()) {
      known = known && Rank(name) >= 0;
      largest = std::max(largest, Rank(name));
    }
    if (known) out_rank = largest;
  }
  if (out_rank < 0) return Mixed(absl::StrCat(label, " has an output of unknown rank"));
  int aligned = -1;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].kind == State::kShape) {
      return Mixed(absl::StrCat(label, " uses the row count as data"));
    }
    if (in[i].kind != State::kRows) continue;
    const int rank = Rank(node.input(i));
    if (rank < 0) return Mixed(absl::StrCat(label, " broadcasts rows of unknown rank"));
    if (rank > out_rank) return Mixed(absl::StrCat(label, " has an input above its output's rank"));
    const int axis = in[i].axis + out_rank - rank;
    if (aligned >= 0 && axis != aligned) {
      return Mixed(absl::StrCat(label, " combines rows on different axes"));
    }
    aligned = axis;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].kind != State::kSame || node.input(i).empty()) continue;
    const ValueInfo* info = Info(node.input(i));
    if (info == nullptr || !info->rank_known) {
      return Mixed(absl::StrCat(label, " broadcasts a value of unknown shape against rows"));
    }
    const int position = aligned - (out_rank - info->rank());
    if (position >= info->rank()) {
      return Mixed(absl::StrCat(label, " has an input above its output's rank"));
    }
    if (position >= 0 && info->dims[position] != 1) {
      return Mixed(absl::StrCat(label, " broadcasts a value along the row axis"));
    }
  }
  return Rows(aligned, out_rank);
}

State Analyzer::MatMul(const onnx::NodeProto& node, const std::vector<State>& in,
                       const std::string& label) const {
  const int a_rank = Rank(node.input(0));
  const int b_rank = Rank(node.input(1));
  int out_rank = Rank(node.output(0));
  if (out_rank < 0 && a_rank >= 1 && b_rank >= 1) {
    out_rank = std::max(a_rank, b_rank) - (a_rank == 1 || b_rank == 1 ? 1 : 0);
  }
  if (a_rank < 1 || b_rank < 1 || out_rank < 0) {
    return Mixed(absl::StrCat(label, " multiplies values of unknown rank"));
  }
  // Where each operand's rows land in the output: a batch axis keeps its place (aligned to the
  // right), A's row axis becomes the output's second-to-last, B's column axis its last;
  // contracted axes mix rows.
  auto place = [&](const State& state, int rank, bool left) -> std::optional<int> {
    if (state.kind != State::kRows) return std::nullopt;
    const int axis = state.axis;
    if (rank == 1) return -1;  // a vector's only axis is contracted
    if (left && axis == rank - 1) return -1;
    if (!left && axis == rank - 2) return -1;
    if (left && axis == rank - 2) return out_rank - (b_rank == 1 ? 1 : 2);
    if (!left && axis == rank - 1) return out_rank - 1;
    return axis + out_rank - rank;  // a batch axis
  };
  const std::optional<int> a = place(in[0], a_rank, true);
  const std::optional<int> b = place(in[1], b_rank, false);
  if (a == -1 || b == -1) return Mixed(absl::StrCat(label, " contracts over the row axis"));
  if (a.has_value() && b.has_value()) {
    // Both operands carry rows: only as the same batch axis of both.
    if (*a != *b || *a >= out_rank - 2) {
      return Mixed(absl::StrCat(label, " multiplies rows by other rows"));
    }
    return Rows(*a, out_rank);
  }
  const int axis = a.has_value() ? *a : *b;
  // The constant operand must not broadcast along a batch axis that holds rows.
  if (axis < out_rank - 2) {
    const std::string& other = node.input(a.has_value() ? 1 : 0);
    const ValueInfo* info = Info(other);
    if (info == nullptr || !info->rank_known) {
      return Mixed(absl::StrCat(label, " multiplies rows by a value of unknown shape"));
    }
    const int position = axis - (out_rank - info->rank());
    if (position >= 0 && position < info->rank() - 2 && info->dims[position] != 1) {
      return Mixed(absl::StrCat(label, " broadcasts a value along the row axis"));
    }
  }
  return Rows(axis, out_rank);
}

State Analyzer::Reshape(const onnx::NodeProto& node, const std::vector<State>& in,
                        const std::string& label) const {
  const State& data = in[0];
  if (data.kind != State::kRows || data.axis != 0) {
    return Mixed(absl::StrCat(label, " moves rows in a reshape"));
  }
  auto target = ElementsOf(node.input(1), in[1]);
  if (!target.has_value() || target->empty()) {
    return Mixed(absl::StrCat(label, " reshapes to a target it cannot follow"));
  }
  const bool allow_zero = IntAttribute(node, "allowzero", 0) != 0;
  for (size_t i = 1; i < target->size(); ++i) {
    if ((*target)[i].kind == Element::kRows) {
      return Mixed(absl::StrCat(label, " puts the row count on another axis"));
    }
  }
  const Element& head = (*target)[0];
  if (head.kind == Element::kRows) return Rows(0);
  if (head.kind == Element::kKnown && head.value == 0 && !allow_zero) return Rows(0);
  if (head.kind == Element::kKnown && head.value == -1) {
    // -1 keeps the row axis only when the other axes keep exactly the per-row size.
    const ValueInfo* info = Info(node.input(0));
    if (info != nullptr && info->rank_known) {
      int64_t per_row = 1;
      bool known = true;
      for (int i = 1; i < info->rank(); ++i) {
        known = known && info->dims[i] >= 0;
        per_row *= info->dims[i];
      }
      int64_t target_per_row = 1;
      for (size_t i = 1; i < target->size() && known; ++i) {
        const Element& e = (*target)[i];
        if (e.kind != Element::kKnown || e.value < 0) {
          known = false;
        } else if (e.value == 0 && !allow_zero) {
          known = static_cast<int>(i) < info->rank();
          if (known) target_per_row *= info->dims[i];
        } else {
          target_per_row *= e.value;
        }
      }
      if (known && per_row == target_per_row) return Rows(0);
    }
  }
  return Mixed(absl::StrCat(label, " reshapes the row axis"));
}

State Analyzer::Expand(const onnx::NodeProto& node, const std::vector<State>& in,
                       const std::string& label) const {
  auto shape = ElementsOf(node.input(1), in[1]);
  const int rank = Rank(node.input(0));
  int out_rank = Rank(node.output(0));
  if (out_rank < 0 && shape.has_value()) out_rank = std::max(rank, static_cast<int>(shape->size()));
  if (!shape.has_value() || rank < 0 || out_rank < 0) {
    return Mixed(absl::StrCat(label, " expands to a shape it cannot follow"));
  }
  const int offset = out_rank - static_cast<int>(shape->size());
  auto element_at = [&](int axis) -> std::optional<Element> {
    const int index = axis - offset;
    if (index < 0 || index >= static_cast<int>(shape->size())) return std::nullopt;
    return (*shape)[index];
  };
  if (in[0].kind == State::kRows) {
    if (rank > out_rank) return Mixed(absl::StrCat(label, " expands to a lower rank"));
    const int axis = in[0].axis + out_rank - rank;
    for (int i = 0; i < static_cast<int>(shape->size()); ++i) {
      if ((*shape)[i].kind == Element::kRows && i + offset != axis) {
        return Mixed(absl::StrCat(label, " expands rows along another axis"));
      }
    }
    const auto at = element_at(axis);
    if (at.has_value() && at->kind != Element::kRows &&
        !(at->kind == Element::kKnown && at->value == 1)) {
      return Mixed(absl::StrCat(label, " expands the row axis"));
    }
    return Rows(axis, out_rank);
  }
  // A constant expanded to the row count: every row is the same constant.
  int axis = -1;
  for (int i = 0; i < static_cast<int>(shape->size()); ++i) {
    if ((*shape)[i].kind != Element::kRows) continue;
    if (axis >= 0) return Mixed(absl::StrCat(label, " puts the row count on two axes"));
    axis = i + offset;
  }
  const ValueInfo* info = Info(node.input(0));
  const int position = axis - (out_rank - rank);
  if (axis < 0 || info == nullptr || !info->rank_known || position >= info->rank() ||
      (position >= 0 && info->dims[position] != 1)) {
    return Mixed(absl::StrCat(label, " expands a value of unknown shape to the rows"));
  }
  return Rows(axis, out_rank);
}

Analyzer::SliceBounds Analyzer::SliceBoundsOf(const onnx::NodeProto& node) const {
  SliceBounds bounds;
  if (opset_ < 10) {
    bounds.starts = IntsAttribute(node, "starts");
    bounds.ends = IntsAttribute(node, "ends");
    bounds.axes = IntsAttribute(node, "axes");
    return bounds;
  }
  if (node.input_size() >= 2) bounds.starts = Ints(node.input(1));
  if (node.input_size() >= 3) bounds.ends = Ints(node.input(2));
  bounds.axes_given = node.input_size() >= 4 && !node.input(3).empty();
  if (bounds.axes_given) bounds.axes = Ints(node.input(3));
  if (node.input_size() >= 5 && !node.input(4).empty()) bounds.steps = Ints(node.input(4));
  return bounds;
}

State Analyzer::Slice(const onnx::NodeProto& node, const std::vector<State>& in,
                      const std::string& label) const {
  const State& data = in[0];
  const int rank = Rank(node.input(0));
  if (data.kind != State::kRows || rank < 0) {
    return Mixed(absl::StrCat(label, " slices with row-dependent bounds"));
  }
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].kind != State::kSame) {
      return Mixed(absl::StrCat(label, " slices with row-dependent bounds"));
    }
  }
  auto [starts, ends, axes, steps, axes_given] = SliceBoundsOf(node);
  if (axes_given && !axes.has_value()) {
    return Mixed(absl::StrCat(label, " slices non-constant axes"));
  }
  const size_t count = starts.has_value() ? starts->size() : ends.has_value() ? ends->size() : 0;
  if (!axes.has_value()) {
    if (count == 0) return Mixed(absl::StrCat(label, " slices non-constant axes"));
    axes.emplace();
    for (size_t i = 0; i < count; ++i) axes->push_back(static_cast<int64_t>(i));
  }
  for (size_t i = 0; i < axes->size(); ++i) {
    if (Normalize((*axes)[i], rank) != data.axis) continue;
    // Slicing the row axis is allowed only when it keeps every row: [0, end) by 1.
    const bool whole = starts.has_value() && ends.has_value() && i < starts->size() &&
                       i < ends->size() && (*starts)[i] == 0 && (*ends)[i] >= int64_t{1} << 31 &&
                       (!steps.has_value() || (i < steps->size() && (*steps)[i] == 1));
    if (!whole) return Mixed(absl::StrCat(label, " slices the row axis"));
  }
  return data;
}

State Analyzer::Resize(const onnx::NodeProto& node, const std::vector<State>& in,
                       const std::string& label) const {
  const State& data = in[0];
  const int rank = Rank(node.input(0));
  if (data.kind != State::kRows || rank < 0 || FindAttribute(node, "axes") != nullptr) {
    return Mixed(absl::StrCat(label, " resizes rows it cannot follow"));
  }
  // Scales are input 1 of Upsample and Resize-10, input 2 from Resize-11; sizes input 3.
  const int scales_index = node.op_type() == "Upsample" || opset_ < 11 ? 1 : 2;
  bool keeps_rows = false;
  if (node.input_size() > scales_index && !node.input(scales_index).empty()) {
    auto scales = Floats(node.input(scales_index));
    if (scales.has_value() && static_cast<int>(scales->size()) == rank) {
      keeps_rows = (*scales)[data.axis] == 1.0f;
    } else if (!scales.has_value() || !scales->empty()) {
      return Mixed(absl::StrCat(label, " resizes by scales it cannot follow"));
    }
  }
  if (node.input_size() > 3 && !node.input(3).empty()) {
    auto sizes = ElementsOf(node.input(3), in[3]);
    if (!sizes.has_value() || static_cast<int>(sizes->size()) != rank ||
        (*sizes)[data.axis].kind != Element::kRows) {
      return Mixed(absl::StrCat(label, " resizes the row axis"));
    }
    keeps_rows = true;
  }
  for (size_t i = 1; i < in.size(); ++i) {
    if (i != 3 && in[i].kind != State::kSame) {
      return Mixed(absl::StrCat(label, " resizes with row-dependent parameters"));
    }
  }
  if (!keeps_rows) return Mixed(absl::StrCat(label, " resizes the row axis"));
  return data;
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

}  // namespace

RowIndependence AnalyzeRowIndependence(
    const onnx::GraphProto& graph, const std::vector<int>& order, int opset,
    const std::function<const ValueInfo*(const std::string&)>& info) {
  return Analyzer(opset, info).Run(graph, order);
}

}  // namespace cloister::runtime
