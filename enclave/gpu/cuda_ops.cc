#include "enclave/gpu/cuda_ops.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_kernels.h"
#include "enclave/gpu/cuda_ops_internal.h"
#include "enclave/runtime/plan.h"

namespace cloister::gpu {
namespace cuda_ops_internal {

using runtime::DataType;
using runtime::Tensor;

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

}  // namespace cuda_ops_internal

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

using cuda_ops_internal::DeviceCall;
using cuda_ops_internal::DeviceFactory;
using cuda_ops_internal::DeviceSpec;
using cuda_ops_internal::DeviceTable;

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

// Every family's device factories; operators of the CPU executor missing here run on the host.
DeviceTable BuildDeviceTable() {
  DeviceTable table;
  cuda_ops_internal::AddElementwiseOps(table);
  cuda_ops_internal::AddGemmConvOps(table);
  cuda_ops_internal::AddReduceOps(table);
  cuda_ops_internal::AddShapeOps(table);
  return table;
}

// Opset versions probed to find each CPU operator's registered versions.
constexpr int kMaxProbedOpset = 32;
constexpr int kFusedProbe = 1 << 20;

}  // namespace

void RegisterCudaKernels(const KernelRegistry& cpu, bool allow_host_fallback,
                         KernelRegistry& registry) {
  const DeviceTable table = BuildDeviceTable();
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
