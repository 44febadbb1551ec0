#include "enclave/gpu/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_kernels.h"
#include "enclave/runtime/plan.h"
#include "enclave/runtime/window.h"

namespace cloister::gpu {
namespace {

using runtime::DataType;
using runtime::Kernel;
using runtime::KernelContext;
using runtime::KernelFactory;
using runtime::KernelRegistry;
using runtime::NodeContext;
using runtime::Tensor;

static_assert(static_cast<int>(DataType::kFloat) == static_cast<int>(DeviceType::kFloat));
static_assert(static_cast<int>(DataType::kFloat16) == static_cast<int>(DeviceType::kHalf));
static_assert(static_cast<int>(DataType::kInt64) == static_cast<int>(DeviceType::kInt64));
static_assert(static_cast<int>(DataType::kBool) == static_cast<int>(DeviceType::kBool));

DeviceType ToDevice(DataType dtype) { return static_cast<DeviceType>(static_cast<int>(dtype)); }

// One device execution of a node: its resolved inputs (device tensors, except the host-read
// ones) and where its outputs go.
struct DeviceCall {
  CudaRunState& run;
  KernelContext& context;
  const Kernel& cpu;
  std::vector<Tensor> in;
  std::vector<bool> present;

  cudaStream_t stream() const { return run.stream(); }
  absl::StatusOr<Tensor> Output(int index, DataType dtype, std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(Tensor tensor, run.NewTensor(dtype, std::move(shape)));
    context.SetOutput(index, tensor);
    return tensor;
  }
};

using DeviceFn = std::function<absl::Status(DeviceCall&)>;
struct DeviceSpec {
  DeviceFn fn;
  std::vector<int> host_inputs;  // inputs read on the host (shape-like operands)
};
// nullopt: no device implementation for this node's types or attributes.
using DeviceFactory = std::function<absl::StatusOr<std::optional<DeviceSpec>>(NodeContext&)>;

template <typename T>
const T* Ptr(const Tensor& tensor) {
  return static_cast<const T*>(tensor.raw_data());
}
template <typename T>
T* Ptr(Tensor& tensor) {
  return static_cast<T*>(tensor.raw_data());
}

// Host-read integer operand as int64 values.
std::vector<int64_t> HostInts(const Tensor& tensor) {
  std::vector<int64_t> values(tensor.count());
  if (tensor.dtype() == DataType::kInt64) {
    for (int64_t i = 0; i < tensor.count(); ++i) values[i] = tensor.data<int64_t>()[i];
  } else if (tensor.dtype() == DataType::kInt32) {
    for (int64_t i = 0; i < tensor.count(); ++i) values[i] = tensor.data<int32_t>()[i];
  }
  return values;
}

std::vector<int64_t> DenseStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

absl::Status CheckRank(size_t rank) {
  if (rank > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is over the CUDA executor's limit of ", kMaxRank));
  }
  return absl::OkStatus();
}

// An index over `out_shape` with operands broadcast into it (numpy rules, aligned right).
// Operands past `shapes` (up to 3) are dense over out_shape.
absl::StatusOr<StridedIndex> BroadcastIndex(const std::vector<int64_t>& out_shape,
                                            const std::vector<std::vector<int64_t>>& shapes) {
  RETURN_IF_ERROR(CheckRank(out_shape.size()));
  StridedIndex index;
  index.rank = static_cast<int>(out_shape.size());
  for (int d = 0; d < index.rank; ++d) index.dims[d] = out_shape[d];
  const std::vector<int64_t> dense = DenseStrides(out_shape);
  for (size_t operand = 0; operand < 3; ++operand) {
    if (operand >= shapes.size()) {
      for (int d = 0; d < index.rank; ++d) index.strides[operand][d] = dense[d];
      continue;
    }
    const std::vector<int64_t>& shape = shapes[operand];
    const std::vector<int64_t> strides = DenseStrides(shape);
    const int shift = index.rank - static_cast<int>(shape.size());
    for (int d = 0; d < index.rank; ++d) {
      const int source = d - shift;
      index.strides[operand][d] = source < 0 || shape[source] == 1 ? 0 : strides[source];
    }
  }
  return index;
}

bool IsFloat(DataType dtype) { return dtype == DataType::kFloat; }

// ---------------------------------------------------------------------------------------------
// The kernel every operator gets.

class CudaKernel : public Kernel {
 public:
  CudaKernel(std::unique_ptr<Kernel> cpu, std::optional<DeviceSpec> spec,
             std::vector<std::optional<Tensor>> device_constants)
      : cpu_(std::move(cpu)),
        spec_(std::move(spec)),
        device_constants_(std::move(device_constants)) {}

  absl::Status Compute(KernelContext& context) const override {
    bool any_device = false;
    for (int i = 0; i < context.input_count(); ++i) {
      any_device = any_device || (context.has_input(i) && context.input(i).on_device());
    }
    // Host-resident values (shape arithmetic, constant folding) stay on the host.
    if (!any_device) return cpu_->Compute(context);
    auto* device = dynamic_cast<CudaRun*>(context.pool().device());
    if (device == nullptr) {
      return absl::InternalError("a device tensor reached a run without CUDA state");
    }
    CudaRunState& run = device->state();
    if (!spec_.has_value()) return HostFallback(context, run);
    DeviceCall call{run, context, *cpu_, {}, {}};
    call.in.resize(context.input_count());
    call.present.resize(context.input_count(), false);
    for (int i = 0; i < context.input_count(); ++i) {
      if (!context.has_input(i)) continue;
      call.present[i] = true;
      const Tensor& input = context.input(i);
      const bool host_read = std::find(spec_->host_inputs.begin(), spec_->host_inputs.end(), i) !=
                             spec_->host_inputs.end();
      if (host_read) {
        ASSIGN_OR_RETURN(call.in[i], run.Download(input));
      } else if (i < static_cast<int>(device_constants_.size()) && device_constants_[i]) {
        call.in[i] = *device_constants_[i];
      } else {
        ASSIGN_OR_RETURN(call.in[i], run.Upload(input));
      }
    }
    return spec_->fn(call);
  }

