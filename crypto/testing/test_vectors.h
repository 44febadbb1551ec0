// Test-only helpers for the crypto known-answer tests: locating and parsing the JSON vector
// files under ${CLOISTER_SHARED_DIR}/testdata/crypto (Wycheproof, RFC 9180, RFC 5869, NIST
// CAVP), reading hex fields and inflating zlib-compressed fields. Linked only into tests.
// Thread-safe: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::crypto::testing {

// The absolute path of `relative` inside the crypto test-data folder.
std::string VectorPath(std::string_view relative);

// Reads and parses a JSON file from the crypto test-data folder; NotFound or InvalidArgument
// (with the path) when it is missing or not JSON.
absl::StatusOr<nlohmann::json> LoadVectors(std::string_view relative);

// The hex string field `name` of `object` decoded; a missing field or bad hex fails the
// current test (ADD_FAILURE) and yields empty bytes.
Bytes HexField(const nlohmann::json& object, std::string_view name);

// Whether the Wycheproof test has `flag` in its "flags" array.
bool HasFlag(const nlohmann::json& test, std::string_view flag);

// "tcId 12 (comment)" for failure messages.
std::string TestLabel(const nlohmann::json& test);

// Inflates a zlib stream (RFC 1950); InvalidArgument if it is not one.
absl::StatusOr<Bytes> ZlibInflate(ByteSpan compressed);

}  // namespace cloister::crypto::testing
