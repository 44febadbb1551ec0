#include "enclave/runtime/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::runtime {
namespace {

constexpr size_t kAlignment = 64;
constexpr uint64_t kMaxTensorSize = uint64_t{1} << 40;

struct TypeEntry {
  DataType dtype;
  std::string_view kserve;
  size_t size;
};
constexpr TypeEntry kTypes[] = {
    {DataType::kFloat, "FP32", 4},    {DataType::kDouble, "FP64", 8},
    {DataType::kFloat16, "FP16", 2},  {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2},   {DataType::kInt32, "INT32", 4},
    {DataType::kInt64, "INT64", 8},   {DataType::kUint8, "UINT8", 1},
    {DataType::kUint16, "UINT16", 2}, {DataType::kUint32, "UINT32", 4},
    {DataType::kUint64, "UINT64", 8}, {DataType::kBool, "BOOL", 1},
    {DataType::kString, "BYTES", 0},
};

}  // namespace

absl::StatusOr<DataType> DataTypeFromKServe(std::string_view name) {
  for (const TypeEntry& type : kTypes) {
    if (type.kserve == name) return type.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KServe datatype '", std::string(name), "'"));
}

std::string_view KServeName(DataType dtype) {
  for (const TypeEntry& type : kTypes) {
    if (type.dtype == dtype) return type.kserve;
  }
  return "INVALID";
}

size_t ElementSize(DataType dtype) {
  for (const TypeEntry& type : kTypes) {
    if (type.dtype == dtype) return type.size;
  }
  return 0;
}

absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (dim != 0 && count > (int64_t{1} << 50) / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has too many elements"));
    }
    count *= dim;
  }
  return count;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ",";
    text += shape[i] < 0 ? "?" : std::to_string(shape[i]);
  }
  return text + "]";
}

namespace internal {
std::shared_ptr<Buffer> Buffer::Allocate(size_t capacity) {
  size_t rounded = (capacity + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded);
  if (data == nullptr) return nullptr;
  // Fresh memory may hold another tenant's freed data: never hand it out unwiped.
  std::memset(data, 0, rounded);
  return std::make_shared<Buffer>(data, capacity);
}
Buffer::~Buffer() {
  if (releaser_ != nullptr) {
    releaser_->Release(data_, capacity_);
  } else {
    std::free(data_);
  }
}
}  // namespace internal

Tensor::Tensor() : shape_{0} {}

Tensor::Tensor(DataType dtype, std::vector<int64_t> shape, std::shared_ptr<internal::Buffer> buffer)
    : dtype_(dtype), shape_(std::move(shape)), buffer_(std::move(buffer)) {
  count_ = 1;
  for (int64_t dim : shape_) {
    CLOISTER_CHECK(dim >= 0);
    count_ *= dim;
  }
  CLOISTER_CHECK(dtype_ != DataType::kString);
  CLOISTER_CHECK(size() == 0 || (buffer_ && buffer_->capacity() >= size()));
}

absl::StatusOr<Tensor> Tensor::Create(DataType dtype, std::vector<int64_t> shape) {
  if (dtype == DataType::kString) {
    return absl::InvalidArgumentError("string tensors are not supported");
  }
  ASSIGN_OR_RETURN(int64_t count, ElementCount(shape));
  uint64_t size = static_cast<uint64_t>(count) * ElementSize(dtype);
  if (size > kMaxTensorSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of shape ", ShapeToString(shape), " is too large"));
  }
  auto buffer = internal::Buffer::Allocate(size);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for a tensor of shape ", ShapeToString(shape)));
  }
  return Tensor(dtype, std::move(shape), std::move(buffer));
}

Tensor Tensor::Clone() const {
  CLOISTER_CHECK(!on_device());
  auto buffer = internal::Buffer::Allocate(size());
  CLOISTER_CHECK(buffer != nullptr);  // copies of tensors that already fit in memory
  Tensor copy(dtype_, shape_, std::move(buffer));
  if (size() > 0) std::memcpy(copy.raw_data(), raw_data(), size());
  return copy;
}

Tensor Tensor::Reshaped(std::vector<int64_t> shape) const {
  Tensor view(dtype_, std::move(shape), buffer_);
  CLOISTER_CHECK(view.count() == count_);
  return view;
}

std::shared_ptr<internal::Buffer> Tensor::TakeBuffer() {
  std::shared_ptr<internal::Buffer> buffer = std::move(buffer_);
  *this = Tensor();
  return buffer;
}

void Tensor::CheckType(DataType requested) const {
  CLOISTER_CHECK(requested == dtype_);
  CLOISTER_CHECK(!on_device());
}

}  // namespace cloister::runtime
