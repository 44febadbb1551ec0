// libFuzzer target: the safetensors reader on arbitrary bytes (the file comes from a tenant's
// package). Every tensor it accepts must lie inside the buffer with the size its shape implies.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "enclave/llm/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  auto file = cloister::llm::SafetensorsFile::Parse("fuzz.safetensors", bytes);
  if (!file.ok()) return 0;
  for (const auto& [name, view] : file->tensors()) {
    const uint8_t* begin = view.data.data();
    if (view.data.size() != 0 &&
        (begin < data || begin + view.data.size() > data + size ||
         view.data.size() != static_cast<size_t>(view.count()) * cloister::llm::DTypeSize(view.dtype))) {
      std::abort();
    }
  }
  return 0;
}
