#include "host/receipts/receipt_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"
#include "cloister/attest/v1/evidence.pb.h"
#include "crypto/receipt.h"
#include "google/protobuf/util/json_util.h"

namespace cloister::host {

namespace {

using boundary::v1::ReceiptLogLine;
using boundary::v1::SignedUsageReceipt;
using boundary::v1::UsageCounters;
using boundary::v1::UsageReceipt;

UsageCounters Sum(const UsageCounters& a, const UsageCounters& b) {
  UsageCounters sum;
  sum.set_batches(a.batches() + b.batches());
  sum.set_requests(a.requests() + b.requests());
  sum.set_failed_requests(a.failed_requests() + b.failed_requests());
  sum.set_input_size(a.input_size() + b.input_size());
  sum.set_output_size(a.output_size() + b.output_size());
  sum.set_execution_ns(a.execution_ns() + b.execution_ns());
  sum.set_transfer_ns(a.transfer_ns() + b.transfer_ns());
  sum.set_sequences(a.sequences() + b.sequences());
  sum.set_prompt_tokens(a.prompt_tokens() + b.prompt_tokens());
  sum.set_cached_tokens(a.cached_tokens() + b.cached_tokens());
  sum.set_completion_tokens(a.completion_tokens() + b.completion_tokens());
  sum.set_kv_block_ms(a.kv_block_ms() + b.kv_block_ms());
  return sum;
}

bool SameCounters(const UsageCounters& a, const UsageCounters& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

}  // namespace

absl::StatusOr<Bytes> EnclaveSigningKeyFromEvidence(const boundary::v1::GetEvidenceResult& result) {
  attest::v1::ChallengeResponse response;
  attest::v1::EvidenceBundle bundle;
  if (!response.ParseFromString(result.challenge_response()) ||
      !bundle.ParseFromString(response.bundle())) {
    return absl::InvalidArgumentError("evidence does not parse; no enclave signing key in it");
  }
  if (bundle.enclave_signing_public_key().size() != 32) {
    return absl::InvalidArgumentError("evidence carries no 32-byte enclave signing key");
  }
  return ToBytes(bundle.enclave_signing_public_key());
}

absl::StatusOr<UsageReceipt> VerifyUsageReceipt(ByteSpan enclave_signing_public_key,
                                                const SignedUsageReceipt& signed_receipt) {
  RETURN_IF_ERROR(crypto::VerifyUsageReceipt(enclave_signing_public_key,
                                             AsBytes(signed_receipt.receipt()),
                                             AsBytes(signed_receipt.signature())));
  UsageReceipt receipt;
  if (!receipt.ParseFromString(signed_receipt.receipt())) {
    return absl::InvalidArgumentError("usage receipt is signed but does not parse");
  }
  if (!ConstantTimeEquals(AsBytes(receipt.enclave_signing_public_key()),
                          enclave_signing_public_key)) {
    return absl::PermissionDeniedError("usage receipt names another enclave's signing key");
  }
  return receipt;
}

absl::StatusOr<std::unique_ptr<ReceiptLog>> ReceiptLog::Open(const std::string& data_dir,
                                                             Clock* clock) {
  const std::string dir = data_dir + "/receipts";
  RETURN_IF_ERROR(MakeDirs(dir, 0700));
  const std::string path = dir + "/receipts.jsonl";
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open receipt log ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<ReceiptLog>(new ReceiptLog(path, fd, clock));
}

ReceiptLog::~ReceiptLog() {
  absl::MutexLock lock(&mu_);
  ::fdatasync(fd_);
  ::close(fd_);
}

absl::StatusOr<UsageReceipt> ReceiptLog::Append(const std::string& worker,
                                                ByteSpan enclave_signing_public_key,
                                                const SignedUsageReceipt& signed_receipt) {
  ASSIGN_OR_RETURN(UsageReceipt receipt,
                   VerifyUsageReceipt(enclave_signing_public_key, signed_receipt));
  ReceiptLogLine line;
  line.set_worker(worker);
  line.set_stored_at_unix_ns(absl::ToUnixNanos(clock_->Now()));
  *line.mutable_signed_() = signed_receipt;
  *line.mutable_decoded() = receipt;
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  auto printed = google::protobuf::util::MessageToJsonString(line, &json, options);
  if (!printed.ok()) return absl::InternalError("cannot print a receipt log line");
  json.push_back('\n');
  absl::MutexLock lock(&mu_);
  size_t written = 0;
  while (written < json.size()) {
    ssize_t n = ::write(fd_, json.data() + written, json.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("cannot append to receipt log ", path_, ": ", std::strerror(errno)));
    }
    written += static_cast<size_t>(n);
  }
  return receipt;
}

absl::Status ReceiptLog::Sync() {
  absl::MutexLock lock(&mu_);
  if (::fdatasync(fd_) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot sync receipt log ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceiptAudit> AuditReceiptLog(const std::string& path,
                                             const std::vector<Bytes>& trusted_keys) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read receipt log ", path));
  return AuditReceiptLines(in, path, trusted_keys);
}

absl::StatusOr<ReceiptAudit> AuditReceiptLines(std::istream& in, const std::string& path,
                                               const std::vector<Bytes>& trusted_keys) {
  struct Entry {
    size_t line;
    UsageReceipt receipt;
  };
  // Verified receipts by enclave key.
  std::map<std::string, std::vector<Entry>> by_key;
  ReceiptAudit audit;
  std::string text;
  size_t line_number = 0;
  while (std::getline(in, text)) {
    ++line_number;
    if (text.empty()) continue;
    auto fail = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(path, " line ", line_number, ": ", why));
    };
    ReceiptLogLine line;
    if (!google::protobuf::util::JsonStringToMessage(text, &line).ok()) {
      return fail("not a receipt log line");
    }
    UsageReceipt named;
    if (!named.ParseFromString(line.signed_().receipt())) return fail("receipt does not parse");
    const ByteSpan key = AsBytes(named.enclave_signing_public_key());
    if (!trusted_keys.empty() &&
        std::none_of(trusted_keys.begin(), trusted_keys.end(),
                     [&](const Bytes& trusted) { return ConstantTimeEquals(trusted, key); })) {
      return fail("receipt signed by a key that is not a trusted enclave key");
    }
    auto verified = VerifyUsageReceipt(key, line.signed_());
    if (!verified.ok()) return fail(verified.status().message());
    std::vector<Entry>& entries = by_key[named.enclave_signing_public_key()];
    if (entries.empty()) audit.keys.emplace_back(key.begin(), key.end());
    entries.push_back({line_number, std::move(*verified)});
    ++audit.receipts;
  }
  for (auto& [key, entries] : by_key) {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.receipt.sequence() < b.receipt.sequence();
    });
    std::map<std::pair<std::string, std::string>, UsageCounters> running;
    for (size_t i = 0; i < entries.size(); ++i) {
      const UsageReceipt& receipt = entries[i].receipt;
      const uint64_t previous = i > 0 ? entries[i - 1].receipt.sequence() : 0;
      if (i > 0 && receipt.sequence() == previous) {
        return absl::DataLossError(absl::StrCat(path, " line ", entries[i].line,
                                                ": sequence number ", receipt.sequence(),
                                                " appears twice"));
      }
      // Every receipt an enclave key signs is numbered, so a gap is a receipt removed (of any
      // tenant: the cumulative chain below only sees those of the same tenant and model).
      if (receipt.sequence() == 0) {
        return absl::DataLossError(absl::StrCat(path, " line ", entries[i].line,
                                                ": receipt numbered 0 (numbers start at 1)"));
      }
      if (receipt.sequence() != previous + 1) {
        const std::string signer =
            absl::StrCat("enclave key ", HexEncode(AsBytes(key)).substr(0, 16), "...");
        return absl::DataLossError(absl::StrCat(
            path, " line ", entries[i].line, ": ",
            previous == 0
                ? absl::StrCat("the first receipt of ", signer, " is number ", receipt.sequence())
                : absl::StrCat("receipt ", receipt.sequence(), " of ", signer, " follows receipt ",
                               previous),
            ": ", receipt.sequence() - previous - 1, " missing"));
      }
      auto id = std::make_pair(receipt.tenant_id(), receipt.model_handle());
      UsageCounters expected = Sum(running[id], receipt.batch());
      if (!SameCounters(expected, receipt.cumulative())) {
        return absl::DataLossError(absl::StrCat(
            path, " line ", entries[i].line, ": cumulative usage of tenant ", receipt.tenant_id(),
            " is not the previous receipt's plus this batch (a receipt is missing)"));
      }
      running[id] = receipt.cumulative();
    }
    for (const auto& [id, counters] : running) audit.totals[id] = Sum(audit.totals[id], counters);
  }
  return audit;
}

}  // namespace cloister::host