 private:
  // Runs the CPU kernel on host copies of the inputs; the outputs stay on the host.
  absl::Status HostFallback(KernelContext& context, CudaRunState& run) const {
    std::vector<Tensor> host(context.input_count());
    std::vector<const Tensor*> pointers(context.input_count(), nullptr);
    for (int i = 0; i < context.input_count(); ++i) {
      if (!context.has_input(i)) continue;
      ASSIGN_OR_RETURN(host[i], run.Download(context.input(i)));
      pointers[i] = &host[i];
    }
    const int output_count = static_cast<int>(context.outputs().size());
    KernelContext host_context(std::move(pointers), std::vector<bool>(host.size(), false),
                               output_count, context.pool());
    RETURN_IF_ERROR(cpu_->Compute(host_context));
    for (int i = 0; i < output_count; ++i) {
      context.SetOutput(i, std::move(host_context.outputs()[i]));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Kernel> cpu_;
  std::optional<DeviceSpec> spec_;
  std::vector<std::optional<Tensor>> device_constants_;
};

KernelFactory Wrap(KernelFactory cpu_factory, DeviceFactory device_factory,
                   bool allow_host_fallback) {
  return [cpu_factory = std::move(cpu_factory), device_factory = std::move(device_factory),
          allow_host_fallback](NodeContext& context) -> absl::StatusOr<std::unique_ptr<Kernel>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Kernel> cpu, cpu_factory(context));
    std::optional<DeviceSpec> spec;
    if (device_factory) {
      ASSIGN_OR_RETURN(spec, device_factory(context));
    }
    // A node whose inputs are all constant (a Constant node among them) folds at load on the
    // host and never runs, so it needs no device kernel.
    bool all_constant = true;
    for (int i = 0; i < context.total_input_count(); ++i) {
      const bool present = i >= context.input_count() || context.has_input(i);
      if (present && !context.input(i).constant.has_value()) all_constant = false;
    }
    if (!spec.has_value() && !all_constant) {
      if (!allow_host_fallback) {
        return absl::UnimplementedError(
            "the CUDA executor has no device kernel for this operator with these element "
            "types and attributes");
      }
      Log(LogLevel::kInfo, "cuda_host_fallback",
          {{"op", context.op_type()}, {"node", context.node().name()}});
    }
    // Constants go to the device once, now, unless the node folds or reads them on the host.
    std::vector<std::optional<Tensor>> device_constants(context.total_input_count());
    if (spec.has_value() && !all_constant) {
      for (int i = 0; i < context.total_input_count(); ++i) {
        if (i < context.input_count() && !context.has_input(i)) continue;
        const std::optional<Tensor>& constant = context.input(i).constant;
        if (!constant.has_value()) continue;
        if (std::find(spec->host_inputs.begin(), spec->host_inputs.end(), i) !=
            spec->host_inputs.end()) {
          continue;
        }
        ASSIGN_OR_RETURN(Tensor uploaded, UploadConstant(*constant));
        device_constants[i] = std::move(uploaded);
      }
    }
    return std::unique_ptr<Kernel>(
        new CudaKernel(std::move(cpu), std::move(spec), std::move(device_constants)));
  };
}

std::optional<DeviceSpec> Spec(DeviceFn fn, std::vector<int> host_inputs = {}) {
  return DeviceSpec{std::move(fn), std::move(host_inputs)};
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

DeviceFactory UnaryFactory(
    UnaryOp op, std::function<absl::Status(NodeContext&, float*, float*)> attributes = nullptr) {
  return [op, attributes](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    float alpha = 0.f, beta = 0.f;
    if (attributes) RETURN_IF_ERROR(attributes(node, &alpha, &beta));
    return Spec([op, alpha, beta](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
      return CudaStatus(
          LaunchUnary(op, alpha, beta, Ptr<float>(x), Ptr<float>(y), x.count(), call.stream()),
          "unary kernel");
    });
  };
}

DeviceFactory ClipFactory() {
  return [](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    float low = -std::numeric_limits<float>::infinity();
    float high = std::numeric_limits<float>::infinity();
    if (node.since_version() < 11) {
      ASSIGN_OR_RETURN(low, node.Float("min", low));
      ASSIGN_OR_RETURN(high, node.Float("max", high));
    }
    return Spec(
        [low, high](DeviceCall& call) -> absl::Status {
          float min_value = low, max_value = high;
          if (call.present.size() > 1 && call.present[1] && call.in[1].count() > 0) {
            min_value = call.in[1].data<float>()[0];
          }
          if (call.present.size() > 2 && call.present[2] && call.in[2].count() > 0) {
            max_value = call.in[2].data<float>()[0];
          }
          const Tensor& x = call.in[0];
          ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
          return CudaStatus(LaunchUnary(UnaryOp::kClip, min_value, max_value, Ptr<float>(x),
                                        Ptr<float>(y), x.count(), call.stream()),
                            "Clip kernel");
        },
        {1, 2});
  };
}

bool IsComparisonOp(BinaryOp op) { return op >= BinaryOp::kEqual; }

DeviceFactory BinaryFactory(BinaryOp op) {
  return [op](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (node.input_count() != 2 || !node.has_input(1)) return std::nullopt;
    const DataType a = node.input(0).dtype, b = node.input(1).dtype;
    if (a != b) return std::nullopt;
    const bool logic = op == BinaryOp::kAnd || op == BinaryOp::kOr || op == BinaryOp::kXor;
    bool supported = a == DataType::kFloat || a == DataType::kDouble || a == DataType::kInt32 ||
                     a == DataType::kInt64;
    if (op == BinaryOp::kPow || op == BinaryOp::kPRelu) supported = a == DataType::kFloat;
    if (logic) supported = a == DataType::kBool;
    if (op == BinaryOp::kEqual && a == DataType::kBool) supported = true;
    if (!supported) return std::nullopt;
    return Spec([op](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      const Tensor& y = call.in[1];
      ASSIGN_OR_RETURN(std::vector<int64_t> shape, runtime::BroadcastShapes(x.shape(), y.shape()));
      ASSIGN_OR_RETURN(StridedIndex index, BroadcastIndex(shape, {x.shape(), y.shape()}));
      const DataType out_type = IsComparisonOp(op) ? DataType::kBool : x.dtype();
      ASSIGN_OR_RETURN(Tensor out, call.Output(0, out_type, shape));
      return CudaStatus(LaunchBinary(op, ToDevice(x.dtype()), x.raw_data(), y.raw_data(),
                                     out.raw_data(), index, call.stream()),
                        "binary kernel");
    });
  };
}

absl::StatusOr<std::optional<DeviceSpec>> MakeWhere(NodeContext& node) {
  const DataType type = node.input(1).dtype;
  if (runtime::ElementSize(type) == 0) return std::nullopt;
  return Spec([](DeviceCall& call) -> absl::Status {
    const Tensor& cond = call.in[0];
    const Tensor& x = call.in[1];
    const Tensor& y = call.in[2];
    ASSIGN_OR_RETURN(std::vector<int64_t> xy, runtime::BroadcastShapes(x.shape(), y.shape()));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, runtime::BroadcastShapes(cond.shape(), xy));
    ASSIGN_OR_RETURN(StridedIndex index,
                     BroadcastIndex(shape, {cond.shape(), x.shape(), y.shape()}));
    ASSIGN_OR_RETURN(Tensor out, call.Output(0, x.dtype(), shape));
    return CudaStatus(
        LaunchWhere(Ptr<bool>(cond), x.raw_data(), y.raw_data(), out.raw_data(),
                    static_cast<int>(runtime::ElementSize(x.dtype())), index, call.stream()),
        "Where kernel");
  });
}

DeviceFactory CastFactory(bool like) {
  return [like](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    const DataType from = node.input(0).dtype;
    const DataType to = node.outputs()[0].dtype;  // the CPU factory declared it
    if (runtime::ElementSize(from) == 0 || runtime::ElementSize(to) == 0) return std::nullopt;
    return Spec([from, to](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, to, x.shape()));
      return CudaStatus(LaunchCast(ToDevice(from), ToDevice(to), x.raw_data(), y.raw_data(),
                                   x.count(), call.stream()),
                        "Cast kernel");
    });
  };
}

// ---------------------------------------------------------------------------------------------
// Matrix products (cuBLAS, FP32; row-major operands through the transposed column-major view).

// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C for row-major A, B, C.
absl::Status RowMajorGemm(cublasHandle_t blas, bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float* a, const float* b, float beta,
                          float* c) {
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    return absl::InvalidArgumentError("matrix dimension over 2^31");
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  return CublasStatus(
      cublasSgemm(blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, a,
                  lda, &beta, c, static_cast<int>(n)),
      "cublasSgemm");
}

