// configfs-tsm reports, the /dev/sev-guest ioctls and the SNP certificate table.

#include "attest/collectors/tsm.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attest/collectors/sev_guest_abi.h"
#include "attest/snp_report.h"
#include "attest/string_view.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/random.h"

namespace cloister::attest {
namespace {

namespace abi = sev_guest_abi;

absl::StatusCode ErrnoCode(int error) {
  switch (error) {
    case ENOENT:
    case ENODEV:
    case ENXIO:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case EBUSY:
    case EAGAIN:
    case EINTR:
    case EIO:
    case ETIMEDOUT:
      return absl::StatusCode::kUnavailable;
    case EINVAL:
    case E2BIG:
    case EFBIG:
    case ERANGE:
      return absl::StatusCode::kInvalidArgument;
    case ENOTTY:
    case EOPNOTSUPP:
    case ENOSYS:
      return absl::StatusCode::kUnimplemented;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoStatus(int error, std::string_view what) {
  return absl::Status(ErrnoCode(error), absl::StrCat(Sv(what), ": ", std::strerror(error)));
}

// Closes the descriptor on scope exit.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the result (configfs stores binary attributes on close).
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

class RealTsmFs : public TsmFs {
 public:
  bool IsDirectory(const std::string& path) override {
    struct stat info;
    return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
  }

  absl::Status MakeDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0700) != 0) return ErrnoStatus(errno, absl::StrCat("mkdir ", path));
    return absl::OkStatus();
  }

  absl::Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("rmdir ", path));
    return absl::OkStatus();
  }

  absl::Status Write(const std::string& path, ByteSpan data) override {
    ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("opening ", path, " for writing"));
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ErrnoStatus(n < 0 ? errno : EIO, absl::StrCat("writing ", path));
      done += static_cast<size_t>(n);
    }
    if (fd.Close() != 0) return ErrnoStatus(errno, absl::StrCat("writing ", path));
    return absl::OkStatus();
  }

  absl::StatusOr<Bytes> Read(const std::string& path, size_t max_size) override {
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("opening ", path));
    Bytes out;
    uint8_t buffer[4096];
    while (true) {
      ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("reading ", path));
      if (n == 0) break;
      if (out.size() + static_cast<size_t>(n) > max_size) {
        return absl::OutOfRangeError(absl::StrCat(path, " is larger than ", max_size, " bytes"));
      }
      out.insert(out.end(), buffer, buffer + n);
    }
    return out;
  }
};

absl::StatusOr<uint64_t> ReadGeneration(TsmFs& fs, const std::string& entry) {
  ASSIGN_OR_RETURN(Bytes text, fs.Read(entry + "/generation", 64));
  uint64_t generation = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ToString(text)), &generation)) {
    return absl::DataLossError(
        absl::StrCat(entry, "/generation holds '", ToString(text), "', not a number"));
  }
  return generation;
}

struct EntryResult {
  TsmReport report;
  uint64_t generation_before = 0;
};

// One request against a freshly made entry.
absl::StatusOr<EntryResult> RunEntry(TsmFs& fs, const std::string& entry,
                                     const TsmReportRequest& request) {
  EntryResult result;
  ASSIGN_OR_RETURN(Bytes provider, fs.Read(entry + "/provider", 256));
  result.report.provider = std::string(absl::StripAsciiWhitespace(ToString(provider)));
  if (!request.expected_provider.empty() && result.report.provider != request.expected_provider) {
    return absl::FailedPreconditionError(absl::StrCat("configfs-tsm provider is '",
                                                      result.report.provider, "', expected '",
                                                      request.expected_provider, "'"));
  }
  if (request.privlevel.has_value()) {
    RETURN_IF_ERROR(fs.Write(entry + "/privlevel", AsBytes(absl::StrCat(*request.privlevel))));
  }
  RETURN_IF_ERROR(fs.Write(entry + "/inblob", request.inblob));
  ASSIGN_OR_RETURN(result.generation_before, ReadGeneration(fs, entry));
  ASSIGN_OR_RETURN(result.report.outblob, fs.Read(entry + "/outblob", kTsmMaxOutblobSize));
  if (result.report.outblob.empty()) {
    return absl::DataLossError(absl::StrCat(entry, "/outblob is empty"));
  }
  auto auxblob = fs.Read(entry + "/auxblob", kTsmMaxAuxblobSize);
  if (auxblob.ok()) {
    result.report.auxblob = std::move(*auxblob);
  } else if (!absl::IsNotFound(auxblob.status())) {
    return auxblob.status();
  }
  ASSIGN_OR_RETURN(result.report.generation, ReadGeneration(fs, entry));
  return result;
}

