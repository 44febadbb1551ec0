// Matrix products and windowed operators of the CUDA operator table: MatMul, Gemm and dense
// Conv through cuBLAS (FP32; row-major operands through the transposed column-major view),
// grouped and small Conv and MaxPool/AveragePool through our kernels.
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_ops_internal.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/window.h"

namespace cloister::gpu::cuda_ops_internal {
namespace {

using runtime::DataType;
using runtime::NodeContext;
using runtime::Tensor;

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

}  // namespace

void AddGemmConvOps(DeviceTable& table) {
  table["MatMul"] = MakeMatMul;
  table["Gemm"] = MakeGemm;
  table["Conv"] = MakeConv;
  table["MaxPool"] = PoolFactory(true);
  table["AveragePool"] = PoolFactory(false);
}

}  // namespace cloister::gpu::cuda_ops_internal