absl::StatusOr<std::optional<DeviceSpec>> MakeMatMul(NodeContext& node) {
  if (!IsFloat(node.input(0).dtype) || !IsFloat(node.input(1).dtype)) return std::nullopt;
  return Spec([](DeviceCall& call) -> absl::Status {
    Tensor a = call.in[0];
    Tensor b = call.in[1];
    if (a.rank() == 0 || b.rank() == 0) return absl::InvalidArgumentError("MatMul of a scalar");
    const bool a_vector = a.rank() == 1, b_vector = b.rank() == 1;
    if (a_vector) a = a.Reshaped({1, a.dim(0)});
    if (b_vector) b = b.Reshaped({b.dim(0), 1});
    const int64_t m = a.dim(a.rank() - 2), k = a.dim(a.rank() - 1);
    const int64_t n = b.dim(b.rank() - 1);
    if (b.dim(b.rank() - 2) != k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MatMul inner dimensions differ: ", runtime::ShapeToString(call.in[0].shape()), " and ",
          runtime::ShapeToString(call.in[1].shape())));
    }
    std::vector<int64_t> a_batch(a.shape().begin(), a.shape().end() - 2);
    std::vector<int64_t> b_batch(b.shape().begin(), b.shape().end() - 2);
    ASSIGN_OR_RETURN(std::vector<int64_t> batch, runtime::BroadcastShapes(a_batch, b_batch));
    std::vector<int64_t> shape = batch;
    if (!a_vector) shape.push_back(m);
    if (!b_vector) shape.push_back(n);
    ASSIGN_OR_RETURN(Tensor out, call.Output(0, DataType::kFloat, shape));
    ASSIGN_OR_RETURN(StridedIndex index, BroadcastIndex(batch, {a_batch, b_batch}));
    int64_t batch_count = 1;
    for (int64_t d : batch) batch_count *= d;
    if (batch_count == 0 || m == 0 || n == 0) return absl::OkStatus();
    const float* a_data = Ptr<float>(a);
    const float* b_data = Ptr<float>(b);
    float* out_data = Ptr<float>(out);
    if (k == 0) {
      return CudaStatus(cudaMemsetAsync(out_data, 0, out.size(), call.stream()), "cudaMemsetAsync");
    }
    // Offsets of each batch's matrices (in matrices); uniform strides go to one batched call.
    std::vector<int64_t> a_offsets(batch_count), b_offsets(batch_count);
    for (int64_t i = 0; i < batch_count; ++i) {
      int64_t linear = i, a_offset = 0, b_offset = 0;
      for (int d = index.rank - 1; d >= 0; --d) {
        const int64_t coordinate = linear % index.dims[d];
        linear /= index.dims[d];
        a_offset += coordinate * index.strides[0][d];
        b_offset += coordinate * index.strides[1][d];
      }
      a_offsets[i] = a_offset;
      b_offsets[i] = b_offset;
    }
    bool uniform = true;
    const int64_t a_step = batch_count > 1 ? a_offsets[1] - a_offsets[0] : 0;
    const int64_t b_step = batch_count > 1 ? b_offsets[1] - b_offsets[0] : 0;
    for (int64_t i = 0; uniform && i < batch_count; ++i) {
      uniform = a_offsets[i] == i * a_step && b_offsets[i] == i * b_step;
    }
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch_count > INT32_MAX) {
      return absl::InvalidArgumentError("matrix dimension over 2^31");
    }
    const float one = 1.f, zero = 0.f;
    if (uniform) {
      return CublasStatus(
          cublasSgemmStridedBatched(call.run.blas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n),
                                    static_cast<int>(m), static_cast<int>(k), &one, b_data,
                                    static_cast<int>(n), b_step * k * n, a_data,
                                    static_cast<int>(k), a_step * m * k, &zero, out_data,
                                    static_cast<int>(n), m * n, static_cast<int>(batch_count)),
          "cublasSgemmStridedBatched");
    }
    for (int64_t i = 0; i < batch_count; ++i) {
      RETURN_IF_ERROR(RowMajorGemm(call.run.blas(), false, false, m, n, k, 1.f,
                                   a_data + a_offsets[i] * m * k, b_data + b_offsets[i] * k * n,
                                   0.f, out_data + i * m * n));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeGemm(NodeContext& node) {
  for (int i = 0; i < node.input_count(); ++i) {
    if (node.has_input(i) && !IsFloat(node.input(i).dtype)) return std::nullopt;
  }
  ASSIGN_OR_RETURN(int64_t trans_a, node.Int("transA", 0));
  ASSIGN_OR_RETURN(int64_t trans_b, node.Int("transB", 0));
  ASSIGN_OR_RETURN(float alpha, node.Float("alpha", 1.f));
  ASSIGN_OR_RETURN(float beta, node.Float("beta", 1.f));
  return Spec([trans_a, trans_b, alpha, beta](DeviceCall& call) -> absl::Status {
    const Tensor& a = call.in[0];
    const Tensor& b = call.in[1];
    if (a.rank() != 2 || b.rank() != 2) return absl::InvalidArgumentError("Gemm needs matrices");
    const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
    const int64_t n = trans_b ? b.dim(0) : b.dim(1);
    if ((trans_b ? b.dim(1) : b.dim(0)) != k) {
      return absl::InvalidArgumentError("Gemm inner dimensions differ");
    }
    ASSIGN_OR_RETURN(Tensor out, call.Output(0, DataType::kFloat, {m, n}));
    float c_weight = 0.f;
    if (call.present.size() > 2 && call.present[2] && beta != 0.f) {
      const Tensor& c = call.in[2];
      ASSIGN_OR_RETURN(std::vector<int64_t> shape, runtime::BroadcastShapes(c.shape(), {m, n}));
      if (shape != std::vector<int64_t>{m, n}) {
        return absl::InvalidArgumentError("Gemm's C does not broadcast to the output");
      }
      // Operand 0 is C broadcast, operand 2 the dense output.
      ASSIGN_OR_RETURN(StridedIndex index, BroadcastIndex({m, n}, {c.shape()}));
      RETURN_IF_ERROR(
          CudaStatus(LaunchStridedCopy(c.raw_data(), out.raw_data(), 4, index, call.stream()),
                     "Gemm bias copy"));
      c_weight = beta;
    }
    if (k == 0) {
      // No products: the output is beta * C (or zero).
      if (c_weight == 0.f) {
        return CudaStatus(cudaMemsetAsync(out.raw_data(), 0, out.size(), call.stream()),
                          "cudaMemsetAsync");
      }
      if (m * n > INT32_MAX) return absl::InvalidArgumentError("Gemm output over 2^31");
      return CublasStatus(
          cublasSscal(call.run.blas(), static_cast<int>(m * n), &c_weight, Ptr<float>(out), 1),
          "cublasSscal");
    }
    return RowMajorGemm(call.run.blas(), trans_a != 0, trans_b != 0, m, n, k, alpha, Ptr<float>(a),
                        Ptr<float>(b), c_weight, Ptr<float>(out));
  });
}

// ---------------------------------------------------------------------------------------------
// Convolution, pooling, normalisation.

WindowGeometry ToDeviceGeometry(const runtime::WindowGeometry& g, int64_t batch,
                                int64_t in_channels, int64_t out_channels, int64_t groups) {
  WindowGeometry device;
  device.spatial_rank = g.spatial_rank;
  device.batch = batch;
  device.in_channels = in_channels;
  device.out_channels = out_channels;
  device.groups = groups;
  for (int i = 0; i < 3; ++i) {
    device.in_dims[i] = g.input[i];
    device.out_dims[i] = g.output[i];
    device.kernel[i] = g.kernel[i];
    device.strides[i] = g.stride[i];
    device.dilations[i] = g.dilation[i];
    device.pads_begin[i] = g.pad_begin[i];
    device.pads_end[i] = g.pad_end[i];
  }
  return device;
}

std::vector<int64_t> Spatial(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin() + 2, shape.end());
}

