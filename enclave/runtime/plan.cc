#include "enclave/runtime/plan.h"

#include <algorithm>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/fusion.h"
#include "enclave/runtime/onnx_tensor.h"
#include "proto/wipe.h"

namespace cloister::runtime {

std::shared_ptr<internal::Buffer> BufferPool::Acquire(size_t size) {
  auto it = free_.lower_bound(size);
  // Reuse only when the waste is bounded, so small values do not pin large buffers.
  if (it != free_.end() && it->first <= size * 2 + 4096) {
    std::shared_ptr<internal::Buffer> buffer = std::move(it->second.buffer);
    free_size_ -= it->first;
    free_.erase(it);
    return buffer;
  }
  return internal::Buffer::Allocate(size);
}

void BufferPool::Release(std::shared_ptr<internal::Buffer> buffer) {
  if (buffer != nullptr && buffer.use_count() == 1 &&
      buffer->kind() == internal::MemoryKind::kHost) {
    const size_t capacity = buffer->capacity();
    free_size_ += capacity;
    free_.emplace(capacity, Entry{std::move(buffer), run_});
  }
}

void BufferPool::EndRun(uint64_t max_idle_runs) {
  for (auto it = free_.begin(); it != free_.end();) {
    if (run_ - it->second.last_run > max_idle_runs) {
      free_size_ -= it->first;
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

std::string NodeLabel(const onnx::NodeProto& node) {
  std::string name = node.name();
  for (int i = 0; name.empty() && i < node.output_size(); ++i) name = node.output(i);
  return absl::StrCat("node '", name, "' (", node.op_type(), ")");
}

absl::Status NodeError(const onnx::NodeProto& node, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(NodeLabel(node), ": ", status.message()));
}

void CollectFreeVariables(const onnx::GraphProto& graph, std::vector<std::string>& free,
                          std::unordered_set<std::string>& seen_free) {
  std::unordered_set<std::string> defined;
  for (const auto& input : graph.input()) defined.insert(input.name());
  for (const auto& initializer : graph.initializer()) defined.insert(initializer.name());
  for (const auto& node : graph.node()) {
    for (const auto& output : node.output()) defined.insert(output);
  }
  auto use = [&](const std::string& name) {
    if (name.empty() || defined.count(name) || seen_free.count(name)) return;
    seen_free.insert(name);
    free.push_back(name);
  };
  for (const auto& node : graph.node()) {
    for (const auto& input : node.input()) use(input);
    for (const auto& attribute : node.attribute()) {
      std::vector<const onnx::GraphProto*> subgraphs;
      if (attribute.has_g()) subgraphs.push_back(&attribute.g());
      for (const auto& g : attribute.graphs()) subgraphs.push_back(&g);
      for (const onnx::GraphProto* subgraph : subgraphs) {
        std::vector<std::string> inner;
        std::unordered_set<std::string> inner_seen;
        CollectFreeVariables(*subgraph, inner, inner_seen);
        for (const std::string& name : inner) use(name);
      }
    }
  }
  for (const auto& output : graph.output()) use(output.name());
}

bool HasSubgraph(const onnx::NodeProto& node) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.has_g() || attribute.graphs_size() > 0) return true;
  }
  return false;
}

absl::StatusOr<ValueInfo> InfoFromValueInfoProto(const onnx::ValueInfoProto& value) {
  if (!value.type().has_tensor_type()) {
    return absl::InvalidArgumentError(absl::StrCat("value '", value.name(),
                                                   "' is not a tensor (sequences and maps are not "
                                                   "supported)"));
  }
  const auto& tensor_type = value.type().tensor_type();
  auto dtype = DataTypeFromOnnx(tensor_type.elem_type());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("value '", value.name(), "': ", dtype.status().message()));
  }
  if (*dtype == DataType::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat("value '", value.name(), "': string tensors are not supported"));
  }
  if (!tensor_type.has_shape()) return ValueInfo::Unranked(*dtype);
  std::vector<int64_t> dims;
  for (const auto& dim : tensor_type.shape().dim()) {
    if (dim.has_dim_value()) {
      if (dim.dim_value() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("value '", value.name(), "' declares a negative dimension"));
      }
      dims.push_back(dim.dim_value());
    } else {
      dims.push_back(-1);
    }
  }
  return ValueInfo::Shaped(*dtype, std::move(dims));
}

