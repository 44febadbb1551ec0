#include "crypto/testing/test_vectors.h"

#include <zlib.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace cloister::crypto::testing {

std::string VectorPath(std::string_view relative) {
  return std::string(CLOISTER_CRYPTO_TESTDATA_DIR) + "/" + std::string(relative);
}

absl::StatusOr<nlohmann::json> LoadVectors(std::string_view relative) {
  const std::string path = VectorPath(relative);
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open test vectors ", path));
  nlohmann::json json = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("test vectors ", path, " are not valid JSON"));
  }
  return json;
}

Bytes HexField(const nlohmann::json& object, std::string_view name) {
  const auto it = object.find(std::string(name));
  if (it == object.end() || !it->is_string()) {
    ADD_FAILURE() << "vector has no hex string field '" << name << "'";
    return {};
  }
  absl::StatusOr<Bytes> bytes = HexDecode(it->get<std::string>());
  if (!bytes.ok()) {
    ADD_FAILURE() << "field '" << name << "': " << bytes.status();
    return {};
  }
  return *std::move(bytes);
}

bool HasFlag(const nlohmann::json& test, std::string_view flag) {
  const auto it = test.find("flags");
  if (it == test.end() || !it->is_array()) return false;
  for (const auto& value : *it) {
    if (value.is_string() && value.get<std::string>() == flag) return true;
  }
  return false;
}

std::string TestLabel(const nlohmann::json& test) {
  std::string label = absl::StrCat("tcId ", test.value("tcId", -1));
  const std::string comment = test.value("comment", "");
  if (!comment.empty()) absl::StrAppend(&label, " (", comment, ")");
  return label;
}

absl::StatusOr<Bytes> ZlibInflate(ByteSpan compressed) {
  z_stream stream = {};
  if (inflateInit(&stream) != Z_OK) return absl::InternalError("zlib inflateInit failed");
  stream.next_in = const_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());
  Bytes out;
  int result = Z_OK;
  while (result == Z_OK) {
    const size_t offset = out.size();
    out.resize(offset + 64 * 1024);
    stream.next_out = out.data() + offset;
    stream.avail_out = 64 * 1024;
    result = inflate(&stream, Z_NO_FLUSH);
    out.resize(out.size() - stream.avail_out);
    if (result == Z_BUF_ERROR && stream.avail_in == 0) break;
  }
  inflateEnd(&stream);
  if (result != Z_STREAM_END) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a complete zlib stream (zlib error ", result, ")"));
  }
  return out;
}

}  // namespace cloister::crypto::testing
