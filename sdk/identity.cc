#include "sdk/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "crypto/keys.h"

namespace cloister::sdk {
namespace {

constexpr absl::string_view kPublicPrefix = "public: ";
constexpr absl::string_view kHeader(kIdentityKeyHeader.data(), kIdentityKeyHeader.size());
constexpr size_t kMaxKeyFileSize = 4096;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes exactly `size` bytes of hex into `out` (which may be secret memory).
bool DecodeHexInto(absl::string_view hex, std::span<uint8_t> out) {
  if (hex.size() != out.size() * 2) return false;
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexDigit(hex[2 * i]);
    int lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

absl::string_view TrimLineEnd(absl::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
    line.remove_suffix(1);
  }
  return line;
}

// Wipes a string that held key material when it goes out of scope.
struct WipeOnExit {
  std::string& text;
  ~WipeOnExit() { SecureWipe(text.data(), text.size()); }
};

}  // namespace

TenantIdentity TenantIdentity::Generate() {
  crypto::Ed25519KeyPair pair = crypto::GenerateEd25519();
  return TenantIdentity(std::move(pair.seed), std::move(pair.public_key));
}

absl::StatusOr<TenantIdentity> TenantIdentity::FromSeed(ByteSpan seed) {
  if (seed.size() != crypto::kEd25519SeedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("an Ed25519 seed is ", crypto::kEd25519SeedSize, " bytes, not ", seed.size()));
  }
  ASSIGN_OR_RETURN(crypto::Ed25519KeyPair pair, crypto::Ed25519FromSeed(seed));
  return TenantIdentity(std::move(pair.seed), std::move(pair.public_key));
}

absl::StatusOr<TenantIdentity> TenantIdentity::Parse(std::string_view text_in,
                                                     std::string_view file_name_in) {
  absl::string_view text(text_in.data(), text_in.size());
  absl::string_view file_name(file_name_in.data(), file_name_in.size());
  auto bad = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": not a cloister identity key: ", problem));
  };
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // Allow a final newline (and blank lines after the key), nothing else.
  while (!lines.empty() && TrimLineEnd(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) return bad("the file is empty");
  if (TrimLineEnd(lines[0]) != kHeader) {
    return bad(absl::StrCat("the first line is not \"", kHeader, "\""));
  }
  if (lines.size() < 3) return bad("expected 3 lines (header, seed, public key)");
  if (lines.size() > 3) return bad("unexpected text after the public key line");
  SecretBytes seed(crypto::kEd25519SeedSize);
  if (!DecodeHexInto(TrimLineEnd(lines[1]), seed.mutable_span())) {
    return bad("the second line is not a 64-digit hex seed");
  }
  absl::string_view public_line = TrimLineEnd(lines[2]);
  if (!absl::StartsWith(public_line, kPublicPrefix)) {
    return bad("the third line does not start with \"public: \"");
  }
  Bytes public_key(crypto::kEd25519PublicKeySize);
  if (!DecodeHexInto(public_line.substr(kPublicPrefix.size()), public_key)) {
    return bad("the public key is not 64 hex digits");
  }
  auto pair = crypto::Ed25519FromSeed(seed.span());
  if (!pair.ok()) return bad(pair.status().message());
  if (pair->public_key != public_key) {
    return bad("the public key does not match the seed (the file was altered)");
  }
  return TenantIdentity(std::move(pair->seed), std::move(pair->public_key));
}

absl::StatusOr<TenantIdentity> TenantIdentity::Load(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("identity key ", path,
                       " does not exist (create one with `cloister keygen --key ", path, "`)"));
    }
    if (err == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat("identity key ", path, " is a symbolic link; point to the file itself"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open identity key ", path, ": ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("identity key ", path, " is not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "identity key %s is accessible by group or others (mode %04o); run `chmod 600 %s`", path,
        st.st_mode & 07777, path));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxKeyFileSize) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a cloister identity key: the file is too large"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  WipeOnExit wipe{text};
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::PermissionDeniedError(
          absl::StrCat("cannot read identity key ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Parse(std::string_view(text).substr(0, done), path);
}

std::string TenantIdentity::Format() const {
  return absl::StrCat(kHeader, "\n", HexEncode(seed_.span()), "\n", kPublicPrefix,
                      HexEncode(public_key_), "\n");
}

absl::Status TenantIdentity::Save(const std::string& path) const {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    int err = errno;
    if (err == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " already exists; refusing to overwrite a key file"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(err)));
  }
  auto fail = [&](absl::string_view what, int err) {
    ::close(fd);
    ::unlink(path.c_str());
    return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err)));
  };
  // The umask can only remove bits, but make the mode exact regardless.
  if (::fchmod(fd, 0600) != 0) return fail("set the mode of", errno);
  std::string text = Format();
  WipeOnExit wipe{text};
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write", errno);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("flush", errno);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    return absl::InternalError(absl::StrCat("cannot close ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Bytes> TenantIdentity::Sign(ByteSpan message) const {
  return crypto::Ed25519Sign(seed_.span(), message);
}

}  // namespace cloister::sdk
