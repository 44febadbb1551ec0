#include "crypto/random.h"

#include <sodium.h>

#include "base/status.h"

namespace cloister::crypto {

void RandomFill(std::span<uint8_t> out) {
  static const bool initialized = sodium_init() >= 0;
  CLOISTER_CHECK(initialized);
  if (out.empty()) return;  // an empty span may have a null data pointer
  randombytes_buf(out.data(), out.size());
}

Bytes RandomBytes(size_t size) {
  Bytes out(size);
  RandomFill(out);
  return out;
}

SecretBytes RandomSecret(size_t size) {
  SecretBytes out(size);
  RandomFill(out.mutable_span());
  return out;
}

}  // namespace cloister::crypto
