// Plan::Execute: runs a compiled plan's steps in order over one set of values (plan.h).
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {

std::vector<bool> Plan::NeededSteps(const std::vector<int>& outputs) const {
  std::vector<bool> needed(steps_.size(), false);
  std::vector<int> stack;
  for (int output : outputs) stack.push_back(output_slots_[output]);
  std::vector<bool> visited(slot_infos_.size(), false);
  while (!stack.empty()) {
    const int slot = stack.back();
    stack.pop_back();
    if (visited[slot]) continue;
    visited[slot] = true;
    const int step = producer_step_[slot];
    if (step < 0 || needed[step]) continue;
    needed[step] = true;
    for (int input : steps_[step].inputs) {
      if (input >= 0) stack.push_back(input);
    }
  }
  return needed;
}

absl::Status Plan::RunStep(size_t s, std::vector<Tensor>& values, BufferPool& pool,
                           const Deadline& deadline, std::vector<double>* step_seconds) const {
  const Step& step = steps_[s];
  std::vector<const Tensor*> step_inputs(step.inputs.size(), nullptr);
  std::vector<bool> dies(step.inputs.size(), false);
  for (size_t i = 0; i < step.inputs.size(); ++i) {
    const int slot = step.inputs[i];
    if (slot < 0) continue;
    step_inputs[i] = &values[slot];
    dies[i] = std::find(step.release.begin(), step.release.end(), slot) != step.release.end();
  }
  KernelContext context(std::move(step_inputs), std::move(dies),
                        static_cast<int>(step.outputs.size()), pool);
  context.set_deadline(deadline);
  const auto started =
      step_seconds ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  absl::Status status = step.kernel->Compute(context);
  // Device kernels only queue work: wait for it so the time is the step's.
  if (step_seconds != nullptr && status.ok() && pool.device() != nullptr) {
    status = pool.device()->Synchronize();
  }
  if (step_seconds != nullptr) {
    (*step_seconds)[s] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  if (!status.ok()) {
    std::string name = step.node_name.empty() && !step.outputs.empty() && step.outputs[0] >= 0
                           ? slot_names_[step.outputs[0]]
                           : step.node_name;
    return absl::Status(status.code(), absl::StrCat("node '", name, "' (", step.op_type,
                                                    "): ", status.message()));
  }
  for (size_t i = 0; i < step.outputs.size(); ++i) {
    Tensor& produced = context.outputs()[i];
    const int slot = step.outputs[i];
    if (slot < 0) {
      pool.Release(produced.TakeBuffer());
      continue;
    }
    if (!MatchesInfo(produced, slot_infos_[slot])) {
      return absl::InternalError(absl::StrCat(
          "node '", step.node_name, "' (", step.op_type, "): output '", slot_names_[slot],
          "' has type ", TypeName(produced.dtype()), " shape ", ShapeToString(produced.shape()),
          ", inferred ", TypeName(slot_infos_[slot].dtype), " ",
          slot_infos_[slot].rank_known ? ShapeToString(slot_infos_[slot].dims) : "[*]"));
    }
    values[slot] = std::move(produced);
  }
  for (int slot : step.release) pool.Release(values[slot].TakeBuffer());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> Plan::Execute(std::vector<Tensor> inputs,
                                                  const std::vector<int>& wanted_outputs,
                                                  BufferPool& pool,
                                                  std::vector<double>* step_seconds,
                                                  const Deadline& deadline) const {
  if (step_seconds != nullptr) step_seconds->assign(steps_.size(), 0.0);
  CLOISTER_CHECK(inputs.size() == input_slots_.size());
  std::vector<Tensor> values(slot_infos_.size());
  for (int slot : constant_slots_) values[slot] = *slot_infos_[slot].constant;
  for (size_t i = 0; i < inputs.size(); ++i) values[input_slots_[i]] = std::move(inputs[i]);

  std::vector<int> outputs = wanted_outputs;
  if (outputs.empty()) {
    for (size_t i = 0; i < output_slots_.size(); ++i) outputs.push_back(static_cast<int>(i));
  }
  // With a subset of outputs, run only the steps they depend on.
  const std::vector<bool> needed =
      wanted_outputs.empty() ? std::vector<bool>() : NeededSteps(outputs);
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (!needed.empty() && !needed[s]) continue;
    if (deadline.passed()) {
      return absl::DeadlineExceededError(
          absl::StrCat("the run reached its deadline after ", s, " of ", steps_.size(), " steps"));
    }
    RETURN_IF_ERROR(RunStep(s, values, pool, deadline, step_seconds));
  }

  std::vector<Tensor> results;
  results.reserve(outputs.size());
  for (int output : outputs) results.push_back(values[output_slots_[output]]);
  // Whatever is still alive goes back to the pool, except what the results hold.
  for (Tensor& value : values) pool.Release(value.TakeBuffer());
  return results;
}

}  // namespace cloister::runtime
