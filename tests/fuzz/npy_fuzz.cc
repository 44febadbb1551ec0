// Fuzz target for the .npy reader (sdk/npy.h): tensors come from files a tenant points the CLI
// and the Python SDK at, so any bytes must give an array or an error, never a crash or an
// allocation the declared shape does not back. An array that parses must serialise again.
#include <cstddef>
#include <cstdint>

#include "base/bytes.h"
#include "sdk/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto array = cloister::sdk::ParseNpy(cloister::ByteSpan(data, size), "fuzz.npy");
  if (array.ok()) {
    auto bytes = cloister::sdk::SerializeNpy(*array);
    if (!bytes.ok()) __builtin_trap();  // what parsed must be writable again
  }
  return 0;
}