absl::StatusOr<std::optional<DeviceSpec>> MakeConv(NodeContext& node) {
  for (int i = 0; i < node.input_count(); ++i) {
    if (node.has_input(i) && !IsFloat(node.input(i).dtype)) return std::nullopt;
  }
  ASSIGN_OR_RETURN(runtime::WindowAttributes attributes,
                   runtime::WindowAttributes::Read(node, true, false));
  ASSIGN_OR_RETURN(int64_t groups, node.Int("group", 1));
  if (groups < 1) return std::nullopt;
  return Spec([attributes, groups](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    const Tensor& w = call.in[1];
    if (x.rank() < 3 || x.rank() > 5 || w.rank() != x.rank()) {
      return absl::InvalidArgumentError("Conv needs inputs of rank 3 to 5 with matching weights");
    }
    const int64_t batch = x.dim(0), channels = x.dim(1), out_channels = w.dim(0);
    if (channels % groups != 0 || out_channels % groups != 0 || w.dim(1) * groups != channels) {
      return absl::InvalidArgumentError("Conv channels do not match the groups and weights");
    }
    ASSIGN_OR_RETURN(runtime::WindowGeometry g,
                     runtime::ComputeWindow(attributes, Spatial(x.shape()), Spatial(w.shape())));
    std::vector<int64_t> shape = {batch, out_channels};
    for (int64_t d : g.OutputDims()) shape.push_back(d);
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, shape));
    const WindowGeometry geometry = ToDeviceGeometry(g, batch, channels, out_channels, groups);
    const float* bias =
        call.present.size() > 2 && call.present[2] ? Ptr<float>(call.in[2]) : nullptr;
    if (bias != nullptr && call.in[2].count() != out_channels) {
      return absl::InvalidArgumentError("Conv bias size differs from the output channels");
    }
    const int64_t out_spatial = g.output_count();
    const int64_t group_in = channels / groups;
    const int64_t rows = group_in * g.kernel_count();
    // Grouped and small convolutions run directly; dense ones as im2col + cuBLAS.
    if (groups > 1 || rows < 32) {
      return CudaStatus(LaunchConvDirect(Ptr<float>(x), Ptr<float>(w), bias, Ptr<float>(y),
                                         geometry, call.stream()),
                        "Conv kernel");
    }
    ASSIGN_OR_RETURN(Tensor col, call.run.NewTensor(DataType::kFloat, {rows, out_spatial}));
    for (int64_t n = 0; n < batch; ++n) {
      RETURN_IF_ERROR(CudaStatus(
          LaunchIm2Col(Ptr<float>(x), Ptr<float>(col), geometry, n, 0, call.stream()), "im2col"));
      RETURN_IF_ERROR(RowMajorGemm(call.run.blas(), false, false, out_channels, out_spatial, rows,
                                   1.f, Ptr<float>(w), Ptr<float>(col), 0.f,
                                   Ptr<float>(y) + n * out_channels * out_spatial));
    }
    if (bias == nullptr) return absl::OkStatus();
    return CudaStatus(
        LaunchAddChannelBias(Ptr<float>(y), bias, batch, out_channels, out_spatial, call.stream()),
        "Conv bias");
  });
}

DeviceFactory PoolFactory(bool max_pool) {
  return [max_pool](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype) || node.output_count() != 1) return std::nullopt;
    const int version = node.since_version();
    ASSIGN_OR_RETURN(
        runtime::WindowAttributes attributes,
        runtime::WindowAttributes::Read(node, max_pool && version >= 10, version >= 10));
    ASSIGN_OR_RETURN(int64_t include_pad, node.Int("count_include_pad", 0));
    return Spec([attributes, max_pool, include_pad](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      if (x.rank() < 3 || x.rank() > 5) {
        return absl::InvalidArgumentError("pooling needs an input of rank 3 to 5");
      }
      ASSIGN_OR_RETURN(
          runtime::WindowGeometry g,
          runtime::ComputeWindow(attributes, Spatial(x.shape()), attributes.kernel_shape));
      std::vector<int64_t> shape = {x.dim(0), x.dim(1)};
      for (int64_t d : g.OutputDims()) shape.push_back(d);
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, shape));
      return CudaStatus(LaunchPool(Ptr<float>(x), Ptr<float>(y),
                                   ToDeviceGeometry(g, x.dim(0), x.dim(1), x.dim(1), 1), max_pool,
                                   include_pad != 0, call.stream()),
                        "pooling kernel");
    });
  };
}

// Reduces float `x` over `axes` (normalised, sorted) into a new output.
absl::Status ReduceInto(DeviceCall& call, ReduceOp op, const Tensor& x,
                        const std::vector<bool>& reduce_axis, bool keep_dims, int output) {
  RETURN_IF_ERROR(CheckRank(x.rank()));
  std::vector<int64_t> out_shape, kept_dims, kept_strides, reduced_dims, reduced_strides;
  const std::vector<int64_t> strides = DenseStrides(x.shape());
  for (int d = 0; d < x.rank(); ++d) {
    if (reduce_axis[d]) {
      if (keep_dims) out_shape.push_back(1);
      reduced_dims.push_back(x.dim(d));
      reduced_strides.push_back(strides[d]);
    } else {
      out_shape.push_back(x.dim(d));
      kept_dims.push_back(x.dim(d));
      kept_strides.push_back(strides[d]);
    }
  }
  ASSIGN_OR_RETURN(Tensor y, call.Output(output, DataType::kFloat, out_shape));
  StridedIndex kept, reduced;
  kept.rank = static_cast<int>(kept_dims.size());
  for (int d = 0; d < kept.rank; ++d) {
    kept.dims[d] = kept_dims[d];
    kept.strides[0][d] = kept_strides[d];
  }
  reduced.rank = static_cast<int>(reduced_dims.size());
  for (int d = 0; d < reduced.rank; ++d) {
    reduced.dims[d] = reduced_dims[d];
    reduced.strides[0][d] = reduced_strides[d];
  }
  return CudaStatus(LaunchReduce(op, Ptr<float>(x), Ptr<float>(y), kept, reduced, call.stream()),
                    "reduce kernel");
}

DeviceFactory ReduceFactory(ReduceOp op, int axes_input_since) {
  return [op, axes_input_since](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    ASSIGN_OR_RETURN(int64_t keep_dims, node.Int("keepdims", 1));
    ASSIGN_OR_RETURN(int64_t noop_with_empty_axes, node.Int("noop_with_empty_axes", 0));
    const bool axes_input = node.since_version() >= axes_input_since;
    std::vector<int64_t> attribute_axes;
    if (!axes_input) {
      ASSIGN_OR_RETURN(attribute_axes, node.Ints("axes", std::vector<int64_t>{}));
    }
    return Spec(
        [op, keep_dims, noop_with_empty_axes, axes_input,
         attribute_axes](DeviceCall& call) -> absl::Status {
          const Tensor& x = call.in[0];
          std::vector<int64_t> axes = attribute_axes;
          if (axes_input && call.present.size() > 1 && call.present[1]) {
            axes = HostInts(call.in[1]);
          }
          std::vector<bool> reduce_axis(x.rank(), axes.empty());
          if (axes.empty() && noop_with_empty_axes != 0) {
            reduce_axis.assign(x.rank(), false);
          }
          for (int64_t axis : axes) {
            ASSIGN_OR_RETURN(int normalized, runtime::NormalizeAxis(axis, x.rank()));
            reduce_axis[normalized] = true;
          }
          return ReduceInto(call, op, x, reduce_axis, keep_dims != 0, 0);
        },
        {1});
  };
}

DeviceFactory GlobalPoolFactory(ReduceOp op) {
  return [op](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    return Spec([op](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      if (x.rank() < 3) return absl::InvalidArgumentError("input needs at least 3 dimensions");
      std::vector<bool> reduce_axis(x.rank(), true);
      reduce_axis[0] = reduce_axis[1] = false;
      return ReduceInto(call, op, x, reduce_axis, true, 0);
    });
  };
}

DeviceFactory SoftmaxFactory(bool log) {
  return [log](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    if (!IsFloat(node.input(0).dtype)) return std::nullopt;
    const bool flatten = node.since_version() < 13;
    ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", flatten ? 1 : -1));
    return Spec([log, flatten, axis](DeviceCall& call) -> absl::Status {
      const Tensor& x = call.in[0];
      ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
      if (x.rank() == 0) {
        return CudaStatus(LaunchSoftmax(Ptr<float>(x), Ptr<float>(y), 1, 1, 1, log, call.stream()),
                          "Softmax kernel");
      }
      ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
      int64_t outer = 1, middle = 1, inner = 1;
      for (int d = 0; d < x.rank(); ++d) {
        if (d < a) {
          outer *= x.dim(d);
        } else if (d == a || flatten) {
          middle *= x.dim(d);
        } else {
          inner *= x.dim(d);
        }
      }
      return CudaStatus(
          LaunchSoftmax(Ptr<float>(x), Ptr<float>(y), outer, middle, inner, log, call.stream()),
          "Softmax kernel");
    });
  };
}

// Expands a per-feature vector (1 or row_size elements) to row_size elements on the device.
absl::StatusOr<Tensor> FeatureVector(DeviceCall& call, const Tensor& vector, int64_t row_size) {
  if (vector.count() == row_size) return vector;
  if (vector.count() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a scale or bias of ", vector.count(), " elements for rows of ", row_size));
  }
  ASSIGN_OR_RETURN(Tensor expanded, call.run.NewTensor(DataType::kFloat, {row_size}));
  StridedIndex index;
  index.rank = 1;
  index.dims[0] = row_size;
  index.strides[0][0] = 0;
  index.strides[2][0] = 1;
  RETURN_IF_ERROR(
      CudaStatus(LaunchStridedCopy(vector.raw_data(), expanded.raw_data(), 4, index, call.stream()),
                 "broadcast copy"));
  return expanded;
}

