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

#if defined(__x86_64__)
namespace {

__attribute__((target("avx512f"))) void ZeroAvx512Registers() {
  // vzeroall clears ymm0-15 and the upper parts of zmm0-15; zmm16-31 and k1-7 need their own.
  asm volatile(
      "vzeroall\n\t"
      "vpxord %%zmm16, %%zmm16, %%zmm16\n\t"
      "vpxord %%zmm17, %%zmm17, %%zmm17\n\t"
      "vpxord %%zmm18, %%zmm18, %%zmm18\n\t"
      "vpxord %%zmm19, %%zmm19, %%zmm19\n\t"
      "vpxord %%zmm20, %%zmm20, %%zmm20\n\t"
      "vpxord %%zmm21, %%zmm21, %%zmm21\n\t"
      "vpxord %%zmm22, %%zmm22, %%zmm22\n\t"
      "vpxord %%zmm23, %%zmm23, %%zmm23\n\t"
      "vpxord %%zmm24, %%zmm24, %%zmm24\n\t"
      "vpxord %%zmm25, %%zmm25, %%zmm25\n\t"
      "vpxord %%zmm26, %%zmm26, %%zmm26\n\t"
      "vpxord %%zmm27, %%zmm27, %%zmm27\n\t"
      "vpxord %%zmm28, %%zmm28, %%zmm28\n\t"
      "vpxord %%zmm29, %%zmm29, %%zmm29\n\t"
      "vpxord %%zmm30, %%zmm30, %%zmm30\n\t"
      "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
      "kxorw %%k1, %%k1, %%k1\n\t"
      "kxorw %%k2, %%k2, %%k2\n\t"
      "kxorw %%k3, %%k3, %%k3\n\t"
      "kxorw %%k4, %%k4, %%k4\n\t"
      "kxorw %%k5, %%k5, %%k5\n\t"
      "kxorw %%k6, %%k6, %%k6\n\t"
      "kxorw %%k7, %%k7, %%k7\n\t"
      "vzeroupper"
      ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
          "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
          "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27",
          "xmm28", "xmm29", "xmm30", "xmm31", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "memory");
}

__attribute__((target("avx"))) void ZeroAvxRegisters() {
  asm volatile("vzeroall" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
               "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory");
}

void ZeroSseRegisters() {
  asm volatile(
      "pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1\n\tpxor %%xmm2, %%xmm2\n\t"
      "pxor %%xmm3, %%xmm3\n\tpxor %%xmm4, %%xmm4\n\tpxor %%xmm5, %%xmm5\n\t"
      "pxor %%xmm6, %%xmm6\n\tpxor %%xmm7, %%xmm7\n\tpxor %%xmm8, %%xmm8\n\t"
      "pxor %%xmm9, %%xmm9\n\tpxor %%xmm10, %%xmm10\n\tpxor %%xmm11, %%xmm11\n\t"
      "pxor %%xmm12, %%xmm12\n\tpxor %%xmm13, %%xmm13\n\tpxor %%xmm14, %%xmm14\n\t"
      "pxor %%xmm15, %%xmm15"
      ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
          "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory");
}

}  // namespace

void ScrubVectorRegisters() {
  static const int level = __builtin_cpu_supports("avx512f") ? 2
                           : __builtin_cpu_supports("avx") ? 1
                                                           : 0;
  if (level == 2) {
    ZeroAvx512Registers();
  } else if (level == 1) {
    ZeroAvxRegisters();
  } else {
    ZeroSseRegisters();
  }
}
#else
void ScrubVectorRegisters() {}
#endif

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