uint32_t LoadLe32(ByteSpan bytes, size_t offset) {
  return static_cast<uint32_t>(bytes[offset]) | static_cast<uint32_t>(bytes[offset + 1]) << 8 |
         static_cast<uint32_t>(bytes[offset + 2]) << 16 |
         static_cast<uint32_t>(bytes[offset + 3]) << 24;
}

// ---- /dev/sev-guest ----

absl::StatusOr<int> OpenSevGuest(const std::string& device) {
  int fd = ::open(device.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          device, " not found: not an SEV-SNP guest, or the sev-guest driver is not loaded"));
    }
    return ErrnoStatus(error, absl::StrCat("opening ", device));
  }
  return fd;
}

absl::Status IoctlError(std::string_view request_name, const std::string& device, int error,
                        uint64_t exitinfo2) {
  return absl::Status(
      ErrnoCode(error),
      absl::StrCat(Sv(request_name), " on ", device, " failed: ", std::strerror(error),
                   " (firmware error 0x", absl::Hex(exitinfo2 & 0xFFFFFFFFu), ", VMM error 0x",
                   absl::Hex(exitinfo2 >> 32), ")"));
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// ---- certificate table ----

std::string GuidText(ByteSpan guid) {
  std::string hex = HexEncode(guid);
  return absl::StrCat(hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-",
                      hex.substr(16, 4), "-", hex.substr(20, 12));
}

SnpCertKind KindOfGuid(std::string_view guid) {
  if (guid == kSnpVcekGuid) return SnpCertKind::kVcek;
  if (guid == kSnpVlekGuid) return SnpCertKind::kVlek;
  if (guid == kSnpAskGuid) return SnpCertKind::kAsk;
  if (guid == kSnpArkGuid) return SnpCertKind::kArk;
  return SnpCertKind::kOther;
}

std::string EntryName(size_t index, const SnpCertEntry& entry) {
  switch (entry.kind) {
    case SnpCertKind::kVcek:
      return absl::StrCat("entry ", index, " (VCEK)");
    case SnpCertKind::kVlek:
      return absl::StrCat("entry ", index, " (VLEK)");
    case SnpCertKind::kAsk:
      return absl::StrCat("entry ", index, " (ASK)");
    case SnpCertKind::kArk:
      return absl::StrCat("entry ", index, " (ARK)");
    case SnpCertKind::kOther:
      break;
  }
  return absl::StrCat("entry ", index, " (", entry.guid, ")");
}

// A certificate as hosts store it: PEM text, or DER possibly followed by zero padding.
absl::StatusOr<Certificate> ParseTableCertificate(ByteSpan data) {
  constexpr std::string_view kPemStart = "-----BEGIN";
  if (data.size() >= kPemStart.size() &&
      std::equal(kPemStart.begin(), kPemStart.end(), data.begin())) {
    std::string pem = ToString(data);
    while (!pem.empty() && pem.back() == '\0') pem.pop_back();
    return Certificate::FromPem(pem);
  }
  // DER SEQUENCE header: tag 0x30, then a short or long-form length.
  if (data.size() < 2 || data[0] != 0x30) {
    return absl::InvalidArgumentError("neither a DER certificate nor PEM");
  }
  size_t header = 2;
  uint64_t length = data[1];
  if (data[1] & 0x80) {
    size_t octets = data[1] & 0x7F;
    if (octets == 0 || octets > 4 || data.size() < 2 + octets) {
      return absl::InvalidArgumentError("malformed DER length");
    }
    length = 0;
    for (size_t i = 0; i < octets; ++i) length = (length << 8) | data[2 + i];
    header += octets;
  }
  if (length > data.size() - header) {
    return absl::InvalidArgumentError(absl::StrCat("DER certificate of ", header + length,
                                                   " bytes is longer than its ", data.size(),
                                                   "-byte entry"));
  }
  ByteSpan der = data.first(header + length);
  ByteSpan padding = data.subspan(header + length);
  if (std::any_of(padding.begin(), padding.end(), [](uint8_t b) { return b != 0; })) {
    return absl::InvalidArgumentError("non-zero bytes after the DER certificate");
  }
  return Certificate::FromDer(der);
}

}  // namespace

TsmFs& TsmFs::Real() {
  static RealTsmFs* fs = new RealTsmFs();
  return *fs;
}

