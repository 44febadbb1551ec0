#include "proto/model_package.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/status.h"

namespace cloister::package {
namespace {

// The ustar header (POSIX.1-1988): field offsets and widths within the 512-byte block.
struct Field {
  const char* name;
  size_t offset;
  size_t width;
};
constexpr Field kName{"name", 0, 100};
constexpr Field kMode{"mode", 100, 8};
constexpr Field kUid{"uid", 108, 8};
constexpr Field kGid{"gid", 116, 8};
constexpr Field kSize{"size", 124, 12};
constexpr Field kMtime{"mtime", 136, 12};
constexpr Field kChecksum{"checksum", 148, 8};
constexpr Field kTypeflag{"typeflag", 156, 1};
constexpr Field kLinkname{"linkname", 157, 100};
constexpr Field kMagic{"magic", 257, 6};
constexpr Field kVersion{"version", 263, 2};
constexpr Field kUname{"uname", 265, 32};
constexpr Field kGname{"gname", 297, 32};
constexpr Field kDevmajor{"devmajor", 329, 8};
constexpr Field kDevminor{"devminor", 337, 8};
constexpr Field kPrefix{"prefix", 345, 155};
constexpr Field kPad{"padding", 500, 12};
// Every field but name, size and checksum has one canonical value (see CanonicalHeader).
constexpr std::array<Field, 13> kFixedFields{kMode,     kUid,      kGid,     kMtime, kTypeflag,
                                             kLinkname, kMagic,    kVersion, kUname, kGname,
                                             kDevmajor, kDevminor, kPrefix};

using Block = std::array<uint8_t, kBlockSize>;

constexpr size_t kShardNameSize = 32;  // "model-00001-of-00002.safetensors"

bool AllDigits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int ParseFiveDigits(std::string_view text) {
  int value = 0;
  for (char c : text) value = value * 10 + (c - '0');
  return value;
}

// For a shard name, its (index, total); nullopt for any other name.
std::optional<std::pair<int, int>> ShardNumbers(std::string_view name) {
  if (name.size() != kShardNameSize || name.substr(0, 6) != "model-" ||
      name.substr(11, 4) != "-of-" || name.substr(20) != ".safetensors") {
    return std::nullopt;
  }
  std::string_view index = name.substr(6, 5);
  std::string_view total = name.substr(15, 5);
  if (!AllDigits(index) || !AllDigits(total)) return std::nullopt;
  int index_value = ParseFiveDigits(index);
  int total_value = ParseFiveDigits(total);
  if (index_value < 1 || index_value > total_value) return std::nullopt;
  return std::make_pair(index_value, total_value);
}

bool IsSafetensorsName(std::string_view name) {
  return name == kSafetensors || ShardNumbers(name).has_value();
}

// Position of a member in the fixed order: the JSON files, then the safetensors files by name.
int Rank(std::string_view name) {
  if (name == kConfig) return 0;
  if (name == kGenerationConfig) return 1;
  if (name == kTokenizer) return 2;
  if (name == kTokenizerConfig) return 3;
  if (name == kSafetensorsIndex) return 4;
  return 5;
}

bool ComesBefore(std::string_view a, std::string_view b) {
  int rank_a = Rank(a);
  int rank_b = Rank(b);
  return rank_a != rank_b ? rank_a < rank_b : a < b;
}

std::string Quoted(std::string_view name) { return absl::StrCat("'", std::string(name), "'"); }

// Which of the allowlisted members a checkpoint must have, and how they go together.
absl::Status CheckMemberSet(const PackageMembers& members) {
  if (members.size() > kMaxMembers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model package: ", members.size(), " members, more than the ", kMaxMembers, " allowed"));
  }
  for (std::string_view required : {kConfig, kTokenizer}) {
    if (!members.contains(required)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model package: required member ", Quoted(required), " is missing"));
    }
  }
  bool single = members.contains(kSafetensors);
  int shard_count = 0;
  int shard_total = 0;
  std::string first_shard;
  for (const auto& [name, bytes] : members) {
    auto numbers = ShardNumbers(name);
    if (!numbers) continue;
    if (shard_count == 0) {
      shard_total = numbers->second;
      first_shard = name;
    } else if (numbers->second != shard_total) {
      return absl::InvalidArgumentError(absl::StrCat("model package: member ", Quoted(name),
                                                     " belongs to another set of shards than ",
                                                     Quoted(first_shard)));
    }
    ++shard_count;
  }
  if (!single && shard_count == 0) {
    return absl::InvalidArgumentError(
        "model package: no weights (model.safetensors or model-NNNNN-of-MMMMM.safetensors)");
  }
  if (single && shard_count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model package: both 'model.safetensors' and shards (", Quoted(first_shard), ")"));
  }
  if (shard_count > 0) {
    if (!members.contains(kSafetensorsIndex)) {
      return absl::InvalidArgumentError(absl::StrCat("model package: shards (", Quoted(first_shard),
                                                     ") without 'model.safetensors.index.json'"));
    }
    if (shard_count != shard_total) {
      return absl::InvalidArgumentError(absl::StrCat("model package: ", shard_count, " of ",
                                                     shard_total, " shards (", Quoted(first_shard),
                                                     " ...)"));
    }
  }
  return absl::OkStatus();
}

void PutText(Block& block, const Field& field, std::string_view text) {
  std::memcpy(block.data() + field.offset, text.data(), std::min(text.size(), field.width));
}

// `value` as `width - 1` octal digits and a NUL.
void PutOctal(Block& block, const Field& field, uint64_t value) {
  PutText(block, field, absl::StrFormat("%0*o", static_cast<int>(field.width - 1), value));
  block[field.offset + field.width - 1] = 0;
}

uint64_t ChecksumOf(const Block& block) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kBlockSize; ++i) {
    bool in_checksum = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.width;
    sum += in_checksum ? uint8_t{' '} : block[i];
  }
  return sum;
}

