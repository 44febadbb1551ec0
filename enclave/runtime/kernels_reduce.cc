// Reduction CPU kernels: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp with axes
// as an attribute (older versions) or an input (ReduceSum-13, the rest from 18), ArgMax/ArgMin
// and CumSum. Float types accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/parallel.h"
#include "enclave/runtime/simd.h"

namespace cloister::runtime {
namespace {

enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

// Which axes are reduced, after normalising `axes` (empty = all unless noop).
absl::StatusOr<std::vector<bool>> ReducedAxes(const std::vector<int64_t>& axes, int rank) {
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t axis : axes) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, rank));
    reduced[a] = true;
  }
  return reduced;
}

std::vector<int64_t> ReducedShape(const std::vector<int64_t>& shape,
                                  const std::vector<bool>& reduced, bool keep_dims) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!reduced[i]) {
      out.push_back(shape[i]);
    } else if (keep_dims) {
      out.push_back(1);
    }
  }
  return out;
}

template <typename T>
using Accumulator = std::conditional_t<std::is_floating_point_v<T>, double,
                                       std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

template <typename A>
A InitialValue(Reduce kind) {
  switch (kind) {
    case Reduce::kMax:
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
    case Reduce::kMin:
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::max();
    case Reduce::kProd:
      return A(1);
    default:
      return A(0);
  }
}

template <typename A>
inline A Accumulate(Reduce kind, A acc, A x) {
  switch (kind) {
    case Reduce::kSum:
    case Reduce::kMean:
    case Reduce::kLogSum:
      return acc + x;
    case Reduce::kMax:
      return x > acc ? x : acc;
    case Reduce::kMin:
      return x < acc ? x : acc;
    case Reduce::kProd:
      return acc * x;
    case Reduce::kL1:
      return acc + (x < A(0) ? A(0) - x : x);
    case Reduce::kL2:
    case Reduce::kSumSquare:
      return acc + x * x;
    case Reduce::kLogSumExp:
      return acc + static_cast<A>(std::exp(static_cast<double>(x)));
  }
  return acc;
}

template <typename A>
inline A Finish(Reduce kind, A acc, int64_t count) {
  switch (kind) {
    case Reduce::kMean:
      return count > 0 ? acc / static_cast<A>(count) : acc;
    case Reduce::kL2:
      return static_cast<A>(std::sqrt(static_cast<double>(acc)));
    case Reduce::kLogSum:
    case Reduce::kLogSumExp:
      return static_cast<A>(std::log(static_cast<double>(acc)));
    default:
      return acc;
  }
}

// Reduces `rows` contiguous rows of `width` floats with Sum, Mean or Max through simd.h.
void ReduceTrailingFloat(Reduce kind, const float* in, int64_t rows, int64_t width, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * width;
    if (kind == Reduce::kMax) {
      out[r] = simd::MaxOf(row, width);
    } else {
      const float sum = simd::Sum(row, width);
      out[r] = kind == Reduce::kMean && width > 0 ? sum / static_cast<float>(width) : sum;
    }
  }
}

// Reduces `rows` contiguous rows of `width` elements each.
template <typename T>
void ReduceTrailing(Reduce kind, const T* in, int64_t rows, int64_t width, T* out) {
  using A = Accumulator<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = in + r * width;
    A acc = InitialValue<A>(kind);
    for (int64_t i = 0; i < width; ++i) acc = Accumulate<A>(kind, acc, static_cast<A>(row[i]));
    out[r] = static_cast<T>(Finish<A>(kind, acc, width));
  }
}