// Combines what a kernel inferred with what the model declares; a contradiction is an error.
absl::StatusOr<ValueInfo> MergeDeclared(const ValueInfo& inferred, const ValueInfo& declared,
                                        const std::string& name) {
  if (inferred.dtype != declared.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("value '", name, "' is declared ",
                                                   TypeName(declared.dtype), " but computes ",
                                                   TypeName(inferred.dtype)));
  }
  if (!declared.rank_known) return inferred;
  if (!inferred.rank_known) {
    ValueInfo merged = declared;
    merged.constant = inferred.constant;
    return merged;
  }
  if (inferred.rank() != declared.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("value '", name, "' is declared with shape ", ShapeToString(declared.dims),
                     " but computes shape ", ShapeToString(inferred.dims)));
  }
  ValueInfo merged = inferred;
  for (int i = 0; i < merged.rank(); ++i) {
    if (merged.dims[i] < 0) {
      merged.dims[i] = declared.dims[i];
    } else if (declared.dims[i] >= 0 && declared.dims[i] != merged.dims[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("value '", name, "' is declared with shape ", ShapeToString(declared.dims),
                       " but computes shape ", ShapeToString(inferred.dims)));
    }
  }
  return merged;
}

}  // namespace

// Checks a kernel's output against what the load-time inference promised.
bool MatchesInfo(const Tensor& tensor, const ValueInfo& info) {
  if (tensor.dtype() != info.dtype) return false;
  if (!info.rank_known) return true;
  if (tensor.rank() != info.rank()) return false;
  for (int i = 0; i < tensor.rank(); ++i) {
    if (info.dims[i] >= 0 && info.dims[i] != tensor.dim(i)) return false;
  }
  return true;
}


std::vector<std::string> FreeVariables(const onnx::GraphProto& graph) {
  std::vector<std::string> free;
  std::unordered_set<std::string> seen;
  CollectFreeVariables(graph, free, seen);
  return free;
}

std::vector<std::string> ImplicitInputs(const onnx::NodeProto& node) {
  std::vector<std::string> names;
  std::unordered_set<std::string> seen;
  for (const auto& attribute : node.attribute()) {
    std::vector<const onnx::GraphProto*> subgraphs;
    if (attribute.has_g()) subgraphs.push_back(&attribute.g());
    for (const auto& g : attribute.graphs()) subgraphs.push_back(&g);
    for (const onnx::GraphProto* subgraph : subgraphs) {
      for (const std::string& name : FreeVariables(*subgraph)) {
        if (seen.insert(name).second) names.push_back(name);
      }
    }
  }
  return names;
}

class GraphCompiler {
 public:
  explicit GraphCompiler(const CompileOptions& options) : options_(options) {}
  // The rewritten copy of the graph is the tenant's plaintext (names, initializers): wiped
  // before it is freed.
  ~GraphCompiler() {
    proto::WipeMessage(rewritten_.graph);
    for (auto& [index, fused] : rewritten_.fused) {
      for (auto& node : fused.originals) proto::WipeMessage(node);
    }
  }

  absl::StatusOr<std::shared_ptr<const Plan>> Compile(const onnx::GraphProto& graph,
                                                      const std::vector<OuterValue>& outer);

