// Control-flow CPU kernels: If. Each branch is compiled at load time into its own Plan whose
// inputs are the outer-scope values the branches read (the node's implicit inputs).
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/kernel_util.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {
namespace {

class IfKernel : public Kernel {
 public:
  IfKernel(std::shared_ptr<const Plan> then_branch, std::shared_ptr<const Plan> else_branch)
      : then_branch_(std::move(then_branch)), else_branch_(std::move(else_branch)) {}

  absl::Status Compute(KernelContext& context) const override {
    const Tensor& condition = context.input(0);
    if (condition.count() != 1) {
      return absl::InvalidArgumentError("condition must hold exactly one element");
    }
    const Plan& branch = *condition.data<bool>() ? *then_branch_ : *else_branch_;
    std::vector<Tensor> captured;
    for (int i = 1; i < context.input_count(); ++i) captured.push_back(context.input(i));
    ASSIGN_OR_RETURN(std::vector<Tensor> results,
                     branch.Execute(std::move(captured), {}, context.pool(),
                                    /*step_seconds=*/nullptr, context.deadline()));
    if (results.size() != context.outputs().size()) {
      return absl::InternalError("branch output count changed");
    }
    for (size_t i = 0; i < results.size(); ++i) {
      context.SetOutput(static_cast<int>(i), std::move(results[i]));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const Plan> then_branch_;
  std::shared_ptr<const Plan> else_branch_;
};

// Merges the two branches' infos for one output: types must agree; dims that differ are -1.
absl::StatusOr<ValueInfo> MergeBranches(const ValueInfo& a, const ValueInfo& b, int index) {
  if (a.dtype != b.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("branches disagree on the type of output ",
                                                   index, ": ", TypeName(a.dtype), " and ",
                                                   TypeName(b.dtype)));
  }
  if (!a.rank_known || !b.rank_known || a.rank() != b.rank()) return ValueInfo::Unranked(a.dtype);
  ValueInfo merged = ValueInfo::Shaped(a.dtype, a.dims);
  for (int i = 0; i < a.rank(); ++i) {
    if (a.dims[i] != b.dims[i]) merged.dims[i] = -1;
  }
  return merged;
}

absl::StatusOr<std::unique_ptr<Kernel>> MakeIf(NodeContext& context) {
  RETURN_IF_ERROR(context.ExpectInputs(1, 1));
  RETURN_IF_ERROR(RequireType(context, 0, [](DataType t) { return t == DataType::kBool; }));
  ASSIGN_OR_RETURN(std::shared_ptr<const Plan> then_branch, context.Subgraph("then_branch"));
  ASSIGN_OR_RETURN(std::shared_ptr<const Plan> else_branch, context.Subgraph("else_branch"));
  const size_t outputs = static_cast<size_t>(context.output_count());
  if (then_branch->output_slots().size() != outputs ||
      else_branch->output_slots().size() != outputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "branches produce ", then_branch->output_slots().size(), " and ",
        else_branch->output_slots().size(), " outputs for ", outputs, " node outputs"));
  }
  for (size_t i = 0; i < outputs; ++i) {
    ASSIGN_OR_RETURN(
        ValueInfo info,
        MergeBranches(then_branch->slot_info(then_branch->output_slots()[i]),
                      else_branch->slot_info(else_branch->output_slots()[i]), static_cast<int>(i)));
    context.SetOutput(static_cast<int>(i), std::move(info));
  }
  return MakeKernel<IfKernel>(std::move(then_branch), std::move(else_branch));
}

}  // namespace

void RegisterControlKernels(KernelRegistry& registry) {
  registry.Register("If", {1, 11, 13, 16}, MakeIf);
}

}  // namespace cloister::runtime