absl::StatusOr<std::optional<DeviceSpec>> MakeLayerNorm(NodeContext& node) {
  if (node.output_count() != 1) return std::nullopt;
  for (int i = 0; i < node.input_count(); ++i) {
    if (node.has_input(i) && !IsFloat(node.input(i).dtype)) return std::nullopt;
  }
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", -1));
  ASSIGN_OR_RETURN(float epsilon, node.Float("epsilon", 1e-5f));
  return Spec([axis, epsilon](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
    int64_t rows = 1, row_size = 1;
    for (int d = 0; d < x.rank(); ++d) (d < a ? rows : row_size) *= x.dim(d);
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
    ASSIGN_OR_RETURN(Tensor scale, FeatureVector(call, call.in[1], row_size));
    std::optional<Tensor> bias;
    if (call.present.size() > 2 && call.present[2]) {
      ASSIGN_OR_RETURN(bias, FeatureVector(call, call.in[2], row_size));
    }
    return CudaStatus(
        LaunchLayerNorm(Ptr<float>(x), Ptr<float>(scale), bias ? Ptr<float>(*bias) : nullptr,
                        Ptr<float>(y), rows, row_size, epsilon, call.stream()),
        "LayerNorm kernel");
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeBatchNorm(NodeContext& node) {
  if (node.output_count() != 1) return std::nullopt;
  for (int i = 0; i < 5; ++i) {
    if (!node.has_input(i) || !IsFloat(node.input(i).dtype)) return std::nullopt;
  }
  ASSIGN_OR_RETURN(int64_t training, node.Int("training_mode", 0));
  if (training != 0) return std::nullopt;
  ASSIGN_OR_RETURN(float epsilon, node.Float("epsilon", 1e-5f));
  return Spec([epsilon](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    if (x.rank() < 2) return absl::InvalidArgumentError("BatchNormalization needs rank >= 2");
    const int64_t channels = x.dim(1);
    for (int i = 1; i < 5; ++i) {
      if (call.in[i].count() != channels) {
        return absl::InvalidArgumentError("BatchNormalization parameter size differs from C");
      }
    }
    int64_t inner = 1;
    for (int d = 2; d < x.rank(); ++d) inner *= x.dim(d);
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, DataType::kFloat, x.shape()));
    return CudaStatus(LaunchBatchNorm(Ptr<float>(x), Ptr<float>(call.in[1]), Ptr<float>(call.in[2]),
                                      Ptr<float>(call.in[3]), Ptr<float>(call.in[4]), Ptr<float>(y),
                                      x.dim(0), channels, inner, epsilon, call.stream()),
                      "BatchNormalization kernel");
  });
}

// ---------------------------------------------------------------------------------------------
// Data movement.

int SizeOf(const Tensor& tensor) { return static_cast<int>(runtime::ElementSize(tensor.dtype())); }

absl::StatusOr<std::optional<DeviceSpec>> MakeTranspose(NodeContext& node) {
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, node.Ints("perm", std::vector<int64_t>{}));
  return Spec([perm](DeviceCall& call) -> absl::Status {
    const Tensor& x = call.in[0];
    RETURN_IF_ERROR(CheckRank(x.rank()));
    std::vector<int64_t> order = perm;
    if (order.empty()) {
      for (int d = x.rank() - 1; d >= 0; --d) order.push_back(d);
    }
    if (static_cast<int>(order.size()) != x.rank()) {
      return absl::InvalidArgumentError("perm does not match the input rank");
    }
    const std::vector<int64_t> strides = DenseStrides(x.shape());
    std::vector<int64_t> shape(x.rank());
    StridedIndex index;
    index.rank = x.rank();
    for (int d = 0; d < x.rank(); ++d) {
      if (order[d] < 0 || order[d] >= x.rank()) {
        return absl::InvalidArgumentError("perm holds an axis out of range");
      }
      shape[d] = x.dim(order[d]);
      index.dims[d] = shape[d];
      index.strides[0][d] = strides[order[d]];
    }
    const std::vector<int64_t> out_strides = DenseStrides(shape);
    for (int d = 0; d < x.rank(); ++d) index.strides[2][d] = out_strides[d];
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
    return CudaStatus(
        LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
        "Transpose kernel");
  });
}

// Copies `x` into the block of `out` starting at `begin` along `axis` (same other dims).
absl::Status CopyIntoAxis(DeviceCall& call, const Tensor& x, Tensor& out, int axis, int64_t begin) {
  RETURN_IF_ERROR(CheckRank(x.rank()));
  const std::vector<int64_t> in_strides = DenseStrides(x.shape());
  const std::vector<int64_t> out_strides = DenseStrides(out.shape());
  StridedIndex index;
  index.rank = x.rank();
  for (int d = 0; d < x.rank(); ++d) {
    index.dims[d] = x.dim(d);
    index.strides[0][d] = in_strides[d];
    index.strides[2][d] = out_strides[d];
  }
  index.offsets[2] = begin * out_strides[axis];
  return CudaStatus(
      LaunchStridedCopy(x.raw_data(), out.raw_data(), SizeOf(x), index, call.stream()),
      "Concat kernel");
}

absl::StatusOr<std::optional<DeviceSpec>> MakeConcat(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 1));
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  return Spec([axis](DeviceCall& call) -> absl::Status {
    const Tensor& first = call.in[0];
    ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, first.rank()));
    std::vector<int64_t> shape = first.shape();
    shape[a] = 0;
    for (size_t i = 0; i < call.in.size(); ++i) {
      const Tensor& x = call.in[i];
      if (x.rank() != first.rank()) return absl::InvalidArgumentError("Concat ranks differ");
      for (int d = 0; d < x.rank(); ++d) {
        if (d != a && x.dim(d) != first.dim(d)) {
          return absl::InvalidArgumentError("Concat inputs differ outside the axis");
        }
      }
      shape[a] += x.dim(a);
    }
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, first.dtype(), shape));
    int64_t begin = 0;
    for (const Tensor& x : call.in) {
      if (x.count() > 0) RETURN_IF_ERROR(CopyIntoAxis(call, x, y, a, begin));
      begin += x.dim(a);
    }
    return absl::OkStatus();
  });
}

// Copies the block [begin, begin + out dim) of `x` along `axis` into a new output.
absl::Status SliceAxis(DeviceCall& call, const Tensor& x, int axis, int64_t begin, int64_t count,
                       int output) {
  std::vector<int64_t> shape = x.shape();
  shape[axis] = count;
  ASSIGN_OR_RETURN(Tensor y, call.Output(output, x.dtype(), shape));
  const std::vector<int64_t> in_strides = DenseStrides(x.shape());
  const std::vector<int64_t> out_strides = DenseStrides(shape);
  StridedIndex index;
  index.rank = x.rank();
  for (int d = 0; d < x.rank(); ++d) {
    index.dims[d] = shape[d];
    index.strides[0][d] = in_strides[d];
    index.strides[2][d] = out_strides[d];
  }
  index.offsets[0] = begin * in_strides[axis];
  return CudaStatus(LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
                    "Split kernel");
}

