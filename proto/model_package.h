// Model packages (docs/PROTOCOL.md, "Model packages"): a Hugging Face checkpoint folder packed
// into one deterministic POSIX ustar archive, so a tenant can inspect it with `tar tvf` and the
// same files always give the same bytes, hence the same SHA-256 (the model digest). The SDK
// writes packages (PackModel); the enclave reads them in memory (ReadModelPackage) with a
// strict reader that accepts only the canonical encoding PackModel writes: any other archive,
// however valid as tar, is refused with a one-line error that names the member.
//
// Members, in this order: config.json, generation_config.json (optional), tokenizer.json,
// tokenizer_config.json (optional), model.safetensors.index.json (with shards), then either
// model.safetensors or its shards (model-00001-of-00003.safetensors, ...) by name.
//
// Thread-safe: pure functions. ReadModelPackage returns views into the caller's buffer, which
// must outlive them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::package {

inline constexpr size_t kBlockSize = 512;
// More members than the five JSON files and this many shards is refused.
inline constexpr size_t kMaxMembers = 256;
// The largest member ustar's 11 octal size digits can say (8 GiB - 1).
inline constexpr uint64_t kMaxMemberSize = (uint64_t{1} << 33) - 1;

inline constexpr std::string_view kConfig = "config.json";
inline constexpr std::string_view kGenerationConfig = "generation_config.json";
inline constexpr std::string_view kTokenizer = "tokenizer.json";
inline constexpr std::string_view kTokenizerConfig = "tokenizer_config.json";
inline constexpr std::string_view kSafetensorsIndex = "model.safetensors.index.json";
inline constexpr std::string_view kSafetensors = "model.safetensors";

// A package's members by name, viewing the package's bytes.
using PackageMembers = std::map<std::string, ByteSpan, std::less<>>;

// Whether `name` may be a member: one of the fixed names above, or a shard name
// "model-NNNNN-of-MMMMM.safetensors" with 1 <= NNNNN <= MMMMM (five digits each).
bool IsAllowedMemberName(std::string_view name);

// Packs `members` (name -> bytes, any order) into the canonical archive. InvalidArgument, with
// the member's name, for a name IsAllowedMemberName refuses, a member over kMaxMemberSize, more
// than kMaxMembers, or a set that ReadModelPackage would refuse (a required member missing,
// model.safetensors beside shards, shards without the index, shards of different totals).
absl::StatusOr<Bytes> PackModel(const PackageMembers& members);

// Reads a package produced by PackModel. InvalidArgument ("model package: member 2
// 'tokenizer.json': ...") for: a header block whose checksum is wrong or whose fields are not
// the canonical ones (regular file, mode 0644, owner 0:0, no names, mtime 0, no link, no
// prefix), an entry that is not a regular file, a name outside the allowlist (path separators
// and ".." included), a duplicate or out-of-order member, a size beyond the buffer, non-zero
// padding, more than kMaxMembers, a missing required member, a missing or short end marker,
// and bytes after it.
absl::StatusOr<PackageMembers> ReadModelPackage(ByteSpan bytes);

// Whether `bytes` start like a package: a first header block named config.json with the ustar
// magic ("ustar\0" "00" at offset 257). Says nothing about the rest; ReadModelPackage decides.
// Lets the enclave tell a packaged LLM checkpoint from an ONNX model: a serialized ModelProto
// cannot start with 'c' (field 12 as a group, which ModelProto does not have).
bool IsModelPackage(ByteSpan bytes);

}  // namespace cloister::package
