// Less common CPU kernels: IsNaN, IsInf, Shrink, Trilu, DepthToSpace, SpaceToDepth,
// OneHot, TopK, NonZero, GatherND, ScatterElements, ScatterND, Hardmax, EyeLike and LRN.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/onnx_tensor.h"

namespace cloister::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// IsNaN, IsInf, Shrink.

class FloatPredicateKernel : public Kernel {
 public:
  FloatPredicateKernel(bool nan, bool negative, bool positive)
      : nan_(nan), negative_(negative), positive_(positive) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kBool, x.shape()));
    bool* out = y->data<bool>();
    FloatTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      for (int64_t i = 0; i < x.count(); ++i) {
        if (nan_) {
          out[i] = std::isnan(in[i]);
        } else {
          out[i] = std::isinf(in[i]) && ((in[i] > 0 && positive_) || (in[i] < 0 && negative_));
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  bool nan_, negative_, positive_;
};

KernelFactory FloatPredicate(bool nan) {
  return [nan](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsFloat));
    int64_t negative = 1, positive = 1;
    if (!nan) {
      ASSIGN_OR_RETURN(negative, context.Int("detect_negative", 1));
      ASSIGN_OR_RETURN(positive, context.Int("detect_positive", 1));
    }
    ValueInfo info = context.input(0).ShapeOnly();
    info.dtype = DataType::kBool;
    context.SetOutput(0, info);
    return MakeKernel<FloatPredicateKernel>(nan, negative != 0, positive != 0);
  };
}

class ShrinkKernel : public Kernel {
 public:
  ShrinkKernel(float lambda, float bias) : lambda_(lambda), bias_(bias) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), x.shape()));
    NumericTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = y->data<T>();
      for (int64_t i = 0; i < x.count(); ++i) {
        const double v = static_cast<double>(in[i]);
        out[i] = static_cast<T>(v < -lambda_ ? v + bias_ : (v > lambda_ ? v - bias_ : 0.0));
      }
    });
    return absl::OkStatus();
  }

 private:
  float lambda_, bias_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeShrink(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsNumeric));
  ASSIGN_OR_RETURN(float lambda, context.Float("lambd", 0.5f));
  ASSIGN_OR_RETURN(float bias, context.Float("bias", 0.0f));
  context.SetOutput(0, context.input(0).ShapeOnly());
  return MakeKernel<ShrinkKernel>(lambda, bias);
}

// ---------------------------------------------------------------------------------------------
// Trilu.

