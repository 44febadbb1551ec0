// Tensors of the enclave's inference runtime: an element type, a shape and a 64-byte aligned
// buffer in row-major (C) order. A buffer lives in host memory, or in device memory when a device
// executor (enclave/gpu) made it; only that executor's kernels and copies touch device memory,
// and typed host access (data<T>(), Clone) CHECK-fails on it.
//
// Ownership: a Tensor holds its buffer through a shared reference. Copying a Tensor is cheap and
// the copy shares the buffer (like a view); Clone() makes an independent deep copy. The runtime
// never writes into a buffer that someone else still holds, and Model::Run hands back outputs
// whose buffers nobody else shares, so callers may write into what they receive.
// Threading: a Tensor is a value; concurrent reads are safe, concurrent writes to one buffer are
// the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::runtime {

// Element types. kString exists so that models and requests using it can be named in errors;
// no tensor of strings can be created.
enum class DataType {
  kFloat,
  kDouble,
  kFloat16,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kBool,
  kString,
};

// Parses a KServe v2 datatype name ("FP32", "FP64", "FP16", "INT8".."INT64", "UINT8".."UINT64",
// "BOOL", "BYTES"); anything else is InvalidArgument.
absl::StatusOr<DataType> DataTypeFromKServe(std::string_view name);
// The KServe v2 name of a type ("FP32" for kFloat, "BYTES" for kString).
std::string_view KServeName(DataType dtype);
// The same as an owned string, for messages.
inline std::string TypeName(DataType dtype) { return std::string(KServeName(dtype)); }
// Bytes per element; 0 for kString, which has no fixed size.
size_t ElementSize(DataType dtype);

// Maps a C++ element type to its DataType (float16 elements are stored as uint16_t bit patterns
// and accessed with data<Float16Bits>()).
struct Float16Bits {
  uint16_t bits;
};
template <typename T>
struct DataTypeOf;
template <>
struct DataTypeOf<float> {
  static constexpr DataType value = DataType::kFloat;
};
template <>
struct DataTypeOf<double> {
  static constexpr DataType value = DataType::kDouble;
};
template <>
struct DataTypeOf<Float16Bits> {
  static constexpr DataType value = DataType::kFloat16;
};
template <>
struct DataTypeOf<int8_t> {
  static constexpr DataType value = DataType::kInt8;
};
template <>
struct DataTypeOf<int16_t> {
  static constexpr DataType value = DataType::kInt16;
};
template <>
struct DataTypeOf<int32_t> {
  static constexpr DataType value = DataType::kInt32;
};
template <>
struct DataTypeOf<int64_t> {
  static constexpr DataType value = DataType::kInt64;
};
template <>
struct DataTypeOf<uint8_t> {
  static constexpr DataType value = DataType::kUint8;
};
template <>
struct DataTypeOf<uint16_t> {
  static constexpr DataType value = DataType::kUint16;
};
template <>
struct DataTypeOf<uint32_t> {
  static constexpr DataType value = DataType::kUint32;
};
template <>
struct DataTypeOf<uint64_t> {
  static constexpr DataType value = DataType::kUint64;
};
template <>
struct DataTypeOf<bool> {
  static constexpr DataType value = DataType::kBool;
};

// Number of elements of a shape; InvalidArgument for a negative dimension or an overflow.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape);
// "[1,3,48,192]"; -1 is printed as "?".
std::string ShapeToString(const std::vector<int64_t>& shape);

