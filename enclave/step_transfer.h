// StepTransferEngine: an LLM StepEngine whose steps cross the enclave's CPU-GPU path
// (pcie/transfer_path.h) the way a device engine's do (DESIGN.md section 10, "The PCIe path"):
// per step, the token ids of all parts in one transfer to the executor's side, which the wrapped
// engine then reads from there, and its results (chosen ids, and the logits of the parts the
// engine does not choose for) in one transfer back. Weights and the KV cache never cross. With
// the CPU engine in mode `emulated` this is what the CC tax on generation costs our path; in
// mode `off` it is the plain copies a device engine would make.
//
// Threading: as StepEngine (one driver at a time); the path is thread-safe and may be shared.
// Ownership: owns the wrapped engine; the path must outlive it.
#pragma once

#include <memory>

#include "enclave/llm/engine.h"
#include "enclave/pcie/transfer_path.h"

namespace cloister::enclave {

std::unique_ptr<llm::StepEngine> MakeStepTransferEngine(std::unique_ptr<llm::StepEngine> inner,
                                                        pcie::TransferPath* path);

}  // namespace cloister::enclave