class TriluKernel : public Kernel {
 public:
  explicit TriluKernel(bool upper) : upper_(upper) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 2) return absl::InvalidArgumentError("input needs at least 2 dimensions");
    int64_t k = 0;
    if (context.has_input(1)) {
      if (context.input(1).count() != 1) return absl::InvalidArgumentError("k must be a scalar");
      k = ToInt64Vector(context.input(1))[0];
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), x.shape()));
    const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
    const int64_t matrices = rows * cols == 0 ? 0 : x.count() / (rows * cols);
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      for (int64_t m = 0; m < matrices; ++m) {
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t at = (m * rows + i) * cols + j;
            const bool keep = upper_ ? j - i >= k : j - i <= k;
            out[at] = keep ? in[at] : T(0);
          }
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  bool upper_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeTrilu(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  ASSIGN_OR_RETURN(int64_t upper, context.Int("upper", 1));
  context.SetOutput(0, context.input(0).ShapeOnly());
  return MakeKernel<TriluKernel>(upper != 0);
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace and SpaceToDepth.

class DepthSpaceKernel : public Kernel {
 public:
  // to_space: DepthToSpace (crd selects the CRD mode); otherwise SpaceToDepth.
  DepthSpaceKernel(bool to_space, int64_t block, bool crd)
      : to_space_(to_space), block_(block), crd_(crd) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() != 4) return absl::InvalidArgumentError("input must have rank 4");
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = block_;
    std::vector<int64_t> shape;
    if (to_space_) {
      if (c % (b * b) != 0)
        return absl::InvalidArgumentError("channels not divisible by blocksize^2");
      shape = {n, c / (b * b), h * b, w * b};
    } else {
      if (h % b != 0 || w % b != 0) {
        return absl::InvalidArgumentError("height and width must be divisible by blocksize");
      }
      shape = {n, c * b * b, h / b, w / b};
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), shape));
    DispatchBySize(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x.raw_data());
      T* out = static_cast<T*>(y->raw_data());
      const int64_t oc = shape[1], oh = shape[2], ow = shape[3];
      for (int64_t in_ = 0; in_ < n; ++in_) {
        for (int64_t co = 0; co < oc; ++co) {
          for (int64_t yo = 0; yo < oh; ++yo) {
            for (int64_t xo = 0; xo < ow; ++xo) {
              int64_t ci, yi, xi;
              if (to_space_) {
                const int64_t by = yo % b, bx = xo % b;
                yi = yo / b;
                xi = xo / b;
                ci = crd_ ? (co * b + by) * b + bx : (by * b + bx) * oc + co;
              } else {
                // Output channel = (by * b + bx) * C + c.
                const int64_t block_index = co / c, channel = co % c;
                const int64_t by = block_index / b, bx = block_index % b;
                ci = channel;
                yi = yo * b + by;
                xi = xo * b + bx;
              }
              out[((in_ * oc + co) * oh + yo) * ow + xo] = in[((in_ * c + ci) * h + yi) * w + xi];
            }
          }
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  bool to_space_;
  int64_t block_;
  bool crd_;
};

KernelFactory DepthSpaceFactory(bool to_space) {
  return [to_space](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(1, 1));
    RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
    ASSIGN_OR_RETURN(int64_t block, context.Int("blocksize"));
    if (block <= 0) return absl::InvalidArgumentError("blocksize must be positive");
    bool crd = false;
    if (to_space) {
      ASSIGN_OR_RETURN(std::string mode, context.String("mode", "DCR"));
      if (mode != "DCR" && mode != "CRD") {
        return absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' is not valid"));
      }
      crd = mode == "CRD";
    }
    const ValueInfo& x = context.input(0);
    if (x.rank_known) {
      if (x.rank() != 4) return absl::InvalidArgumentError("input must have rank 4");
      std::vector<int64_t> d = x.dims;
      auto scale = [](int64_t v, int64_t f, bool up) { return v < 0 ? -1 : (up ? v * f : v / f); };
      if (to_space) {
        d = {d[0], scale(d[1], block * block, false), scale(d[2], block, true),
             scale(d[3], block, true)};
      } else {
        d = {d[0], scale(d[1], block * block, true), scale(d[2], block, false),
             scale(d[3], block, false)};
      }
      context.SetOutput(0, x.dtype, d);
    } else {
      context.SetOutputUnranked(0, x.dtype);
    }
    return MakeKernel<DepthSpaceKernel>(to_space, block, crd);
  };
}

// ---------------------------------------------------------------------------------------------
// OneHot.