// One block of adjacent reduced axes between kept ones: x is [outer, reduced, inner] and the
// output [outer, inner]. Each output row adds the `reduced` input rows of its block in order
// (the order ReduceGeneral adds them in, so the results are the same), and ranges of outer
// rows go to the run's workers.
template <typename T>
void ReduceMiddle(KernelContext& context, Reduce kind, const T* in, int64_t outer,
                  int64_t reduced, int64_t inner, T* out) {
  using A = Accumulator<T>;
  ForRanges(context, outer, reduced * inner, [&](int64_t first, int64_t last) {
    std::vector<A> acc(inner);
    for (int64_t o = first; o < last; ++o) {
      std::fill(acc.begin(), acc.end(), InitialValue<A>(kind));
      for (int64_t r = 0; r < reduced; ++r) {
        const T* row = in + (o * reduced + r) * inner;
        for (int64_t j = 0; j < inner; ++j) {
          acc[j] = Accumulate<A>(kind, acc[j], static_cast<A>(row[j]));
        }
      }
      for (int64_t j = 0; j < inner; ++j) {
        out[o * inner + j] = static_cast<T>(Finish<A>(kind, acc[j], reduced));
      }
    }
  });
}

// Any set of reduced axes: walks x once, adding into the output position of each element.
template <typename T>
void ReduceGeneral(Reduce kind, const Tensor& x, const std::vector<bool>& reduced,
                   int64_t reduce_count, int64_t out_count, T* out) {
  using A = Accumulator<T>;
  const int rank = x.rank();
  const T* in = x.data<T>();
  std::vector<A> acc(out_count, InitialValue<A>(kind));
  std::vector<int64_t> out_strides(rank, 0);
  int64_t stride = 1;
  for (int i = rank; i-- > 0;) {
    if (!reduced[i]) {
      out_strides[i] = stride;
      stride *= x.dim(i);
    }
  }
  std::vector<int64_t> position(rank, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < x.count(); ++i) {
    acc[o] = Accumulate<A>(kind, acc[o], static_cast<A>(in[i]));
    for (int d = rank; d-- > 0;) {
      ++position[d];
      o += out_strides[d];
      if (position[d] < x.dim(d)) break;
      o -= out_strides[d] * x.dim(d);
      position[d] = 0;
    }
  }
  for (int64_t r = 0; r < out_count; ++r) {
    out[r] = static_cast<T>(Finish<A>(kind, acc[r], reduce_count));
  }
}

class ReduceKernel : public Kernel {
 public:
  ReduceKernel(Reduce kind, std::vector<int64_t> axes, bool axes_from_input, bool keep_dims,
               bool noop_with_empty_axes)
      : kind_(kind),
        axes_(std::move(axes)),
        axes_from_input_(axes_from_input),
        keep_dims_(keep_dims),
        noop_with_empty_axes_(noop_with_empty_axes) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> axes = axes_;
    if (axes_from_input_ && context.has_input(1)) axes = ToInt64Vector(context.input(1));
    if (axes.empty() && noop_with_empty_axes_) {
      context.SetOutput(0, x);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<bool> reduced, ReducedAxes(axes, x.rank()));
    ASSIGN_OR_RETURN(Tensor * y,
                     context.Output(0, x.dtype(), ReducedShape(x.shape(), reduced, keep_dims_)));
    const int rank = x.rank();
    int64_t reduce_count = 1;
    for (int i = 0; i < rank; ++i) {
      if (reduced[i]) reduce_count *= x.dim(i);
    }
    // Fast path: the reduced axes are exactly the trailing ones.
    int first_reduced = rank;
    while (first_reduced > 0 && reduced[first_reduced - 1]) --first_reduced;
    bool trailing = true;
    for (int i = 0; i < first_reduced; ++i) trailing = trailing && !reduced[i];
    const Reduce kind = kind_;
    NumericTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = y->data<T>();
      if constexpr (std::is_same_v<T, float>) {
        if (trailing && (kind == Reduce::kSum || kind == Reduce::kMean || kind == Reduce::kMax)) {
          ReduceTrailingFloat(kind, in, y->count(), reduce_count, out);
          return;
        }
      }
      if (trailing) {
        ReduceTrailing<T>(kind, in, y->count(), reduce_count, out);
        return;
      }
      // One block of adjacent reduced axes [block_start, block_end), kept axes around it.
      int block_start = 0;
      while (block_start < rank && !reduced[block_start]) ++block_start;
      int block_end = block_start;
      while (block_end < rank && reduced[block_end]) ++block_end;
      bool one_block = block_start < rank;
      for (int i = block_end; i < rank; ++i) one_block = one_block && !reduced[i];
      if (one_block) {
        ReduceMiddle<T>(context, kind, in, Product(x.shape(), 0, block_start), reduce_count,
                        Product(x.shape(), block_end, rank), out);
        return;
      }
      ReduceGeneral<T>(kind, x, reduced, reduce_count, y->count(), out);
    });
    return absl::OkStatus();
  }

 private:
  Reduce kind_;
  std::vector<int64_t> axes_;
  bool axes_from_input_;
  bool keep_dims_;
  bool noop_with_empty_axes_;
};