 private:
  absl::StatusOr<int> NewSlot(const std::string& name, ValueInfo info) {
    if (!name.empty() && scope_.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("value '", name, "' is defined more than once"));
    }
    const int slot = static_cast<int>(plan_->slot_infos_.size());
    plan_->slot_infos_.push_back(std::move(info));
    plan_->slot_names_.push_back(name);
    plan_->producer_step_.push_back(-1);
    if (!name.empty()) scope_[name] = slot;
    return slot;
  }
  absl::StatusOr<std::vector<int>> SortNodes(const onnx::GraphProto& graph);
  // Compiles the node at `index` of the rewritten graph (a fused node falls back to its
  // originals when its kernel refuses it).
  absl::Status CompileIndexed(const onnx::GraphProto& graph, int index);
  // `fused` marks a node created by FuseDecomposedOperators; `allow_epilogue` permits folding
  // the node into the step that produces its first input.
  absl::Status CompileNode(const onnx::NodeProto& node, bool fused, bool allow_epilogue);
  // Tries to fold `node` (already validated in `context`) into the step producing its first
  // input; true when it did.
  absl::StatusOr<bool> FuseIntoProducer(const onnx::NodeProto& node, NodeContext& context,
                                        const std::vector<int>& input_slots);
  absl::Status FoldNode(const onnx::NodeProto& node, const Kernel& kernel,
                        const std::vector<int>& input_slots, std::vector<ValueInfo>& outputs);
  void PlanLiveness();
  // CompileNode's steps: the slots and infos of the node's inputs (implicit ones too, which
  // also go to `captured`); the check that the kernel set exactly the listed outputs; a slot
  // per output; the step itself.
  absl::Status GatherInputs(const onnx::NodeProto& node, std::vector<int>& input_slots,
                            std::vector<ValueInfo>& input_infos,
                            std::vector<OuterValue>& captured) const;
  static absl::Status CheckOutputsSet(const onnx::NodeProto& node, const NodeContext& context);
  absl::StatusOr<std::vector<int>> NewOutputSlots(const onnx::NodeProto& node,
                                                  std::vector<ValueInfo>& outputs);
  void AddStep(const onnx::NodeProto& node, std::unique_ptr<Kernel> kernel,
               std::vector<int> input_slots, std::vector<int> output_slots);
  // Compile's steps: slots for the initializers, then for the graph inputs and the declared
  // infos; the graph outputs bound to their slots.
  absl::Status AddInitializers(const onnx::GraphProto& graph,
                               std::unordered_set<std::string>& initializer_names);
  absl::Status AddInputsAndDeclarations(const onnx::GraphProto& graph, bool is_subgraph,
                                        const std::unordered_set<std::string>& initializer_names);
  absl::Status BindOutputs(const onnx::GraphProto& graph);

  const CompileOptions& options_;
  std::shared_ptr<Plan> plan_;
  std::unordered_map<std::string, int> scope_;
  std::unordered_map<std::string, ValueInfo> declared_;  // value_info and graph outputs
  RewriteResult rewritten_;
  std::unordered_map<std::string, int> readers_;  // per value: reading nodes + graph outputs
};

// Operator version used to look up the kernels of fused nodes (they are not user operators).
constexpr int kFusedOpset = 1 << 20;

absl::StatusOr<std::vector<int>> GraphCompiler::SortNodes(const onnx::GraphProto& graph) {
  const int node_count = graph.node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < node_count; ++i) {
    for (const std::string& output : graph.node(i).output()) {
      if (output.empty()) continue;
      if (scope_.count(output) || !producer.emplace(output, i).second) {
        return NodeError(graph.node(i),
                         absl::InvalidArgumentError(absl::StrCat(
                             "output '", output, "' is already defined elsewhere in the graph")));
      }
    }
  }
  std::vector<std::vector<int>> consumers(node_count);
  std::vector<int> pending(node_count, 0);
  for (int i = 0; i < node_count; ++i) {
    const onnx::NodeProto& node = graph.node(i);
    std::vector<std::string> reads(node.input().begin(), node.input().end());
    for (std::string& name : ImplicitInputs(node)) reads.push_back(std::move(name));
    if (auto fused = rewritten_.fused.find(i); fused != rewritten_.fused.end()) {
      reads.insert(reads.end(), fused->second.reads.begin(), fused->second.reads.end());
    }
    std::set<int> dependencies;
    for (const std::string& name : reads) {
      if (name.empty() || scope_.count(name)) continue;
      auto it = producer.find(name);
      if (it == producer.end()) {
        return NodeError(node, absl::InvalidArgumentError(absl::StrCat(
                                   "input '", name,
                                   "' is not produced by any node, initializer or graph input")));
      }
      dependencies.insert(it->second);
    }
    for (int dependency : dependencies) {
      if (dependency == i) {
        return NodeError(node, absl::InvalidArgumentError("the node reads its own output"));
      }
      consumers[dependency].push_back(i);
      ++pending[i];
    }
  }
  // Kahn's algorithm, keeping the file's order among ready nodes.
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < node_count; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  order.reserve(node_count);
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int consumer : consumers[i]) {
      if (--pending[consumer] == 0) ready.push(consumer);
    }
  }
  if (static_cast<int>(order.size()) != node_count) {
    for (int i = 0; i < node_count; ++i) {
      if (pending[i] > 0) {
        return NodeError(graph.node(i),
                         absl::InvalidArgumentError("the graph has a cycle through this node"));
      }
    }
  }
  return order;
}

