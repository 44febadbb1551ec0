#include "host/audit/audit_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"
#include "cloister/attest/v1/evidence.pb.h"
#include "crypto/hash.h"
#include "crypto/receipt.h"
#include "nlohmann/json.hpp"

namespace cloister::host {
namespace {

using Json = nlohmann::json;

constexpr size_t kDigestSize = 32;
constexpr uint64_t kMaxAuditFileSize = uint64_t{16} << 30;

bool IsWord(absl::string_view text) {
  if (text.empty() || text.size() > 64) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string Limit(absl::string_view value) {
  if (value.size() <= kMaxAuditValueSize) return std::string(value);
  return absl::StrCat(value.substr(0, kMaxAuditValueSize), "...");
}

// The exact bytes of one line, without its newline.
std::string EntryLine(uint64_t sequence, absl::Time time, absl::string_view event,
                      absl::string_view tenant_id, const AuditDetails& details,
                      ByteSpan previous_digest) {
  Json details_json = Json::object();
  for (const auto& [key, value] : details) details_json[key] = Limit(value);
  Json entry = {
      {"seq", sequence},
      {"time", absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone())},
      {"event", std::string(event)},
      {"tenant", Limit(tenant_id)},
      {"details", std::move(details_json)},
      {"prev", HexEncode(previous_digest)},
  };
  // Keys come out sorted (nlohmann's object is a std::map); bytes that are not UTF-8 are
  // replaced rather than thrown on.
  return entry.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("cannot append to audit log ", path, ": ", std::strerror(errno)));
    }
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Splits the file into lines; a non-empty remainder after the last newline is a torn entry.
absl::StatusOr<std::vector<std::string_view>> SplitLines(absl::string_view absl_text) {
  std::string_view text(absl_text.data(), absl_text.size());
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      return absl::DataLossError(absl::StrCat("entry ", lines.size() + 1,
                                              ": the last line is incomplete (no newline): a torn "
                                              "write or a truncated file"));
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

absl::Status Bad(uint64_t entry, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("entry ", entry, ": ", what));
}

bool SameKey(const Bytes& a, const Bytes& b) { return a == b; }

}  // namespace

AuditLog::AuditLog(std::string path, int fd, Clock* clock, uint64_t last_sequence,
                   Bytes last_digest, uint64_t signed_sequence, bool head_is_checkpoint)
    : path_(std::move(path)),
      clock_(clock),
      fd_(fd),
      last_sequence_(last_sequence),
      last_digest_(std::move(last_digest)),
      signed_sequence_(signed_sequence),
      head_is_checkpoint_(head_is_checkpoint) {}

AuditLog::~AuditLog() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path, Clock* clock) {
  std::string folder = std::filesystem::path(path).parent_path().string();
  if (!folder.empty()) RETURN_IF_ERROR(MakeDirs(folder, 0700));
  uint64_t last_sequence = 0;
  Bytes last_digest(kDigestSize, 0);
  uint64_t signed_sequence = 0;
  bool head_is_checkpoint = false;
  if (FileExists(path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxAuditFileSize));
    ASSIGN_OR_RETURN(std::vector<std::string_view> lines, SplitLines(text));
    if (!lines.empty()) {
      // Only the last line is read back: the chain continues from it. The whole file is
      // `cloister-audit verify`'s business.
      Json last = Json::parse(lines.back(), nullptr, false);
      if (last.is_discarded() || !last.is_object() || !last.contains("seq") ||
          !last["seq"].is_number_unsigned()) {
        return absl::DataLossError(
            absl::StrCat("audit log ", path, ": entry ", lines.size(),
                         " is not a valid entry; run cloister-audit verify"));
      }
      last_sequence = last["seq"].get<uint64_t>();
      last_digest = crypto::Sha256(AsBytes(lines.back()));
      head_is_checkpoint = last.value("event", "") == audit_event::kCheckpoint;
      for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
        Json entry = Json::parse(*it, nullptr, false);
        if (entry.is_discarded() || !entry.is_object()) break;
        if (entry.value("event", "") == audit_event::kCheckpoint && entry.contains("details") &&
            entry["details"].is_object()) {
          uint64_t covers = 0;
          if (absl::SimpleAtoi(entry["details"].value("covers_seq", ""), &covers)) {
            signed_sequence = covers;
          }
          break;
        }
      }
    }
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open audit log ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<AuditLog>(new AuditLog(
      path, fd, clock, last_sequence, std::move(last_digest), signed_sequence, head_is_checkpoint));
}

