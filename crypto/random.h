// Cryptographically secure random bytes (libsodium's randombytes). Thread-safe.
#pragma once

#include <span>

#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::crypto {

void RandomFill(std::span<uint8_t> out);
Bytes RandomBytes(size_t size);
SecretBytes RandomSecret(size_t size);

}  // namespace cloister::crypto
