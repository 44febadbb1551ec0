// The safetensors format (an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the data): a strict, allocation-bounded reader over
// bytes already in memory. Every offset, shape and size is checked against the buffer before any
// tensor is exposed: a header that lies (ranges out of bounds or overlapping, a shape whose
// element count does not match its range, an unknown dtype, a duplicate name) is refused.
// Thread-safe after Parse: read-only views into the caller's buffer, which must outlive them.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::llm {

enum class DType { kF32, kF16, kBF16 };

std::string_view DTypeName(DType dtype);
inline size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;  // exactly count() * DTypeSize(dtype) bytes
  int64_t count() const;
};

class SafetensorsFile {
 public:
  // `name` is used in error messages ("model.safetensors: ...").
  static absl::StatusOr<SafetensorsFile> Parse(std::string_view name,
                                               std::span<const uint8_t> bytes);

  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  const TensorView* Find(std::string_view tensor) const;

 private:
  std::map<std::string, TensorView, std::less<>> tensors_;
};

// All tensors of a checkpoint: one model.safetensors, or the shards that
// model.safetensors.index.json names (each tensor in the shard its weight_map says).
// `files` maps member names to their bytes. Errors name the file.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(
      const std::map<std::string, std::span<const uint8_t>, std::less<>>& files);
  const TensorView* Find(std::string_view tensor) const;
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }

 private:
  std::map<std::string, TensorView, std::less<>> tensors_;
};

}  // namespace cloister::llm
