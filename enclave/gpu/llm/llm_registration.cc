// Registers the CUDA LLM engine as the "cuda" engine backend (enclave/llm/engine.h) when this
// object is linked into a program (CMake target cloister_gpu_llm_engine).
#include "enclave/gpu/llm/cuda_llm_engine.h"
#include "enclave/llm/engine.h"

namespace cloister::gpu::llm {
namespace {

[[maybe_unused]] const bool registered = [] {
  cloister::llm::RegisterEngineBackend(
      "cuda", {CudaLlmAvailable, CreateCudaLlmEngine, [] { return MeasureDeviceReadBandwidth(); }});
  return true;
}();

}  // namespace
}  // namespace cloister::gpu::llm