absl::StatusOr<std::optional<DeviceSpec>> MakeSplit(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 0));
  std::vector<int64_t> attribute_split;
  if (node.since_version() < 13) {
    ASSIGN_OR_RETURN(attribute_split, node.Ints("split", std::vector<int64_t>{}));
  }
  const int outputs = node.output_count();
  return Spec(
      [axis, attribute_split, outputs](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        RETURN_IF_ERROR(CheckRank(x.rank()));
        ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
        std::vector<int64_t> split = attribute_split;
        if (call.present.size() > 1 && call.present[1]) split = HostInts(call.in[1]);
        const int64_t total = x.dim(a);
        if (split.empty()) {
          // Equal parts, the last one smaller when the axis does not divide (Split-18).
          const int64_t part = (total + outputs - 1) / outputs;
          for (int i = 0; i < outputs; ++i) {
            split.push_back(std::max<int64_t>(0, std::min(part, total - part * i)));
          }
        }
        int64_t sum = 0;
        for (int64_t s : split) sum += s;
        if (static_cast<int>(split.size()) != outputs || sum != total) {
          return absl::InvalidArgumentError("split sizes do not add up to the axis");
        }
        int64_t begin = 0;
        for (int i = 0; i < outputs; ++i) {
          RETURN_IF_ERROR(SliceAxis(call, x, a, begin, split[i], i));
          begin += split[i];
        }
        return absl::OkStatus();
      },
      {1});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeSlice(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  const bool attributes = node.since_version() < 10;
  std::vector<int64_t> attr_starts, attr_ends, attr_axes;
  if (attributes) {
    ASSIGN_OR_RETURN(attr_starts, node.Ints("starts"));
    ASSIGN_OR_RETURN(attr_ends, node.Ints("ends"));
    ASSIGN_OR_RETURN(attr_axes, node.Ints("axes", std::vector<int64_t>{}));
  }
  return Spec(
      [attributes, attr_starts, attr_ends, attr_axes](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        RETURN_IF_ERROR(CheckRank(x.rank()));
        std::vector<int64_t> starts = attr_starts, ends = attr_ends, axes = attr_axes, steps;
        auto present = [&](size_t i) { return call.present.size() > i && call.present[i]; };
        if (!attributes) {
          starts = HostInts(call.in[1]);
          ends = HostInts(call.in[2]);
          if (present(3)) axes = HostInts(call.in[3]);
          if (present(4)) steps = HostInts(call.in[4]);
        }
        if (axes.empty()) {
          for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
        }
        if (steps.empty()) steps.assign(starts.size(), 1);
        if (ends.size() != starts.size() || axes.size() != starts.size() ||
            steps.size() != starts.size()) {
          return absl::InvalidArgumentError("Slice starts, ends, axes and steps differ in length");
        }
        std::vector<int64_t> begin(x.rank(), 0), step(x.rank(), 1), shape = x.shape();
        for (size_t i = 0; i < starts.size(); ++i) {
          ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axes[i], x.rank()));
          const int64_t dim = x.dim(a);
          if (steps[i] == 0) return absl::InvalidArgumentError("Slice step is 0");
          int64_t start = starts[i], end = ends[i];
          if (start < 0) start += dim;
          if (end < 0) end += dim;
          if (steps[i] > 0) {
            start = std::clamp<int64_t>(start, 0, dim);
            end = std::clamp<int64_t>(end, 0, dim);
          } else {
            start = std::clamp<int64_t>(start, 0, dim - 1);
            end = std::clamp<int64_t>(end, -1, dim - 1);
          }
          int64_t count = 0;
          if (steps[i] > 0 && end > start) count = (end - start + steps[i] - 1) / steps[i];
          if (steps[i] < 0 && start > end) count = (start - end - steps[i] - 1) / (-steps[i]);
          begin[a] = start;
          step[a] = steps[i];
          shape[a] = count;
        }
        ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
        const std::vector<int64_t> in_strides = DenseStrides(x.shape());
        const std::vector<int64_t> out_strides = DenseStrides(shape);
        StridedIndex index;
        index.rank = x.rank();
        for (int d = 0; d < x.rank(); ++d) {
          index.dims[d] = shape[d];
          index.strides[0][d] = in_strides[d] * step[d];
          index.strides[2][d] = out_strides[d];
          index.offsets[0] += begin[d] * in_strides[d];
        }
        return CudaStatus(
            LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
            "Slice kernel");
      },
      {1, 2, 3, 4});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeGather(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 0));
  return Spec([axis](DeviceCall& call) -> absl::Status {
    const Tensor& data = call.in[0];
    const Tensor& indices = call.in[1];
    ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, data.rank()));
    std::vector<int64_t> shape(data.shape().begin(), data.shape().begin() + a);
    shape.insert(shape.end(), indices.shape().begin(), indices.shape().end());
    shape.insert(shape.end(), data.shape().begin() + a + 1, data.shape().end());
    ASSIGN_OR_RETURN(Tensor y, call.Output(0, data.dtype(), shape));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < a; ++d) outer *= data.dim(d);
    for (int d = a + 1; d < data.rank(); ++d) inner *= data.dim(d);
    return CudaStatus(
        LaunchGather(data.raw_data(), SizeOf(data), indices.raw_data(),
                     indices.dtype() == DataType::kInt64, outer, data.dim(a), inner,
                     indices.count(), y.raw_data(), call.run.error_flag(), call.stream()),
        "Gather kernel");
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeExpand(NodeContext& node) {
  if (runtime::ElementSize(node.input(0).dtype) == 0) return std::nullopt;
  return Spec(
      [](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                         runtime::BroadcastShapes(x.shape(), HostInts(call.in[1])));
        ASSIGN_OR_RETURN(StridedIndex index, BroadcastIndex(shape, {x.shape()}));
        ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
        return CudaStatus(
            LaunchStridedCopy(x.raw_data(), y.raw_data(), SizeOf(x), index, call.stream()),
            "Expand kernel");
      },
      {1});
}

absl::StatusOr<std::optional<DeviceSpec>> MakePad(NodeContext& node) {
  const DataType type = node.input(0).dtype;
  if (runtime::ElementSize(type) == 0 || runtime::ElementSize(type) > 8) return std::nullopt;
  ASSIGN_OR_RETURN(std::string mode_name, node.String("mode", "constant"));
  PadMode mode;
  if (mode_name == "constant") {
    mode = PadMode::kConstant;
  } else if (mode_name == "reflect") {
    mode = PadMode::kReflect;
  } else if (mode_name == "edge") {
    mode = PadMode::kEdge;
  } else {
    return std::nullopt;
  }
  const bool attributes = node.since_version() < 11;
  std::vector<int64_t> attr_pads;
  float attr_value = 0.f;
  if (attributes) {
    ASSIGN_OR_RETURN(attr_pads, node.Ints("pads"));
    ASSIGN_OR_RETURN(attr_value, node.Float("value", 0.f));
    if (type != DataType::kFloat) return std::nullopt;
  }
  return Spec(
      [mode, attributes, attr_pads, attr_value](DeviceCall& call) -> absl::Status {
        const Tensor& x = call.in[0];
        RETURN_IF_ERROR(CheckRank(x.rank()));
        auto present = [&](size_t i) { return call.present.size() > i && call.present[i]; };
        std::vector<int64_t> pads = attributes ? attr_pads : HostInts(call.in[1]);
        unsigned char constant[8] = {};
        if (attributes) {
          std::memcpy(constant, &attr_value, sizeof(float));
        } else if (present(2) && call.in[2].count() > 0) {
          std::memcpy(constant, call.in[2].raw_data(), runtime::ElementSize(x.dtype()));
        }
        std::vector<int64_t> axes;
        if (!attributes && present(3)) {
          for (int64_t axis : HostInts(call.in[3])) {
            ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
            axes.push_back(a);
          }
        } else {
          for (int d = 0; d < x.rank(); ++d) axes.push_back(d);
        }
        if (pads.size() != 2 * axes.size()) {
          return absl::InvalidArgumentError("Pad's pads have the wrong length");
        }
        std::vector<int64_t> begin(x.rank(), 0), shape = x.shape();
        for (size_t i = 0; i < axes.size(); ++i) {
          begin[axes[i]] = pads[i];
          shape[axes[i]] += pads[i] + pads[i + axes.size()];
          if (shape[axes[i]] < 0) return absl::InvalidArgumentError("Pad crops below zero");
        }
        ASSIGN_OR_RETURN(Tensor y, call.Output(0, x.dtype(), shape));
        const std::vector<int64_t> in_strides = DenseStrides(x.shape());
        StridedIndex index;
        index.rank = x.rank();
        for (int d = 0; d < x.rank(); ++d) {
          index.dims[d] = shape[d];
          index.strides[0][d] = in_strides[d];
        }
        return CudaStatus(LaunchPad(x.raw_data(), y.raw_data(), SizeOf(x), mode, constant, index,
                                    x.shape().data(), begin.data(), call.stream()),
                          "Pad kernel");
      },
      {1, 2, 3});
}