// `input_version` is the first version taking axes as an input.
KernelFactory ReduceFactory(Reduce kind, int input_version) {
  return [kind, input_version](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    const bool from_input = context.since_version() >= input_version;
    RETURN_IF_ERROR(context.ExpectInputs(1, from_input ? 2 : 1));
    const bool float_only = kind == Reduce::kMean || kind == Reduce::kL2 ||
                            kind == Reduce::kLogSum || kind == Reduce::kLogSumExp;
    RETURN_IF_ERROR(RequireType(
        context, 0, float_only ? IsFloat : [](DataType t) {
          return IsFloat(t) || t == DataType::kInt32 || t == DataType::kInt64 ||
                 t == DataType::kUint32 || t == DataType::kUint64 || t == DataType::kInt8 ||
                 t == DataType::kUint8;
        }));
    ASSIGN_OR_RETURN(int64_t keep_dims, context.Int("keepdims", 1));
    int64_t noop = 0;
    std::vector<int64_t> axes;
    bool axes_known = true;
    bool dynamic_axes = false;
    if (from_input) {
      ASSIGN_OR_RETURN(noop, context.Int("noop_with_empty_axes", 0));
      RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
      if (context.has_input(1)) {
        if (const Tensor* constant = context.constant_input(1)) {
          axes = ToInt64Vector(*constant);
        } else {
          axes_known = false;
          dynamic_axes = true;
        }
      }
    } else {
      ASSIGN_OR_RETURN(axes, context.Ints("axes", std::vector<int64_t>{}));
    }
    const ValueInfo& x = context.input(0);
    if (x.rank_known && axes_known) {
      if (axes.empty() && noop != 0) {
        context.SetOutput(0, x.dtype, x.dims);
      } else {
        ASSIGN_OR_RETURN(std::vector<bool> reduced, ReducedAxes(axes, x.rank()));
        context.SetOutput(0, x.dtype, ReducedShape(x.dims, reduced, keep_dims != 0));
      }
    } else if (x.rank_known && keep_dims != 0) {
      context.SetOutput(0, x.dtype, std::vector<int64_t>(x.rank(), -1));
    } else {
      context.SetOutputUnranked(0, x.dtype);
    }
    return MakeKernel<ReduceKernel>(kind, std::move(axes), dynamic_axes, keep_dims != 0, noop != 0);
  };
}

class ArgKernel : public Kernel {
 public:
  ArgKernel(bool max, int64_t axis, bool keep_dims, bool last)
      : max_(max), axis_(axis), keep_dims_(keep_dims), last_(last) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, x.rank()));
    std::vector<bool> reduced(x.rank(), false);
    reduced[axis] = true;
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kInt64,
                                                ReducedShape(x.shape(), reduced, keep_dims_)));
    const int64_t outer = Product(x.shape(), 0, axis);
    const int64_t dim = x.dim(axis);
    const int64_t inner = Product(x.shape(), axis + 1, x.rank());
    if (dim == 0) return absl::InvalidArgumentError("cannot take the arg of an empty axis");
    NumericTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      int64_t* out = y->data<int64_t>();
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          const T* base = in + o * dim * inner + i;
          int64_t best = 0;
          for (int64_t j = 1; j < dim; ++j) {
            const T v = base[j * inner], b = base[best * inner];
            const bool better = max_ ? (last_ ? v >= b : v > b) : (last_ ? v <= b : v < b);
            if (better) best = j;
          }
          out[o * inner + i] = best;
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  bool max_;
  int64_t axis_;
  bool keep_dims_;
  bool last_;
};

