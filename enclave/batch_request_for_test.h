// Test helper shared by the batch runner's tests: a request whose one input "x" holds `rows` x
// `columns` floats, viewing `values` (which must outlive the request).
#pragma once

#include <cstdint>
#include <vector>

#include "enclave/batch_runner.h"

namespace cloister::enclave {

inline BatchRequest FloatRowsRequest(const std::vector<float>& values, int64_t rows,
                                     int64_t columns) {
  BatchRequest request;
  request.inputs.push_back(
      {"x",
       runtime::DataType::kFloat,
       {rows, columns},
       ByteSpan(reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float))});
  return request;
}

}  // namespace cloister::enclave
