// The enclave's ONNX inference runtime: loads a model from bytes, validates it completely (every
// operator, version, attribute and element type is checked when the model is loaded, never
// first at request time), infers shapes (batch and other dimensions may stay dynamic), folds
// constants, fuses what exporters decompose (LayerNorm, GELU, HardSwish; Conv/MatMul with the
// BatchNorm, bias, scale and activation after them), plans buffer reuse by liveness, and runs
// requests on the CPU executor or, when LoadOptions::executor names it, a device executor (then
// inputs are uploaded and outputs downloaded in every run; callers only see host tensors). Small
// and auditable by design: our own graph runtime over the ONNX protobuf classes and BLAS, no
// third-party inference engine.
//
// Threading: Model::Load may run on any thread. A loaded Model is immutable; Run() is const and
// may be called from many threads at once (each run has its own buffers, and they share the
// model's intra-op threads). BLAS threading is process-wide (see LoadOptions::threads).
// Ownership: Load returns a unique_ptr; the model does not keep the bytes it was loaded from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/deadline.h"
#include "base/task_pool.h"
#include "enclave/runtime/row_analysis.h"
#include "enclave/runtime/tensor.h"

namespace cloister::runtime {

class Plan;
class BufferPool;
class Executor;

struct TensorSpec {
  std::string name;
  DataType dtype = DataType::kFloat;
  std::vector<int64_t> shape;  // -1 = dynamic (known only per request)
};

struct LoadOptions {
  uint64_t max_model_size = uint64_t{1} << 30;
  // Threads one run may use; 0 leaves BLAS at the library default (all hardware threads).
  // Above 1 (CPU executor), the model keeps that many threads of its own (the caller's among
  // them) and its kernels split their work over them (the images and groups of a convolution,
  // the rows of a matrix product), calling BLAS single-threaded inside each part; OpenBLAS is
  // then set to one thread. OpenBLAS keeps one process-wide setting, so the last model loaded
  // with a non-zero value decides it.
  int threads = 0;
  // Kernels may keep copies of constant weights rearranged for their inner loops (today: a
  // MatMul's float B on CPUs with AVX-512, packed_gemm.h), which costs a second copy of those
  // weights in memory; false keeps one copy and multiplies through BLAS.
  bool pack_weights = true;
  // The executor whose kernels run the model (see FindExecutor); nullptr: the CPU executor.
  // It must outlive the model (executors from FindExecutor live for the whole process).
  const Executor* executor = nullptr;
};

// The BLAS threads for a CPU executor that runs `concurrent_runs` models side by side: the
// hardware threads shared out among them (at least 1). OpenBLAS runs concurrent calls from
// several threads one after another through its one thread pool, and its idle threads spin,
// so giving each run all the cores makes concurrent runs slower than one run per core. 0 (keep
// the library's setting) when OPENBLAS_NUM_THREADS is set: the operator chose.
int BlasThreadsFor(int concurrent_runs);

class Model {
 public:
  // Parses and validates `onnx_bytes`. InvalidArgument for a malformed or oversized model,
  // external tensor data, cycles, undefined inputs, duplicate definitions, contradictory shapes;
  // Unimplemented/NotFound for an operator, version or element type the runtime lacks. Errors
  // about a node name it and its operator.
  static absl::StatusOr<std::unique_ptr<Model>> Load(ByteSpan onnx_bytes,
                                                     const LoadOptions& options = {});
  ~Model();

  // Graph inputs (those without an initializer) and outputs, in graph order.
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }

  // Runs the graph. Every input is given once by name; an unknown, missing or repeated name, or a
  // tensor of the wrong element type, rank or fixed dimension, is InvalidArgument naming the
  // input. Returns all outputs in graph order, or `requested_outputs` in the order asked (an
  // unknown name is InvalidArgument). A kernel failure (for example a shape that only turns out
  // inconsistent at run time) is an error naming the node. A run still going at `deadline`
  // stops with DeadlineExceeded between two steps, and inside the steps that can run long:
  // between two images of a convolution, two time steps of an LSTM, two steps of an If branch,
  // two row blocks of a MatMul or Gemm (one image's convolution runs to its end).
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> Run(
      const std::vector<std::pair<std::string, Tensor>>& inputs,
      const std::vector<std::string>& requested_outputs = {},
      const Deadline& deadline = {}) const;

  // Like Run, for callers that move a batch's tensors to and from a device themselves
  // (enclave/batch_runner.h): inputs may already be device tensors (they are used in place), and
  // outputs a device executor computed stay in its memory (on_device() tensors that scrub
  // themselves when their last holder drops them). A device output may share its buffer with an
  // input or a constant: read it, never write it. Host outputs are as Run's. On the CPU executor
  // this is Run.
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> RunLeavingOutputsOnDevice(
      const std::vector<std::pair<std::string, Tensor>>& inputs,
      const std::vector<std::string>& requested_outputs = {},
      const Deadline& deadline = {}) const;

  // Whether the graph computes every row of its outputs from the same rows of its inputs alone,
  // so that requests concatenated along axis 0 may run as one; when not, why (row_analysis.h).
  const RowIndependence& row_independence() const;

  // Number of kernel invocations per run after constant folding (for tests and diagnostics).
  size_t step_count() const;

  // Diagnostics: runs the graph `runs` times and returns the total seconds spent per operator
  // type (one entry per step type, most expensive first), plus the call count per type.
  struct OperatorTime {
    std::string op_type;
    double seconds = 0;
    int calls = 0;
  };
  absl::StatusOr<std::vector<OperatorTime>> Profile(
      const std::vector<std::pair<std::string, Tensor>>& inputs, int runs) const;

 private:
  Model() = default;
  // Checks the named inputs against the specs and puts them in graph order.
  absl::StatusOr<std::vector<Tensor>> OrderInputs(
      const std::vector<std::pair<std::string, Tensor>>& inputs) const;

  // A pool from the idle list, or a new one (with a fresh device run state on a device
  // executor, which can fail).
  absl::StatusOr<std::unique_ptr<BufferPool>> TakePool() const;
  // Ends the pool's run and keeps it for later runs; a pool whose device run failed to finish
  // is dropped, and that error is returned.
  absl::Status ReturnPool(std::unique_ptr<BufferPool> pool) const;
  // Runs the plan on `ordered` inputs with a pool of its own; on a device executor uploads the
  // inputs and downloads the results.
  // With `download` false the results stay where the executor made them.
  absl::StatusOr<std::vector<Tensor>> ExecuteOnce(std::vector<Tensor> ordered,
                                                  const std::vector<int>& wanted,
                                                  std::vector<double>* step_seconds,
                                                  const Deadline& deadline = {},
                                                  bool download = true) const;
  // Run and RunLeavingOutputsOnDevice.
  absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> RunAndName(
      const std::vector<std::pair<std::string, Tensor>>& inputs,
      const std::vector<std::string>& requested_outputs, const Deadline& deadline,
      bool download) const;

  const Executor* executor_ = nullptr;
  std::shared_ptr<const Plan> plan_;
  // Buffer pools of finished runs, reused by later ones (bounded by kMaxIdlePools).
  std::unique_ptr<TaskPool> workers_;  // intra-op threads; null when runs are single-threaded
  mutable absl::Mutex pools_mutex_;
  mutable std::vector<std::unique_ptr<BufferPool>> idle_pools_ ABSL_GUARDED_BY(pools_mutex_);
  std::vector<TensorSpec> inputs_;
  std::vector<TensorSpec> outputs_;
  std::unordered_map<std::string, int> input_index_;
  std::unordered_map<std::string, int> output_index_;
};

}  // namespace cloister::runtime
