#include "enclave/runtime/model.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/plan.h"
#include "onnx/onnx_pb.h"
#include "proto/wipe.h"

namespace cloister::runtime {
namespace {

// The newest default-domain opset whose operator versions the kernels know.
constexpr int kMaxOpset = 18;
// Idle buffer pools a model keeps for later runs (about the number of concurrent callers).
constexpr size_t kMaxIdlePools = 4;
// A pooled buffer no run has used for this many runs is freed.
constexpr uint64_t kMaxIdleRuns = 8;

TensorSpec SpecFor(const std::string& name, const ValueInfo& info) {
  TensorSpec spec{name, info.dtype, {}};
  if (info.rank_known) spec.shape = info.dims;
  return spec;
}

// OpenBLAS picks its kernels from the CPU model. Virtual machines that report a generic CPU
// ("Intel Xeon Processor") make it fall back to Prescott (SSE3) kernels, 2-3x slower than the
// AVX2/AVX-512 ones. The choice is made when the library loads, so it cannot be changed here;
// say once how to fix it (OPENBLAS_CORETYPE in the enclave's environment).
void WarnAboutGenericBlasKernels() {
  static const bool warned = [] {
    const char* core = openblas_get_corename();
    const std::string name = core != nullptr ? core : "";
    if ((name == "Prescott" || name == "Core2" || name == "Nehalem" || name == "Sandybridge") &&
        __builtin_cpu_supports("avx2")) {
      Log(LogLevel::kWarning, "blas_generic_kernels",
          {{"core", name},
           {"fix", "set OPENBLAS_CORETYPE=Haswell (AVX2) or SkylakeX (AVX-512) for this process"}});
    }
    return true;
  }();
  (void)warned;
}

}  // namespace

int BlasThreadsFor(int concurrent_runs) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return 0;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, concurrent_runs));
}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(ByteSpan onnx_bytes,
                                                   const LoadOptions& options) {
  if (onnx_bytes.size() > options.max_model_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model is ", onnx_bytes.size(), " bytes, over the limit of ", options.max_model_size));
  }
  if (onnx_bytes.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("model is over 2 GiB, which protobuf cannot parse");
  }
  onnx::ModelProto proto;
  // The parsed model is the tenant's plaintext (weights, names, doc strings): wiped on every
  // way out, once the runtime holds what it needs.
  absl::Cleanup wipe_proto = [&proto] { proto::WipeMessage(proto); };
  if (!proto.ParseFromArray(onnx_bytes.data(), static_cast<int>(onnx_bytes.size()))) {
    return absl::InvalidArgumentError("model bytes are not a valid ONNX ModelProto");
  }
  if (proto.ir_version() < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("model IR version ", proto.ir_version(), " is not supported (need >= 3)"));
  }
  int opset = 0;
  for (const onnx::OperatorSetIdProto& entry : proto.opset_import()) {
    if (entry.domain().empty() || entry.domain() == "ai.onnx") {
      opset = static_cast<int>(entry.version());
    }
  }
  if (opset == 0) return absl::InvalidArgumentError("model imports no default ONNX opset");
  if (opset > kMaxOpset) {
    return absl::UnimplementedError(absl::StrCat(
        "model opset ", opset, " is newer than the runtime supports (", kMaxOpset, ")"));
  }
  if (!proto.has_graph()) return absl::InvalidArgumentError("model has no graph");
  if (options.threads < 0) return absl::InvalidArgumentError("threads must be >= 0");
  const Executor* executor = options.executor != nullptr ? options.executor : &CpuExecutor();
  // More than one thread on the CPU executor: the kernels split their work over the model's
  // own threads, and BLAS runs single-threaded inside each part.
  const bool intra_op = options.threads > 1 && executor == &CpuExecutor();
  if (options.threads > 0) openblas_set_num_threads(intra_op ? 1 : options.threads);
  WarnAboutGenericBlasKernels();

  CompileOptions compile{executor, opset, options.pack_weights};
  ASSIGN_OR_RETURN(std::shared_ptr<const Plan> plan, CompileGraph(proto.graph(), compile, {}));

  std::unique_ptr<Model> model(new Model());
  model->executor_ = executor;
  if (intra_op) {
    model->workers_ = std::make_unique<TaskPool>(options.threads, TaskPool::ForIntraOp());
  }
  for (size_t i = 0; i < plan->input_slots().size(); ++i) {
    model->inputs_.push_back(
        SpecFor(plan->input_names()[i], plan->slot_info(plan->input_slots()[i])));
    model->input_index_[plan->input_names()[i]] = static_cast<int>(i);
  }
  for (size_t i = 0; i < plan->output_slots().size(); ++i) {
    model->outputs_.push_back(
        SpecFor(plan->output_names()[i], plan->slot_info(plan->output_slots()[i])));
    model->output_index_.emplace(plan->output_names()[i], static_cast<int>(i));
  }
  model->plan_ = std::move(plan);
  return model;
}

