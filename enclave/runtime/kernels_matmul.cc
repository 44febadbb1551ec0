// Matrix-product CPU kernels over gemm.h: MatMul (numpy-style batch broadcasting; fuses a
// following bias add and activation at load) and Gemm.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/activation.h"
#include "enclave/runtime/dispatch.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/gemm.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/packed_gemm.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// MatMul and Gemm.

absl::StatusOr<std::vector<int64_t>> MatMulShape(std::vector<int64_t> a, std::vector<int64_t> b) {
  if (a.empty() || b.empty()) return absl::InvalidArgumentError("MatMul inputs cannot be scalars");
  const bool a_vector = a.size() == 1, b_vector = b.size() == 1;
  if (a_vector) a.insert(a.begin(), 1);
  if (b_vector) b.push_back(1);
  const int64_t ka = a[a.size() - 1], kb = b[b.size() - 2];
  if (ka >= 0 && kb >= 0 && ka != kb) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner dimensions differ: ", ShapeToString(a), " x ", ShapeToString(b)));
  }
  std::vector<int64_t> batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  ASSIGN_OR_RETURN(std::vector<int64_t> out, BroadcastShapes(batch_a, batch_b));
  if (!a_vector) out.push_back(a[a.size() - 2]);
  if (!b_vector) out.push_back(b[b.size() - 1]);
  return out;
}

// Matrix sizes and batch dims of one MatMul: A [batch_a..., m, k] times B [batch_b..., k, n]
// over the broadcast `batch`.
struct MatMulDims {
  int64_t m = 0, k = 0, n = 0;
  std::vector<int64_t> batch_a, batch_b, batch;
};

absl::StatusOr<MatMulDims> MatMulDimsOf(std::vector<int64_t> as, std::vector<int64_t> bs) {
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  MatMulDims dims;
  dims.m = as[as.size() - 2];
  dims.k = as.back();
  dims.n = bs.back();
  dims.batch_a.assign(as.begin(), as.end() - 2);
  dims.batch_b.assign(bs.begin(), bs.end() - 2);
  ASSIGN_OR_RETURN(dims.batch, BroadcastShapes(dims.batch_a, dims.batch_b));
  return dims;
}

// Offsets (in matrices) into A and B of output batch item `i` (general broadcast over the
// batch dims).
void BatchOffsets(const MatMulDims& dims, int64_t i, int64_t& ai, int64_t& bi) {
  const size_t rank = dims.batch.size();
  ai = bi = 0;
  int64_t a_stride = 1, b_stride = 1;
  for (size_t d = rank; d-- > 0;) {
    const int64_t index = i % dims.batch[d];
    i /= dims.batch[d];
    if (d >= rank - dims.batch_a.size()) {
      const int64_t extent = dims.batch_a[d + dims.batch_a.size() - rank];
      if (extent != 1) ai += index * a_stride;
      a_stride *= extent;
    }
    if (d >= rank - dims.batch_b.size()) {
      const int64_t extent = dims.batch_b[d + dims.batch_b.size() - rank];
      if (extent != 1) bi += index * b_stride;
      b_stride *= extent;
    }
  }
}

// Multiplies the batch items, ranges of them side by side on `workers` (when there are and the
// items add up to enough work); checks `deadline` (thread-safe) between items once they add up
// to a row block's work.
template <typename T, typename Deadline>
absl::Status MultiplyBroadcastBatches(TaskPool* workers, const MatMulDims& dims, const T* ad,
                                      const T* bd, T beta, T* yd, Deadline& deadline) {
  const int64_t m = dims.m, k = dims.k, n = dims.n;
  const int64_t batches = Product(dims.batch, 0, dims.batch.size());
  const int64_t parts = RowParts(workers, batches, m * n, k);
  return RunInParts(workers, batches, parts, [&](int64_t first, int64_t last) -> absl::Status {
    int64_t unchecked = 0;  // multiply-adds since the last deadline check
    for (int64_t i = first; i < last; ++i) {
      if (unchecked >= kRowBlockMultiplyAdds) {
        RETURN_IF_ERROR(deadline());
        unchecked = 0;
      }
      unchecked += m * n * k;
      int64_t ai = 0, bi = 0;
      BatchOffsets(dims, i, ai, bi);
      RETURN_IF_ERROR(GemmInRowBlocks<T>(false, false, m, n, k, T(1), ad + ai * m * k, k,
                                         bd + bi * k * n, n, beta, yd + i * m * n, n, deadline));
    }
    return absl::OkStatus();
  });
}