absl::Status GraphCompiler::FoldNode(const onnx::NodeProto& node, const Kernel& kernel,
                                     const std::vector<int>& input_slots,
                                     std::vector<ValueInfo>& outputs) {
  std::vector<const Tensor*> inputs;
  for (int slot : input_slots) {
    inputs.push_back(slot < 0 ? nullptr : &*plan_->slot_infos_[slot].constant);
  }
  BufferPool pool;
  KernelContext context(std::move(inputs), std::vector<bool>(input_slots.size(), false),
                        node.output_size(), pool);
  RETURN_IF_ERROR(kernel.Compute(context));
  for (int i = 0; i < node.output_size(); ++i) {
    Tensor& value = context.outputs()[i];
    if (!MatchesInfo(value, outputs[i])) {
      return absl::InternalError(
          absl::StrCat("folded output ", i, " has shape ", ShapeToString(value.shape()),
                       " against the inferred ", ShapeToString(outputs[i].dims)));
    }
    // Constants are shared by all runs; copy views so they own exactly their bytes.
    if (value.BufferShared()) value = value.Clone();
    outputs[i] = ValueInfo::Shaped(value.dtype(), value.shape());
    outputs[i].constant = std::move(value);
  }
  return absl::OkStatus();
}

absl::Status GraphCompiler::CompileIndexed(const onnx::GraphProto& graph, int index) {
  auto fused = rewritten_.fused.find(index);
  if (fused == rewritten_.fused.end()) return CompileNode(graph.node(index), false, true);
  absl::Status status = CompileNode(graph.node(index), true, true);
  if (status.ok()) return status;
  // The fused kernel declined (say, an element type it lacks): run the original nodes. Their
  // values have other readers than the rewritten graph shows, so no epilogue fusion there.
  for (const onnx::NodeProto& original : fused->second.originals) {
    RETURN_IF_ERROR(CompileNode(original, false, false));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> GraphCompiler::FuseIntoProducer(const onnx::NodeProto& node,
                                                     NodeContext& context,
                                                     const std::vector<int>& input_slots) {
  if (node.output_size() != 1 || node.output(0).empty() || input_slots.empty() ||
      input_slots[0] < 0 || static_cast<int>(input_slots.size()) != node.input_size()) {
    return false;
  }
  // Add and Mul commute: present the produced value first, as FuseNext expects.
  if ((node.op_type() == "Add" || node.op_type() == "Mul") && node.input_size() == 2 &&
      input_slots[1] >= 0 && plan_->producer_step_[input_slots[1]] >= 0 &&
      plan_->slot_infos_[input_slots[0]].constant.has_value()) {
    onnx::NodeProto swapped = node;
    swapped.set_input(0, node.input(1));
    swapped.set_input(1, node.input(0));
    NodeContext swapped_context(swapped, context.since_version(),
                                {context.input(1), context.input(0)}, 2, nullptr);
    for (int i = 0; i < context.output_count(); ++i) {
      swapped_context.SetOutput(i, context.outputs()[i]);
    }
    return FuseIntoProducer(swapped, swapped_context, {input_slots[1], input_slots[0]});
  }
  const int source = input_slots[0];
  const int producer = plan_->producer_step_[source];
  if (producer < 0 || readers_[node.input(0)] != 1) return false;
  for (size_t i = 1; i < input_slots.size(); ++i) {
    if (input_slots[i] == source) return false;
    if (input_slots[i] >= 0 && !plan_->slot_infos_[input_slots[i]].constant.has_value()) {
      return false;
    }
  }
  Step& step = plan_->steps_[producer];
  if (step.outputs.size() != 1 || step.outputs[0] != source) return false;
  std::unique_ptr<Kernel> fused = step.kernel->FuseNext(context);
  if (fused == nullptr) return false;
  ValueInfo info = std::move(context.outputs()[0]);
  auto declared = declared_.find(node.output(0));
  if (declared != declared_.end()) {
    ASSIGN_OR_RETURN(info, MergeDeclared(info, declared->second, node.output(0)));
  }
  ASSIGN_OR_RETURN(int slot, NewSlot(node.output(0), std::move(info)));
  for (auto& kernel : plan_->kernels_) {
    if (kernel.get() == step.kernel) {
      kernel = std::move(fused);
      step.kernel = kernel.get();
      break;
    }
  }
  CLOISTER_CHECK(fused == nullptr);  // the old kernel was found and replaced
  step.outputs[0] = slot;
  step.op_type += "+" + node.op_type();
  plan_->producer_step_[slot] = producer;
  plan_->producer_step_[source] = -1;
  return true;
}

absl::Status GraphCompiler::CompileNode(const onnx::NodeProto& node, bool fused,
                                        bool allow_epilogue) {
  if (!fused && !node.domain().empty() && node.domain() != "ai.onnx") {
    return NodeError(node, absl::UnimplementedError(absl::StrCat("operator domain '", node.domain(),
                                                                 "' is not supported")));
  }
  auto match =
      options_.executor->kernels().Find(node.op_type(), fused ? kFusedOpset : options_.opset);
  if (!match.ok()) return NodeError(node, match.status());

  std::vector<int> input_slots;
  std::vector<ValueInfo> input_infos;
  std::vector<OuterValue> captured;
  RETURN_IF_ERROR(GatherInputs(node, input_slots, input_infos, captured));
  const CompileOptions& options = options_;
  NodeContext context(node, match->since_version, std::move(input_infos), node.input_size(),
                      [&options, captured](const onnx::GraphProto& graph) {
                        return CompileGraph(graph, options, captured);
                      });
  context.set_pack_weights(options_.pack_weights);
  if (node.output_size() == 0) {
    return NodeError(node, absl::InvalidArgumentError("the node has no outputs"));
  }
  auto kernel = (*match->factory)(context);
  if (!kernel.ok()) return NodeError(node, kernel.status());
  RETURN_IF_ERROR(CheckOutputsSet(node, context));

  std::vector<ValueInfo>& outputs = context.outputs();
  bool all_constant = true;
  for (const ValueInfo& info : outputs) all_constant = all_constant && info.constant.has_value();
  if (!all_constant && !HasSubgraph(node) && node.output_size() > 0) {
    bool inputs_constant = true;
    for (int slot : input_slots) {
      if (slot >= 0 && !plan_->slot_infos_[slot].constant.has_value()) inputs_constant = false;
    }
    if (inputs_constant) {
      absl::Status folded = FoldNode(node, **kernel, input_slots, outputs);
      if (!folded.ok()) return NodeError(node, folded);
      all_constant = true;
    }
  }
  if (!all_constant && allow_epilogue && !HasSubgraph(node)) {
    auto fused_into_producer = FuseIntoProducer(node, context, input_slots);
    if (!fused_into_producer.ok()) return NodeError(node, fused_into_producer.status());
    if (*fused_into_producer) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<int> output_slots, NewOutputSlots(node, outputs));
  if (all_constant) return absl::OkStatus();
  AddStep(node, std::move(kernel).value(), std::move(input_slots), std::move(output_slots));
  return absl::OkStatus();
}

absl::Status GraphCompiler::GatherInputs(const onnx::NodeProto& node,
                                         std::vector<int>& input_slots,
                                         std::vector<ValueInfo>& input_infos,
                                         std::vector<OuterValue>& captured) const {
  for (const std::string& name : node.input()) {
    if (name.empty()) {
      input_slots.push_back(-1);
      input_infos.push_back(ValueInfo{});
      continue;
    }
    const int slot = scope_.at(name);  // SortNodes checked that it exists
    input_slots.push_back(slot);
    input_infos.push_back(plan_->slot_infos_[slot]);
  }
  for (const std::string& name : ImplicitInputs(node)) {
    auto it = scope_.find(name);
    if (it == scope_.end()) {
      return NodeError(node, absl::InvalidArgumentError(absl::StrCat("subgraph reads '", name,
                                                                     "', which is not defined")));
    }
    input_slots.push_back(it->second);
    input_infos.push_back(plan_->slot_infos_[it->second]);
    captured.push_back(OuterValue{name, plan_->slot_infos_[it->second]});
  }
  return absl::OkStatus();
}

absl::Status GraphCompiler::CheckOutputsSet(const onnx::NodeProto& node,
                                            const NodeContext& context) {
  if (context.sets_unlisted_output()) {
    return NodeError(node, absl::InvalidArgumentError(absl::StrCat(
        "the node lists ", node.output_size(), " outputs, fewer than the operator writes")));
  }
  for (int i = 0; i < node.output_size(); ++i) {
    if (!context.outputs_set()[i]) {
      return NodeError(node, absl::InvalidArgumentError(absl::StrCat(
          "the operator has no output ", i, " ('", node.output(i), "')")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> GraphCompiler::NewOutputSlots(const onnx::NodeProto& node,
                                                               std::vector<ValueInfo>& outputs) {
  std::vector<int> output_slots;
  for (int i = 0; i < node.output_size(); ++i) {
    const std::string& name = node.output(i);
    if (name.empty()) {
      output_slots.push_back(-1);
      continue;
    }
    ValueInfo info = std::move(outputs[i]);
    auto declared = declared_.find(name);
    if (declared != declared_.end()) {
      auto merged = MergeDeclared(info, declared->second, name);
      if (!merged.ok()) return NodeError(node, merged.status());
      info = std::move(merged).value();
    }
    auto slot = NewSlot(name, std::move(info));
    if (!slot.ok()) return NodeError(node, slot.status());
    output_slots.push_back(*slot);
  }
  return output_slots;
}

void GraphCompiler::AddStep(const onnx::NodeProto& node, std::unique_ptr<Kernel> kernel,
                            std::vector<int> input_slots, std::vector<int> output_slots) {
  const int step_index = static_cast<int>(plan_->steps_.size());
  for (int slot : output_slots) {
    if (slot >= 0) plan_->producer_step_[slot] = step_index;
  }
  plan_->kernels_.push_back(std::move(kernel));
  plan_->steps_.push_back(Step{plan_->kernels_.back().get(),
                               node.name(),
                               node.op_type(),
                               std::move(input_slots),
                               std::move(output_slots),
                               {}});
}

void GraphCompiler::PlanLiveness() {
  const int slot_count = static_cast<int>(plan_->slot_infos_.size());
  std::vector<int> last_use(slot_count, -1);
  for (int s = 0; s < static_cast<int>(plan_->steps_.size()); ++s) {
    const Step& step = plan_->steps_[s];
    for (int slot : step.inputs) {
      if (slot >= 0) last_use[slot] = s;
    }
    for (int slot : step.outputs) {
      if (slot >= 0 && last_use[slot] < s) last_use[slot] = s;  // unused outputs die at once
    }
  }
  std::vector<bool> kept(slot_count, false);
  for (int slot : plan_->output_slots_) kept[slot] = true;
  std::vector<bool> needs_value(slot_count, false);
  for (int slot = 0; slot < slot_count; ++slot) {
    if (last_use[slot] >= 0 && !kept[slot]) {
      plan_->steps_[last_use[slot]].release.push_back(slot);
    }
    if (last_use[slot] >= 0 || kept[slot]) needs_value[slot] = true;
  }
  for (int slot = 0; slot < slot_count; ++slot) {
    if (needs_value[slot] && plan_->slot_infos_[slot].constant.has_value()) {
      plan_->constant_slots_.push_back(slot);
    }
  }
}

absl::StatusOr<std::shared_ptr<const Plan>> GraphCompiler::Compile(
    const onnx::GraphProto& original, const std::vector<OuterValue>& outer) {
  plan_ = std::make_shared<Plan>();
  rewritten_ = FuseDecomposedOperators(original, options_.opset);
  const onnx::GraphProto& graph = rewritten_.graph;
  for (const onnx::NodeProto& node : graph.node()) {
    for (const std::string& input : node.input()) {
      if (!input.empty()) ++readers_[input];
    }
    for (const std::string& input : ImplicitInputs(node)) ++readers_[input];
  }
  for (const auto& output : graph.output()) ++readers_[output.name()];
  const bool is_subgraph = !outer.empty();
  for (const OuterValue& value : outer) {
    ASSIGN_OR_RETURN(int slot, NewSlot(value.name, value.info));
    plan_->input_slots_.push_back(slot);
    plan_->input_names_.push_back(value.name);
  }
  std::unordered_set<std::string> initializer_names;
  RETURN_IF_ERROR(AddInitializers(graph, initializer_names));
  RETURN_IF_ERROR(AddInputsAndDeclarations(graph, is_subgraph, initializer_names));

  ASSIGN_OR_RETURN(std::vector<int> order, SortNodes(graph));
  for (int index : order) RETURN_IF_ERROR(CompileIndexed(graph, index));

  if (graph.output_size() == 0) return absl::InvalidArgumentError("the graph has no outputs");
  RETURN_IF_ERROR(BindOutputs(graph));
  if (!is_subgraph) {
    plan_->rows_ = AnalyzeRowIndependence(
        graph, order, options_.opset, [&](const std::string& name) -> const ValueInfo* {
          auto it = scope_.find(name);
          return it == scope_.end() ? nullptr : &plan_->slot_infos_[it->second];
        });
  }
  PlanLiveness();
  return std::shared_ptr<const Plan>(std::move(plan_));
}

absl::Status GraphCompiler::AddInitializers(const onnx::GraphProto& graph,
                                            std::unordered_set<std::string>& initializer_names) {
  for (const onnx::TensorProto& initializer : graph.initializer()) {
    auto tensor = TensorFromProto(initializer);
    if (!tensor.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("initializer '", initializer.name(), "': ", tensor.status().message()));
    }
    ValueInfo info = ValueInfo::Shaped(tensor->dtype(), tensor->shape());
    info.constant = std::move(tensor).value();
    if (scope_.count(initializer.name())) {
      // A subgraph initializer shadows the outer value of the same name.
      scope_.erase(initializer.name());
    }
    RETURN_IF_ERROR(NewSlot(initializer.name(), std::move(info)).status());
    initializer_names.insert(initializer.name());
  }
  return absl::OkStatus();
}

absl::Status GraphCompiler::AddInputsAndDeclarations(
    const onnx::GraphProto& graph, bool is_subgraph,
    const std::unordered_set<std::string>& initializer_names) {
  for (const onnx::ValueInfoProto& input : graph.input()) {
    // Inputs with an initializer are frozen to it (treated as constants), which lets them fold.
    if (initializer_names.count(input.name())) continue;
    if (is_subgraph) {
      return absl::InvalidArgumentError(
          absl::StrCat("subgraph input '", input.name(), "' is not supported"));
    }
    ASSIGN_OR_RETURN(ValueInfo info, InfoFromValueInfoProto(input));
    ASSIGN_OR_RETURN(int slot, NewSlot(input.name(), std::move(info)));
    plan_->input_slots_.push_back(slot);
    plan_->input_names_.push_back(input.name());
  }
  for (const onnx::ValueInfoProto& value : graph.value_info()) {
    auto info = InfoFromValueInfoProto(value);
    if (info.ok()) declared_[value.name()] = std::move(info).value();
  }
  for (const onnx::ValueInfoProto& output : graph.output()) {
    if (output.type().has_tensor_type() && output.type().tensor_type().elem_type() != 0) {
      ASSIGN_OR_RETURN(ValueInfo info, InfoFromValueInfoProto(output));
      declared_[output.name()] = std::move(info);
    }
  }
  return absl::OkStatus();
}

absl::Status GraphCompiler::BindOutputs(const onnx::GraphProto& graph) {
  for (const onnx::ValueInfoProto& output : graph.output()) {
    auto it = scope_.find(output.name());
    if (it == scope_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph output '", output.name(), "' is not produced by the graph"));
    }
    auto declared = declared_.find(output.name());
    if (declared != declared_.end()) {
      ASSIGN_OR_RETURN(
          plan_->slot_infos_[it->second],
          MergeDeclared(plan_->slot_infos_[it->second], declared->second, output.name()));
    }
    plan_->output_slots_.push_back(it->second);
    plan_->output_names_.push_back(output.name());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Plan>> CompileGraph(const onnx::GraphProto& graph,
                                                         const CompileOptions& options,
                                                         const std::vector<OuterValue>& outer) {
  CLOISTER_CHECK(options.executor != nullptr);
  GraphCompiler compiler(options);
  return compiler.Compile(graph, outer);
}

}  // namespace cloister::runtime
