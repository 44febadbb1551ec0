// Fuzz target for the model loader (enclave/runtime/model.h): a tenant uploads arbitrary bytes
// as a model, so any input must give a loaded model or an error, never a crash, a hang or an
// unbounded allocation. A model that loads is also run once on zero-filled inputs whose unknown
// dimensions are 1 and whose other dimensions are capped (small inputs only), so the shapes
// inferred at load time are exercised against the kernels; a run may fail, but it must fail with an
// error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/bytes.h"
#include "enclave/runtime/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace runtime = cloister::runtime;
  runtime::LoadOptions options;
  options.max_model_size = 1 << 20;
  options.threads = 1;
  auto model = runtime::Model::Load(cloister::ByteSpan(data, size), options);
  if (!model.ok()) return 0;
  std::vector<std::pair<std::string, runtime::Tensor>> inputs;
  for (const runtime::TensorSpec& spec : (*model)->inputs()) {
    std::vector<int64_t> shape = spec.shape;
    int64_t count = 1;
    for (int64_t& dim : shape) {
      dim = dim < 0 ? 1 : std::min<int64_t>(dim, 16);
      count *= std::max<int64_t>(dim, 1);
      if (count > (1 << 16)) return 0;  // keep each run small
    }
    auto tensor = runtime::Tensor::Create(spec.dtype, shape);
    if (!tensor.ok()) return 0;
    inputs.emplace_back(spec.name, *std::move(tensor));
  }
  // A model may legitimately produce tensors up to the runtime's 4 GiB limit; running such a
  // model is slow, not wrong, so the fuzzer skips runs whose outputs are known to be large.
  for (const runtime::TensorSpec& spec : (*model)->outputs()) {
    int64_t count = 1;
    for (int64_t dim : spec.shape) {
      count *= std::max<int64_t>(dim, 1);
      if (count > (1 << 24)) return 0;
    }
  }
  (void)(*model)->Run(inputs);
  return 0;
}