absl::StatusOr<TsmReport> GetTsmReport(TsmFs& fs, const std::string& root,
                                       const TsmReportRequest& request) {
  if (request.inblob.size() > kTsmMaxInblobSize) {
    return absl::InvalidArgumentError(absl::StrCat("configfs-tsm inblob is ", request.inblob.size(),
                                                   " bytes, at most 64 allowed"));
  }
  if (request.privlevel.has_value() && *request.privlevel > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("configfs-tsm privlevel ", *request.privlevel, " is above 3"));
  }
  if (!fs.IsDirectory(root)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configfs-tsm is not available: ", root,
        " is not a directory (needs Linux 6.7 or newer in a confidential VM, configfs mounted)"));
  }
  uint64_t before = 0;
  uint64_t after = 0;
  for (int attempt = 0; attempt < kTsmMaxAttempts; ++attempt) {
    std::string entry =
        absl::StrCat(root, "/cloister-", ::getpid(), "-", HexEncode(crypto::RandomBytes(8)));
    RETURN_IF_ERROR(fs.MakeDir(entry));
    absl::StatusOr<EntryResult> result = RunEntry(fs, entry, request);
    absl::Status removed = fs.RemoveDir(entry);
    if (!removed.ok()) {
      Log(LogLevel::kWarning, "tsm_entry_left_behind",
          {{"entry", entry}, {"reason", std::string(removed.message())}});
    }
    if (!result.ok()) return result.status();
    if (result->generation_before == result->report.generation) {
      return std::move(result->report);
    }
    before = result->generation_before;
    after = result->report.generation;
    Log(LogLevel::kWarning, "tsm_concurrent_writer",
        {{"entry", entry},
         {"before", static_cast<unsigned long>(before)},
         {"after", static_cast<unsigned long>(after)}});
  }
  return absl::AbortedError(absl::StrCat(
      "configfs-tsm report changed while it was read (generation ", before, " -> ", after, ") in ",
      kTsmMaxAttempts, " attempts: another writer is using the entry"));
}

// ---- /dev/sev-guest ----

absl::StatusOr<Bytes> ParseSnpReportResponse(ByteSpan response) {
  if (response.size() < abi::kReportOffset) {
    return absl::DataLossError(
        absl::StrCat("SNP report response is ", response.size(), " bytes, too short"));
  }
  uint32_t status = LoadLe32(response, abi::kResponseStatusOffset);
  if (status != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the SNP firmware refused the report request: status 0x", absl::Hex(status)));
  }
  uint32_t size = LoadLe32(response, abi::kReportSizeOffset);
  if (size == 0 || size > response.size() - abi::kReportOffset) {
    return absl::DataLossError(absl::StrCat("SNP report response gives a report size of ", size,
                                            " bytes, outside 1..",
                                            response.size() - abi::kReportOffset));
  }
  ByteSpan report = response.subspan(abi::kReportOffset, size);
  return Bytes(report.begin(), report.end());
}

absl::StatusOr<SecretBytes> ParseSnpDerivedKeyResponse(ByteSpan response) {
  if (response.size() < abi::kDerivedKeyOffset + abi::kDerivedKeySize) {
    return absl::DataLossError(
        absl::StrCat("SNP derived-key response is ", response.size(), " bytes, too short"));
  }
  uint32_t status = LoadLe32(response, abi::kResponseStatusOffset);
  if (status != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the SNP firmware refused the derived-key request: status 0x", absl::Hex(status)));
  }
  return SecretBytes(response.subspan(abi::kDerivedKeyOffset, abi::kDerivedKeySize));
}