class OneHotKernel : public Kernel {
 public:
  explicit OneHotKernel(int64_t axis) : axis_(axis) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& indices = context.input(0);
    const Tensor& depth_tensor = context.input(1);
    const Tensor& values = context.input(2);
    if (depth_tensor.count() != 1 || values.count() != 2) {
      return absl::InvalidArgumentError("depth must be a scalar and values hold [off, on]");
    }
    double depth_value = 0;
    NumericTypes::Dispatch(depth_tensor.dtype(), [&](auto tag) {
      using T = decltype(tag);
      depth_value = static_cast<double>(*depth_tensor.data<T>());
    });
    const int64_t depth = static_cast<int64_t>(depth_value);
    if (depth <= 0) return absl::InvalidArgumentError("depth must be positive");
    const int rank = indices.rank() + 1;
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, rank));
    std::vector<int64_t> shape = indices.shape();
    shape.insert(shape.begin() + axis, depth);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, values.dtype(), shape));
    const int64_t outer = Product(indices.shape(), 0, axis);
    const int64_t inner = Product(indices.shape(), axis, indices.rank());
    std::vector<double> index(indices.count());
    NumericTypes::Dispatch(indices.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = indices.data<T>();
      for (int64_t i = 0; i < indices.count(); ++i) index[i] = static_cast<double>(in[i]);
    });
    DispatchBySize(values.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T off = static_cast<const T*>(values.raw_data())[0];
      const T on = static_cast<const T*>(values.raw_data())[1];
      T* out = static_cast<T*>(y->raw_data());
      std::fill(out, out + y->count(), off);
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          int64_t k = static_cast<int64_t>(index[o * inner + i]);
          if (k < 0) k += depth;
          if (k < 0 || k >= depth) continue;
          out[(o * depth + k) * inner + i] = on;
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeOneHot(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(3, 3));
  RETURN_IF_ERROR(RequireType(context, 0, IsNumeric));
  RETURN_IF_ERROR(RequireType(context, 1, IsNumeric));
  RETURN_IF_ERROR(RequireType(context, 2, IsMovable));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", -1));
  const ValueInfo& indices = context.input(0);
  if (indices.rank_known) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, indices.rank() + 1));
    std::vector<int64_t> dims = indices.dims;
    dims.insert(dims.begin() + a, -1);
    context.SetOutput(0, context.input(2).dtype, dims);
  } else {
    context.SetOutputUnranked(0, context.input(2).dtype);
  }
  return MakeKernel<OneHotKernel>(axis);
}

// ---------------------------------------------------------------------------------------------
// TopK.

class TopKKernel : public Kernel {
 public:
  TopKKernel(int64_t axis, bool largest, int64_t fixed_k)
      : axis_(axis), largest_(largest), fixed_k_(fixed_k) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    int64_t k = fixed_k_;
    if (k < 0) {
      if (context.input(1).count() != 1) return absl::InvalidArgumentError("K must hold one value");
      k = ToInt64Vector(context.input(1))[0];
    }
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, x.rank()));
    const int64_t dim = x.dim(axis);
    if (k < 0 || k > dim) {
      return absl::InvalidArgumentError(absl::StrCat("K = ", k, " is out of range for ", dim));
    }
    std::vector<int64_t> shape = x.shape();
    shape[axis] = k;
    ASSIGN_OR_RETURN(Tensor * values, context.Output(0, x.dtype(), shape));
    ASSIGN_OR_RETURN(Tensor * indices, context.Output(1, DataType::kInt64, shape));
    const int64_t outer = Product(x.shape(), 0, axis);
    const int64_t inner = Product(x.shape(), axis + 1, x.rank());
    NumericTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = values->data<T>();
      int64_t* out_index = indices->data<int64_t>();
      std::vector<int64_t> order(dim);
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          const T* base = in + o * dim * inner + i;
          std::iota(order.begin(), order.end(), 0);
          // Ties keep the lower index first.
          auto better = [&](int64_t a, int64_t b) {
            const T va = base[a * inner], vb = base[b * inner];
            if (va != vb) return largest_ ? va > vb : va < vb;
            return a < b;
          };
          std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
          for (int64_t j = 0; j < k; ++j) {
            out[(o * k + j) * inner + i] = base[order[j] * inner];
            out_index[(o * k + j) * inner + i] = order[j];
          }
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
  bool largest_;
  int64_t fixed_k_;  // -1: from input 1
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeTopK(NodeContext& context) {
  const int version = context.since_version();
  RETURN_IF_ERROR(context.ExpectInputs(version < 10 ? 1 : 2, version < 10 ? 1 : 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsNumeric));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", -1));
  int64_t largest = 1, sorted = 1, k = -1;
  if (version >= 11) {
    ASSIGN_OR_RETURN(largest, context.Int("largest", 1));
    ASSIGN_OR_RETURN(sorted, context.Int("sorted", 1));
  }
  (void)sorted;  // results are always sorted, which satisfies sorted=0 as well
  if (version < 10) {
    ASSIGN_OR_RETURN(k, context.Int("k"));
  } else if (const Tensor* constant = context.constant_input(1);
             constant && constant->count() == 1) {
    k = ToInt64Vector(*constant)[0];
  }
  const ValueInfo& x = context.input(0);
  if (x.rank_known) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, x.rank()));
    std::vector<int64_t> dims = x.dims;
    dims[a] = k;
    context.SetOutput(0, x.dtype, dims);
    context.SetOutput(1, DataType::kInt64, dims);
  } else {
    context.SetOutputUnranked(0, x.dtype);
    context.SetOutputUnranked(1, DataType::kInt64);
  }
  return MakeKernel<TopKKernel>(axis, largest != 0, version < 10 ? k : -1);
}