class MatMulKernel : public Kernel {
 public:
  // `columns` is the output's last dimension when B is a constant (else -1).
  // `packed` (may be null) is B packed at load, when B is a constant float matrix and the CPU
  // runs PackedGemm.
  MatMulKernel(int64_t columns, std::shared_ptr<const PackedWeights> packed)
      : columns_(columns), packed_(std::move(packed)) {}

  // Fuses a following Add of a constant row vector (bias) and then an activation.
  std::unique_ptr<Kernel> FuseNext(const NodeContext& next) const override {
    if (columns_ <= 0 || next.input(0).dtype != DataType::kFloat) return nullptr;
    auto fused = std::make_unique<MatMulKernel>(*this);
    if (auto activation = Activation::FromNode(next)) {
      if (activation_.kind != Activation::Kind::kNone) return nullptr;
      fused->activation_ = *activation;
      return fused;
    }
    if (next.op_type() != "Add" || next.since_version() < 7 || next.input_count() != 2 ||
        !bias_.empty() || activation_.kind != Activation::Kind::kNone) {
      return nullptr;
    }
    const Tensor* c = next.constant_input(1);
    if (c == nullptr || c->dtype() != DataType::kFloat || c->count() != columns_) return nullptr;
    for (int d = 0; d + 1 < c->rank(); ++d) {
      if (c->dim(d) != 1) return nullptr;
    }
    // The bias must not raise the output rank.
    if (!next.input(0).rank_known || c->rank() > next.input(0).rank()) return nullptr;
    fused->bias_.assign(c->data<float>(), c->data<float>() + columns_);
    return fused;
  }

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    ASSIGN_OR_RETURN(std::vector<int64_t> out_shape, MatMulShape(a.shape(), b.shape()));
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, a.dtype(), out_shape));
    const bool has_bias = !bias_.empty();
    if (has_bias && (out_shape.empty() || out_shape.back() != static_cast<int64_t>(bias_.size()))) {
      return absl::InternalError("fused bias does not match the output");
    }
    ASSIGN_OR_RETURN(MatMulDims dims, MatMulDimsOf(a.shape(), b.shape()));
    const int64_t m = dims.m, k = dims.k, n = dims.n;
    const int64_t a_batches = Product(dims.batch_a, 0, dims.batch_a.size());
    const int64_t b_batches = Product(dims.batch_b, 0, dims.batch_b.size());
    // One product can be large: the run's deadline is checked between blocks of rows and
    // between batch items once they add up to a block's work.
    auto deadline = [&context] { return context.CheckDeadline(); };
    absl::Status status;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const T* ad = a.data<T>();
      const T* bd = b.data<T>();
      T* yd = y->data<T>();
      const T beta = has_bias ? T(1) : T(0);
      TaskPool* workers = context.pool().workers();
      if (b_batches == 1) {
        // Weights shared by every batch (then the batch dims are A's): one tall multiply, its
        // rows in parts that each start at the bias and end with the activation while the rows
        // are still in cache.
        const int64_t rows = a_batches * m;
        status = RunInParts(workers, rows, RowParts(workers, rows, n, k),
                             [&](int64_t first, int64_t last) -> absl::Status {
                               if constexpr (std::is_same_v<T, float>) {
                                 if (packed_ != nullptr && packed_->k() == k &&
                                     packed_->n() == n) {
                                   return MultiplyPacked(first, last, ad, yd, deadline);
                                 }
                               }
                               if (has_bias) FillBias(yd, first, last);
                               RETURN_IF_ERROR(GemmInRowBlocks<T>(
                                   false, false, last - first, n, k, T(1), ad + first * k, k, bd,
                                   n, beta, yd + first * n, n, deadline));
                               if constexpr (std::is_same_v<T, float>) {
                                 activation_.Apply(yd + first * n, (last - first) * n);
                               }
                               return absl::OkStatus();
                             });
        return;
      }
      if (has_bias) FillBias(yd, 0, y->count() / std::max<int64_t>(n, 1));
      status = MultiplyBroadcastBatches<T>(workers, dims, ad, bd, beta, yd, deadline);
      if constexpr (std::is_same_v<T, float>) {
        if (status.ok()) activation_.Apply(yd, y->count());
      }
    };
    if (!GemmTypes::Dispatch(a.dtype(), run)) {
      return absl::InternalError("MatMul dispatched on an unchecked type");
    }
    return status;
  }

 private:
  // Rows [first, last) of Y = A * the packed B (+ bias, then the activation: Gelu in
  // registers, another after), in blocks of rows with the deadline checked between them.
  template <typename Deadline>
  absl::Status MultiplyPacked(int64_t first, int64_t last, const float* ad, float* yd,
                              Deadline& deadline) const {
    const int64_t k = packed_->k(), n = packed_->n();
    const bool gelu = activation_.kind == Activation::Kind::kGelu;
    const int64_t block = std::max<int64_t>(1, kRowBlockMultiplyAdds / std::max<int64_t>(1, n * k));
    for (int64_t row = first; row < last; row += block) {
      if (row > first) RETURN_IF_ERROR(deadline());
      const int64_t count = std::min(block, last - row);
      PackedGemm(count, ad + row * k, k, *packed_, bias_.empty() ? nullptr : bias_.data(),
                 yd + row * n, n, gelu ? PackedEpilogue::kGelu : PackedEpilogue::kNone);
      if (!gelu) activation_.Apply(yd + row * n, count * n);
    }
    return absl::OkStatus();
  }

  // Starts output rows [first, last) at the fused bias (the Gemm then adds to it); a float
  // output only (the fusion takes float MatMuls only).
  template <typename T>
  void FillBias(T* yd, int64_t first, int64_t last) const {
    if constexpr (std::is_same_v<T, float>) {
      const int64_t n = static_cast<int64_t>(bias_.size());
      for (int64_t row = first; row < last; ++row) {
        std::memcpy(yd + row * n, bias_.data(), sizeof(float) * n);
      }
    }
  }

  int64_t columns_;
  std::shared_ptr<const PackedWeights> packed_;
  std::vector<float> bias_;
  Activation activation_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeMatMul(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(2, 2));
  RETURN_IF_ERROR(RequireType(context, 0, GemmTypes::Contains));
  RETURN_IF_ERROR(RequireSameType(context, 0, 1));
  const ValueInfo& a = context.input(0);
  const ValueInfo& b = context.input(1);
  if (a.rank_known && b.rank_known) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, MatMulShape(a.dims, b.dims));
    context.SetOutput(0, a.dtype, dims);
  } else {
    context.SetOutputUnranked(0, a.dtype);
  }
  const Tensor* weights = context.constant_input(1);
  const int64_t columns = weights != nullptr && weights->rank() >= 2 ? weights->shape().back() : -1;
  std::shared_ptr<const PackedWeights> packed;
  if (weights != nullptr && weights->rank() == 2 && weights->dtype() == DataType::kFloat &&
      weights->count() > 0 && context.pack_weights() && PackedGemmSupported()) {
    packed = std::make_shared<const PackedWeights>(weights->data<float>(), weights->dim(0),
                                                   weights->dim(1), weights->dim(1));
  }
  return MakeKernel<MatMulKernel>(columns, std::move(packed));
}

