// Internals of the row-independence analysis (row_analysis.h), shared by its two source files:
// row_analysis.cc (the per-operator rules and the walk over the graph) and row_analysis_rules.cc
// (the rules for shape arithmetic, broadcasting, MatMul, Reshape, Expand, Slice and Resize).
// Threading: an Analyzer is used by one thread for one call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "enclave/runtime/kernel.h"
#include "enclave/runtime/row_analysis.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime::row_analysis_internal {

// One element of a shape vector.
struct Element {
  enum Kind { kKnown, kSame, kRows };
  Kind kind = kSame;
  int64_t value = 0;  // kKnown only
};

inline Element Known(int64_t value) { return {Element::kKnown, value}; }

// What coalescing does to one value (see row_analysis.h).
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

inline State Same() { return State{State::kSame}; }
// Rows on `axis`; `rank` when inference left the value's rank open and the rule knows it.
inline State Rows(int axis, int rank = -1) {
  State state{State::kRows, axis};
  state.rank = rank;
  return state;
}
inline State Mixed(std::string why) {
  State state;
  state.why = std::move(why);
  return state;
}
// A shape vector; "same" (keeping its elements) when none of them is the row count.
inline State ShapeOf(std::vector<Element> elements, bool scalar) {
  const bool has_rows = std::any_of(elements.begin(), elements.end(),
                                    [](const Element& e) { return e.kind == Element::kRows; });
  State state{has_rows ? State::kShape : State::kSame};
  state.elements = std::move(elements);
  state.has_elements = true;
  state.scalar = scalar;
  return state;
}

// Whether the value is a vector of known elements (a shape vector, with or without the rows).
inline bool IsVector(const State& state) { return state.has_elements; }

inline int Normalize(int64_t axis, int rank) {
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

inline const onnx::AttributeProto* FindAttribute(const onnx::NodeProto& node,
                                                 std::string_view name) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.name() == name) return &attribute;
  }
  return nullptr;
}
inline int64_t IntAttribute(const onnx::NodeProto& node, std::string_view name, int64_t fallback) {
  const onnx::AttributeProto* attribute = FindAttribute(node, name);
  return attribute == nullptr ? fallback : attribute->i();
}
inline std::optional<std::vector<int64_t>> IntsAttribute(const onnx::NodeProto& node,
                                                         std::string_view name) {
  const onnx::AttributeProto* attribute = FindAttribute(node, name);
  if (attribute == nullptr) return std::nullopt;
  return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
}

// "node 'name' (Op)", naming a node in reasons.
std::string Label(const onnx::NodeProto& node);

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

  // A node with rows among its inputs, as the per-operator rules below see it.
  struct RowNode {
    const onnx::NodeProto& node;
    const std::vector<State>& in;
    const std::string& label;
    size_t outputs;
    int rank;  // the first input's, -1 when unknown
    const State& first;

    // `state` for every output.
    std::vector<State> All(State state) const {
      return std::vector<State>(outputs, std::move(state));
    }
    // Every output mixed, the reason being the label followed by `what`.
    std::vector<State> AllMixed(const char* what) const;
    // Whether the inputs from `from` on are all "same".
    bool OthersSame(size_t from) const;
  };
  // The per-operator rules for a node with rows, one family each; nothing when the operator is
  // not of the family.
  // Elementwise operators: rows pass through when every other input is the same for all rows.
  std::optional<std::vector<State>> ApplyElementwise(const RowNode& row_node) const;
  // Convolutions, pooling and the like: only rows on axis 0, each item computed alone.
  std::optional<std::vector<State>> ApplyPerItem(const RowNode& row_node) const;
  // Normalizations: rows mix when the normalized axes include the row axis.
  std::optional<std::vector<State>> ApplyNormalization(const RowNode& row_node) const;
  // Reductions, ArgMax/ArgMin, TopK and CumSum: rows mix when they work along the row axis.
  std::optional<std::vector<State>> ApplyReduction(const RowNode& row_node) const;
  // Transpose, Reshape, Flatten, Squeeze, Unsqueeze and OneHot: where the row axis moves.
  std::optional<std::vector<State>> ApplyAxisChange(const RowNode& row_node) const;
  std::vector<State> ApplySqueeze(const RowNode& row_node) const;  // Squeeze and Unsqueeze
  // Concat, Split, Slice, Expand, Tile, Pad and Resize: whether the row axis is kept whole.
  std::optional<std::vector<State>> ApplyCopy(const RowNode& row_node) const;
  std::vector<State> ApplyPad(const RowNode& row_node) const;
  // Gather, GatherElements and GatherND: whether the indices pick within each row.
  std::optional<std::vector<State>> ApplyGather(const RowNode& row_node) const;
  // Shape: the row count as an element of a shape vector.
  std::optional<std::vector<State>> ApplyShape(const RowNode& row_node) const;
  // MatMul, Gemm and Trilu: whether the rows are contracted or masked together.
  std::optional<std::vector<State>> ApplyMatrix(const RowNode& row_node) const;
  // LSTM: each sequence of the batch runs alone.
  std::optional<std::vector<State>> ApplyRecurrent(const RowNode& row_node) const;

  // The rules for nodes whose inputs hold no rows, only shape vectors and constants
  // (row_analysis_rules.cc).
  std::vector<State> ApplyShapeArithmetic(const onnx::NodeProto& node,
                                          const std::vector<State>& in) const;
  // Steps of ApplyShapeArithmetic for one operator each; nothing when the result would use the
  // row count in a way the analysis cannot follow.
  std::optional<State> GatherShapeElements(const onnx::NodeProto& node,
                                           const std::vector<State>& in) const;
  std::optional<State> ConcatShapeElements(const onnx::NodeProto& node,
                                           const std::vector<State>& in) const;
  std::optional<State> SqueezeShapeVector(const onnx::NodeProto& node,
                                          const std::vector<State>& in) const;
  std::optional<State> SliceShapeVector(const onnx::NodeProto& node,
                                        const std::vector<State>& in) const;
  std::optional<State> CombineShapeElements(const onnx::NodeProto& node,
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

}  // namespace cloister::runtime::row_analysis_internal
