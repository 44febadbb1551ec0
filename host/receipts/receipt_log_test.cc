#include "host/receipts/receipt_log.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "cloister/attest/v1/evidence.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "host/receipts/receipt_signer_for_test.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

using boundary::v1::SignedUsageReceipt;
using boundary::v1::UsageCounters;
using boundary::v1::UsageReceipt;

std::string TempDir() {
  std::string dir = cloister::testing::MakeTempDir("receipts");
  EXPECT_FALSE(dir.empty());
  return dir;
}

using Signer = testing::ReceiptSigner;

TEST(ReceiptVerifyTest, AGenuineReceiptVerifiesAndATamperedOneFails) {
  Signer enclave;
  SignedUsageReceipt signed_receipt = enclave.Next("alpha", 3, 300);
  auto receipt = VerifyUsageReceipt(enclave.public_key(), signed_receipt);
  ASSERT_TRUE(receipt.ok()) << receipt.status();
  EXPECT_EQ(receipt->tenant_id(), "alpha");
  EXPECT_EQ(receipt->batch().requests(), 3u);

  // The host inflates the tenant's request count.
  UsageReceipt inflated = *receipt;
  inflated.mutable_batch()->set_requests(30);
  SignedUsageReceipt forged = signed_receipt;
  forged.set_receipt(inflated.SerializeAsString());
  EXPECT_EQ(VerifyUsageReceipt(enclave.public_key(), forged).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A flipped signature bit, another enclave's key, a truncated signature.
  SignedUsageReceipt flipped = signed_receipt;
  (*flipped.mutable_signature())[10] ^= 0x20;
  EXPECT_EQ(VerifyUsageReceipt(enclave.public_key(), flipped).status().code(),
            absl::StatusCode::kPermissionDenied);
  Signer other;
  EXPECT_EQ(VerifyUsageReceipt(other.public_key(), signed_receipt).status().code(),
            absl::StatusCode::kPermissionDenied);
  SignedUsageReceipt short_signature = signed_receipt;
  short_signature.mutable_signature()->resize(63);
  EXPECT_EQ(VerifyUsageReceipt(enclave.public_key(), short_signature).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A receipt re-signed by another key still names the first: refused under the second key.
  EXPECT_EQ(VerifyUsageReceipt(other.public_key(), other.Sign(*receipt)).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(ReceiptLogTest, AppendsVerifiedReceiptsAndTheAuditSumsThem) {
  std::string dir = TempDir();
  Signer enclave;
  {
    auto log = ReceiptLog::Open(dir);
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_EQ((*log)->path(), dir + "/receipts/receipts.jsonl");
    for (int i = 1; i <= 4; ++i) {
      ASSERT_TRUE(
          (*log)->Append("worker-0", enclave.public_key(), enclave.Next("alpha", i, 100 * i)).ok());
    }
    ASSERT_TRUE((*log)->Append("worker-0", enclave.public_key(), enclave.Next("beta", 7, 70)).ok());
    // A forged receipt is refused and not written.
    SignedUsageReceipt forged = enclave.Next("alpha", 1, 1);
    (*forged.mutable_receipt())[3] ^= 1;
    EXPECT_FALSE((*log)->Append("worker-0", enclave.public_key(), forged).ok());
    EXPECT_TRUE((*log)->Sync().ok());
  }
  auto audit = AuditReceiptLog(dir + "/receipts/receipts.jsonl", {enclave.public_key()});
  ASSERT_TRUE(audit.ok()) << audit.status();
  EXPECT_EQ(audit->receipts, 5u);
  const auto& alpha = audit->totals[{"alpha", std::string(32, 'a')}];
  EXPECT_EQ(alpha.requests(), 1u + 2 + 3 + 4);
  EXPECT_EQ(alpha.input_size(), 1000u);
  EXPECT_EQ(alpha.batches(), 4u);
  EXPECT_EQ((audit->totals[{"beta", std::string(32, 'a')}].requests()), 7u);

  // The log is JSON lines: one per receipt, with the decoded receipt beside the signed bytes.
  auto text = ReadFile(dir + "/receipts/receipts.jsonl");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 5);
  EXPECT_NE(text->find("\"tenant_id\":\"beta\""), std::string::npos);

  // Only trusted keys count.
  Signer stranger;
  EXPECT_EQ(
      AuditReceiptLog(dir + "/receipts/receipts.jsonl", {stranger.public_key()}).status().code(),
      absl::StatusCode::kDataLoss);
}

TEST(ReceiptLogTest, TheAuditFindsEditedAndMissingLines) {
  std::string dir = TempDir();
  Signer enclave;
  {
    auto log = ReceiptLog::Open(dir);
    ASSERT_TRUE(log.ok());
    for (int i = 1; i <= 3; ++i) {
      ASSERT_TRUE((*log)->Append("w", enclave.public_key(), enclave.Next("alpha", 2, 20)).ok());
    }
  }
  const std::string path = dir + "/receipts/receipts.jsonl";
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text->size();) {
    size_t end = text->find('\n', begin);
    lines.push_back(text->substr(begin, end - begin));
    begin = end + 1;
  }
  ASSERT_EQ(lines.size(), 3u);
  auto write = [&](const std::vector<std::string>& content) {
    std::ofstream out(path, std::ios::trunc);
    for (const auto& line : content) out << line << "\n";
  };
  // A dropped middle receipt breaks the cumulative chain.
  write({lines[0], lines[2]});
  auto missing = AuditReceiptLog(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos) << missing.status();
  // A duplicated receipt.
  write({lines[0], lines[1], lines[1], lines[2]});
  EXPECT_EQ(AuditReceiptLog(path).status().code(), absl::StatusCode::kDataLoss);
  // An edited signed receipt (one base64 character changed).
  std::string edited = lines[1];
  size_t at = edited.find("\"receipt\":\"") + 20;
  edited[at] = edited[at] == 'A' ? 'B' : 'A';
  write({lines[0], edited, lines[2]});
  auto tampered = AuditReceiptLog(path);
  EXPECT_EQ(tampered.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(tampered.status().message().find("line 2"), std::string::npos) << tampered.status();
  // Untouched, it passes; an unreadable file is NotFound.
  write(lines);
  EXPECT_TRUE(AuditReceiptLog(path).ok());
  EXPECT_EQ(AuditReceiptLog(dir + "/nope.jsonl").status().code(), absl::StatusCode::kNotFound);
}

// The cumulative chains are per tenant and model, so only the sequence numbers show a removed
// receipt that was a tenant's last, or the first of a key.
TEST(ReceiptLogTest, TheAuditFindsARemovedReceiptThatNoChainShows) {
  std::string dir = TempDir();
  Signer first, second;
  {
    auto log = ReceiptLog::Open(dir);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Append("w0", first.public_key(), first.Next("alpha", 1, 10)).ok());
    ASSERT_TRUE((*log)->Append("w1", second.public_key(), second.Next("alpha", 1, 10)).ok());
    ASSERT_TRUE((*log)->Append("w0", first.public_key(), first.Next("beta", 2, 20)).ok());
    ASSERT_TRUE((*log)->Append("w0", first.public_key(), first.Next("alpha", 3, 30)).ok());
  }
  const std::string path = dir + "/receipts/receipts.jsonl";
  auto audit = AuditReceiptLog(path);
  ASSERT_TRUE(audit.ok()) << audit.status();
  EXPECT_EQ(audit->receipts, 4u);
  EXPECT_EQ(audit->keys, (std::vector<Bytes>{first.public_key(), second.public_key()}));
  EXPECT_EQ((audit->totals[{"alpha", std::string(32, 'a')}].requests()), 1u + 1 + 3);

  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  auto write = [&](const std::vector<std::string>& content) {
    std::ofstream out(path, std::ios::trunc);
    for (const auto& line : content) out << line << "\n";
  };
  // Tenant beta's only receipt, between two of alpha's.
  write({lines[0], lines[1], lines[3]});
  auto gap = AuditReceiptLog(path);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(gap.status().message().find("line 3: receipt 3 of enclave key " +
                                        HexEncode(first.public_key()).substr(0, 16) +
                                        "... follows receipt 1: 1 missing"),
            std::string::npos)
      << gap.status();
  // The first receipt of a key.
  write({lines[1], lines[2], lines[3]});
  auto head = AuditReceiptLog(path);
  EXPECT_EQ(head.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(head.status().message().find("is number 2: 1 missing"), std::string::npos)
      << head.status();
  // The last receipt of every key can be cut off unseen: what no log check can find.
  write({lines[0], lines[1], lines[2]});
  EXPECT_TRUE(AuditReceiptLog(path).ok());
}

// A key's receipts start at 1; one numbered 0 (which no enclave issues, but anyone with a key of
// their own can sign when keys are not pinned) is named as such.
TEST(ReceiptLogTest, TheAuditRefusesAReceiptNumberedZero) {
  Signer signer;
  UsageReceipt receipt;
  ASSERT_TRUE(receipt.ParseFromString(signer.Next("alpha", 1, 10).receipt()));
  receipt.set_sequence(0);
  auto line = [&](const SignedUsageReceipt& signed_receipt) {
    boundary::v1::ReceiptLogLine log_line;
    *log_line.mutable_signed_() = signed_receipt;
    std::string json;
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(log_line, &json).ok());
    return json + "\n";
  };
  std::istringstream in(line(signer.Sign(receipt)));
  auto audit = AuditReceiptLines(in, "receipts.jsonl");
  EXPECT_EQ(audit.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(audit.status().message(),
            "receipts.jsonl line 1: receipt numbered 0 (numbers start at 1)");
  // A first receipt numbered 2: receipt 1 is missing.
  std::istringstream good(line(signer.Next("alpha", 2, 20)));
  EXPECT_EQ(AuditReceiptLines(good, "receipts.jsonl").status().message(),
            "receipts.jsonl line 1: the first receipt of enclave key " +
                HexEncode(signer.public_key()).substr(0, 16) + "... is number 2: 1 missing");
}

TEST(ReceiptLogTest, EnclaveKeyComesFromTheEvidence) {
  attest::v1::EvidenceBundle bundle;
  bundle.set_enclave_signing_public_key(std::string(32, 'k'));
  attest::v1::ChallengeResponse response;
  response.set_bundle(bundle.SerializeAsString());
  boundary::v1::GetEvidenceResult result;
  result.set_challenge_response(response.SerializeAsString());
  auto key = EnclaveSigningKeyFromEvidence(result);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(*key, Bytes(32, 'k'));
  result.set_challenge_response("garbage");
  EXPECT_EQ(EnclaveSigningKeyFromEvidence(result).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cloister::host