// The one header PackModel writes for a member of `name` and `size` bytes.
Block CanonicalHeader(std::string_view name, uint64_t size) {
  Block block{};
  PutText(block, kName, name);
  PutOctal(block, kMode, 0644);
  PutOctal(block, kUid, 0);
  PutOctal(block, kGid, 0);
  PutOctal(block, kSize, size);
  PutOctal(block, kMtime, 0);
  block[kTypeflag.offset] = '0';
  PutText(block, kMagic, std::string_view("ustar\0", 6));
  PutText(block, kVersion, "00");
  PutOctal(block, kDevmajor, 0);
  PutOctal(block, kDevminor, 0);
  // Six octal digits, a NUL and a space, as tar has always written it.
  uint64_t checksum = ChecksumOf(block);
  PutText(block, kChecksum, absl::StrFormat("%06o", checksum));
  block[kChecksum.offset + 6] = 0;
  block[kChecksum.offset + 7] = ' ';
  return block;
}

size_t PaddingFor(uint64_t size) { return (kBlockSize - size % kBlockSize) % kBlockSize; }

bool IsZero(ByteSpan bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

std::string_view FieldText(ByteSpan header, const Field& field) {
  return std::string_view(reinterpret_cast<const char*>(header.data()) + field.offset, field.width);
}

// The octal digits of a numeric field, which must end in a NUL; nullopt otherwise.
std::optional<uint64_t> ParseOctal(ByteSpan header, const Field& field) {
  std::string_view text = FieldText(header, field);
  if (text.back() != '\0') return std::nullopt;
  text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '7') return std::nullopt;
    value = value << 3 | static_cast<uint64_t>(c - '0');
  }
  return value;
}

// What a typeflag other than a regular file's is, for the error.
absl::string_view EntryKind(uint8_t typeflag) {
  switch (typeflag) {
    case '1':
      return "a hard link";
    case '2':
      return "a symbolic link";
    case '3':
      return "a character device";
    case '4':
      return "a block device";
    case '5':
      return "a directory";
    case '6':
      return "a FIFO";
    case 'x':
    case 'g':
      return "a pax extended header";
    case 'L':
    case 'K':
      return "a GNU long-name entry";
    default:
      return "not a regular file";
  }
}

}  // namespace

bool IsAllowedMemberName(std::string_view name) {
  return name == kConfig || name == kGenerationConfig || name == kTokenizer ||
         name == kTokenizerConfig || name == kSafetensorsIndex || IsSafetensorsName(name);
}

absl::StatusOr<Bytes> PackModel(const PackageMembers& members) {
  std::vector<std::pair<std::string_view, ByteSpan>> ordered;
  ordered.reserve(members.size());
  uint64_t total_size = 2 * kBlockSize;
  for (const auto& [name, bytes] : members) {
    if (!IsAllowedMemberName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model package: ", Quoted(name), " is not a checkpoint file a package may hold"));
    }
    if (bytes.size() > kMaxMemberSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("model package: member ", Quoted(name), " is ", bytes.size(),
                       " bytes, over the ustar limit of ", kMaxMemberSize));
    }
    ordered.emplace_back(name, bytes);
    total_size += kBlockSize + bytes.size() + PaddingFor(bytes.size());
  }
  RETURN_IF_ERROR(CheckMemberSet(members));
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return ComesBefore(a.first, b.first); });
  Bytes out;
  out.reserve(total_size);
  for (const auto& [name, bytes] : ordered) {
    Block header = CanonicalHeader(name, bytes.size());
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), bytes.begin(), bytes.end());
    out.resize(out.size() + PaddingFor(bytes.size()), 0);
  }
  out.resize(out.size() + 2 * kBlockSize, 0);
  return out;
}

