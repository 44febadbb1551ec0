#include "enclave/step_transfer.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::enclave {
namespace {

class StepTransferEngine : public llm::ForwardingEngine {
 public:
  StepTransferEngine(std::unique_ptr<llm::StepEngine> inner, pcie::TransferPath* path)
      : ForwardingEngine(std::move(inner)), path_(path) {}

  absl::Status Step(std::span<const llm::StepSequence> parts, llm::StepResult& result) override {
    // In: every part's tokens, one after another, in one transfer.
    size_t count = 0;
    for (const llm::StepSequence& part : parts) count += part.tokens.size();
    ASSIGN_OR_RETURN(pcie::StagingBuffer staging,
                     path_->AcquireHostStaging(std::max<size_t>(count, 1) * sizeof(int32_t)));
    size_t offset = 0;
    for (const llm::StepSequence& part : parts) {
      std::memcpy(staging.data() + offset, part.tokens.data(), part.tokens.size_bytes());
      offset += part.tokens.size_bytes();
    }
    ASSIGN_OR_RETURN(pcie::StagingBuffer device, path_->ToDevice(staging.view()));
    // The engine reads the ids from the executor's side of the transfer.
    std::vector<llm::StepSequence> moved(parts.begin(), parts.end());
    const auto* ids = reinterpret_cast<const int32_t*>(device.data());
    size_t at = 0;
    for (llm::StepSequence& part : moved) {
      part.tokens = std::span<const int32_t>(ids + at, part.tokens.size());
      at += part.tokens.size();
    }
    RETURN_IF_ERROR(inner().Step(moved, result));
    // Out: the chosen ids and the logits rows, in one transfer.
    const size_t id_bytes = result.ids.size() * sizeof(int32_t);
    const size_t logit_bytes = result.logits.size() * sizeof(float);
    ASSIGN_OR_RETURN(pcie::StagingBuffer out,
                     path_->AcquireDeviceStaging(std::max<size_t>(id_bytes + logit_bytes, 1)));
    std::memcpy(out.data(), result.ids.data(), id_bytes);
    std::memcpy(out.data() + id_bytes, result.logits.data(), logit_bytes);
    ASSIGN_OR_RETURN(pcie::StagingBuffer back, path_->ToHost(out.view()));
    std::memcpy(result.ids.data(), back.data(), id_bytes);
    std::memcpy(result.logits.data(), back.data() + id_bytes, logit_bytes);
    return absl::OkStatus();
  }

 private:
  pcie::TransferPath* const path_;
};

}  // namespace

std::unique_ptr<llm::StepEngine> MakeStepTransferEngine(std::unique_ptr<llm::StepEngine> inner,
                                                        pcie::TransferPath* path) {
  return std::make_unique<StepTransferEngine>(std::move(inner), path);
}

}  // namespace cloister::enclave
