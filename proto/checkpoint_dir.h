// Checkpoint folders: which files of a Hugging Face checkpoint folder make the checkpoint, and
// reading them, in one place for the SDK (which packs them, model_package.h) and the offline
// LLM tools (which load them). A checkpoint file is one a package may hold
// (IsAllowedMemberName): config.json, generation_config.json, tokenizer.json,
// tokenizer_config.json, model.safetensors.index.json, model.safetensors or its shards.
// Everything else in the folder (README.md, *.gguf, subfolders) is left alone. Links are refused
// rather than followed, so what is read is what the folder holds.
// Thread-safe: no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::package {

// The largest model.safetensors.index.json ListCheckpointDir reads (real ones are kilobytes).
inline constexpr uint64_t kMaxSafetensorsIndexSize = uint64_t{64} << 20;

// The checkpoint files of the folder `dir`, member name -> path, each a regular file. With a
// model.safetensors.index.json, reads it and checks that every shard its "weight_map" names is
// a shard name (model-NNNNN-of-MMMMM.safetensors) of a file in the folder. InvalidArgument, one
// line naming the folder or file: a folder that cannot be read, a checkpoint file that is a
// symbolic link or not a regular file, a folder without config.json, tokenizer.json or weights
// (model.safetensors or shards), an index that is not JSON, has no "weight_map" object, or names
// a shard outside the folder, a file that is not a shard, or a shard the folder lacks. Whether
// the files go together (shards without their index, say) is PackModel's or the loader's call.
absl::StatusOr<std::map<std::string, std::string>> ListCheckpointDir(const std::string& dir);

// Reads the regular file `path` whole, without following a link. InvalidArgument for a link, a
// file that is not regular or holds more than `max_size` bytes; PermissionDenied for one that
// cannot be opened or read; Aborted for one that changes size while read.
absl::StatusOr<std::string> ReadCheckpointFile(const std::string& path, uint64_t max_size);

// Reads the files ListCheckpointDir finds and packs them (PackModel): the package whose SHA-256
// is the model digest the enclave reports. Refuses what ListCheckpointDir refuses, a file that
// cannot be read or changes type while read, and a set PackModel refuses (shards without their
// index, say). `max_size` bounds the package (InvalidArgument above it, before reading). The
// files' contents are wiped once packed.
absl::StatusOr<Bytes> PackCheckpointDir(const std::string& dir, uint64_t max_size);

}  // namespace cloister::package