// ---------------------------------------------------------------------------------------------
// NonZero.

class NonZeroKernel : public Kernel {
 public:
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    std::vector<int64_t> hits;
    NumericOrBoolTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      for (int64_t i = 0; i < x.count(); ++i) {
        if (in[i] != T(0)) hits.push_back(i);
      }
    });
    const int rank = x.rank();
    const int64_t n = static_cast<int64_t>(hits.size());
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kInt64, {std::max(rank, 1), n}));
    int64_t* out = y->data<int64_t>();
    if (rank == 0) {
      std::fill(out, out + n, 0);
      return absl::OkStatus();
    }
    for (int64_t j = 0; j < n; ++j) {
      int64_t rest = hits[j];
      for (int d = rank; d-- > 0;) {
        out[d * n + j] = rest % x.dim(d);
        rest /= x.dim(d);
      }
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeNonZero(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsNumericOrBool));
  const ValueInfo& x = context.input(0);
  context.SetOutput(0, DataType::kInt64, {x.rank_known ? std::max(x.rank(), 1) : -1, -1});
  return MakeKernel<NonZeroKernel>();
}

// ---------------------------------------------------------------------------------------------
// GatherND, ScatterElements, ScatterND.

class GatherNDKernel : public Kernel {
 public:
  explicit GatherNDKernel(int64_t batch_dims) : batch_dims_(batch_dims) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& data = context.input(0);
    const Tensor& indices = context.input(1);
    const int64_t b = batch_dims_;
    if (indices.rank() < 1 || data.rank() < 1 || b >= std::min(data.rank(), indices.rank())) {
      return absl::InvalidArgumentError("bad ranks for GatherND");
    }
    const int64_t last = indices.dim(indices.rank() - 1);
    if (last < 1 || last > data.rank() - b) {
      return absl::InvalidArgumentError("index tuples are longer than the data rank");
    }
    for (int64_t d = 0; d < b; ++d) {
      if (data.dim(d) != indices.dim(d)) return absl::InvalidArgumentError("batch dims differ");
    }
    std::vector<int64_t> shape(indices.shape().begin(), indices.shape().end() - 1);
    for (int d = static_cast<int>(b + last); d < data.rank(); ++d) shape.push_back(data.dim(d));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, data.dtype(), shape));
    const std::vector<int64_t> index = ToInt64Vector(indices);
    const int64_t batches = Product(data.shape(), 0, b);
    const int64_t slice = Product(data.shape(), b + last, data.rank());
    const int64_t batch_data = Product(data.shape(), b, data.rank());
    const int64_t tuples =
        (indices.count() / std::max<int64_t>(last, 1)) / std::max<int64_t>(batches, 1);
    const size_t element = ElementSize(data.dtype());
    const char* in = static_cast<const char*>(data.raw_data());
    char* out = static_cast<char*>(y->raw_data());
    for (int64_t batch = 0; batch < batches; ++batch) {
      for (int64_t t = 0; t < tuples; ++t) {
        const int64_t* tuple = &index[(batch * tuples + t) * last];
        int64_t offset = 0;
        for (int64_t d = 0; d < last; ++d) {
          const int64_t dim = data.dim(static_cast<int>(b + d));
          int64_t k = tuple[d];
          if (k < -dim || k >= dim) return absl::InvalidArgumentError("index out of range");
          if (k < 0) k += dim;
          offset = offset * dim + k;
        }
        std::memcpy(out + ((batch * tuples + t) * slice) * element,
                    in + (batch * batch_data + offset * slice) * element, slice * element);
      }
    }
    return absl::OkStatus();
  }

 private:
  int64_t batch_dims_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeGatherND(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, IsMovable));
  RETURN_IF_ERROR(RequireType(context, 1, [](DataType t) { return t == DataType::kInt64; }));
  ASSIGN_OR_RETURN(int64_t batch_dims, context.Int("batch_dims", 0));
  if (batch_dims < 0) return absl::InvalidArgumentError("batch_dims must not be negative");
  context.SetOutputUnranked(0, context.input(0).dtype);
  return MakeKernel<GatherNDKernel>(batch_dims);
}

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

