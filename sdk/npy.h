// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0), the tensor file
// format of the `cloister infer` command. Only what a tensor needs is supported: a
// little-endian (or one-byte) numeric or boolean dtype in C order. Each supported dtype maps
// to one KServe v2 datatype ("FP32", "INT64", ...), which is how tensors travel to the enclave.
//
// The parser treats its input as untrusted: every malformed file (bad magic, truncated or
// oversized header, a header that is not the expected dict, an unsupported or big-endian
// dtype, Fortran order, a negative or overflowing shape, data that does not match the shape)
// is an InvalidArgument error with one line naming the file and the problem.
// Thread-safe: pure functions; NpyArray is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "cloister/api/v1/api.pb.h"

namespace cloister::sdk {

// A dense array in C (row-major) order with little-endian elements.
struct NpyArray {
  std::string datatype;        // KServe datatype, e.g. "FP32"
  std::vector<int64_t> shape;  // empty for a scalar
  Bytes data;                  // element_count(shape) * element size bytes
};

// Bytes per element of a KServe datatype this module supports; InvalidArgument otherwise.
absl::StatusOr<size_t> DatatypeElementSize(std::string_view datatype);

// The number of elements of `shape` (1 for a scalar). InvalidArgument for a negative
// dimension or a count that overflows 63 bits.
absl::StatusOr<uint64_t> ShapeElementCount(const std::vector<int64_t>& shape);

// Parses the bytes of a .npy file. `file_name` only names the file in error messages.
absl::StatusOr<NpyArray> ParseNpy(ByteSpan file_bytes, std::string_view file_name);

// Reads and parses a .npy file. NotFound or PermissionDenied when it cannot be read,
// InvalidArgument when it is malformed.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);

// Serializes to a version 1.0 file with the header padded to 64 bytes, as numpy writes it.
// InvalidArgument for an unsupported datatype, a bad shape or a data size that does not
// match the shape.
absl::StatusOr<Bytes> SerializeNpy(const NpyArray& array);

// Writes the serialized array to `path` atomically (mode 0644).
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

// Conversions to and from the KServe-shaped tensor of the tenant API. FromTensor checks the
// datatype and that the raw size matches the shape (InvalidArgument otherwise).
// ValidateTensor checks the same without copying the data.
cloister::api::v1::Tensor ToTensor(std::string name, NpyArray array);
absl::Status ValidateTensor(const cloister::api::v1::Tensor& tensor);
absl::StatusOr<NpyArray> FromTensor(const cloister::api::v1::Tensor& tensor);

}  // namespace cloister::sdk