absl::Status AuditLog::AppendLocked(absl::string_view event, absl::string_view tenant_id,
                                    const AuditDetails& details) {
  CLOISTER_CHECK(IsWord(event));
  for (const auto& detail : details) CLOISTER_CHECK(IsWord(detail.first));
  std::string line =
      EntryLine(last_sequence_ + 1, clock_->Now(), event, tenant_id, details, last_digest_);
  Bytes digest = crypto::Sha256(AsBytes(line));
  line.push_back('\n');
  RETURN_IF_ERROR(WriteAll(fd_, line, path_));
  ++last_sequence_;
  last_digest_ = std::move(digest);
  head_is_checkpoint_ = event == audit_event::kCheckpoint;
  return absl::OkStatus();
}

absl::Status AuditLog::Record(absl::string_view event, absl::string_view tenant_id,
                              const AuditDetails& details) {
  absl::MutexLock lock(&mu_);
  return AppendLocked(event, tenant_id, details);
}

absl::Status AuditLog::Checkpoint(const Signer& signer) {
  absl::MutexLock checkpoint_lock(&checkpoint_mu_);
  uint64_t sequence;
  Bytes digest;
  {
    absl::MutexLock lock(&mu_);
    // Nothing new since the last checkpoint (whose own entry is the head): nothing to sign.
    if (last_sequence_ == 0 || head_is_checkpoint_) return absl::OkStatus();
    sequence = last_sequence_;
    digest = last_digest_;
  }
  ASSIGN_OR_RETURN(boundary::v1::SignedAuditCheckpoint signed_checkpoint, signer(digest, sequence));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AppendLocked(audit_event::kCheckpoint, "",
                               {{"covers_seq", absl::StrCat(sequence)},
                                {"checkpoint", HexEncode(AsBytes(signed_checkpoint.checkpoint()))},
                                {"signature", HexEncode(AsBytes(signed_checkpoint.signature()))}}));
  signed_sequence_ = sequence;
  return absl::OkStatus();
}