// ---------------------------------------------------------------------------------------------
// Views (no device work), shape queries (host outputs) and control flow.

// Output 0 as a view of input 0 with `shape` computed on the host.
using ShapeFn = std::function<absl::StatusOr<std::vector<int64_t>>(DeviceCall&)>;
std::optional<DeviceSpec> ViewSpec(ShapeFn shape_of, std::vector<int> host_inputs) {
  return Spec(
      [shape_of](DeviceCall& call) -> absl::Status {
        ASSIGN_OR_RETURN(std::vector<int64_t> shape, shape_of(call));
        ASSIGN_OR_RETURN(int64_t count, runtime::ElementCount(shape));
        if (count != call.in[0].count()) {
          return absl::InvalidArgumentError(absl::StrCat("cannot view ",
                                                         runtime::ShapeToString(call.in[0].shape()),
                                                         " as ", runtime::ShapeToString(shape)));
        }
        call.context.SetOutput(0, call.in[0].Reshaped(std::move(shape)));
        // Optional extra outputs (Dropout's mask) are declared by the CPU factory; none here.
        return absl::OkStatus();
      },
      std::move(host_inputs));
}

absl::StatusOr<std::optional<DeviceSpec>> MakeReshape(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t allow_zero, node.Int("allowzero", 0));
  std::vector<int64_t> attr_shape;
  const bool attribute = node.since_version() < 5;
  if (attribute) {
    ASSIGN_OR_RETURN(attr_shape, node.Ints("shape"));
  }
  return ViewSpec(
      [allow_zero, attribute,
       attr_shape](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> {
        const Tensor& x = call.in[0];
        std::vector<int64_t> shape = attribute ? attr_shape : HostInts(call.in[1]);
        int infer = -1;
        int64_t known = 1;
        for (size_t i = 0; i < shape.size(); ++i) {
          if (shape[i] == 0 && allow_zero == 0) {
            if (static_cast<int>(i) >= x.rank()) {
              return absl::InvalidArgumentError("Reshape copies a dimension the input lacks");
            }
            shape[i] = x.dim(static_cast<int>(i));
          }
          if (shape[i] == -1) {
            if (infer >= 0) return absl::InvalidArgumentError("Reshape has two -1 dimensions");
            infer = static_cast<int>(i);
          } else if (shape[i] < 0) {
            return absl::InvalidArgumentError("Reshape has a negative dimension");
          } else {
            known *= shape[i];
          }
        }
        if (infer >= 0) {
          if (known == 0 || x.count() % known != 0) {
            return absl::InvalidArgumentError("Reshape cannot infer the -1 dimension");
          }
          shape[infer] = x.count() / known;
        }
        return shape;
      },
      {1});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeFlatten(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t axis, node.Int("axis", 1));
  return ViewSpec(
      [axis](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> {
        const Tensor& x = call.in[0];
        int64_t a = axis < 0 ? axis + x.rank() : axis;
        if (a < 0 || a > x.rank()) return absl::InvalidArgumentError("Flatten axis out of range");
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < x.rank(); ++d) (d < a ? outer : inner) *= x.dim(d);
        return std::vector<int64_t>{outer, inner};
      },
      {});
}

DeviceFactory SqueezeFactory(bool unsqueeze) {
  return [unsqueeze](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    const bool attribute = node.since_version() < 13;
    std::vector<int64_t> attr_axes;
    if (attribute) {
      ASSIGN_OR_RETURN(attr_axes, node.Ints("axes", std::vector<int64_t>{}));
    }
    return ViewSpec(
        [unsqueeze, attribute,
         attr_axes](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> {
          const Tensor& x = call.in[0];
          std::vector<int64_t> axes = attr_axes;
          if (!attribute && call.present.size() > 1 && call.present[1]) {
            axes = HostInts(call.in[1]);
          }
          if (unsqueeze) {
            const int rank = x.rank() + static_cast<int>(axes.size());
            std::vector<bool> inserted(rank, false);
            for (int64_t axis : axes) {
              ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, rank));
              if (inserted[a]) return absl::InvalidArgumentError("Unsqueeze repeats an axis");
              inserted[a] = true;
            }
            std::vector<int64_t> shape;
            int source = 0;
            for (int d = 0; d < rank; ++d) shape.push_back(inserted[d] ? 1 : x.dim(source++));
            return shape;
          }
          std::vector<bool> removed(x.rank(), axes.empty());
          if (axes.empty()) {
            for (int d = 0; d < x.rank(); ++d) removed[d] = x.dim(d) == 1;
          }
          for (int64_t axis : axes) {
            ASSIGN_OR_RETURN(int a, runtime::NormalizeAxis(axis, x.rank()));
            if (x.dim(a) != 1) return absl::InvalidArgumentError("Squeeze of a dimension != 1");
            removed[a] = true;
          }
          std::vector<int64_t> shape;
          for (int d = 0; d < x.rank(); ++d) {
            if (!removed[d]) shape.push_back(x.dim(d));
          }
          return shape;
        },
        {1});
  };
}

absl::StatusOr<std::optional<DeviceSpec>> MakeIdentity(NodeContext& node) {
  if (node.output_count() != 1) return std::nullopt;  // Dropout with a mask: host
  return ViewSpec(
      [](DeviceCall& call) -> absl::StatusOr<std::vector<int64_t>> { return call.in[0].shape(); },
      {1, 2});
}