absl::StatusOr<SevGuestReport> GetSevGuestReport(const std::string& device, ByteSpan report_data,
                                                 uint32_t vmpl) {
  if (report_data.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("SNP REPORT_DATA is ", report_data.size(), " bytes, expected 64"));
  }
  if (vmpl > 3) return absl::InvalidArgumentError(absl::StrCat("VMPL ", vmpl, " is above 3"));
  ASSIGN_OR_RETURN(int raw_fd, OpenSevGuest(device));
  ScopedFd fd(raw_fd);

  abi::ReportRequest request{};
  std::memcpy(request.user_data, report_data.data(), report_data.size());
  request.vmpl = vmpl;
  Bytes response(abi::kReportResponseSize, 0);

  size_t certs_size = abi::kMaxCertsSize;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<uint8_t, FreeDeleter> certs(
        static_cast<uint8_t*>(std::aligned_alloc(abi::kPageSize, certs_size)));
    if (certs == nullptr)
      return absl::ResourceExhaustedError("no memory for the certificate buffer");
    std::memset(certs.get(), 0, certs_size);
    abi::ExtReportRequest ext{};
    ext.data = request;
    ext.certs_address = reinterpret_cast<uint64_t>(certs.get());
    ext.certs_len = static_cast<uint32_t>(certs_size);
    abi::GuestRequest guest{};
    guest.msg_version = abi::kMessageVersion;
    guest.req_data = reinterpret_cast<uint64_t>(&ext);
    guest.resp_data = reinterpret_cast<uint64_t>(response.data());
    if (::ioctl(fd.get(), abi::kGetExtReport, &guest) == 0) {
      SevGuestReport out;
      ASSIGN_OR_RETURN(out.report, ParseSnpReportResponse(response));
      ByteSpan table(certs.get(), certs_size);
      // An all-zero buffer means the host supplied no certificates.
      if (std::any_of(table.begin(), table.end(), [](uint8_t b) { return b != 0; })) {
        out.certificate_table.assign(table.begin(), table.end());
      }
      return out;
    }
    int error = errno;
    uint32_t vmm_error = static_cast<uint32_t>(guest.exitinfo2 >> 32);
    if (vmm_error == abi::kVmmErrorInvalidLength && attempt == 0 && ext.certs_len > certs_size &&
        ext.certs_len <= 16 * abi::kMaxCertsSize && ext.certs_len % abi::kPageSize == 0) {
      certs_size = ext.certs_len;  // the host needs a larger buffer; the kernel says how large
      continue;
    }
    if (error != ENOTTY && error != EOPNOTSUPP && error != ENOSYS) {
      return IoctlError("SNP_GET_EXT_REPORT", device, error, guest.exitinfo2);
    }
    break;  // the kernel has no extended report: plain report without certificates
  }

  abi::GuestRequest guest{};
  guest.msg_version = abi::kMessageVersion;
  guest.req_data = reinterpret_cast<uint64_t>(&request);
  guest.resp_data = reinterpret_cast<uint64_t>(response.data());
  if (::ioctl(fd.get(), abi::kGetReport, &guest) != 0) {
    return IoctlError("SNP_GET_REPORT", device, errno, guest.exitinfo2);
  }
  SevGuestReport out;
  ASSIGN_OR_RETURN(out.report, ParseSnpReportResponse(response));
  return out;
}

absl::StatusOr<SecretBytes> GetSnpDerivedKey(const std::string& device,
                                             const SnpDerivedKeyRequest& request) {
  constexpr uint64_t kKnownFields = (uint64_t{1} << 6) - 1;
  if ((request.guest_field_select & ~kKnownFields) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("SNP derived-key field select 0x",
                                                   absl::Hex(request.guest_field_select),
                                                   " has bits outside 0-5"));
  }
  if (request.vmpl > 3) {
    return absl::InvalidArgumentError(absl::StrCat("VMPL ", request.vmpl, " is above 3"));
  }
  ASSIGN_OR_RETURN(int raw_fd, OpenSevGuest(device));
  ScopedFd fd(raw_fd);
  abi::DerivedKeyRequest key_request{};
  key_request.root_key_select = request.use_vmrk ? 1 : 0;
  key_request.guest_field_select = request.guest_field_select;
  key_request.vmpl = request.vmpl;
  key_request.guest_svn = request.guest_svn;
  key_request.tcb_version = request.tcb_version;
  SecretBytes response(abi::kDerivedKeyResponseSize);
  abi::GuestRequest guest{};
  guest.msg_version = abi::kMessageVersion;
  guest.req_data = reinterpret_cast<uint64_t>(&key_request);
  guest.resp_data = reinterpret_cast<uint64_t>(response.data());
  if (::ioctl(fd.get(), abi::kGetDerivedKey, &guest) != 0) {
    return IoctlError("SNP_GET_DERIVED_KEY", device, errno, guest.exitinfo2);
  }
  return ParseSnpDerivedKeyResponse(response.span());
}

// ---- certificate table ----

absl::StatusOr<Bytes> SnpGuidBytes(std::string_view guid) {
  if (guid.size() != 36 || guid[8] != '-' || guid[13] != '-' || guid[18] != '-' ||
      guid[23] != '-') {
    return absl::InvalidArgumentError(absl::StrCat("'", Sv(guid), "' is not a GUID"));
  }
  std::string hex;
  for (char c : guid) {
    if (c != '-') hex.push_back(c);
  }
  return HexDecode(hex);
}

