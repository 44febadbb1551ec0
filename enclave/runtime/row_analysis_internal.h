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

}  // namespace cloister::runtime::row_analysis_internal
