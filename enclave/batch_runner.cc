#include "enclave/batch_runner.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "base/secret_bytes.h"
#include "base/status.h"

namespace cloister::enclave {

namespace {

using NamedTensors = std::vector<std::pair<std::string, runtime::Tensor>>;

// Tensors in staging buffers start on the runtime's own buffer alignment.
constexpr size_t kStagingAlignment = 64;

size_t AlignUp(size_t value) { return (value + kStagingAlignment - 1) & ~(kStagingAlignment - 1); }

// Keeps the executor-side staging lease alive while any tensor views it; the lease zeroes its
// block when the last view is gone.
class StagingViewReleaser final : public runtime::internal::BufferReleaser {
 public:
  explicit StagingViewReleaser(std::shared_ptr<void> lease) : lease_(std::move(lease)) {}
  void Release(void*, size_t) override {}

 private:
  std::shared_ptr<void> lease_;
};

// Wipes a host result of the runtime once its bytes are copied; device results scrub
// themselves when they die (and may share a constant's buffer, which must stay).
void WipeHostResult(runtime::Tensor& tensor) {
  if (!tensor.on_device()) SecureWipe(tensor.raw_data(), tensor.size());
}

// True when the model keeps rows apart (row_analysis.h) and every request has the same input
// names, types and shapes except along axis 0 (of rank one or more), and asks for the same
// outputs, so the requests can run as one.
bool Coalescible(const runtime::Model& model, const std::vector<BatchRequest>& requests) {
  if (requests.size() < 2 || !model.row_independence().independent) return false;
  const BatchRequest& first = requests[0];
  if (first.inputs.empty()) return false;  // no rows to put together
  for (const auto& input : first.inputs) {
    if (input.shape.empty()) return false;
  }
  for (size_t r = 1; r < requests.size(); ++r) {
    const BatchRequest& other = requests[r];
    if (other.inputs.size() != first.inputs.size() ||
        other.requested_outputs != first.requested_outputs) {
      return false;
    }
    for (size_t i = 0; i < first.inputs.size(); ++i) {
      const BatchInput& a = first.inputs[i];
      const BatchInput& b = other.inputs[i];
      if (a.name != b.name || a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
      for (size_t d = 1; d < a.shape.size(); ++d) {
        if (a.shape[d] != b.shape[d]) return false;
      }
    }
  }
  // Every input of a request has the same number of rows.
  for (const auto& request : requests) {
    for (const auto& input : request.inputs) {
      if (input.shape[0] != request.inputs[0].shape[0]) return false;
    }
  }
  return true;
}

// Consecutive requests that run as one: [begin, end).
struct Group {
  size_t begin;
  size_t end;
};

// Rows past which a longer run gains little on the CPU executor (its kernels are as efficient
// per row at 16 rows as at 64, within a few per cent, on the models we measured; bench/README.md)
// while one long group keeps the other threads waiting for it at the end of a batch.
constexpr int64_t kRowsPerRun = 16;

// Coalesced requests: one group when `parallel` is 1, else groups of about equal rows, at least
// `parallel` of them (as far as there are requests) and about one per kRowsPerRun rows; requests
// that do not coalesce: one group each.
std::vector<Group> PlanGroups(const std::vector<BatchRequest>& requests, bool coalesce,
                              int parallel) {
  const size_t count = requests.size();
  std::vector<Group> groups;
  if (!coalesce) {
    for (size_t r = 0; r < count; ++r) groups.push_back({r, r + 1});
    return groups;
  }
  std::vector<int64_t> rows;
  int64_t total_rows = 0;
  for (const auto& request : requests) {
    rows.push_back(request.inputs[0].shape[0]);  // Coalescible: every request has inputs
    total_rows += rows.back();
  }
  size_t wanted = 1;
  if (parallel > 1) {
    // At least one group per thread; beyond that, a group per kRowsPerRun rows, so that large
    // requests run in runs of their own which the threads take as they come free.
    const int64_t by_rows = (total_rows + kRowsPerRun - 1) / kRowsPerRun;
    wanted = std::min(count, static_cast<size_t>(std::max<int64_t>(parallel, by_rows)));
  }
  size_t begin = 0;
  int64_t rows_before = 0;  // rows of the groups planned so far
  for (size_t g = 0; g < wanted; ++g) {
    size_t end = count;
    if (g + 1 < wanted) {
      // Take requests while that brings the rows so far nearer to this group's share, leaving
      // at least one request for each group still to come.
      const int64_t target = total_rows * static_cast<int64_t>(g + 1) / wanted;
      end = begin + 1;
      int64_t taken = rows_before + rows[begin];
      while (end < count - (wanted - g - 1) && 2 * taken + rows[end] <= 2 * target) {
        taken += rows[end++];
      }
      rows_before = taken;
    }
    groups.push_back({begin, end});
    begin = end;
  }
  return groups;
}

// One output slice on its way back: `size` bytes at `source_offset` in `tensor`, to be sent to
// request `request` at `staging_offset` of the outgoing buffer.
struct OutputSlice {
  size_t request;
  std::string name;
  runtime::DataType dtype;
  std::vector<int64_t> shape;
  runtime::Tensor tensor;
  size_t source_offset;
  size_t size;
  size_t staging_offset = 0;
};

// Staging layout of a batch's inputs: one 64-byte aligned region per input (per request unless
// coalesced), the coalesced requests' rows back to back inside it. offsets[r][k] is where
// request r's input k starts.
struct InputLayout {
  std::vector<std::vector<size_t>> offsets;
  size_t size = 0;
};

InputLayout PlanInputs(const std::vector<BatchRequest>& requests, bool coalesce) {
  const size_t count = requests.size();
  InputLayout layout;
  layout.offsets.resize(count);
  size_t& total = layout.size;
  if (coalesce) {
    for (size_t k = 0; k < requests[0].inputs.size(); ++k) {
      total = AlignUp(total);
      for (size_t r = 0; r < count; ++r) {
        layout.offsets[r].push_back(total);
        total += requests[r].inputs[k].raw.size();
      }
    }
  } else {
    for (size_t r = 0; r < count; ++r) {
      for (const auto& input : requests[r].inputs) {
        total = AlignUp(total);
        layout.offsets[r].push_back(total);
        total += input.raw.size();
      }
    }
  }
  return layout;
}

// Moves the requests' inputs to the executor's side in one transfer laid out as `layout`
// (timed into `transfer_ns`), sealed straight from the opened requests where the path can: no
// host staging buffer, no gather copy.
absl::StatusOr<pcie::PathBuffer> SendInputs(pcie::BatchPath& path,
                                            const std::vector<BatchRequest>& requests,
                                            const InputLayout& layout, uint64_t& transfer_ns) {
  std::vector<pcie::GatherPiece> pieces;
  for (size_t r = 0; r < requests.size(); ++r) {
    for (size_t k = 0; k < requests[r].inputs.size(); ++k) {
      const ByteSpan raw = requests[r].inputs[k].raw;
      if (!raw.empty()) pieces.push_back({layout.offsets[r][k], raw.data(), raw.size()});
    }
  }
  // Coalesced layouts put input k of every request before input k+1 of any.
  std::sort(
      pieces.begin(), pieces.end(),
      [](const pcie::GatherPiece& a, const pcie::GatherPiece& b) { return a.offset < b.offset; });
  absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(pcie::PathBuffer device, path.GatherToDevice(layout.size, pieces));
  transfer_ns += absl::ToInt64Nanoseconds(absl::Now() - start);
  return device;
}

// What one group's runs left: the output slices to send back, and the runs' counts.
struct GroupOutcome {
  std::vector<OutputSlice> slices;
  uint64_t execution_ns = 0;
  int model_runs = 0;
  bool coalesced = false;
};

// Runs the groups of a batch on views of its executor-side input buffer. Each group writes the
// replies of its own requests only, so groups may run on several threads at once. The views
// keep the buffer's lease alive while any tensor (an input, or an output that shares it) needs
// them, including past the runner's own end.
class GroupRunner {
 public:
  GroupRunner(const runtime::Model& model, const std::vector<BatchRequest>& requests,
              const InputLayout& layout, const pcie::PathBuffer& inputs, bool on_device,
              std::vector<absl::StatusOr<api::v1::InferReplyPayload>>& replies)
      : model_(model),
        requests_(requests),
        layout_(layout),
        inputs_(inputs),
        on_device_(on_device),
        replies_(replies),
        releaser_(std::make_shared<StagingViewReleaser>(inputs.hold)) {}

  // A group of several requests runs as one over their concatenated rows. When that run fails,
  // or its outputs cannot be cut back into the requests' rows, they run again one by one, so
  // each request gets its own result or error.
  void Run(const Group& group, GroupOutcome& out) const {
    if (group.end - group.begin > 1 && RunTogether(group, out)) return;
    RunEach(group, out);
  }

 private:
  runtime::Tensor View(size_t offset, runtime::DataType dtype, std::vector<int64_t> shape,
                       size_t size) const {
    const runtime::internal::MemoryKind kind =
        on_device_ ? runtime::internal::MemoryKind::kDevice : runtime::internal::MemoryKind::kHost;
    auto buffer =
        std::make_shared<runtime::internal::Buffer>(inputs_.data + offset, size, kind, releaser_);
    return runtime::Tensor(dtype, std::move(shape), std::move(buffer));
  }

  absl::StatusOr<NamedTensors> TimedRun(const NamedTensors& inputs,
                                        const std::vector<std::string>& wanted,
                                        const Deadline& deadline, GroupOutcome& out) const {
    absl::Time start = absl::Now();
    // On a device the outputs stay there, to be gathered and moved back in one transfer.
    auto run = on_device_ ? model_.RunLeavingOutputsOnDevice(inputs, wanted, deadline)
                          : model_.Run(inputs, wanted, deadline);
    out.execution_ns += absl::ToInt64Nanoseconds(absl::Now() - start);
    ++out.model_runs;
    return run;
  }

  // One run over the group's rows; true when that settled every request of the group.
  bool RunTogether(const Group& group, GroupOutcome& out) const {
    int64_t group_rows = 0;
    for (size_t r = group.begin; r < group.end; ++r) group_rows += requests_[r].inputs[0].shape[0];
    NamedTensors merged;
    for (size_t k = 0; k < requests_[group.begin].inputs.size(); ++k) {
      const BatchInput& first = requests_[group.begin].inputs[k];
      std::vector<int64_t> shape = first.shape;
      shape[0] = group_rows;
      size_t size = 0;
      for (size_t r = group.begin; r < group.end; ++r) size += requests_[r].inputs[k].raw.size();
      merged.emplace_back(first.name,
                          View(layout_.offsets[group.begin][k], first.dtype, shape, size));
    }
    Deadline latest = requests_[group.begin].deadline;
    for (size_t r = group.begin + 1; r < group.end; ++r) {
      latest = Deadline::Later(latest, requests_[r].deadline);
    }
    auto run = TimedRun(merged, requests_[group.begin].requested_outputs, latest, out);
    if (absl::IsDeadlineExceeded(run.status())) {
      // Past every one of the group's deadlines: no request would gain from a run of its own.
      for (size_t r = group.begin; r < group.end; ++r) replies_[r] = run.status();
      return true;
    }
    if (!run.ok()) return false;
    bool splittable = true;
    for (const auto& [name, tensor] : *run) {
      splittable &= tensor.rank() > 0 && tensor.dim(0) == group_rows;
    }
    if (!splittable) {
      for (auto& [name, tensor] : *run) WipeHostResult(tensor);
      return false;
    }
    int64_t begin = 0;
    for (size_t r = group.begin; r < group.end; ++r) {
      const int64_t rows = requests_[r].inputs[0].shape[0];
      for (const auto& [name, tensor] : *run) {
        const size_t row_size = group_rows == 0 ? 0 : tensor.size() / group_rows;
        std::vector<int64_t> shape = tensor.shape();
        shape[0] = rows;
        out.slices.push_back(
            {r, name, tensor.dtype(), shape, tensor, begin * row_size, rows * row_size});
      }
      begin += rows;
      replies_[r] = api::v1::InferReplyPayload();
    }
    out.coalesced = true;
    return true;
  }

  // One run per request, over views of the same executor-side buffer.
  void RunEach(const Group& group, GroupOutcome& out) const {
    for (size_t r = group.begin; r < group.end; ++r) {
      NamedTensors inputs;
      for (size_t k = 0; k < requests_[r].inputs.size(); ++k) {
        const BatchInput& input = requests_[r].inputs[k];
        inputs.emplace_back(
            input.name, View(layout_.offsets[r][k], input.dtype, input.shape, input.raw.size()));
      }
      auto run = TimedRun(inputs, requests_[r].requested_outputs, requests_[r].deadline, out);
      if (!run.ok()) {
        replies_[r] = run.status();
        continue;
      }
      for (const auto& [name, tensor] : *run) {
        out.slices.push_back({r, name, tensor.dtype(), tensor.shape(), tensor, 0, tensor.size()});
      }
      replies_[r] = api::v1::InferReplyPayload();
    }
  }

  const runtime::Model& model_;
  const std::vector<BatchRequest>& requests_;
  const InputLayout& layout_;
  const pcie::PathBuffer& inputs_;
  const bool on_device_;
  std::vector<absl::StatusOr<api::v1::InferReplyPayload>>& replies_;
  const std::shared_ptr<StagingViewReleaser> releaser_;
};

// Runs the groups, on the pool's threads when there is a pool, and adds their counts to
// `outcome`; returns every group's output slices, in request order.
absl::StatusOr<std::vector<OutputSlice>> RunGroups(const GroupRunner& runner,
                                                   const std::vector<Group>& groups, TaskPool* runs,
                                                   BatchOutcome& outcome) {
  std::vector<GroupOutcome> group_outcomes(groups.size());
  if (runs != nullptr && groups.size() > 1) {
    RETURN_IF_ERROR(runs->Run(groups.size(), [&](size_t g, int) {
      runner.Run(groups[g], group_outcomes[g]);
      return absl::OkStatus();
    }));
  } else {
    for (size_t g = 0; g < groups.size(); ++g) runner.Run(groups[g], group_outcomes[g]);
  }
  std::vector<OutputSlice> slices;
  for (auto& group : group_outcomes) {
    for (auto& slice : group.slices) slices.push_back(std::move(slice));
    outcome.execution_ns += group.execution_ns;
    outcome.model_runs += group.model_runs;
    outcome.coalesced &= group.coalesced;
  }
  return slices;
}

// Gathers every output slice on the executor's side, moves them back in one transfer and cuts
// them into the replies. The runtime's host result buffers are wiped once gathered.
absl::Status ReturnOutputs(pcie::BatchPath& path, std::vector<OutputSlice>& slices,
                           BatchOutcome& outcome) {
  size_t out_total = 0;
  for (auto& slice : slices) {
    out_total = AlignUp(out_total);
    slice.staging_offset = out_total;
    out_total += slice.size;
    outcome.output_size += slice.size;
  }
  ASSIGN_OR_RETURN(pcie::PathBuffer outgoing, path.AcquireDeviceStaging(out_total));
  std::vector<pcie::GatherPiece> pieces;
  pieces.reserve(slices.size());
  for (const auto& slice : slices) {
    pieces.push_back({slice.staging_offset,
                      static_cast<const uint8_t*>(slice.tensor.raw_data()) + slice.source_offset,
                      slice.size});
  }
  absl::Status gathered = path.GatherOnDevice(outgoing, pieces);
  // The runtime's host result buffers held plaintext: wipe them (Model::Run hands them over
  // unshared; a coalesced output appears in one slice per request, so wipe each buffer once).
  std::set<const void*> wiped;
  for (auto& slice : slices) {
    if (wiped.insert(slice.tensor.raw_data()).second) WipeHostResult(slice.tensor);
    slice.tensor = runtime::Tensor();
  }
  RETURN_IF_ERROR(gathered);
  absl::Time start = absl::Now();
  auto back = path.ToHost(outgoing);
  outcome.transfer_ns += absl::ToInt64Nanoseconds(absl::Now() - start);
  outgoing.Release();
  if (!back.ok()) return back.status();
  for (const auto& slice : slices) {
    auto* tensor = outcome.replies[slice.request]->add_outputs();
    tensor->set_name(slice.name);
    tensor->set_datatype(std::string(runtime::KServeName(slice.dtype)));
    for (int64_t d : slice.shape) tensor->add_shape(d);
    tensor->set_raw(reinterpret_cast<const char*>(back->data) + slice.staging_offset, slice.size);
  }
  return absl::OkStatus();
}

}  // namespace

int DefaultRunThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
}

absl::StatusOr<BatchOutcome> RunBatch(const runtime::Model& model, pcie::TransferPath& path,
                                      const std::vector<BatchRequest>& requests, TaskPool* runs) {
  pcie::HostBatchPath host_path(path);
  return RunBatch(model, host_path, requests, runs);
}

// Plan the layout and the groups, send the inputs, run the groups, return the outputs.
absl::StatusOr<BatchOutcome> RunBatch(const runtime::Model& model, pcie::BatchPath& path,
                                      const std::vector<BatchRequest>& requests, TaskPool* runs) {
  BatchOutcome outcome;
  outcome.replies.assign(requests.size(), absl::UnknownError("not run"));
  if (requests.empty()) return outcome;
  const bool coalesce = Coalescible(model, requests);
  const InputLayout layout = PlanInputs(requests, coalesce);
  for (const auto& request : requests) {
    for (const auto& input : request.inputs) outcome.input_size += input.raw.size();
  }
  ASSIGN_OR_RETURN(pcie::PathBuffer inputs,
                   SendInputs(path, requests, layout, outcome.transfer_ns));
  const std::vector<Group> groups = PlanGroups(requests, coalesce, runs ? runs->size() : 1);
  outcome.coalesced = coalesce;
  std::vector<OutputSlice> slices;
  {
    const GroupRunner runner(model, requests, layout, inputs, path.executor_memory_on_device(),
                             outcome.replies);
    ASSIGN_OR_RETURN(slices, RunGroups(runner, groups, runs, outcome));
  }
  inputs.Release();  // the inputs' executor-side buffer goes back zeroed once no view is left
  RETURN_IF_ERROR(ReturnOutputs(path, slices, outcome));
  return outcome;
}

}  // namespace cloister::enclave
