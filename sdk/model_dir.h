// Packing a Hugging Face checkpoint folder into a model package (proto/model_package.h) for
// upload. Which files are the checkpoint is proto/checkpoint_dir.h's call, the same for the
// offline LLM tools: only the files a package may hold are read, everything else in the folder
// (README.md, *.gguf, ...) is left alone, and links are refused rather than followed, so what is
// packed is what the folder holds.
// Thread-safe: no shared state.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::sdk {

// The checkpoint files of the folder `dir`, by member name, each a regular file
// (package::ListCheckpointDir). Refuses with one line naming the folder or file: a folder that
// cannot be read, a checkpoint file that is a symbolic link or not a regular file, a folder
// without config.json, tokenizer.json or weights (model.safetensors or its shards), and a
// model.safetensors.index.json that is not JSON or names a shard the folder lacks. Reads no file
// but the index.
absl::StatusOr<std::map<std::string, std::string>> ListModelDir(const std::string& dir);

// Reads the files ListModelDir finds and packs them (PackModel): the bytes to upload, whose
// SHA-256 is the model digest the enclave reports. Refuses what ListModelDir refuses, a file that
// cannot be read or changes type while read, and a set PackModel refuses (shards without their
// index, say). `max_size` bounds the package (InvalidArgument above it, before reading).
absl::StatusOr<Bytes> PackModelDir(const std::string& dir, uint64_t max_size);

}  // namespace cloister::sdk
