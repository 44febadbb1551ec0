// Tensor-manipulation CPU kernels that rearrange or repeat elements: Transpose, Expand, Tile
// and Pad.
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/broadcast.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/parallel.h"

namespace cloister::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// Transpose.

template <typename T>
void TransposeCopy(KernelContext& context, const T* in, const std::vector<int64_t>& in_shape,
                   const std::vector<int64_t>& perm, T* out) {
  const size_t rank = perm.size();
  std::vector<int64_t> in_strides(rank, 1);
  for (size_t i = rank; i-- > 1;) in_strides[i - 1] = in_strides[i] * in_shape[i];
  std::vector<int64_t> out_shape(rank), strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    out_shape[i] = in_shape[perm[i]];
    strides[i] = in_strides[perm[i]];
  }
  int64_t total = 1;
  for (int64_t d : out_shape) total *= d;
  if (total == 0) return;
  if (rank == 0) {
    out[0] = in[0];
    return;
  }
  const int64_t inner = out_shape[rank - 1];
  const int64_t inner_stride = strides[rank - 1];
  // Output rows (runs of `inner` elements) are independent: ranges of them go to the workers.
  ForRanges(context, total / inner, inner, [&](int64_t first, int64_t last) {
    // The input offset and output index of row `first`.
    std::vector<int64_t> index(rank, 0);
    int64_t offset = 0, rest = first;
    for (size_t axis = rank - 1; axis-- > 0;) {
      index[axis] = rest % out_shape[axis];
      rest /= out_shape[axis];
      offset += index[axis] * strides[axis];
    }
    for (int64_t row = first; row < last; ++row) {
      T* dst = out + row * inner;
      const T* src = in + offset;
      if (inner_stride == 1) {
        std::memcpy(dst, src, sizeof(T) * inner);
      } else {
        for (int64_t i = 0; i < inner; ++i) dst[i] = src[i * inner_stride];
      }
      for (size_t axis = rank - 1; axis-- > 0;) {
        ++index[axis];
        offset += strides[axis];
        if (index[axis] < out_shape[axis]) break;
        offset -= strides[axis] * out_shape[axis];
        index[axis] = 0;
      }
    }
  });
}

class TransposeKernel : public Kernel {
 public:
  explicit TransposeKernel(std::vector<int64_t> perm) : perm_(std::move(perm)) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> perm = perm_;
    if (perm.empty()) {
      for (int i = x.rank(); i-- > 0;) perm.push_back(i);
    }
    if (static_cast<int>(perm.size()) != x.rank()) {
      return absl::InvalidArgumentError("perm does not match the input rank");
    }
    std::vector<int64_t> shape(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) shape[i] = x.dim(static_cast<int>(perm[i]));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      TransposeCopy<T>(context, static_cast<const T*>(x.raw_data()), x.shape(), perm,
                       static_cast<T*>(y->raw_data()));
    });
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> perm_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeTranspose(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, context.Ints("perm", std::vector<int64_t>{}));
  const ValueInfo& x = context.input(0);
  if (!perm.empty()) {
    std::vector<bool> seen(perm.size(), false);
    for (int64_t p : perm) {
      if (p < 0 || p >= static_cast<int64_t>(perm.size()) || seen[p]) {
        return absl::InvalidArgumentError("perm is not a permutation");
      }
      seen[p] = true;
    }
  }
  if (x.rank_known) {
    if (!perm.empty() && static_cast<int>(perm.size()) != x.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("perm has ", perm.size(), " entries for rank ", x.rank()));
    }
    std::vector<int64_t> dims(x.rank());
    for (int i = 0; i < x.rank(); ++i) {
      dims[i] = x.dims[perm.empty() ? x.rank() - 1 - i : perm[i]];
    }
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<TransposeKernel>(std::move(perm));
}

// ---------------------------------------------------------------------------------------------
// Expand and Tile.

class ExpandKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                     BroadcastShapes(x.shape(), ToInt64Vector(context.input(1))));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    auto layout = MakeBroadcastLayout<1>(shape, {&x.shape()});
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      ForEachBroadcastRow(layout, [&](int64_t o, int64_t n, const std::array<int64_t, 1>& off,
                                      const std::array<int64_t, 1>& inner) {
        if (inner[0] == 0) {
          std::fill(out + o, out + o + n, in[off[0]]);
        } else {
          std::memcpy(out + o, in + off[0], sizeof(T) * n);
        }
      });
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeExpand(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  const ValueInfo& x = context.input(0);
  const Tensor* shape = context.constant_input(1);
  if (x.rank_known && shape != nullptr) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastShapes(x.dims, ToInt64Vector(*shape)));
    RETURN_IF_ERROR(CheckKnownShapeSize(x.dtype, dims));
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<ExpandKernel>();
}

class TileKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> repeats = ToInt64Vector(context.input(1));
    if (static_cast<int>(repeats.size()) != x.rank()) {
      return absl::InvalidArgumentError("repeats must have one entry per input dimension");
    }
    std::vector<int64_t> shape(x.rank());
    for (int i = 0; i < x.rank(); ++i) {
      if (repeats[i] < 0) return absl::InvalidArgumentError("repeats must not be negative");
      if (repeats[i] != 0 && x.dim(i) > std::numeric_limits<int64_t>::max() / repeats[i]) {
        return absl::InvalidArgumentError("repeats overflow the output shape");
      }
      shape[i] = x.dim(i) * repeats[i];
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    const int rank = x.rank();
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      std::vector<int64_t> in_strides(rank, 1);
      for (int i = rank - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * x.dim(i);
      std::vector<int64_t> position(rank, 0);
      for (int64_t o = 0; o < y->count(); ++o) {
        int64_t offset = 0;
        for (int d = 0; d < rank; ++d) offset += (position[d] % x.dim(d)) * in_strides[d];
        out[o] = in[offset];
        for (int d = rank; d-- > 0;) {
          if (++position[d] < shape[d]) break;
          position[d] = 0;
        }
      }
    });
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeTile(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    std::vector<int64_t> dims(x.rank(), -1);
    if (const Tensor* repeats = context.constant_input(1)) {
      std::vector<int64_t> r = ToInt64Vector(*repeats);
      if (static_cast<int>(r.size()) != x.rank()) {
        return absl::InvalidArgumentError("repeats must have one entry per input dimension");
      }
      for (int i = 0; i < x.rank(); ++i) {
        if (r[i] < 0) return absl::InvalidArgumentError("repeats must not be negative");
        if (x.dims[i] < 0) continue;
        if (r[i] != 0 && x.dims[i] > std::numeric_limits<int64_t>::max() / r[i]) {
          return absl::InvalidArgumentError("repeats overflow the output shape");
        }
        dims[i] = x.dims[i] * r[i];
      }
      RETURN_IF_ERROR(CheckKnownShapeSize(x.dtype, dims));
    }
    context.SetOutput(0, x.dtype, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<TileKernel>();
}

// ---------------------------------------------------------------------------------------------
// Pad.

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

class PadKernel : public Kernel {
 public:
  PadKernel(PadMode mode, std::vector<int64_t> pads, float value, bool from_inputs)
      : mode_(mode), pads_(std::move(pads)), value_(value), from_inputs_(from_inputs) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const int rank = x.rank();
    ASSIGN_OR_RETURN(std::vector<int64_t> pads, Pads(context, rank));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, PaddedShape(x, pads));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    if (y->count() == 0) return absl::OkStatus();
    absl::Status status;
    NumericOrBoolTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T fill = static_cast<T>(value_);
      if (from_inputs_ && context.has_input(2)) {
        if (context.input(2).dtype() != x.dtype() || context.input(2).count() != 1) {
          status = absl::InvalidArgumentError("constant_value must be one value of the input type");
          return;
        }
        fill = *context.input(2).template data<T>();
      }
      PadRows<T>(x, pads, shape, fill, y);
    });
    return status;
  }

 private:
  // The pads of this run: the attribute, or input 1 spread over the axes of input 3.
  absl::StatusOr<std::vector<int64_t>> Pads(KernelContext& context, int rank) const {
    std::vector<int64_t> pads = pads_;
    if (from_inputs_) {
      std::vector<int64_t> given = ToInt64Vector(context.input(1));
      if (context.has_input(3)) {
        std::vector<int64_t> axes = ToInt64Vector(context.input(3));
        if (given.size() != 2 * axes.size()) {
          return absl::InvalidArgumentError("pads must have two entries per axis");
        }
        pads.assign(2 * rank, 0);
        for (size_t i = 0; i < axes.size(); ++i) {
          ASSIGN_OR_RETURN(int a, NormalizeAxis(axes[i], rank));
          pads[a] = given[i];
          pads[a + rank] = given[i + axes.size()];
        }
      } else {
        pads = std::move(given);
      }
    }
    if (static_cast<int>(pads.size()) != 2 * rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("pads has ", pads.size(), " entries for rank ", rank));
    }
    return pads;
  }

  // The output shape, after checking that the pads suit the mode and the input.
  absl::StatusOr<std::vector<int64_t>> PaddedShape(const Tensor& x,
                                                   const std::vector<int64_t>& pads) const {
    const int rank = x.rank();
    std::vector<int64_t> shape(rank);
    for (int i = 0; i < rank; ++i) {
      shape[i] = x.dim(i) + pads[i] + pads[i + rank];
      if (shape[i] < 0) return absl::InvalidArgumentError("pads remove more than the input");
      if (mode_ != PadMode::kConstant && x.dim(i) == 0 && shape[i] > 0) {
        return absl::InvalidArgumentError("cannot pad an empty axis except with a constant");
      }
      if (mode_ == PadMode::kReflect && (pads[i] >= x.dim(i) || pads[i + rank] >= x.dim(i)) &&
          (pads[i] > 0 || pads[i + rank] > 0)) {
        return absl::InvalidArgumentError("reflect pads must be smaller than the axis");
      }
    }
    return shape;
  }

  // Fills the non-empty y of `shape` row by row from x, with `fill` in constant padding.
  template <typename T>
  void PadRows(const Tensor& x, const std::vector<int64_t>& pads, const std::vector<int64_t>& shape,
               T fill, Tensor* y) const {
    const int rank = x.rank();
    const T* in = x.data<T>();
    T* out = y->data<T>();
    std::vector<int64_t> in_strides(rank, 1);
    for (int i = rank - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * x.dim(i);
    std::vector<int64_t> position(rank, 0);
    const int64_t inner = rank == 0 ? 1 : shape[rank - 1];
    for (int64_t o = 0; o < y->count(); o += inner) {
      // Source offset of the row, or -1 when the row lies in constant padding.
      int64_t offset = 0;
      bool outside = false;
      for (int d = 0; d + 1 < rank; ++d) {
        int64_t src = position[d] - pads[d];
        if (!MapIndex(src, x.dim(d))) outside = true;
        offset += src * in_strides[d];
      }
      T* dst = out + o;
      if (rank == 0) {
        dst[0] = in[0];
        break;
      }
      const int64_t last = x.dim(rank - 1);
      const int64_t before = pads[rank - 1];
      for (int64_t i = 0; i < inner; ++i) {
        int64_t src = i - before;
        if (outside || !MapIndex(src, last)) {
          dst[i] = fill;
        } else {
          dst[i] = in[offset + src];
        }
      }
      for (int d = rank - 1; d-- > 0;) {
        if (++position[d] < shape[d]) break;
        position[d] = 0;
      }
    }
  }

  // Maps a source index outside [0, size) according to the mode; false means constant fill.
  bool MapIndex(int64_t& index, int64_t size) const {
    if (index >= 0 && index < size) return true;
    switch (mode_) {
      case PadMode::kConstant:
        return false;
      case PadMode::kEdge:
        index = index < 0 ? 0 : size - 1;
        return true;
      case PadMode::kReflect:
        if (size == 1) {
          index = 0;
          return true;
        }
        while (index < 0 || index >= size) index = index < 0 ? -index : 2 * (size - 1) - index;
        return true;
      case PadMode::kWrap:
        index = ((index % size) + size) % size;
        return true;
    }
    return false;
  }

  PadMode mode_;
  std::vector<int64_t> pads_;
  float value_;
  bool from_inputs_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakePad(NodeContext& context) {
  const int version = context.since_version();
  RETURN_IF_ERROR(RequireType(context, 0, IsNumericOrBool));
  ASSIGN_OR_RETURN(std::string mode_name, context.String("mode", "constant"));
  PadMode mode;
  if (mode_name == "constant") {
    mode = PadMode::kConstant;
  } else if (mode_name == "reflect") {
    mode = PadMode::kReflect;
  } else if (mode_name == "edge") {
    mode = PadMode::kEdge;
  } else if (mode_name == "wrap" && version >= 19) {
    mode = PadMode::kWrap;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("pad mode '", mode_name, "' is not supported"));
  }
  std::vector<int64_t> pads;
  float value = 0.0f;
  bool from_inputs = version >= 11;
  if (!from_inputs) {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    ASSIGN_OR_RETURN(pads, context.Ints(version < 2 ? "paddings" : "pads"));
    ASSIGN_OR_RETURN(value, context.Float("value", 0.0f));
  } else {
    RETURN_IF_ERROR(context.ExpectInputs(2, version >= 18 ? 4 : 3));
    RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
    RETURN_IF_ERROR(RequireSameType(context, 0, 2));
    RETURN_IF_ERROR(RequireType(context, 3, IsIndexType));
  }
  const ValueInfo& x = context.input(0);
  const Tensor* constant_pads = from_inputs ? context.constant_input(1) : nullptr;
  if (x.rank_known && (!from_inputs || (constant_pads && !context.has_input(3)))) {
    std::vector<int64_t> p = from_inputs ? ToInt64Vector(*constant_pads) : pads;
    if (static_cast<int>(p.size()) != 2 * x.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pads has ", p.size(), " entries for rank ", x.rank()));
    }
    std::vector<int64_t> dims(x.rank());
    for (int i = 0; i < x.rank(); ++i) {
      dims[i] = x.dims[i] < 0 ? -1 : x.dims[i] + p[i] + p[i + x.rank()];
    }
    context.SetOutput(0, x.dtype, dims);
  } else if (x.rank_known) {
    context.SetOutput(0, x.dtype, std::vector<int64_t>(x.rank(), -1));
  } else {
    context.SetOutputUnranked(0, x.dtype);
  }
  return MakeKernel<PadKernel>(mode, std::move(pads), value, from_inputs);
}

}  // namespace

void RegisterLayoutKernels(KernelRegistry& registry) {
  registry.Register("Transpose", {1, 13}, MakeTranspose);
  registry.Register("Expand", {8, 13}, MakeExpand);
  registry.Register("Tile", {6, 13}, MakeTile);
  registry.Register("Pad", {2, 11, 13, 18}, MakePad);
}

}  // namespace cloister::runtime
