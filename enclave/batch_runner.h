// Runs one inference batch (one tenant's requests for one model, already opened and checked by
// Enclave) through the PCIe path: every request's input tensors are gathered into one host
// staging buffer and moved to the executor's side in one transfer (pcie/transfer_path.h); the
// model runs once over the concatenated rows when the requests' shapes allow it, else once per
// request on views of the same device-side buffer; all outputs are gathered into one
// device-side buffer and moved back in one transfer, then cut into one reply per request.
// Staging buffers are pooled and zeroed when released; the runtime's output tensors are wiped
// once copied.
//
// Threading: RunBatch may run on several threads at once (Model::Run and TransferPath are
// thread-safe). Ownership: the inputs' bytes are borrowed for the call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "cloister/api/v1/api.pb.h"
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
};

struct BatchOutcome {
  // One per request, in order: the outputs, or why the model refused that request.
  std::vector<absl::StatusOr<api::v1::InferReplyPayload>> replies;
  bool coalesced = false;     // the model ran once over all requests' rows
  uint64_t input_size = 0;    // bytes moved to the executor
  uint64_t output_size = 0;   // bytes of outputs moved back
  uint64_t execution_ns = 0;  // time inside Model::Run
  uint64_t transfer_ns = 0;   // time in the two transfers
};

// Errors from the transfers: then no reply is produced (DataLoss when the emulated path finds
// the inputs modified in flight, and the model did not run at all).
absl::StatusOr<BatchOutcome> RunBatch(const runtime::Model& model, pcie::TransferPath& path,
                                      const std::vector<BatchRequest>& requests);

}  // namespace cloister::enclave
