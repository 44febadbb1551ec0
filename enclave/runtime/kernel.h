// Kernels and the registry that maps an ONNX operator (type and version) to one.
//
// A kernel is built once per graph node when a model is loaded: its factory reads the node's
// attributes, checks input types and whatever shapes are known, infers the output types and
// shapes (ValueInfo, -1 for a dimension known only at run time) and may prepare constant inputs
// (pre-packed weights). An operator, version, attribute or type it cannot run is an error then,
// not at run time. Compute() then runs on every request.
//
// Threading: a built Kernel is immutable; Compute() is const and may run on many threads at
// once, each with its own KernelContext. The registry is filled once and then read-only.
// Ownership: the Plan owns its kernels; a KernelContext borrows the run's tensors.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/deadline.h"
#include "enclave/runtime/tensor.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime {

class Plan;
class BufferPool;

// What is known about a value when a model is loaded.
struct ValueInfo {
  DataType dtype = DataType::kFloat;
  bool rank_known = false;
  std::vector<int64_t> dims;       // valid when rank_known; -1 = known only at run time
  std::optional<Tensor> constant;  // set when the value is a constant (then dims are exact)

  static ValueInfo Unranked(DataType dtype) { return ValueInfo{dtype, false, {}, std::nullopt}; }
  static ValueInfo Shaped(DataType dtype, std::vector<int64_t> dims) {
    return ValueInfo{dtype, true, std::move(dims), std::nullopt};
  }
  int rank() const { return static_cast<int>(dims.size()); }
  bool fully_known() const;
  // The same type and shape, without the constant value.
  ValueInfo ShapeOnly() const { return ValueInfo{dtype, rank_known, dims, std::nullopt}; }
};

// The load-time view of one node: attributes, input infos, output infos to fill in.
class NodeContext {
 public:
  using SubgraphCompiler =
      std::function<absl::StatusOr<std::shared_ptr<const Plan>>(const onnx::GraphProto&)>;

  NodeContext(const onnx::NodeProto& node, int since_version, std::vector<ValueInfo> inputs,
              int explicit_input_count, SubgraphCompiler compiler);

  const onnx::NodeProto& node() const { return node_; }
  const std::string& op_type() const { return node_.op_type(); }
  // The operator version in force (the largest registered version <= the model's opset).
  int since_version() const { return since_version_; }
  // Whether kernels may keep packed copies of constant weights (LoadOptions::pack_weights).
  bool pack_weights() const { return pack_weights_; }
  void set_pack_weights(bool pack) { pack_weights_ = pack; }

  // Inputs as written in the node (an absent optional input has has_input() false). Inputs past
  // explicit_input_count() are outer-scope values that the node's subgraphs read.
  int input_count() const { return explicit_input_count_; }
  int total_input_count() const { return static_cast<int>(inputs_.size()); }
  bool has_input(int index) const;
  const ValueInfo& input(int index) const { return inputs_[index]; }
  // The constant value of input `index`, or nullptr when it is absent or known only at run time.
  const Tensor* constant_input(int index) const;
  int output_count() const { return node_.output_size(); }

  // Checks: input count within [min, max] (absent trailing inputs count as absent).
  absl::Status ExpectInputs(int min_count, int max_count) const;
  // Checks that input `index` has one of `allowed` types.
  absl::Status ExpectType(int index, std::initializer_list<DataType> allowed) const;

  // Attribute accessors. A missing attribute without a fallback, or one of the wrong kind, is an
  // InvalidArgument error naming it.
  bool has_attribute(std::string_view name) const { return Find(name) != nullptr; }
  absl::StatusOr<int64_t> Int(std::string_view name, std::optional<int64_t> fallback = {}) const;
  absl::StatusOr<float> Float(std::string_view name, std::optional<float> fallback = {}) const;
  absl::StatusOr<std::string> String(std::string_view name,
                                     std::optional<std::string> fallback = {}) const;
  absl::StatusOr<std::vector<int64_t>> Ints(
      std::string_view name, std::optional<std::vector<int64_t>> fallback = {}) const;
  absl::StatusOr<std::vector<float>> Floats(std::string_view name,
                                            std::optional<std::vector<float>> fallback = {}) const;
  absl::StatusOr<Tensor> TensorAttribute(std::string_view name) const;
  // Compiles the graph attribute `name` into a plan whose inputs are this node's implicit
  // (outer-scope) inputs, in order.
  absl::StatusOr<std::shared_ptr<const Plan>> Subgraph(std::string_view name) const;

  // Output declarations, one per node output; the factory must set each.
  void SetOutput(int index, ValueInfo info);
  void SetOutput(int index, DataType dtype, std::vector<int64_t> dims) {
    SetOutput(index, ValueInfo::Shaped(dtype, std::move(dims)));
  }
  void SetOutputUnranked(int index, DataType dtype) {
    SetOutput(index, ValueInfo::Unranked(dtype));
  }
  // Declares output `index` a constant known now (for example Shape of a fully known input).
  void SetConstantOutput(int index, Tensor value);
  std::vector<ValueInfo>& outputs() { return outputs_; }
  const std::vector<bool>& outputs_set() const { return outputs_set_; }
  // True when the factory declared an output past output_count(): the node lists fewer outputs
  // than its kernel writes.
  bool sets_unlisted_output() const { return sets_unlisted_output_; }