KernelFactory ArgFactory(bool max) {
  return [max](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsNumeric));
    ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", 0));
    ASSIGN_OR_RETURN(int64_t keep_dims, context.Int("keepdims", 1));
    ASSIGN_OR_RETURN(int64_t last, context.Int("select_last_index", 0));
    const ValueInfo& x = context.input(0);
    if (x.rank_known) {
      ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, x.rank()));
      std::vector<bool> reduced(x.rank(), false);
      reduced[a] = true;
      context.SetOutput(0, DataType::kInt64, ReducedShape(x.dims, reduced, keep_dims != 0));
    } else {
      context.SetOutputUnranked(0, DataType::kInt64);
    }
    return MakeKernel<ArgKernel>(max, axis, keep_dims != 0, last != 0);
  };
}

class CumSumKernel : public Kernel {
 public:
  CumSumKernel(bool exclusive, bool reverse) : exclusive_(exclusive), reverse_(reverse) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    const Tensor& axis_tensor = context.input(1);
    if (axis_tensor.count() != 1) return absl::InvalidArgumentError("axis must be a scalar");
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(ToInt64Vector(axis_tensor)[0], x.rank()));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), x.shape()));
    const int64_t outer = Product(x.shape(), 0, axis);
    const int64_t dim = x.dim(axis);
    const int64_t inner = Product(x.shape(), axis + 1, x.rank());
    NumericTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = y->data<T>();
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          T sum = T(0);
          for (int64_t s = 0; s < dim; ++s) {
            const int64_t j = reverse_ ? dim - 1 - s : s;
            const int64_t at = (o * dim + j) * inner + i;
            if (exclusive_) {
              out[at] = sum;
              sum = static_cast<T>(sum + in[at]);
            } else {
              sum = static_cast<T>(sum + in[at]);
              out[at] = sum;
            }
          }
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  bool exclusive_;
  bool reverse_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeCumSum(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsNumeric));
  RETURN_IF_ERROR(RequireType(context, 1, IsIndexType));
  ASSIGN_OR_RETURN(int64_t exclusive, context.Int("exclusive", 0));
  ASSIGN_OR_RETURN(int64_t reverse, context.Int("reverse", 0));
  ValueInfo info = context.input(0).ShapeOnly();
  context.SetOutput(0, info);
  return MakeKernel<CumSumKernel>(exclusive != 0, reverse != 0);
}

}  // namespace

void RegisterReduceKernels(KernelRegistry& registry) {
  registry.Register("ReduceSum", {1, 11, 13}, ReduceFactory(Reduce::kSum, 13));
  registry.Register("ReduceMean", {1, 11, 13, 18}, ReduceFactory(Reduce::kMean, 18));
  registry.Register("ReduceMax", {1, 11, 12, 13, 18}, ReduceFactory(Reduce::kMax, 18));
  registry.Register("ReduceMin", {1, 11, 12, 13, 18}, ReduceFactory(Reduce::kMin, 18));
  registry.Register("ReduceProd", {1, 11, 13, 18}, ReduceFactory(Reduce::kProd, 18));
  registry.Register("ReduceL1", {1, 11, 13, 18}, ReduceFactory(Reduce::kL1, 18));
  registry.Register("ReduceL2", {1, 11, 13, 18}, ReduceFactory(Reduce::kL2, 18));
  registry.Register("ReduceSumSquare", {1, 11, 13, 18}, ReduceFactory(Reduce::kSumSquare, 18));
  registry.Register("ReduceLogSum", {1, 11, 13, 18}, ReduceFactory(Reduce::kLogSum, 18));
  registry.Register("ReduceLogSumExp", {1, 11, 13, 18}, ReduceFactory(Reduce::kLogSumExp, 18));
  registry.Register("ArgMax", {1, 11, 12, 13}, ArgFactory(true));
  registry.Register("ArgMin", {1, 11, 12, 13}, ArgFactory(false));
  registry.Register("CumSum", {11, 14}, MakeCumSum);
}

}  // namespace cloister::runtime