class GemmKernel : public Kernel {
 public:
  GemmKernel(float alpha, float beta, bool trans_a, bool trans_b)
      : alpha_(alpha), beta_(beta), trans_a_(trans_a), trans_b_(trans_b) {}
  absl::Status Compute(KernelContext& context) const override {
    const Tensor& a = context.input(0);
    const Tensor& b = context.input(1);
    if (a.rank() != 2 || b.rank() != 2) {
      return absl::InvalidArgumentError("A and B must be matrices");
    }
    const int64_t m = trans_a_ ? a.dim(1) : a.dim(0);
    const int64_t k = trans_a_ ? a.dim(0) : a.dim(1);
    const int64_t kb = trans_b_ ? b.dim(1) : b.dim(0);
    const int64_t n = trans_b_ ? b.dim(0) : b.dim(1);
    if (k != kb) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inner dimensions differ: ", ShapeToString(a.shape()), " x ", ShapeToString(b.shape())));
    }
    ASSIGN_OR_RETURN(Tensor * y, context.Output(0, a.dtype(), {m, n}));
    const Tensor* c = context.has_input(2) ? &context.input(2) : nullptr;
    if (c != nullptr) {
      auto shape = BroadcastShapes(c->shape(), {m, n});
      if (!shape.ok() || *shape != std::vector<int64_t>{m, n}) {
        return absl::InvalidArgumentError(absl::StrCat("C of shape ", ShapeToString(c->shape()),
                                                       " does not broadcast to [", m, ",", n, "]"));
      }
    }
    absl::Status status;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      T* yd = y->data<T>();
      T beta = T(0);
      if (c != nullptr && beta_ != 0.0f) {
        // Broadcast C into Y, then accumulate.
        const T* cd = c->data<T>();
        const std::vector<int64_t>& cs = c->shape();
        const int64_t rows = cs.size() == 2 ? cs[0] : 1;
        const int64_t cols = cs.empty() ? 1 : cs.back();
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            yd[i * n + j] = cd[(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
          }
        }
        beta = static_cast<T>(beta_);
      }
      status = GemmInRowParts<T>(context.pool().workers(), trans_a_, trans_b_, m, n, k,
                                 static_cast<T>(alpha_), a.data<T>(), a.dim(1), b.data<T>(),
                                 b.dim(1), beta, yd, n,
                                 [&context] { return context.CheckDeadline(); });
    };
    if (!GemmTypes::Dispatch(a.dtype(), run)) {
      return absl::InternalError("Gemm dispatched on an unchecked type");
    }
    return status;
  }

 private:
  float alpha_, beta_;
  bool trans_a_, trans_b_;
};

