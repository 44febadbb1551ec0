// ByteReader: a bounds-checked cursor over untrusted bytes, for the evidence parsers. Every
// read either succeeds entirely or returns an error naming what was being read, the offset and
// how many bytes were missing; the cursor never moves past the end.
// Not thread-safe; it borrows the span, which must outlive it.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"

namespace cloister::attest {

class ByteReader {
 public:
  // `what` names the structure in error messages, e.g. "SPDM report".
  ByteReader(ByteSpan data, absl::string_view what) : data_(data), what_(what) {}

  size_t offset() const { return offset_; }
  size_t remaining() const { return data_.size() - offset_; }

  // The next `size` bytes; OutOfRange-free: an InvalidArgument error if fewer remain.
  absl::StatusOr<ByteSpan> Take(size_t size, absl::string_view field) {
    if (size > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": ", field, " needs ", size,
                                                     " bytes at offset ", offset_, " but only ",
                                                     remaining(), " remain"));
    }
    ByteSpan out = data_.subspan(offset_, size);
    offset_ += size;
    return out;
  }
  absl::StatusOr<uint8_t> U8(absl::string_view field) {
    auto bytes = Take(1, field);
    if (!bytes.ok()) return bytes.status();
    return (*bytes)[0];
  }
  // Little-endian unsigned integer of `width` bytes (1 to 8).
  absl::StatusOr<uint64_t> LittleEndian(size_t width, absl::string_view field) {
    auto bytes = Take(width, field);
    if (!bytes.ok()) return bytes.status();
    uint64_t value = 0;
    for (size_t i = 0; i < width; ++i) value |= uint64_t{(*bytes)[i]} << (8 * i);
    return value;
  }

 private:
  ByteSpan data_;
  absl::string_view what_;
  size_t offset_ = 0;
};

// Little-endian decoding of a span already known to be `width` bytes long or shorter.
inline uint64_t LoadLittleEndian(ByteSpan bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) value |= uint64_t{bytes[i]} << (8 * i);
  return value;
}

}  // namespace cloister::attest
