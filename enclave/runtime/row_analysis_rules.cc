// The row-independence rules for shape arithmetic, broadcasting operators, MatMul, Reshape,
// Expand, Slice and Resize (see row_analysis.h for what the states mean).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "enclave/runtime/row_analysis_internal.h"

namespace cloister::runtime::row_analysis_internal {

namespace {

// A ConstantOfShape of a shape vector: the rows on the axis the shape gives the row count;
// nothing when two axes do.
std::optional<State> ConstantOfShapeRows(const State& shape) {
  int position = -1;
  for (size_t i = 0; i < shape.elements.size(); ++i) {
    if (shape.elements[i].kind != Element::kRows) continue;
    if (position >= 0) return std::nullopt;
    position = static_cast<int>(i);
  }
  return Rows(position, static_cast<int>(shape.elements.size()));
}

// An arithmetic operator on two known elements; nothing for a division by zero.
std::optional<Element> CombineKnown(const std::string& op, int64_t x, int64_t y) {
  if (op == "Add") return Known(x + y);
  if (op == "Sub") return Known(x - y);
  if (op == "Mul") return Known(x * y);
  if (op == "Max") return Known(std::max(x, y));
  if (op == "Min") return Known(std::min(x, y));
  if (y == 0) return std::nullopt;  // Div
  return Known(x / y);
}

}  // namespace

std::vector<State> Analyzer::ApplyShapeArithmetic(const onnx::NodeProto& node,
                                                  const std::vector<State>& in) const {
  const std::string label = Label(node);
  const size_t outputs = static_cast<size_t>(node.output_size());
  const std::string& op = node.op_type();
  const State& first = in[0];
  if (op == "Expand") return std::vector<State>(outputs, Expand(node, in, label));
  std::optional<State> state;
  if (op == "Identity" || op == "Cast") {
    if (IsVector(first) &&
        !(op == "Cast" && IntAttribute(node, "to", 0) == onnx::TensorProto::BOOL)) {
      state = first;
    }
  } else if (op == "ConstantOfShape") {
    state = ConstantOfShapeRows(first);
  } else if (op == "Gather") {
    state = GatherShapeElements(node, in);
  } else if (op == "Concat") {
    state = ConcatShapeElements(node, in);
  } else if (op == "Unsqueeze" || op == "Squeeze") {
    state = SqueezeShapeVector(node, in);
  } else if (op == "Slice") {
    state = SliceShapeVector(node, in);
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Max" ||
             op == "Min") {
    state = CombineShapeElements(node, in);
  }
  if (!state.has_value()) state = Mixed(absl::StrCat(label, " computes with the row count"));
  return std::vector<State>(outputs, *std::move(state));
}

std::optional<State> Analyzer::GatherShapeElements(const onnx::NodeProto& node,
                                                   const std::vector<State>& in) const {
  const State& first = in[0];
  auto indices = Ints(node.input(1));
  if (!IsVector(first) || first.scalar || !indices.has_value()) return std::nullopt;
  const int64_t size = static_cast<int64_t>(first.elements.size());
  std::vector<Element> picked;
  for (int64_t index : *indices) {
    if (index < 0) index += size;
    if (index < 0 || index >= size) return std::nullopt;
    picked.push_back(first.elements[index]);
  }
  return ShapeOf(std::move(picked), Rank(node.input(1)) == 0);
}

std::optional<State> Analyzer::ConcatShapeElements(const onnx::NodeProto& node,
                                                   const std::vector<State>& in) const {
  std::vector<Element> joined;
  for (int i = 0; i < node.input_size(); ++i) {
    auto elements = ElementsOf(node.input(i), in[i]);
    if (!elements.has_value() || (IsVector(in[i]) && in[i].scalar)) return std::nullopt;
    joined.insert(joined.end(), elements->begin(), elements->end());
  }
  return ShapeOf(std::move(joined), false);
}

std::optional<State> Analyzer::SqueezeShapeVector(const onnx::NodeProto& node,
                                                  const std::vector<State>& in) const {
  const State& first = in[0];
  const std::optional<std::vector<int64_t>> axes = IntsParameter(node, 1, "axes");
  if (!IsVector(first)) return std::nullopt;
  if (node.op_type() == "Unsqueeze") {
    if (!first.scalar || axes != std::vector<int64_t>{0}) return std::nullopt;
    return ShapeOf(first.elements, false);
  }
  if (first.scalar || first.elements.size() != 1 ||
      (axes.has_value() && *axes != std::vector<int64_t>{0} && *axes != std::vector<int64_t>{-1})) {
    return std::nullopt;
  }
  return ShapeOf(first.elements, true);
}

std::optional<State> Analyzer::SliceShapeVector(const onnx::NodeProto& node,
                                                const std::vector<State>& in) const {
  const State& first = in[0];
  if (!IsVector(first) || first.scalar) return std::nullopt;
  const auto [starts, ends, axes, steps, axes_given] = SliceBoundsOf(node);
  if (!starts.has_value() || !ends.has_value() || starts->size() != 1 || ends->size() != 1 ||
      (steps.has_value() && *steps != std::vector<int64_t>{1})) {
    return std::nullopt;
  }
  const int64_t size = static_cast<int64_t>(first.elements.size());
  auto clamp = [&](int64_t index) {
    if (index < 0) index += size;
    return std::clamp<int64_t>(index, 0, size);
  };
  const int64_t begin = clamp((*starts)[0]);
  const int64_t end = std::max(begin, clamp((*ends)[0]));
  return ShapeOf(std::vector<Element>(first.elements.begin() + begin, first.elements.begin() + end),
                 false);
}

std::optional<State> Analyzer::CombineShapeElements(const onnx::NodeProto& node,
                                                    const std::vector<State>& in) const {
  const std::string& op = node.op_type();
  if (in.size() != 2) return std::nullopt;
  auto a = ElementsOf(node.input(0), in[0]);
  auto b = ElementsOf(node.input(1), in[1]);
  if (!a.has_value() || !b.has_value()) return std::nullopt;
  if (a->size() != b->size() && a->size() != 1 && b->size() != 1) return std::nullopt;
  const size_t size = std::max(a->size(), b->size());
  std::vector<Element> combined;
  for (size_t i = 0; i < size; ++i) {
    const Element x = (*a)[a->size() == 1 ? 0 : i];
    const Element y = (*b)[b->size() == 1 ? 0 : i];
    if (x.kind == Element::kKnown && y.kind == Element::kKnown) {
      const std::optional<Element> known = CombineKnown(op, x.value, y.value);
      if (!known.has_value()) return std::nullopt;
      combined.push_back(*known);
      continue;
    }
    // The row count passes only through arithmetic that leaves it as it is.
    const bool identity =
        y.kind == Element::kKnown && (((op == "Add" || op == "Sub") && y.value == 0) ||
                                      ((op == "Mul" || op == "Div") && y.value == 1));
    if (x.kind == Element::kRows && identity) {
      combined.push_back(x);
    } else if (x.kind == Element::kRows || y.kind == Element::kRows) {
      return std::nullopt;
    } else {
      combined.push_back({Element::kSame});
    }
  }
  const bool scalar = (IsVector(in[0]) ? in[0].scalar : Rank(node.input(0)) == 0) &&
                      (IsVector(in[1]) ? in[1].scalar : Rank(node.input(1)) == 0);
  return ShapeOf(std::move(combined), scalar);
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

}  // namespace cloister::runtime::row_analysis_internal
