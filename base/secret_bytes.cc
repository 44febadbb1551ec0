#include "base/secret_bytes.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

#include <sodium.h>

namespace cloister {

void SecureWipe(void* data, size_t size) {
  if (data != nullptr && size > 0) sodium_memzero(data, size);
}

__attribute__((noinline)) void ScrubStack(size_t size) {
  void* area = __builtin_alloca(size);
  SecureWipe(area, size);
}

SecretBytes::SecretBytes(size_t size) : size_(size) {
  if (size_ == 0) return;
  data_ = static_cast<uint8_t*>(::operator new(size_));
  std::memset(data_, 0, size_);
  ::mlock(data_, size_);  // Best effort: RLIMIT_MEMLOCK may refuse; wiping still happens.
}

SecretBytes::SecretBytes(ByteSpan data) : SecretBytes(data.size()) {
  if (!data.empty()) std::memcpy(data_, data.data(), data.size());
}

SecretBytes::~SecretBytes() { Release(); }

SecretBytes::SecretBytes(SecretBytes&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

SecretBytes& SecretBytes::operator=(SecretBytes&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void SecretBytes::Release() {
  if (data_ == nullptr) return;
  SecureWipe(data_, size_);
  ::munlock(data_, size_);
  ::operator delete(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace cloister