size_t Model::step_count() const { return plan_->step_count(); }

const RowIndependence& Model::row_independence() const { return plan_->row_independence(); }

absl::StatusOr<std::vector<Tensor>> Model::OrderInputs(
    const std::vector<std::pair<std::string, Tensor>>& inputs) const {
  std::vector<Tensor> ordered(inputs_.size());
  std::vector<bool> given(inputs_.size(), false);
  for (const auto& [name, tensor] : inputs) {
    auto it = input_index_.find(name);
    if (it == input_index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the model has no input named '", name, "'"));
    }
    const int index = it->second;
    if (given[index]) {
      return absl::InvalidArgumentError(absl::StrCat("input '", name, "' is given twice"));
    }
    const TensorSpec& spec = inputs_[index];
    if (tensor.dtype() != spec.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", name, "' must be ", TypeName(spec.dtype), ", got ", TypeName(tensor.dtype())));
    }
    const ValueInfo& info = plan_->slot_info(plan_->input_slots()[index]);
    if (info.rank_known) {
      bool ok = tensor.rank() == info.rank();
      for (int d = 0; ok && d < tensor.rank(); ++d) {
        ok = info.dims[d] < 0 || info.dims[d] == tensor.dim(d);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat("input '", name, "' must have shape ",
                                                       ShapeToString(info.dims), ", got ",
                                                       ShapeToString(tensor.shape())));
      }
    }
    if (tensor.count() > 0 && tensor.raw_data() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("input '", name, "' has no data"));
    }
    ordered[index] = tensor;
    given[index] = true;
  }
  for (size_t i = 0; i < given.size(); ++i) {
    if (!given[i]) {
      return absl::InvalidArgumentError(absl::StrCat("input '", inputs_[i].name, "' is missing"));
    }
  }
  return ordered;
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> Model::Run(
    const std::vector<std::pair<std::string, Tensor>>& inputs,
    const std::vector<std::string>& requested_outputs, const Deadline& deadline) const {
  return RunAndName(inputs, requested_outputs, deadline, /*download=*/true);
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> Model::RunLeavingOutputsOnDevice(
    const std::vector<std::pair<std::string, Tensor>>& inputs,
    const std::vector<std::string>& requested_outputs, const Deadline& deadline) const {
  return RunAndName(inputs, requested_outputs, deadline, /*download=*/false);
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> Model::RunAndName(
    const std::vector<std::pair<std::string, Tensor>>& inputs,
    const std::vector<std::string>& requested_outputs, const Deadline& deadline,
    bool download) const {
  ASSIGN_OR_RETURN(std::vector<Tensor> ordered, OrderInputs(inputs));
  std::vector<int> wanted;
  for (const std::string& name : requested_outputs) {
    auto it = output_index_.find(name);
    if (it == output_index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the model has no output named '", name, "'"));
    }
    wanted.push_back(it->second);
  }
  ASSIGN_OR_RETURN(std::vector<Tensor> results,
                   ExecuteOnce(std::move(ordered), wanted, nullptr, deadline, download));
  std::vector<std::pair<std::string, Tensor>> named;
  named.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const int index = wanted.empty() ? static_cast<int>(i) : wanted[i];
    Tensor& result = results[i];
    // Never hand out a host buffer the model or the caller still holds (constants,
    // passed-through inputs, the same output twice): callers may wipe host results. Device
    // results are only read (RunLeavingOutputsOnDevice).
    if (result.BufferShared() && !result.on_device()) result = result.Clone();
    named.emplace_back(outputs_[index].name, std::move(result));
  }
  return named;
}

absl::StatusOr<std::vector<Tensor>> Model::ExecuteOnce(std::vector<Tensor> ordered,
                                                       const std::vector<int>& wanted,
                                                       std::vector<double>* step_seconds,
                                                       const Deadline& deadline,
                                                       bool download) const {
  ASSIGN_OR_RETURN(std::unique_ptr<BufferPool> pool, TakePool());
  DeviceRun* device = pool->device();
  if (device == nullptr) {
    // The operators' jobs follow each other within microseconds: the intra-op threads wait
    // for the next one awake until the run ends.
    TaskPool::Hold hold(workers_.get());
    auto executed = plan_->Execute(std::move(ordered), wanted, *pool, step_seconds, deadline);
    RETURN_IF_ERROR(ReturnPool(std::move(pool)));
    return executed;
  }
  // On a device: upload, run, download; the device state finishes its run whatever failed.
  auto run = [&]() -> absl::StatusOr<std::vector<Tensor>> {
    for (Tensor& input : ordered) {
      ASSIGN_OR_RETURN(input, device->Upload(input));
    }
    ASSIGN_OR_RETURN(std::vector<Tensor> results,
                     plan_->Execute(std::move(ordered), wanted, *pool, step_seconds, deadline));
    if (download) {
      for (Tensor& result : results) {
        ASSIGN_OR_RETURN(result, device->Download(result));
      }
    }
    return results;
  };
  absl::StatusOr<std::vector<Tensor>> executed = run();
  ordered.clear();  // device copies of the inputs die before the run ends
  absl::Status returned = ReturnPool(std::move(pool));
  if (!executed.ok()) return executed.status();
  RETURN_IF_ERROR(returned);
  return executed;
}

absl::StatusOr<std::unique_ptr<BufferPool>> Model::TakePool() const {
  {
    absl::MutexLock lock(&pools_mutex_);
    if (!idle_pools_.empty()) {
      std::unique_ptr<BufferPool> pool = std::move(idle_pools_.back());
      idle_pools_.pop_back();
      pool->BeginRun();
      return pool;
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceRun> device, executor_->NewDeviceRun());
  auto pool = std::make_unique<BufferPool>(std::move(device));
  pool->set_workers(workers_.get());
  pool->BeginRun();
  return pool;
}

absl::Status Model::ReturnPool(std::unique_ptr<BufferPool> pool) const {
  pool->EndRun(kMaxIdleRuns);
  if (pool->device() != nullptr) {
    // A device whose queued work failed is not trusted with another run.
    RETURN_IF_ERROR(pool->device()->Finish(kMaxIdleRuns));
  }
  absl::MutexLock lock(&pools_mutex_);
  if (idle_pools_.size() < kMaxIdlePools) idle_pools_.push_back(std::move(pool));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Model::OperatorTime>> Model::Profile(
    const std::vector<std::pair<std::string, Tensor>>& inputs, int runs) const {
  ASSIGN_OR_RETURN(std::vector<Tensor> ordered, OrderInputs(inputs));
  std::map<std::string, OperatorTime> by_type;
  std::vector<double> seconds;
  for (int run = 0; run < runs; ++run) {
    RETURN_IF_ERROR(ExecuteOnce(ordered, {}, &seconds).status());
    for (size_t s = 0; s < seconds.size(); ++s) {
      OperatorTime& entry = by_type[plan_->step(s).op_type];
      entry.op_type = plan_->step(s).op_type;
      entry.seconds += seconds[s];
      ++entry.calls;
    }
  }
  std::vector<OperatorTime> result;
  for (auto& [type, entry] : by_type) result.push_back(entry);
  std::sort(result.begin(), result.end(),
            [](const OperatorTime& a, const OperatorTime& b) { return a.seconds > b.seconds; });
  return result;
}

}  // namespace cloister::runtime
