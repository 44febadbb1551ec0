// SecretBytes: a move-only buffer for keys and other secrets. Its memory is locked (mlock,
// best effort) so it is not swapped out, wiped on destruction and on move-from, and it has
// no printing or streaming operators, so a secret cannot reach a log by accident.
// Not thread-safe: one owner at a time, like std::vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/bytes.h"

namespace cloister {

class SecretBytes {
 public:
  SecretBytes() = default;
  explicit SecretBytes(size_t size);
  explicit SecretBytes(ByteSpan data);
  ~SecretBytes();

  SecretBytes(SecretBytes&& other) noexcept;
  SecretBytes& operator=(SecretBytes&& other) noexcept;
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;

  // An explicit copy, so that every duplication of a secret is visible in review.
  SecretBytes Clone() const { return SecretBytes(span()); }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<uint8_t> mutable_span() { return {data_, size_}; }
  ByteSpan span() const { return {data_, size_}; }

 private:
  void Release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Overwrites memory in a way the compiler cannot elide.
void SecureWipe(void* data, size_t size);

// Overwrites `size` bytes of the calling thread's stack below the caller's frame: what deeper
// calls left there (a parser's copy of its input's tail, a cipher's block buffers) is gone
// once a thread that handled plaintext returns to waiting. The caller must leave that much
// stack free (threads have megabytes; 64 KiB is the usual amount).
void ScrubStack(size_t size);
inline constexpr size_t kStackScrubSize = 64 * 1024;

// Zeroes the calling thread's vector registers (x86-64: xmm/ymm/zmm 0-31 and the AVX-512 mask
// registers, as far as the CPU has them). Copies and wipes leave the last bytes they moved in
// these registers, and glibc's AVX-512 memcpy works in zmm16-31, which little other code touches
// and which a core dump or a later context on the same thread would show: a tenant's plaintext
// can sit there long after its buffers are wiped. Call with ScrubStack when a thread that
// handled plaintext goes back to waiting. A no-op on other architectures.
void ScrubVectorRegisters();

}  // namespace cloister
