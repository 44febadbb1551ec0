// Internals of the CUDA executor's operator table (cuda_ops.h), shared by its source files:
// cuda_ops.cc (the kernel every operator gets, the helpers below and the table's assembly) and
// one file per operator family, each adding its device factories to the table:
// cuda_ops_elementwise.cc (unary, binary, Where, Cast), cuda_ops_gemm_conv.cc (MatMul, Gemm and
// Conv through cuBLAS, pooling), cuda_ops_reduce.cc (reductions, softmax, normalisation) and
// cuda_ops_shape.cc (data movement, views, shape queries, If).
//
// Threading: factories and device functions keep no state between calls; a DeviceCall belongs to
// one run of one node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_kernels.h"
#include "enclave/runtime/kernel.h"

namespace cloister::gpu::cuda_ops_internal {

// DeviceType and runtime::DataType share their order (checked in cuda_ops.cc).
inline DeviceType ToDevice(runtime::DataType dtype) {
  return static_cast<DeviceType>(static_cast<int>(dtype));
}

// One device execution of a node: its resolved inputs (device tensors, except the host-read
// ones) and where its outputs go.
struct DeviceCall {
  CudaRunState& run;
  runtime::KernelContext& context;
  const runtime::Kernel& cpu;
  std::vector<runtime::Tensor> in;
  std::vector<bool> present;

  cudaStream_t stream() const { return run.stream(); }
  absl::StatusOr<runtime::Tensor> Output(int index, runtime::DataType dtype,
                                         std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(runtime::Tensor tensor, run.NewTensor(dtype, std::move(shape)));
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
using DeviceFactory =
    std::function<absl::StatusOr<std::optional<DeviceSpec>>(runtime::NodeContext&)>;
// Device factories by operator name; operators missing here run on the host.
using DeviceTable = std::map<std::string, DeviceFactory>;

inline std::optional<DeviceSpec> Spec(DeviceFn fn, std::vector<int> host_inputs = {}) {
  return DeviceSpec{std::move(fn), std::move(host_inputs)};
}

template <typename T>
const T* Ptr(const runtime::Tensor& tensor) {
  return static_cast<const T*>(tensor.raw_data());
}
template <typename T>
T* Ptr(runtime::Tensor& tensor) {
  return static_cast<T*>(tensor.raw_data());
}

inline bool IsFloat(runtime::DataType dtype) { return dtype == runtime::DataType::kFloat; }
inline int SizeOf(const runtime::Tensor& tensor) {
  return static_cast<int>(runtime::ElementSize(tensor.dtype()));
}

// Host-read integer operand as int64 values.
std::vector<int64_t> HostInts(const runtime::Tensor& tensor);

std::vector<int64_t> DenseStrides(const std::vector<int64_t>& shape);

// InvalidArgument when `rank` is over kMaxRank.
absl::Status CheckRank(size_t rank);

// An index over `out_shape` with operands broadcast into it (numpy rules, aligned right).
// Operands past `shapes` (up to 3) are dense over out_shape.
absl::StatusOr<StridedIndex> BroadcastIndex(const std::vector<int64_t>& out_shape,
                                            const std::vector<std::vector<int64_t>>& shapes);

// Each family adds its operators to the table (cuda_ops.cc calls all four).
void AddElementwiseOps(DeviceTable& table);
void AddGemmConvOps(DeviceTable& table);
void AddReduceOps(DeviceTable& table);
void AddShapeOps(DeviceTable& table);

}  // namespace cloister::gpu::cuda_ops_internal
