// The CUDA LLM engine: a StepEngine (enclave/llm/engine.h) on one NVIDIA GPU. Weights, the
// paged KV cache and every activation live in device memory; cuBLAS runs the matrix products
// (SGEMM in float32 without TF32 for Precision::kF32, the references' precision; BF16/F16
// GEMMs with float32 accumulation for Precision::kBf16) and our kernels (llm_kernels.cu) the
// rest: embedding, RMSNorm, bias and RoPE with the KV write, paged attention, SiLU gating and
// the argmax of greedy rows. Per step the host sends one buffer (token ids, positions, block
// tables) and receives one: the chosen ids, followed by the logits of the rows the host samples
// itself (temperature, penalties, log-probabilities), so that greedy decoding moves only ids.
//
// Memory: weights and the cache are allocated at creation; step scratch grows to the largest
// step seen. Every device allocation is zeroed before it is freed, and freed cache blocks are
// zeroed (ScrubBlock) before reuse.
// Threading: one thread drives an engine (StepEngine's contract).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "enclave/llm/engine.h"
#include "enclave/llm/model.h"

namespace cloister::gpu::llm {

// OK when the driver reports a device, else FailedPrecondition "no CUDA device: ...".
absl::Status CudaLlmAvailable();

// `model` (config and tokenizer; loaded with any WeightFormat) must outlive the engine; the
// weights are read from `files` during the call only. Refuses a head_dim over 256.
absl::StatusOr<std::unique_ptr<cloister::llm::StepEngine>> CreateCudaLlmEngine(
    const cloister::llm::Model& model, const cloister::llm::CheckpointFiles& files,
    const cloister::llm::EngineOptions& options);

// The device's memory read bandwidth in bytes per second: the best of `passes` reads of a
// `bytes` buffer by a kernel with 16-byte loads (the limit a memory-bound decode step meets).
absl::StatusOr<double> MeasureDeviceReadBandwidth(size_t bytes = size_t{1} << 30, int passes = 10);

}  // namespace cloister::gpu::llm