namespace internal {
// Where a buffer's bytes are.
enum class MemoryKind { kHost, kDevice };

// Returns memory the runtime did not allocate itself (device memory) when its Buffer dies.
class BufferReleaser {
 public:
  virtual ~BufferReleaser() = default;
  virtual void Release(void* data, size_t capacity) = 0;
};

// An aligned heap block, or a block of device memory. `capacity` is in bytes.
class Buffer {
 public:
  // A zero-filled host buffer, or nullptr when memory is exhausted.
  static std::shared_ptr<Buffer> Allocate(size_t capacity);
  Buffer(void* data, size_t capacity) : data_(data), capacity_(capacity) {}
  // Memory of `kind` that `releaser` takes back when the buffer dies.
  Buffer(void* data, size_t capacity, MemoryKind kind, std::shared_ptr<BufferReleaser> releaser)
      : data_(data), capacity_(capacity), kind_(kind), releaser_(std::move(releaser)) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  MemoryKind kind() const { return kind_; }

 private:
  void* data_;
  size_t capacity_;
  MemoryKind kind_ = MemoryKind::kHost;
  std::shared_ptr<BufferReleaser> releaser_;  // null: std::free
};
}  // namespace internal

class Tensor {
 public:
  // An empty float tensor of shape [0] with no buffer.
  Tensor();
  // A zero-filled tensor. Fails on negative dimensions, kString, or more than 2^40 bytes.
  static absl::StatusOr<Tensor> Create(DataType dtype, std::vector<int64_t> shape);
  // Convenience for tests and tools: a tensor holding `values` with `shape` (counts must match).
  template <typename T>
  static absl::StatusOr<Tensor> FromVector(std::vector<int64_t> shape,
                                           const std::vector<T>& values);

  // Runtime-internal: wraps an existing buffer of at least count*ElementSize bytes.
  Tensor(DataType dtype, std::vector<int64_t> shape, std::shared_ptr<internal::Buffer> buffer);

  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const { return shape_[axis]; }
  // Element count and byte size.
  int64_t count() const { return count_; }
  size_t size() const { return static_cast<size_t>(count_) * ElementSize(dtype_); }
  bool empty() const { return count_ == 0; }

  // True when the buffer is device memory (see the file comment).
  bool on_device() const {
    return buffer_ != nullptr && buffer_->kind() == internal::MemoryKind::kDevice;
  }

  // Typed host access; CHECK-fails when T does not match dtype() or the buffer is on a device.
  template <typename T>
  T* data() {
    CheckType(DataTypeOf<std::remove_const_t<T>>::value);
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    CheckType(DataTypeOf<std::remove_const_t<T>>::value);
    return static_cast<const T*>(raw_data());
  }
  void* raw_data() { return buffer_ ? buffer_->data() : nullptr; }
  const void* raw_data() const { return buffer_ ? buffer_->data() : nullptr; }

  // A deep copy with its own host buffer (CHECK-fails for a device tensor).
  Tensor Clone() const;
  // The same buffer under another shape with the same element count (CHECKed).
  Tensor Reshaped(std::vector<int64_t> shape) const;
  // True when another holder shares this tensor's buffer.
  bool BufferShared() const { return buffer_ && buffer_.use_count() > 1; }
  const std::shared_ptr<internal::Buffer>& buffer() const { return buffer_; }
  // Runtime-internal: gives up the buffer, leaving an empty tensor.
  std::shared_ptr<internal::Buffer> TakeBuffer();

 private:
  void CheckType(DataType requested) const;

  DataType dtype_ = DataType::kFloat;
  std::vector<int64_t> shape_;
  int64_t count_ = 0;
  std::shared_ptr<internal::Buffer> buffer_;
};

template <typename T>
absl::StatusOr<Tensor> Tensor::FromVector(std::vector<int64_t> shape,
                                          const std::vector<T>& values) {
  auto tensor = Create(DataTypeOf<T>::value, std::move(shape));
  if (!tensor.ok()) return tensor.status();
  if (static_cast<size_t>(tensor->count()) != values.size()) {
    return absl::InvalidArgumentError("FromVector: " + std::to_string(values.size()) +
                                      " values do not fill shape " +
                                      ShapeToString(tensor->shape()));
  }
  T* out = tensor->template data<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return tensor;
}

}  // namespace cloister::runtime
