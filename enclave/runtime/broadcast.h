// Numpy-style broadcasting iteration for the elementwise kernels. The output is walked in
// row-major order as a set of rows; within a row each input advances by 0 (broadcast) or 1, so
// the inner loops are tight and free of index arithmetic. Adjacent dimensions that stay
// contiguous for every input are merged first, so same-shape operands form one long row.
// Threading: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace cloister::runtime {

template <size_t N>
struct BroadcastLayout {
  std::vector<int64_t> dims;                    // merged output dims
  std::array<std::vector<int64_t>, N> strides;  // element strides per input, per merged dim
};

// `input_shapes` must broadcast to `output_shape` (checked by the caller).
template <size_t N>
BroadcastLayout<N> MakeBroadcastLayout(
    const std::vector<int64_t>& output_shape,
    const std::array<const std::vector<int64_t>*, N>& input_shapes) {
  const size_t rank = output_shape.size();
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, N> strides;
  std::array<std::vector<int64_t>, N> full;
  for (size_t k = 0; k < N; ++k) {
    const std::vector<int64_t>& shape = *input_shapes[k];
    full[k].assign(rank, 0);
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      const size_t out_axis = rank - shape.size() + i;
      full[k][out_axis] = shape[i] == 1 ? 0 : stride;
      stride *= shape[i];
    }
  }
  for (size_t axis = 0; axis < rank; ++axis) {
    if (output_shape[axis] == 1) continue;
    if (!dims.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) {
        if (strides[k].back() != full[k][axis] * output_shape[axis]) mergeable = false;
      }
      if (mergeable) {
        dims.back() *= output_shape[axis];
        for (size_t k = 0; k < N; ++k) strides[k].back() = full[k][axis];
        continue;
      }
    }
    dims.push_back(output_shape[axis]);
    for (size_t k = 0; k < N; ++k) strides[k].push_back(full[k][axis]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < N; ++k) strides[k].push_back(0);
  }
  return BroadcastLayout<N>{std::move(dims), std::move(strides)};
}

// The innermost rows of the output: the product of all dims but the last.
template <size_t N>
int64_t BroadcastRows(const BroadcastLayout<N>& layout) {
  int64_t rows = 1;
  for (size_t axis = 0; axis + 1 < layout.dims.size(); ++axis) rows *= layout.dims[axis];
  return rows;
}

// Calls row(out_offset, length, offsets, inner_strides) for innermost rows [first, last) of the
// output, in order (so that ranges of rows can go to different threads).
template <size_t N, typename Row>
void ForEachBroadcastRowIn(const BroadcastLayout<N>& layout, int64_t first, int64_t last,
                           Row&& row) {
  const size_t rank = layout.dims.size();
  const int64_t length = layout.dims[rank - 1];
  for (int64_t d : layout.dims) {
    if (d == 0) return;
  }
  if (first >= last) return;
  std::array<int64_t, N> inner;
  for (size_t k = 0; k < N; ++k) inner[k] = layout.strides[k][rank - 1];
  // The outer index of row `first` (all axes but the last, the last of them fastest).
  std::vector<int64_t> index(rank, 0);
  std::array<int64_t, N> offsets{};
  int64_t rest = first;
  for (size_t axis = rank - 1; axis-- > 0;) {
    index[axis] = rest % layout.dims[axis];
    rest /= layout.dims[axis];
    for (size_t k = 0; k < N; ++k) offsets[k] += index[axis] * layout.strides[k][axis];
  }
  int64_t out_offset = first * length;
  for (int64_t r = first; r < last; ++r) {
    row(out_offset, length, offsets, inner);
    out_offset += length;
    // Advance the outer index (all axes but the last).
    size_t axis = rank - 1;
    while (axis-- > 0) {
      ++index[axis];
      for (size_t k = 0; k < N; ++k) offsets[k] += layout.strides[k][axis];
      if (index[axis] < layout.dims[axis]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= layout.strides[k][axis] * layout.dims[axis];
      index[axis] = 0;
    }
  }
}

// Calls row(out_offset, length, offsets, inner_strides) for each innermost row of the output.
template <size_t N, typename Row>
void ForEachBroadcastRow(const BroadcastLayout<N>& layout, Row&& row) {
  ForEachBroadcastRowIn(layout, 0, BroadcastRows(layout), std::forward<Row>(row));
}

}  // namespace cloister::runtime
