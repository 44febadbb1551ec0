// Fuzz target for the model package reader (proto/model_package.h): the enclave reads packages
// that tenants upload, so any bytes must give members or a one-line error, never a crash, a
// read outside the buffer or an allocation the bytes do not back. The reader accepts only the
// canonical encoding, so a package it accepts must pack again to exactly the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "base/bytes.h"
#include "proto/model_package.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cloister::ByteSpan bytes(data, size);
  (void)cloister::package::IsModelPackage(bytes);
  auto members = cloister::package::ReadModelPackage(bytes);
  if (!members.ok()) return 0;
  for (const auto& [name, view] : *members) {
    // Every view lies inside the input.
    if (view.data() < data || view.data() + view.size() > data + size) __builtin_trap();
  }
  auto packed = cloister::package::PackModel(*members);
  if (!packed.ok()) __builtin_trap();  // what the reader accepts the writer must write
  if (packed->size() != size || !std::equal(packed->begin(), packed->end(), data)) {
    __builtin_trap();  // one set of files, one encoding
  }
  return 0;
}