absl::StatusOr<Reduction> ParseReduction(const NodeContext& context) {
  if (context.since_version() < 16) return Reduction::kNone;
  ASSIGN_OR_RETURN(std::string name, context.String("reduction", "none"));
  if (name == "none") return Reduction::kNone;
  if (name == "add") return Reduction::kAdd;
  if (name == "mul") return Reduction::kMul;
  if (name == "max" && context.since_version() >= 18) return Reduction::kMax;
  if (name == "min" && context.since_version() >= 18) return Reduction::kMin;
  return absl::InvalidArgumentError(absl::StrCat("reduction '", name, "' is not valid"));
}

template <typename T>
void Combine(T& target, T value, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      target = value;
      break;
    case Reduction::kAdd:
      target = static_cast<T>(target + value);
      break;
    case Reduction::kMul:
      target = static_cast<T>(target * value);
      break;
    case Reduction::kMax:
      target = value > target ? value : target;
      break;
    case Reduction::kMin:
      target = value < target ? value : target;
      break;
  }
}

class ScatterKernel : public Kernel {
 public:
  ScatterKernel(bool elements, int64_t axis, Reduction reduction)
      : elements_(elements), axis_(axis), reduction_(reduction) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& data = context.input(0);
    const Tensor& indices = context.input(1);
    const Tensor& updates = context.input(2);
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, data.dtype(), data.shape()));
    if (data.size() > 0) std::memcpy(y->raw_data(), data.raw_data(), data.size());
    const std::vector<int64_t> index = ToInt64Vector(indices);
    absl::Status status;
    NumericOrBoolTypes::Dispatch(data.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* out = y->data<T>();
      const T* up = updates.data<T>();
      status = elements_ ? ScatterElements<T>(data, indices, updates, index, up, out)
                         : ScatterND<T>(data, indices, updates, index, up, out);
    });
    return status;
  }

 private:
  template <typename T>
  absl::Status ScatterElements(const Tensor& data, const Tensor& indices, const Tensor& updates,
                               const std::vector<int64_t>& index, const T* up, T* out) const {
    const int rank = data.rank();
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, rank));
    if (indices.rank() != rank || updates.shape() != indices.shape()) {
      return absl::InvalidArgumentError("indices and updates must match and have the data rank");
    }
    std::vector<int64_t> strides(rank, 1);
    for (int d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * data.dim(d);
    std::vector<int64_t> position(rank, 0);
    for (int64_t i = 0; i < indices.count(); ++i) {
      int64_t k = index[i];
      const int64_t dim = data.dim(axis);
      if (k < -dim || k >= dim) return absl::InvalidArgumentError("index out of range");
      if (k < 0) k += dim;
      int64_t offset = 0;
      for (int d = 0; d < rank; ++d) {
        if (d != axis && position[d] >= data.dim(d)) {
          return absl::InvalidArgumentError("indices exceed the data shape");
        }
        offset += (d == axis ? k : position[d]) * strides[d];
      }
      Combine(out[offset], up[i], reduction_);
      for (int d = rank; d-- > 0;) {
        if (++position[d] < indices.dim(d)) break;
        position[d] = 0;
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status ScatterND(const Tensor& data, const Tensor& indices, const Tensor& updates,
                         const std::vector<int64_t>& index, const T* up, T* out) const {
    if (indices.rank() < 1) return absl::InvalidArgumentError("indices need rank >= 1");
    const int64_t last = indices.dim(indices.rank() - 1);
    if (last > data.rank()) return absl::InvalidArgumentError("index tuples too long");
    std::vector<int64_t> want(indices.shape().begin(), indices.shape().end() - 1);
    for (int d = static_cast<int>(last); d < data.rank(); ++d) want.push_back(data.dim(d));
    if (updates.shape() != want) return absl::InvalidArgumentError("updates shape mismatch");
    const int64_t slice = Product(data.shape(), last, data.rank());
    const int64_t tuples = last == 0 ? 1 : static_cast<int64_t>(index.size()) / last;
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t offset = 0;
      for (int64_t d = 0; d < last; ++d) {
        const int64_t dim = data.dim(static_cast<int>(d));
        int64_t k = index[t * last + d];
        if (k < -dim || k >= dim) return absl::InvalidArgumentError("index out of range");
        if (k < 0) k += dim;
        offset = offset * dim + k;
      }
      for (int64_t s = 0; s < slice; ++s)
        Combine(out[offset * slice + s], up[t * slice + s], reduction_);
    }
    return absl::OkStatus();
  }

  bool elements_;
  int64_t axis_;
  Reduction reduction_;
};

KernelFactory ScatterFactory(bool elements) {
  return [elements](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    RETURN_IF_ERROR(context.ExpectInputs(3, 3));
    RETURN_IF_ERROR(RequireType(context, 0, IsNumericOrBool));
    RETURN_IF_ERROR(RequireType(context, 1, IsIndexType));
    RETURN_IF_ERROR(RequireSameType(context, 0, 2));
    int64_t axis = 0;
    if (elements) {
      ASSIGN_OR_RETURN(axis, context.Int("axis", 0));
    }
    ASSIGN_OR_RETURN(Reduction reduction, ParseReduction(context));
    context.SetOutput(0, context.input(0).ShapeOnly());
    return MakeKernel<ScatterKernel>(elements, axis, reduction);
  };
}

// ---------------------------------------------------------------------------------------------
// Hardmax, EyeLike, LRN.

class HardmaxKernel : public Kernel {
 public:
  HardmaxKernel(int64_t axis, bool coerce_2d) : axis_(axis), coerce_2d_(coerce_2d) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_, std::max(x.rank(), 1)));
    const int64_t outer = Product(x.shape(), 0, axis);
    const int64_t width = coerce_2d_ ? Product(x.shape(), axis, x.rank()) : x.dim(axis);
    const int64_t inner = coerce_2d_ ? 1 : Product(x.shape(), axis + 1, x.rank());
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, x.dtype(), x.shape()));
    FloatTypes::Dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = x.data<T>();
      T* out = y->data<T>();
      std::fill(out, out + y->count(), T(0));
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          const T* base = in + o * width * inner + i;
          int64_t best = 0;
          for (int64_t j = 1; j < width; ++j) {
            if (base[j * inner] > base[best * inner]) best = j;
          }
          if (width > 0) out[o * width * inner + best * inner + i] = T(1);
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
  bool coerce_2d_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeHardmax(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsFloat));
  const bool coerce = context.since_version() < 13;
  ASSIGN_OR_RETURN(int64_t axis, context.Int("axis", coerce ? 1 : -1));
  context.SetOutput(0, context.input(0).ShapeOnly());
  return MakeKernel<HardmaxKernel>(axis, coerce);
}