absl::StatusOr<std::optional<DeviceSpec>> MakeShape(NodeContext& node) {
  ASSIGN_OR_RETURN(int64_t start, node.Int("start", 0));
  const bool has_end = node.has_attribute("end");
  ASSIGN_OR_RETURN(int64_t end, node.Int("end", 0));
  return Spec([start, has_end, end](DeviceCall& call) -> absl::Status {
    const int64_t rank = call.in[0].rank();
    auto clamp = [rank](int64_t value) {
      if (value < 0) value += rank;
      return std::clamp<int64_t>(value, 0, rank);
    };
    const int64_t first = clamp(start), last = has_end ? clamp(end) : rank;
    std::vector<int64_t> dims;
    for (int64_t d = first; d < last; ++d) dims.push_back(call.in[0].dim(static_cast<int>(d)));
    ASSIGN_OR_RETURN(Tensor shape,
                     Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims));
    call.context.SetOutput(0, std::move(shape));  // a host value (shape arithmetic)
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<DeviceSpec>> MakeSize(NodeContext& node) {
  return Spec([](DeviceCall& call) -> absl::Status {
    ASSIGN_OR_RETURN(Tensor size, Tensor::FromVector<int64_t>({}, {call.in[0].count()}));
    call.context.SetOutput(0, std::move(size));
    return absl::OkStatus();
  });
}

// If: the condition is read on the host; the CPU kernel picks the branch, whose plan runs with
// this run's pool (so its CUDA kernels see the captured device values).
absl::StatusOr<std::optional<DeviceSpec>> MakeIf(NodeContext& node) {
  return Spec(
      [](DeviceCall& call) -> absl::Status {
        std::vector<const Tensor*> inputs;
        for (size_t i = 0; i < call.in.size(); ++i) {
          inputs.push_back(call.present[i] ? &call.in[i] : nullptr);
        }
        const int output_count = static_cast<int>(call.context.outputs().size());
        KernelContext branch(std::move(inputs), std::vector<bool>(call.in.size(), false),
                             output_count, call.context.pool());
        RETURN_IF_ERROR(call.cpu.Compute(branch));
        for (int i = 0; i < output_count; ++i) {
          call.context.SetOutput(i, std::move(branch.outputs()[i]));
        }
        return absl::OkStatus();
      },
      {0});
}

// ---------------------------------------------------------------------------------------------
// The table.

struct AttrUnary {
  const char* alpha_name;
  float alpha;
  const char* beta_name;
  float beta;
};

DeviceFactory UnaryWith(UnaryOp op, AttrUnary attrs) {
  return UnaryFactory(op, [attrs](NodeContext& node, float* alpha, float* beta) -> absl::Status {
    if (attrs.alpha_name != nullptr) {
      ASSIGN_OR_RETURN(*alpha, node.Float(attrs.alpha_name, attrs.alpha));
    }
    if (attrs.beta_name != nullptr) {
      ASSIGN_OR_RETURN(*beta, node.Float(attrs.beta_name, attrs.beta));
    }
    return absl::OkStatus();
  });
}

std::map<std::string, DeviceFactory> DeviceTable() {
  std::map<std::string, DeviceFactory> table;
  const std::pair<const char*, UnaryOp> plain[] = {
      {"Relu", UnaryOp::kRelu},
      {"Neg", UnaryOp::kNeg},
      {"Abs", UnaryOp::kAbs},
      {"Sign", UnaryOp::kSign},
      {"Sigmoid", UnaryOp::kSigmoid},
      {"Tanh", UnaryOp::kTanh},
      {"Erf", UnaryOp::kErf},
      {"Sqrt", UnaryOp::kSqrt},
      {"Exp", UnaryOp::kExp},
      {"Log", UnaryOp::kLog},
      {"Sin", UnaryOp::kSin},
      {"Cos", UnaryOp::kCos},
      {"Tan", UnaryOp::kTan},
      {"Asin", UnaryOp::kAsin},
      {"Acos", UnaryOp::kAcos},
      {"Atan", UnaryOp::kAtan},
      {"Sinh", UnaryOp::kSinh},
      {"Cosh", UnaryOp::kCosh},
      {"Asinh", UnaryOp::kAsinh},
      {"Acosh", UnaryOp::kAcosh},
      {"Atanh", UnaryOp::kAtanh},
      {"Floor", UnaryOp::kFloor},
      {"Ceil", UnaryOp::kCeil},
      {"Round", UnaryOp::kRound},
      {"Reciprocal", UnaryOp::kReciprocal},
      {"Softsign", UnaryOp::kSoftsign},
      {"Softplus", UnaryOp::kSoftplus},
      {"HardSwish", UnaryOp::kHardSwish},
  };
  for (const auto& [name, op] : plain) table[name] = UnaryFactory(op);
  table["HardSigmoid"] = UnaryWith(UnaryOp::kHardSigmoid, {"alpha", 0.2f, "beta", 0.5f});
  table["LeakyRelu"] = UnaryWith(UnaryOp::kLeakyRelu, {"alpha", 0.01f, nullptr, 0.f});
  table["Elu"] = UnaryWith(UnaryOp::kElu, {"alpha", 1.f, nullptr, 0.f});
  table["Celu"] = UnaryWith(UnaryOp::kCelu, {"alpha", 1.f, nullptr, 0.f});
  table["Selu"] = UnaryWith(
      UnaryOp::kSelu, {"alpha", 1.67326319217681884765625f, "gamma", 1.05070102214813232421875f});
  table["ThresholdedRelu"] = UnaryWith(UnaryOp::kThresholdedRelu, {"alpha", 1.f, nullptr, 0.f});
  table["Gelu"] = [](NodeContext& node) -> absl::StatusOr<std::optional<DeviceSpec>> {
    ASSIGN_OR_RETURN(std::string approximate, node.String("approximate", "none"));
    return UnaryFactory(approximate == "tanh" ? UnaryOp::kGeluTanh : UnaryOp::kGelu)(node);
  };
  table["Clip"] = ClipFactory();
  const std::pair<const char*, BinaryOp> binary[] = {
      {"Add", BinaryOp::kAdd},
      {"Sub", BinaryOp::kSub},
      {"Mul", BinaryOp::kMul},
      {"Div", BinaryOp::kDiv},
      {"Pow", BinaryOp::kPow},
      {"PRelu", BinaryOp::kPRelu},
      {"Max", BinaryOp::kMax},
      {"Min", BinaryOp::kMin},
      {"Equal", BinaryOp::kEqual},
      {"Less", BinaryOp::kLess},
      {"Greater", BinaryOp::kGreater},
      {"LessOrEqual", BinaryOp::kLessOrEqual},
      {"GreaterOrEqual", BinaryOp::kGreaterOrEqual},
      {"And", BinaryOp::kAnd},
      {"Or", BinaryOp::kOr},
      {"Xor", BinaryOp::kXor},
  };
  for (const auto& [name, op] : binary) table[name] = BinaryFactory(op);
  table["Where"] = MakeWhere;
  table["Cast"] = CastFactory(false);
  table["CastLike"] = CastFactory(true);
  table["MatMul"] = MakeMatMul;
  table["Gemm"] = MakeGemm;
  table["Conv"] = MakeConv;
  table["MaxPool"] = PoolFactory(true);
  table["AveragePool"] = PoolFactory(false);
  table["GlobalAveragePool"] = GlobalPoolFactory(ReduceOp::kMean);
  table["GlobalMaxPool"] = GlobalPoolFactory(ReduceOp::kMax);
  table["BatchNormalization"] = MakeBatchNorm;
  table["LayerNormalization"] = MakeLayerNorm;
  table["Softmax"] = SoftmaxFactory(false);
  table["LogSoftmax"] = SoftmaxFactory(true);
  table["ReduceSum"] = ReduceFactory(ReduceOp::kSum, 13);
  table["ReduceMean"] = ReduceFactory(ReduceOp::kMean, 18);
  table["ReduceMax"] = ReduceFactory(ReduceOp::kMax, 18);
  table["ReduceMin"] = ReduceFactory(ReduceOp::kMin, 18);
  table["ReduceProd"] = ReduceFactory(ReduceOp::kProd, 18);
  table["ReduceL1"] = ReduceFactory(ReduceOp::kL1, 18);
  table["ReduceL2"] = ReduceFactory(ReduceOp::kL2, 18);
  table["ReduceSumSquare"] = ReduceFactory(ReduceOp::kSumSquare, 18);
  table["ReduceLogSum"] = ReduceFactory(ReduceOp::kLogSum, 18);
  table["ReduceLogSumExp"] = ReduceFactory(ReduceOp::kLogSumExp, 18);
  table["Transpose"] = MakeTranspose;
  table["Concat"] = MakeConcat;
  table["Split"] = MakeSplit;
  table["Slice"] = MakeSlice;
  table["Gather"] = MakeGather;
  table["Expand"] = MakeExpand;
  table["Pad"] = MakePad;
  table["Reshape"] = MakeReshape;
  table["Flatten"] = MakeFlatten;
  table["Squeeze"] = SqueezeFactory(false);
  table["Unsqueeze"] = SqueezeFactory(true);
  table["Identity"] = MakeIdentity;
  table["Dropout"] = MakeIdentity;
  table["Shape"] = MakeShape;
  table["Size"] = MakeSize;
  table["If"] = MakeIf;
  return table;
}

// Opset versions probed to find each CPU operator's registered versions.
constexpr int kMaxProbedOpset = 32;
constexpr int kFusedProbe = 1 << 20;

}  // namespace

void RegisterCudaKernels(const KernelRegistry& cpu, bool allow_host_fallback,
                         KernelRegistry& registry) {
  const std::map<std::string, DeviceFactory> table = DeviceTable();
  for (const std::string& op : cpu.OperatorNames()) {
    std::set<int> versions;
    for (int opset = 1; opset <= kMaxProbedOpset; ++opset) {
      auto match = cpu.Find(op, opset);
      if (match.ok()) versions.insert(match->since_version);
    }
    auto fused = cpu.Find(op, kFusedProbe);
    if (fused.ok()) versions.insert(fused->since_version);
    auto device = table.find(op);
    for (int version : versions) {
      auto match = cpu.Find(op, version);
      CLOISTER_CHECK(match.ok());
      registry.Register(
          op, {version},
          Wrap(*match->factory, device != table.end() ? device->second : DeviceFactory(),
               allow_host_fallback));
    }
  }
}

}  // namespace cloister::gpu