absl::StatusOr<PackageMembers> ReadModelPackage(ByteSpan bytes) {
  PackageMembers members;
  std::string previous;
  size_t position = 0;
  for (size_t index = 0;; ++index) {
    // Errors about this member: its number and, once known, its name.
    std::string where = absl::StrCat("model package: member ", index);
    auto refuse = [&where](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
    };
    if (bytes.size() - position < kBlockSize) {
      return refuse(absl::StrCat("truncated at byte ", bytes.size(),
                                 " (no header block; a package ends with two zero blocks)"));
    }
    ByteSpan header = bytes.subspan(position, kBlockSize);
    if (IsZero(header)) {
      // The end marker: a second zero block, then nothing.
      if (bytes.size() - position < 2 * kBlockSize ||
          !IsZero(bytes.subspan(position + kBlockSize, kBlockSize))) {
        return absl::InvalidArgumentError(absl::StrCat("model package: a lone zero block at byte ",
                                                       position,
                                                       " (the end marker is two zero blocks)"));
      }
      if (bytes.size() - position != 2 * kBlockSize) {
        return absl::InvalidArgumentError(
            absl::StrCat("model package: ", bytes.size() - position - 2 * kBlockSize,
                         " bytes of trailing garbage after the end marker"));
      }
      break;
    }
    if (index >= kMaxMembers) {
      return refuse(absl::StrCat("more than the ", kMaxMembers, " members allowed"));
    }
    // The name first, so every later error names the member.
    std::string_view name_field = FieldText(header, kName);
    size_t name_size = name_field.find('\0');
    if (name_size == std::string_view::npos) return refuse("name field is not NUL-terminated");
    std::string name(name_field.substr(0, name_size));
    if (!IsZero(header.subspan(kName.offset + name_size, kName.width - name_size))) {
      return refuse(absl::StrCat("name ", Quoted(name), " has bytes after its NUL"));
    }
    absl::StrAppend(&where, " ", Quoted(name));
    // Six octal digits and a NUL (the space after them is checked with the canonical header).
    std::optional<uint64_t> checksum = ParseOctal(header, Field{"checksum", kChecksum.offset, 7});
    Block block;
    std::copy(header.begin(), header.end(), block.begin());
    if (!checksum || *checksum != ChecksumOf(block)) return refuse("header checksum mismatch");
    if (std::memcmp(header.data() + kMagic.offset,
                    "ustar\0"
                    "00",
                    8) != 0) {
      return refuse("not a POSIX ustar header (magic \"ustar\\0\" \"00\")");
    }
    uint8_t typeflag = header[kTypeflag.offset];
    if (typeflag != '0') {
      return refuse(absl::StrCat("is ", EntryKind(typeflag), ", not a regular file"));
    }
    if (name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
        name.find("..") != std::string::npos) {
      return refuse("name has a path separator or '..'");
    }
    if (!IsAllowedMemberName(name))
      return refuse("name is not a checkpoint file a package may hold");
    if (members.contains(name)) return refuse("duplicate member");
    if (!previous.empty() && !ComesBefore(previous, name)) {
      return refuse(absl::StrCat("out of order (after ", Quoted(previous), ")"));
    }
    std::optional<uint64_t> size = ParseOctal(header, kSize);
    if (!size) return refuse("size field is not 11 octal digits and a NUL");
    size_t data_start = position + kBlockSize;
    if (*size > bytes.size() - data_start) {
      return refuse(absl::StrCat("size of ", *size, " bytes runs past the end of the package (",
                                 bytes.size() - data_start, " bytes left)"));
    }
    // The rest of the header must be the canonical one, field by field.
    Block canonical = CanonicalHeader(name, *size);
    for (const Field& field : kFixedFields) {
      if (std::memcmp(header.data() + field.offset, canonical.data() + field.offset, field.width) !=
          0) {
        return refuse(absl::StrCat("header field '", field.name,
                                   "' is not the canonical value (mode 0644, owner 0:0, mtime 0, "
                                   "no names, links or prefix)"));
      }
    }
    if (std::memcmp(header.data(), canonical.data(), kBlockSize) != 0) {
      return refuse(absl::StrCat("header field '", kChecksum.name, "' or '", kPad.name,
                                 "' is not in its canonical form"));
    }
    size_t padding = PaddingFor(*size);
    size_t data_end = data_start + static_cast<size_t>(*size);
    if (padding > bytes.size() - data_end) {
      return refuse("truncated in the padding after its data");
    }
    if (!IsZero(bytes.subspan(data_end, padding))) return refuse("non-zero padding after its data");
    members.emplace(name, bytes.subspan(data_start, static_cast<size_t>(*size)));
    previous = std::move(name);
    position = data_end + padding;
  }
  RETURN_IF_ERROR(CheckMemberSet(members));
  return members;
}

bool IsModelPackage(ByteSpan bytes) {
  if (bytes.size() < kBlockSize) return false;
  static constexpr char kFirstName[] = "config.json";  // with its NUL
  return std::memcmp(bytes.data(), kFirstName, sizeof(kFirstName)) == 0 &&
         std::memcmp(bytes.data() + kMagic.offset,
                     "ustar\0"
                     "00",
                     8) == 0;
}

}  // namespace cloister::package
