#include "enclave/llm/safetensors.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {
namespace {

using nlohmann::json;

// Headers of real checkpoints are a few hundred bytes per tensor; 100 MiB bounds the JSON parse
// of a hostile file.
constexpr uint64_t kMaxHeaderSize = 100ull << 20;
constexpr size_t kMaxTensors = 1 << 20;
constexpr size_t kMaxRank = 8;

absl::Status Error(std::string_view file, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(file), ": ", std::string(message)));
}

bool ParseDType(std::string_view name, DType& dtype) {
  if (name == "F32") {
    dtype = DType::kF32;
  } else if (name == "F16") {
    dtype = DType::kF16;
  } else if (name == "BF16") {
    dtype = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

// One tensor's header entry: its dtype, shape and byte range inside `data`, all checked.
absl::Status ParseEntry(std::string_view name, const std::string& tensor, const json& entry,
                        std::span<const uint8_t> data, TensorView& view,
                        std::pair<uint64_t, uint64_t>& range) {
  auto bad = [&](std::string_view what) {
    return Error(name, absl::StrCat("tensor \"", tensor, "\": ", std::string(what)));
  };
  if (!entry.is_object()) return bad("entry is not an object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return bad("missing dtype");
  if (!ParseDType(dtype_it->get<std::string>(), view.dtype)) {
    return bad(absl::StrCat("dtype ", dtype_it->get<std::string>(),
                            " is not supported (F32, F16, BF16)"));
  }
  if (shape_it == entry.end() || !shape_it->is_array() || shape_it->size() > kMaxRank) {
    return bad("shape must be a list of at most 8 dimensions");
  }
  uint64_t count = 1;
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
      return bad("shape holds a value that is not a non-negative integer");
    }
    uint64_t dim = d.get<uint64_t>();
    if (dim > (1ull << 40) || (dim != 0 && count > (1ull << 40) / dim)) {
      return bad("shape is too large");
    }
    count *= dim;
    view.shape.push_back(static_cast<int64_t>(dim));
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return bad("data_offsets must be two non-negative integers");
  }
  uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end || end > data.size()) {
    return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] lie outside the ",
                            data.size(), " data bytes"));
  }
  if (end - begin != count * DTypeSize(view.dtype)) {
    return bad(absl::StrCat("data_offsets span ", end - begin, " bytes but the shape needs ",
                            count * DTypeSize(view.dtype)));
  }
  view.data = data.subspan(begin, end - begin);
  range = {begin, end};
  return absl::OkStatus();
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}


int64_t TensorView::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string_view name,
                                                       std::span<const uint8_t> bytes) {
  if (bytes.size() < 8) return Error(name, "shorter than the 8-byte header length");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderSize) {
    return Error(name, absl::StrCat("header length ", header_size, " exceeds the limit of ",
                                    kMaxHeaderSize, " bytes"));
  }
  if (header_size > bytes.size() - 8) {
    return Error(name, absl::StrCat("header length ", header_size, " runs past the end of the ",
                                    bytes.size(), "-byte file"));
  }
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), header_size);
  json root = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return Error(name, "header is not a JSON object");
  }
  if (root.size() > kMaxTensors) return Error(name, "header names too many tensors");
  const std::span<const uint8_t> data = bytes.subspan(8 + header_size);

  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& tensor = it.key();
    if (tensor == "__metadata__") {
      if (!it->is_object()) return Error(name, "__metadata__ must be an object");
      continue;
    }
    TensorView view;
    std::pair<uint64_t, uint64_t> range;
    RETURN_IF_ERROR(ParseEntry(name, tensor, it.value(), data, view, range));
    ranges.push_back(range);
    file.tensors_.emplace(tensor, std::move(view));
  }
  // Tensors must not overlap (a lying header could alias one tensor's bytes as another's).
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return Error(name, "two tensors' data_offsets overlap");
    }
  }
  return file;
}

const TensorView* SafetensorsFile::Find(std::string_view tensor) const {
  auto it = tensors_.find(tensor);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<Checkpoint> Checkpoint::Open(
    const std::map<std::string, std::span<const uint8_t>, std::less<>>& files) {
  Checkpoint checkpoint;
  auto add_file = [&](const std::string& file_name,
                      std::span<const uint8_t> bytes) -> absl::Status {
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(file_name, bytes));
    for (const auto& [tensor, view] : file.tensors()) {
      if (!checkpoint.tensors_.emplace(tensor, view).second) {
        return Error(file_name, absl::StrCat("tensor \"", tensor, "\" is also in another shard"));
      }
    }
    return absl::OkStatus();
  };
  auto index = files.find("model.safetensors.index.json");
  if (index == files.end()) {
    auto single = files.find("model.safetensors");
    if (single == files.end()) {
      return absl::InvalidArgumentError(
          "checkpoint has neither model.safetensors nor model.safetensors.index.json");
    }
    RETURN_IF_ERROR(add_file(single->first, single->second));
    return checkpoint;
  }
  constexpr std::string_view kIndex = "model.safetensors.index.json";
  std::string_view text(reinterpret_cast<const char*>(index->second.data()), index->second.size());
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return Error(kIndex, "not a JSON object");
  auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object()) return Error(kIndex, "missing weight_map");
  std::map<std::string, std::string, std::less<>> owner;  // tensor -> shard
  std::vector<std::string> shards;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) return Error(kIndex, "weight_map values must be file names");
    const std::string shard = it->get<std::string>();
    if (files.find(shard) == files.end()) {
      return Error(kIndex, absl::StrCat("weight_map names \"", shard,
                                        "\", which is not in the checkpoint"));
    }
    owner.emplace(it.key(), shard);
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
  }
  std::sort(shards.begin(), shards.end());
  for (const std::string& shard : shards) {
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(shard, files.find(shard)->second));
    for (const auto& [tensor, view] : file.tensors()) {
      auto o = owner.find(tensor);
      if (o == owner.end() || o->second != shard) {
        return Error(shard, absl::StrCat("tensor \"", tensor, "\" is not mapped to this shard in ",
                                         std::string(kIndex)));
      }
      checkpoint.tensors_.emplace(tensor, view);
    }
  }
  for (const auto& [tensor, shard] : owner) {
    if (checkpoint.tensors_.find(tensor) == checkpoint.tensors_.end()) {
      return Error(shard, absl::StrCat("tensor \"", tensor, "\" of ", std::string(kIndex), " is missing"));
    }
  }
  return checkpoint;
}

const TensorView* Checkpoint::Find(std::string_view tensor) const {
  auto it = tensors_.find(tensor);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace cloister::llm