absl::StatusOr<std::unique_ptr<Kernel>> MakeGemm(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(context.since_version() >= 11 ? 2 : 3, 3));
  RETURN_IF_ERROR(RequireType(context, 0, GemmTypes::Contains));
  RETURN_IF_ERROR(RequireSameType(context, 0, 1));
  RETURN_IF_ERROR(RequireSameType(context, 0, 2));
  ASSIGN_OR_RETURN(float alpha, context.Float("alpha", 1.0f));
  ASSIGN_OR_RETURN(float beta, context.Float("beta", 1.0f));
  ASSIGN_OR_RETURN(int64_t trans_a, context.Int("transA", 0));
  ASSIGN_OR_RETURN(int64_t trans_b, context.Int("transB", 0));
  const ValueInfo& a = context.input(0);
  const ValueInfo& b = context.input(1);
  if ((a.rank_known && a.rank() != 2) || (b.rank_known && b.rank() != 2)) {
    return absl::InvalidArgumentError("A and B must be matrices");
  }
  const int64_t m = a.rank_known ? a.dims[trans_a ? 1 : 0] : -1;
  const int64_t n = b.rank_known ? b.dims[trans_b ? 0 : 1] : -1;
  if (a.rank_known && b.rank_known) {
    const int64_t ka = a.dims[trans_a ? 0 : 1], kb = b.dims[trans_b ? 1 : 0];
    if (ka >= 0 && kb >= 0 && ka != kb) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inner dimensions differ: ", ShapeToString(a.dims), " x ", ShapeToString(b.dims)));
    }
  }
  if (context.since_version() < 7) {
    // Gemm-6 broadcasts C only when the node says so; otherwise C is exactly [M, N].
    ASSIGN_OR_RETURN(int64_t broadcast, context.Int("broadcast", 0));
    const ValueInfo& c = context.input(2);
    if (broadcast == 0 && c.rank_known && m >= 0 && n >= 0 &&
        c.dims != std::vector<int64_t>{m, n}) {
      return absl::InvalidArgumentError(absl::StrCat("C of shape ", ShapeToString(c.dims),
                                                     " needs broadcast=1 for an output of shape ",
                                                     ShapeToString({m, n})));
    }
  }
  context.SetOutput(0, a.dtype, {m, n});
  return MakeKernel<GemmKernel>(alpha, beta, trans_a != 0, trans_b != 0);
}

}  // namespace

void RegisterMatMulKernels(KernelRegistry& registry) {
  registry.Register("MatMul", {1, 9, 13}, MakeMatMul);
  registry.Register("Gemm", {6, 7, 9, 11, 13}, MakeGemm);
}

}  // namespace cloister::runtime
