// Runs one inference batch (one tenant's requests for one model, already opened and checked by
// Enclave) through the PCIe path: every request's input tensors are gathered into one host
// staging buffer and moved to the executor's side in one transfer (pcie/batch_path.h: host
// memory for the CPU executor, device memory for a device executor with a path of its own); the
// model runs once over the concatenated rows when the requests' shapes allow it and the model
// keeps rows apart (Model::row_independence), else once per request on views of the same
// device-side buffer. With a pool of run threads (the CPU
// executor, whose runs are single-threaded) the concatenated rows run as up to one model run
// per pool thread side by side, each over a contiguous group of requests of about equal rows;
// a device executor gets no pool and runs the batch at once. All outputs are gathered into one
// executor-side buffer and moved back in one transfer, then cut into one reply per request.
// Staging buffers are pooled and zeroed when released; the runtime's host output tensors are
// wiped once copied (device ones scrub themselves when they die).
//
// Threading: RunBatch may run on several threads at once (Model::Run, TransferPath and TaskPool
// are thread-safe). Ownership: the inputs' bytes are borrowed for the call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/deadline.h"
#include "base/task_pool.h"
#include "cloister/api/v1/api.pb.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/pcie/transfer_path.h"
#include "enclave/runtime/model.h"

namespace cloister::enclave {

// One input tensor of a request, its shape and size already checked against its bytes.
struct BatchInput {
  std::string name;
  runtime::DataType dtype = runtime::DataType::kFloat;
  std::vector<int64_t> shape;
  ByteSpan raw;
};

struct BatchRequest {
  std::vector<BatchInput> inputs;
  std::vector<std::string> requested_outputs;  // empty: all outputs
  // A run still going at the deadline stops (runtime::Model::Run says where) and the request gets
  // DeadlineExceeded. A run shared by several requests stops at the latest of their deadlines.
  Deadline deadline;  // none by default
};

struct BatchOutcome {
  // One per request, in order: the outputs, or why the model refused that request.
  std::vector<absl::StatusOr<api::v1::InferReplyPayload>> replies;
  // Every request ran in a model run shared with other requests of the batch (over their
  // concatenated rows); without a pool, that is one run over all of them.
  bool coalesced = false;
  int model_runs = 0;         // calls to Model::Run (a failed shared run included)
  uint64_t input_size = 0;    // bytes moved to the executor
  uint64_t output_size = 0;   // bytes of outputs moved back
  uint64_t execution_ns = 0;  // time inside Model::Run
  uint64_t transfer_ns = 0;   // time in the two transfers
};

// cloister-enclave's run threads on the CPU executor: the hardware threads, up to 8.
int DefaultRunThreads();

// `runs`: the threads that run the groups (nullptr: the calling thread alone, one group).
// `path` must lead to the memory of the executor `model` was loaded on: a device path only for
// its device executor (pcie::NewBatchPath finds it). Errors from the transfers: then no reply is
// produced (DataLoss when the emulated path finds the inputs modified in flight, and the model
// did not run at all).
absl::StatusOr<BatchOutcome> RunBatch(const runtime::Model& model, pcie::BatchPath& path,
                                      const std::vector<BatchRequest>& requests,
                                      TaskPool* runs = nullptr);
// The same through a HostBatchPath over `path`.
absl::StatusOr<BatchOutcome> RunBatch(const runtime::Model& model, pcie::TransferPath& path,
                                      const std::vector<BatchRequest>& requests,
                                      TaskPool* runs = nullptr);

}  // namespace cloister::enclave