class EyeLikeKernel : public Kernel {
 public:
  EyeLikeKernel(DataType dtype, int64_t k) : dtype_(dtype), k_(k) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() != 2) return absl::InvalidArgumentError("input must be a matrix");
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, dtype_, x.shape()));
    NumericOrBoolTypes::Dispatch(dtype_, [&](auto tag) {
      using T = decltype(tag);
      T* out = y->data<T>();
      std::fill(out, out + y->count(), T(0));
      for (int64_t i = 0; i < x.dim(0); ++i) {
        const int64_t j = i + k_;
        if (j >= 0 && j < x.dim(1)) out[i * x.dim(1) + j] = T(1);
      }
    });
    return absl::OkStatus();
  }

 private:
  DataType dtype_;
  int64_t k_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeEyeLike(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, IsNumericOrBool));
  DataType dtype = context.input(0).dtype;
  if (context.has_attribute("dtype")) {
    ASSIGN_OR_RETURN(int64_t code, context.Int("dtype"));
    ASSIGN_OR_RETURN(dtype, DataTypeFromOnnx(static_cast<int>(code)));
    if (!IsNumericOrBool(dtype)) {
      return absl::UnimplementedError("EyeLike output type is not supported");
    }
  }
  ASSIGN_OR_RETURN(int64_t k, context.Int("k", 0));
  ValueInfo info = context.input(0).ShapeOnly();
  info.dtype = dtype;
  context.SetOutput(0, info);
  return MakeKernel<EyeLikeKernel>(dtype, k);
}

