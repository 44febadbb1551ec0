// A compiled ONNX graph: values numbered into slots, decomposed patterns fused (fusion.h),
// constants folded, kernels built and ordered, nodes folded into the kernel that produces their
// input where the kernel allows (Kernel::FuseNext), and for each step the slots whose last use it
// is, so a run can hand their buffers back to the pool (liveness-based reuse).
//
// Threading: a Plan is immutable after CompileGraph(); Execute() is const and runs concurrently
// on many threads, each with its own BufferPool. Ownership: the Plan owns its kernels and
// constants; subgraph plans are shared with the kernels (If) that run them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/deadline.h"
#include "base/task_pool.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/row_analysis.h"
#include "enclave/runtime/tensor.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime {

// Free list of host buffers released by dead values, plus the device executor's per-run state
// when the model runs on one. Not thread-safe: one run uses it at a time. A model keeps a few
// between runs so that steady-state runs allocate nothing.
class BufferPool {
 public:
  BufferPool() = default;
  explicit BufferPool(std::unique_ptr<DeviceRun> device) : device_(std::move(device)) {}
  // The device executor's run state (stream, device memory); nullptr on the CPU executor.
  DeviceRun* device() const { return device_.get(); }
  // The threads a kernel may split its work over (intra-op parallelism), with the calling
  // thread among them; nullptr: the run is single-threaded. Borrowed from the model.
  TaskPool* workers() const { return workers_; }
  void set_workers(TaskPool* workers) { workers_ = workers; }

  // A buffer of at least `size` bytes, reused when a free one fits without much waste. A reused
  // buffer holds stale data from an earlier value of this model (the same tenant). nullptr when
  // memory is exhausted.
  std::shared_ptr<internal::Buffer> Acquire(size_t size);
  // Takes a host `buffer` back when nobody else holds it; otherwise drops this reference (device
  // buffers go back to their own pool when they die).
  void Release(std::shared_ptr<internal::Buffer> buffer);
  // Run boundaries: EndRun() frees buffers that no run used in the last `max_idle_runs` runs,
  // so a model whose shapes vary does not grow its pools without bound.
  void BeginRun() { ++run_; }
  void EndRun(uint64_t max_idle_runs);
  size_t free_size() const { return free_size_; }

 private:
  struct Entry {
    std::shared_ptr<internal::Buffer> buffer;
    uint64_t last_run;
  };
  std::multimap<size_t, Entry> free_;
  size_t free_size_ = 0;
  uint64_t run_ = 0;
  std::unique_ptr<DeviceRun> device_;
  TaskPool* workers_ = nullptr;
};

struct Step {
  const Kernel* kernel;
  std::string node_name;
  std::string op_type;
  std::vector<int> inputs;   // slot per input; -1 for an absent optional input
  std::vector<int> outputs;  // slot per output; -1 for an unused optional output
  std::vector<int> release;  // slots whose last use is this step
};

// Whether a kernel's output has the type and the known dimensions load-time inference promised.
bool MatchesInfo(const Tensor& tensor, const ValueInfo& info);

class Plan {
 public:
  // Runs the plan. `inputs` follow input_slots(); the result follows output_slots(), or only
  // `wanted_outputs` (indexes into output_slots()) when that is non-empty, running only the
  // steps they need. Kernel errors name the node.
  // When `step_seconds` is given it receives the wall time of each step (sized step_count()).
  // A run still going at `deadline` stops before its next step: DeadlineExceeded.
  absl::StatusOr<std::vector<Tensor>> Execute(std::vector<Tensor> inputs,
                                              const std::vector<int>& wanted_outputs,
                                              BufferPool& pool,
                                              std::vector<double>* step_seconds = nullptr,
                                              const Deadline& deadline = {}) const;
  const Step& step(size_t index) const { return steps_[index]; }

  const std::vector<int>& input_slots() const { return input_slots_; }
  const std::vector<int>& output_slots() const { return output_slots_; }
  const std::vector<std::string>& input_names() const { return input_names_; }
  const std::vector<std::string>& output_names() const { return output_names_; }
  const ValueInfo& slot_info(int slot) const { return slot_infos_[slot]; }
  size_t step_count() const { return steps_.size(); }
  // Main graphs: whether requests concatenated along axis 0 may run as one (row_analysis.h).
  const RowIndependence& row_independence() const { return rows_; }

 private:
  friend class GraphCompiler;

  // Execute's steps: which steps `outputs` need (empty: all), and one step's run over `values`.
  std::vector<bool> NeededSteps(const std::vector<int>& outputs) const;
  absl::Status RunStep(size_t s, std::vector<Tensor>& values, BufferPool& pool,
                       const Deadline& deadline, std::vector<double>* step_seconds) const;

  std::vector<ValueInfo> slot_infos_;
  std::vector<std::string> slot_names_;
  std::vector<int> constant_slots_;  // constants read by some step or output
  std::vector<int> input_slots_;
  std::vector<std::string> input_names_;
  std::vector<int> output_slots_;
  std::vector<std::string> output_names_;
  std::vector<Step> steps_;
  std::vector<int> producer_step_;  // per slot: the step that writes it, or -1
  std::vector<std::unique_ptr<Kernel>> kernels_;
  RowIndependence rows_;
};

struct CompileOptions {
  const Executor* executor = nullptr;
  int opset = 0;             // version of the default ONNX domain
  bool pack_weights = true;  // LoadOptions::pack_weights
};

// An outer-scope value a subgraph may read.
struct OuterValue {
  std::string name;
  ValueInfo info;
};

// Compiles `graph`. For the main graph `outer` is empty and the plan's inputs are the graph
// inputs that have no initializer. For a subgraph, `outer` lists the values it captures (its
// node's implicit inputs) and they are the plan's inputs; the subgraph's own declared inputs
// must be empty (If branches). Errors name the node and operator.
absl::StatusOr<std::shared_ptr<const Plan>> CompileGraph(const onnx::GraphProto& graph,
                                                         const CompileOptions& options,
                                                         const std::vector<OuterValue>& outer);

// The names a graph reads from enclosing scopes, in order of first use.
std::vector<std::string> FreeVariables(const onnx::GraphProto& graph);
// A node's implicit inputs: what its subgraphs read from enclosing scopes, each name once.
std::vector<std::string> ImplicitInputs(const onnx::NodeProto& node);

}  // namespace cloister::runtime