 private:
  const onnx::AttributeProto* Find(std::string_view name) const;

  const onnx::NodeProto& node_;
  int since_version_;
  std::vector<ValueInfo> inputs_;
  int explicit_input_count_;
  SubgraphCompiler compiler_;
  std::vector<ValueInfo> outputs_;
  std::vector<bool> outputs_set_;
  bool sets_unlisted_output_ = false;
  bool pack_weights_ = true;
};

// Largest single tensor a kernel may produce, in bytes (shapes can come from request data).
inline constexpr uint64_t kMaxOutputSize = uint64_t{1} << 32;

// The run-time view of one node execution: its inputs and a place for its outputs.
class KernelContext {
 public:
  KernelContext(std::vector<const Tensor*> inputs, std::vector<bool> input_dies, int output_count,
                BufferPool& pool);

  int input_count() const { return static_cast<int>(inputs_.size()); }
  bool has_input(int index) const { return index < input_count() && inputs_[index] != nullptr; }
  const Tensor& input(int index) const { return *inputs_[index]; }

  // Allocates output `index`. The contents are unspecified: the kernel writes every element.
  // Fails for a negative dimension or an impossible size (shapes can come from data).
  absl::StatusOr<Tensor*> Output(int index, DataType dtype, std::vector<int64_t> shape);
  // Like Output(), but takes over input `input_index`'s buffer when this is its last use and
  // nobody else holds it; only for kernels that read element i before writing element i.
  absl::StatusOr<Tensor*> OutputReusingInput(int index, int input_index, DataType dtype,
                                             std::vector<int64_t> shape);
  // Scratch memory for the duration of Compute (return it with pool().Release()).
  absl::StatusOr<std::shared_ptr<internal::Buffer>> Scratch(size_t size);
  // Sets output `index` to an existing tensor (for example a reshaped view of an input).
  void SetOutput(int index, Tensor value);

  BufferPool& pool() { return pool_; }
  std::vector<Tensor>& outputs() { return outputs_; }

  // The run's deadline. Kernels whose one step can run long (a convolution over many images, a
  // recurrent layer over a long sequence, an If branch, a large matrix product: gemm.h
  // GemmInRowBlocks) call CheckDeadline() between pieces of
  // work: DeadlineExceeded once it has passed, so a run does not wait for the step to end.
  void set_deadline(const Deadline& deadline) { deadline_ = deadline; }
  const Deadline& deadline() const { return deadline_; }
  absl::Status CheckDeadline() const {
    if (!deadline_.passed()) return absl::OkStatus();
    return absl::DeadlineExceededError("the run reached its deadline inside this step");
  }

 private:
  std::vector<const Tensor*> inputs_;
  std::vector<bool> input_dies_;
  std::vector<Tensor> outputs_;
  BufferPool& pool_;
  Deadline deadline_;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual absl::Status Compute(KernelContext& context) const = 0;

  // Load-time fusion: a kernel that computes this kernel followed by `next`, or nullptr when it
  // cannot. The compiler only asks when `next`'s first input is this kernel's only output, read
  // by nothing else, and `next`'s other inputs are constants.
  virtual std::unique_ptr<Kernel> FuseNext(const NodeContext& next) const { return nullptr; }
};

// A factory validates a node and builds its kernel; it must declare every output in `context`.
using KernelFactory = std::function<absl::StatusOr<std::unique_ptr<Kernel>>(NodeContext&)>;

// Operators by (type, version) in the default ONNX domain.
class KernelRegistry {
 public:
  // Registers `factory` for `op_type` at each of `since_versions` (ONNX schema versions whose
  // semantics the factory implements, reading NodeContext::since_version() where they differ).
  void Register(std::string op_type, std::initializer_list<int> since_versions,
                KernelFactory factory);

  struct Match {
    const KernelFactory* factory;
    int since_version;
  };
  // The entry with the largest since_version <= opset; NotFound (unknown operator) or
  // Unimplemented (known, but not at this opset) otherwise.
  absl::StatusOr<Match> Find(std::string_view op_type, int opset) const;
  std::vector<std::string> OperatorNames() const;

 private:
  struct Entry {
    int since_version;
    std::shared_ptr<KernelFactory> factory;
  };
  std::map<std::string, std::vector<Entry>, std::less<>> entries_;
};

// Broadcasts two shapes the numpy way; InvalidArgument when they are incompatible. Unknown (-1)
// dimensions give -1 unless the other side decides.
absl::StatusOr<std::vector<int64_t>> BroadcastShapes(const std::vector<int64_t>& a,
                                                     const std::vector<int64_t>& b);
// Normalises an axis in [-rank, rank) to [0, rank).
absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank);

}  // namespace cloister::runtime