absl::StatusOr<std::vector<SnpCertEntry>> ParseSnpCertTable(ByteSpan table) {
  std::vector<SnpCertEntry> entries;
  if (table.empty()) return entries;
  struct Range {
    size_t index;
    uint32_t offset;
    uint32_t length;
  };
  std::vector<Range> ranges;
  for (size_t index = 0;; ++index) {
    size_t position = index * kSnpCertTableEntrySize;
    if (position + kSnpCertTableEntrySize > table.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SNP certificate table has no all-zero terminating entry within its ",
                       table.size(), " bytes"));
    }
    ByteSpan raw = table.subspan(position, kSnpCertTableEntrySize);
    if (std::all_of(raw.begin(), raw.end(), [](uint8_t b) { return b == 0; })) break;
    if (index == kSnpCertTableMaxEntries) {
      return absl::InvalidArgumentError(absl::StrCat("SNP certificate table has more than ",
                                                     kSnpCertTableMaxEntries, " entries"));
    }
    ByteSpan guid = raw.first(16);
    SnpCertEntry entry;
    entry.guid = GuidText(guid);
    entry.kind = KindOfGuid(entry.guid);
    uint32_t offset = LoadLe32(raw, 16);
    uint32_t length = LoadLe32(raw, 20);
    if (std::all_of(guid.begin(), guid.end(), [](uint8_t b) { return b == 0; })) {
      return absl::InvalidArgumentError(absl::StrCat("SNP certificate table entry ", index,
                                                     " has a zero GUID but is not all zero"));
    }
    if (length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SNP certificate table ", EntryName(index, entry), " has length 0"));
    }
    if (offset > table.size() || length > table.size() - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("SNP certificate table ", EntryName(index, entry), ": offset ", offset,
                       " + length ", length, " runs past the table's ", table.size(), " bytes"));
    }
    for (size_t other = 0; other < entries.size(); ++other) {
      if (entries[other].guid == entry.guid) {
        return absl::InvalidArgumentError(absl::StrCat("SNP certificate table ",
                                                       EntryName(index, entry),
                                                       " repeats the GUID of entry ", other));
      }
    }
    entry.data.assign(table.begin() + offset, table.begin() + offset + length);
    ranges.push_back({index, offset, length});
    entries.push_back(std::move(entry));
  }
  // The entries and their terminator come first; certificate data must lie after them and
  // no two entries may share bytes.
  const size_t entries_end = (entries.size() + 1) * kSnpCertTableEntrySize;
  for (const Range& range : ranges) {
    if (range.offset < entries_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("SNP certificate table ", EntryName(range.index, entries[range.index]),
                       ": data at offset ", range.offset,
                       " overlaps the table's entries, which end at ", entries_end));
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& previous = ranges[i - 1];
    if (uint64_t{previous.offset} + previous.length > ranges[i].offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("SNP certificate table ", EntryName(previous.index, entries[previous.index]),
                       " and ", EntryName(ranges[i].index, entries[ranges[i].index]), " overlap"));
    }
  }
  for (size_t index = 0; index < entries.size(); ++index) {
    SnpCertEntry& entry = entries[index];
    if (entry.kind == SnpCertKind::kOther) continue;
    auto certificate = ParseTableCertificate(entry.data);
    if (!certificate.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SNP certificate table ", EntryName(index, entry), ": ", certificate.status().message()));
    }
    entry.certificate = std::move(*certificate);
  }
  return entries;
}

std::string SnpCertChainPem(const std::vector<SnpCertEntry>& entries, uint32_t signing_key) {
  auto find = [&](SnpCertKind kind) -> const SnpCertEntry* {
    for (const SnpCertEntry& entry : entries) {
      if (entry.kind == kind && entry.certificate.has_value()) return &entry;
    }
    return nullptr;
  };
  const SnpCertEntry* leaf = nullptr;
  if (signing_key == kSnpSigningKeyVcek) leaf = find(SnpCertKind::kVcek);
  if (signing_key == kSnpSigningKeyVlek) leaf = find(SnpCertKind::kVlek);
  if (leaf == nullptr) return "";
  std::vector<Certificate> chain = {*leaf->certificate};
  if (const SnpCertEntry* ask = find(SnpCertKind::kAsk)) chain.push_back(*ask->certificate);
  if (const SnpCertEntry* ark = find(SnpCertKind::kArk)) chain.push_back(*ark->certificate);
  return ChainToPem(chain);
}

}  // namespace cloister::attest