absl::Status AuditLog::Sync() {
  absl::MutexLock lock(&mu_);
  if (::fdatasync(fd_) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot sync audit log ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

uint64_t AuditLog::entry_count() const {
  absl::MutexLock lock(&mu_);
  return last_sequence_;
}

uint64_t AuditLog::signed_count() const {
  absl::MutexLock lock(&mu_);
  return signed_sequence_;
}

absl::StatusOr<AuditReport> VerifyAuditText(absl::string_view text,
                                            const std::vector<Bytes>& trusted_keys) {
  ASSIGN_OR_RETURN(std::vector<std::string_view> lines, SplitLines(text));
  AuditReport report;
  std::vector<Bytes> digests;  // digests[i]: SHA-256 of entry i + 1
  digests.reserve(lines.size());
  Bytes previous(kDigestSize, 0);
  for (size_t index = 0; index < lines.size(); ++index) {
    const uint64_t number = index + 1;
    Json entry = Json::parse(lines[index], nullptr, false);
    if (entry.is_discarded() || !entry.is_object()) return Bad(number, "is not a JSON object");
    static const char* const kKeys[] = {"details", "event", "prev", "seq", "tenant", "time"};
    if (entry.size() != std::size(kKeys)) {
      return Bad(number, "does not have exactly the keys seq, time, event, tenant, details, prev");
    }
    for (const char* key : kKeys) {
      if (!entry.contains(key)) return Bad(number, absl::StrCat("has no \"", key, "\""));
    }
    if (!entry["seq"].is_number_unsigned()) return Bad(number, "\"seq\" is not a number");
    uint64_t sequence = entry["seq"].get<uint64_t>();
    if (sequence != number) {
      return Bad(number, absl::StrCat("line ", number, " holds entry ", sequence,
                                      sequence > number ? ": entries were removed before it"
                                                        : ": an entry was inserted or repeated"));
    }
    if (!entry["time"].is_string() || !entry["event"].is_string() || !entry["tenant"].is_string() ||
        !entry["prev"].is_string() || !entry["details"].is_object()) {
      return Bad(number, "a field has the wrong type");
    }
    for (const auto& [key, value] : entry["details"].items()) {
      if (!value.is_string())
        return Bad(number, absl::StrCat("detail \"", key, "\" is not a string"));
    }
    if (entry["prev"].get<std::string>() != HexEncode(previous)) {
      return Bad(number > 1 ? number - 1 : number,
                 absl::StrCat("was changed or removed: the hash that entry ", number,
                              " records for its predecessor does not match"));
    }
    Bytes digest = crypto::Sha256(AsBytes(lines[index]));
    if (entry["event"].get<std::string>() == audit_event::kCheckpoint) {
      const Json& details = entry["details"];
      uint64_t covers = 0;
      if (!details.contains("covers_seq") || !details.contains("checkpoint") ||
          !details.contains("signature") ||
          !absl::SimpleAtoi(details["covers_seq"].get<std::string>(), &covers) || covers == 0 ||
          covers >= number) {
        return Bad(number,
                   "checkpoint lacks covers_seq, checkpoint or signature, or covers no "
                   "earlier entry");
      }
      absl::StatusOr<Bytes> checkpoint_bytes = HexDecode(details["checkpoint"].get<std::string>());
      absl::StatusOr<Bytes> signature = HexDecode(details["signature"].get<std::string>());
      boundary::v1::AuditCheckpoint checkpoint;
      if (!checkpoint_bytes.ok() || !signature.ok() ||
          !checkpoint.ParseFromArray(checkpoint_bytes->data(),
                                     static_cast<int>(checkpoint_bytes->size()))) {
        return Bad(number, "checkpoint or signature does not decode");
      }
      Bytes key = ToBytes(checkpoint.enclave_signing_public_key());
      if (absl::Status valid = crypto::VerifyAuditCheckpoint(key, *checkpoint_bytes, *signature);
          !valid.ok()) {
        return Bad(number, valid.message());
      }
      if (!trusted_keys.empty() &&
          std::none_of(trusted_keys.begin(), trusted_keys.end(),
                       [&](const Bytes& trusted) { return SameKey(trusted, key); })) {
        return Bad(number, absl::StrCat("checkpoint is signed by enclave key ", HexEncode(key),
                                        ", which is not in the given evidence"));
      }
      if (checkpoint.sequence() != covers) {
        return Bad(number, "the signed checkpoint covers another entry than covers_seq says");
      }
      if (ToBytes(checkpoint.chain_digest()) != digests[covers - 1]) {
        return Bad(covers, absl::StrCat("does not match the hash the enclave signed in the "
                                        "checkpoint at entry ",
                                        number, ": entries up to ", covers, " were rewritten"));
      }
      report.checkpoints.push_back(
          {number, covers, key, absl::FromUnixNanos(checkpoint.signed_at_unix_ns())});
      report.signed_entries = covers;
      if (std::none_of(report.signing_keys.begin(), report.signing_keys.end(),
                       [&](const Bytes& seen) { return SameKey(seen, key); })) {
        report.signing_keys.push_back(key);
      }
    }
    digests.push_back(digest);
    previous = std::move(digest);
  }
  report.entries = lines.size();
  return report;
}

absl::StatusOr<AuditReport> VerifyAuditLog(const std::string& path,
                                           const std::vector<Bytes>& trusted_keys) {
  absl::StatusOr<std::string> text = ReadFile(path, kMaxAuditFileSize);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read audit log ", path, ": ", text.status().message()));
  }
  return VerifyAuditText(*text, trusted_keys);
}

absl::StatusOr<Bytes> SigningKeyFromEvidenceBytes(absl::string_view evidence) {
  attest::v1::EvidenceBundle bundle;
  if (bundle.ParseFromString(std::string(evidence)) &&
      bundle.enclave_signing_public_key().size() == 32) {
    return ToBytes(bundle.enclave_signing_public_key());
  }
  attest::v1::ChallengeResponse response;
  if (response.ParseFromString(std::string(evidence)) &&
      bundle.ParseFromString(response.bundle()) &&
      bundle.enclave_signing_public_key().size() == 32) {
    return ToBytes(bundle.enclave_signing_public_key());
  }
  return absl::InvalidArgumentError(
      "evidence file is neither an evidence bundle nor a challenge response with a 32-byte "
      "enclave signing key");
}

}  // namespace cloister::host