class LrnKernel : public Kernel {
 public:
  LrnKernel(float alpha, float beta, float bias, int64_t size)
      : alpha_(alpha), beta_(beta), bias_(bias), size_(size) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& x = context.input(0);
    if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, DataType::kFloat, x.shape()));
    const int64_t n = x.dim(0), c = x.dim(1), plane = Product(x.shape(), 2, x.rank());
    const int64_t before = (size_ - 1) / 2, after = size_ - 1 - before;
    const float* in = x.data<float>();
    float* out = y->data<float>();
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t ch = 0; ch < c; ++ch) {
        const int64_t lo = std::max<int64_t>(0, ch - before), hi = std::min(c - 1, ch + after);
        for (int64_t p = 0; p < plane; ++p) {
          float sum = 0;
          for (int64_t k = lo; k <= hi; ++k) {
            const float v = in[(b * c + k) * plane + p];
            sum += v * v;
          }
          const int64_t at = (b * c + ch) * plane + p;
          out[at] = in[at] / std::pow(bias_ + alpha_ / size_ * sum, beta_);
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  float alpha_, beta_, bias_;
  int64_t size_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeLrn(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t == DataType::kFloat; }));
  ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1e-4f));
  ASSIGN_OR_RETURN(float beta, context.Float("beta", 0.75f));
  ASSIGN_OR_RETURN(float bias, context.Float("bias", 1.0f));
  ASSIGN_OR_RETURN(int64_t size, context.Int("size"));
  if (size <= 0) return absl::InvalidArgumentError("size must be positive");
  context.SetOutput(0, context.input(0).ShapeOnly());
  return MakeKernel<LrnKernel>(alpha, beta, bias, size);
}

}  // namespace

void RegisterMiscKernels(KernelRegistry& registry) {
  registry.Register("IsNaN", {9, 13}, FloatPredicate(true));
  registry.Register("IsInf", {10}, FloatPredicate(false));
  registry.Register("Shrink", {9}, MakeShrink);
  registry.Register("Trilu", {14}, MakeTrilu);
  registry.Register("DepthToSpace", {1, 11, 13}, DepthSpaceFactory(true));
  registry.Register("SpaceToDepth", {1, 13}, DepthSpaceFactory(false));
  registry.Register("OneHot", {9, 11}, MakeOneHot);
  registry.Register("TopK", {1, 10, 11}, MakeTopK);
  registry.Register("NonZero", {9, 13}, MakeNonZero);
  registry.Register("GatherND", {11, 12, 13}, MakeGatherND);
  registry.Register("ScatterElements", {11, 13, 16, 18}, ScatterFactory(true));
  registry.Register("ScatterND", {11, 13, 16, 18}, ScatterFactory(false));
  registry.Register("Hardmax", {1, 11, 13}, MakeHardmax);
  registry.Register("EyeLike", {9}, MakeEyeLike);
  registry.Register("LRN", {1, 13}, MakeLrn);
}

}  // namespace cloister::runtime
