#include "host/audit/audit_log.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "crypto/keys.h"
#include "crypto/receipt.h"
#include "gtest/gtest.h"
#include "host/receipts/receipt_log.h"
#include "host/receipts/receipt_signer_for_test.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

using boundary::v1::AuditCheckpoint;
using boundary::v1::SignedAuditCheckpoint;

std::string TempDir() {
  std::string dir = cloister::testing::MakeTempDir("audit-test");
  EXPECT_FALSE(dir.empty());
  return dir;
}

// Signs like the enclave does (enclave/enclave.cc SignAuditCheckpoint), with a test key.
class TestSigner {
 public:
  TestSigner() : key_(crypto::GenerateEd25519()) {}
  AuditLog::Signer signer(FakeClock* clock) {
    return [this, clock](ByteSpan digest,
                         uint64_t sequence) -> absl::StatusOr<SignedAuditCheckpoint> {
      ++calls_;
      AuditCheckpoint checkpoint;
      checkpoint.set_enclave_signing_public_key(ToString(key_.public_key));
      checkpoint.set_chain_digest(ToString(digest));
      checkpoint.set_sequence(sequence);
      checkpoint.set_signed_at_unix_ns(absl::ToUnixNanos(clock->Now()));
      SignedAuditCheckpoint signed_checkpoint;
      signed_checkpoint.set_checkpoint(checkpoint.SerializeAsString());
      absl::StatusOr<Bytes> signature =
          crypto::SignAuditCheckpoint(key_.seed.span(), AsBytes(signed_checkpoint.checkpoint()));
      if (!signature.ok()) return signature.status();
      signed_checkpoint.set_signature(ToString(*signature));
      return signed_checkpoint;
    };
  }
  const Bytes& public_key() const { return key_.public_key; }
  int calls() const { return calls_; }

 private:
  crypto::Ed25519KeyPair key_;
  int calls_ = 0;
};

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = TempDir() + "/audit/audit.jsonl"; }

  // Six ordinary entries and a checkpoint (entry 7) covering them.
  void WriteSignedLog() {
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_, &clock_);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Record(audit_event::kDaemonStarted, "", {{"workers", "1"}}).ok());
    ASSERT_TRUE((*log)->Record(audit_event::kSessionOpened, "acme", {{"worker", "0"}}).ok());
    ASSERT_TRUE((*log)->Record(audit_event::kModelUploaded, "acme", {{"handle", "m1"}}).ok());
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE((*log)->Record(audit_event::kRefused, "bravo", {{"code", "UNAUTHENTICATED"}}).ok());
    ASSERT_TRUE((*log)->Record(audit_event::kModelDeleted, "acme", {{"handle", "m1"}}).ok());
    ASSERT_TRUE((*log)->Record(audit_event::kSessionClosed, "acme", {}).ok());
    ASSERT_TRUE((*log)->Checkpoint(signer_.signer(&clock_)).ok());
    EXPECT_EQ((*log)->entry_count(), 7u);
    EXPECT_EQ((*log)->signed_count(), 6u);
  }

  std::vector<std::string> Lines() {
    absl::StatusOr<std::string> text = ReadFile(path_);
    EXPECT_TRUE(text.ok());
    std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
    return lines;
  }
  void WriteLines(const std::vector<std::string>& lines) {
    ASSERT_TRUE(WriteFileAtomic(path_, absl::StrJoin(lines, "\n") + "\n").ok());
  }

  FakeClock clock_;
  TestSigner signer_;
  std::string path_;
};

TEST_F(AuditLogTest, ChainAndCheckpointVerify) {
  WriteSignedLog();
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_, {signer_.public_key()});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->entries, 7u);
  ASSERT_EQ(report->checkpoints.size(), 1u);
  EXPECT_EQ(report->checkpoints[0].entry, 7u);
  EXPECT_EQ(report->checkpoints[0].covers, 6u);
  EXPECT_EQ(report->signed_entries, 6u);
  EXPECT_EQ(report->signing_keys, std::vector<Bytes>{signer_.public_key()});
}

TEST_F(AuditLogTest, LinesHaveTheFixedFieldSet) {
  WriteSignedLog();
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 7u);
  nlohmann::json second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["seq"], 2);
  EXPECT_EQ(second["event"], "session_opened");
  EXPECT_EQ(second["tenant"], "acme");
  EXPECT_EQ(second["details"]["worker"], "0");
  EXPECT_EQ(second["prev"], HexEncode(crypto::Sha256(AsBytes(lines[0]))));
  EXPECT_EQ(second.size(), 6u);
  nlohmann::json first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["prev"], std::string(64, '0'));
}

TEST_F(AuditLogTest, EditedEntryIsNamed) {
  WriteSignedLog();
  std::vector<std::string> lines = Lines();
  size_t at = lines[2].find("\"m1\"");
  ASSERT_NE(at, std::string::npos);
  lines[2].replace(at, 4, "\"m2\"");
  WriteLines(lines);
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StartsWith(report.status().message(), "entry 3: was changed"))
      << report.status();
}

TEST_F(AuditLogTest, DeletedEntryIsNamed) {
  WriteSignedLog();
  std::vector<std::string> lines = Lines();
  lines.erase(lines.begin() + 3);  // entry 4
  WriteLines(lines);
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::StartsWith(report.status().message(), "entry 4: line 4 holds entry 5"))
      << report.status();
}

TEST_F(AuditLogTest, RewrittenChainIsCaughtByTheSignature) {
  WriteSignedLog();
  std::vector<std::string> lines = Lines();
  // Change entry 2 and recompute every later hash, as a host rewriting history would.
  nlohmann::json edited = nlohmann::json::parse(lines[1]);
  edited["tenant"] = "someone-else";
  lines[1] = edited.dump();
  for (size_t i = 2; i < lines.size(); ++i) {
    nlohmann::json entry = nlohmann::json::parse(lines[i]);
    entry["prev"] = HexEncode(crypto::Sha256(AsBytes(lines[i - 1])));
    lines[i] = entry.dump();
  }
  WriteLines(lines);
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::StartsWith(report.status().message(),
                               "entry 6: does not match the hash the "
                               "enclave signed in the checkpoint at "
                               "entry 7"))
      << report.status();
}

TEST_F(AuditLogTest, ForgedSignatureAndUntrustedKeyAreRefused) {
  WriteSignedLog();
  absl::StatusOr<AuditReport> other_key =
      VerifyAuditLog(path_, {crypto::GenerateEd25519().public_key});
  ASSERT_FALSE(other_key.ok());
  EXPECT_TRUE(absl::StrContains(other_key.status().message(), "entry 7: checkpoint is signed by"))
      << other_key.status();

  std::vector<std::string> lines = Lines();
  nlohmann::json checkpoint = nlohmann::json::parse(lines[6]);
  std::string signature = checkpoint["details"]["signature"];
  signature[0] = signature[0] == 'a' ? 'b' : 'a';
  checkpoint["details"]["signature"] = signature;
  lines[6] = checkpoint.dump();
  WriteLines(lines);
  absl::StatusOr<AuditReport> forged = VerifyAuditLog(path_);
  ASSERT_FALSE(forged.ok());
  EXPECT_TRUE(absl::StrContains(forged.status().message(),
                                "entry 7: audit checkpoint signature "
                                "does not verify"))
      << forged.status();
}

TEST_F(AuditLogTest, ReopenContinuesTheChain) {
  WriteSignedLog();
  {
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_, &clock_);
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_EQ((*log)->entry_count(), 7u);
    EXPECT_EQ((*log)->signed_count(), 6u);
    // Nothing new: no signature asked for, no entry.
    ASSERT_TRUE((*log)->Checkpoint(signer_.signer(&clock_)).ok());
    EXPECT_EQ(signer_.calls(), 1);
    ASSERT_TRUE((*log)->Record(audit_event::kPolicyReloaded, "", {{"tenants", "3"}}).ok());
    ASSERT_TRUE((*log)->Checkpoint(signer_.signer(&clock_)).ok());
    EXPECT_EQ((*log)->entry_count(), 9u);
  }
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_, {signer_.public_key()});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->entries, 9u);
  EXPECT_EQ(report->checkpoints.size(), 2u);
  EXPECT_EQ(report->signed_entries, 8u);
}

TEST_F(AuditLogTest, SignerFailureWritesNothing) {
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_, &clock_);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Record(audit_event::kDaemonStarted, "").ok());
  absl::Status status =
      (*log)->Checkpoint([](ByteSpan, uint64_t) -> absl::StatusOr<SignedAuditCheckpoint> {
        return absl::UnavailableError("enclave worker is gone");
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*log)->entry_count(), 1u);
  EXPECT_EQ((*log)->signed_count(), 0u);
}

TEST_F(AuditLogTest, TornLastLineIsRefusedOnOpenAndNamed) {
  WriteSignedLog();
  absl::StatusOr<std::string> text = ReadFile(path_);
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(WriteFileAtomic(path_, *text + "{\"seq\":8,").ok());
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_, &clock_);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kDataLoss);
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::StartsWith(report.status().message(), "entry 8: the last line is incomplete"))
      << report.status();
}

TEST_F(AuditLogTest, ValuesAreBounded) {
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_, &clock_);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)
                  ->Record(audit_event::kRefused, "acme",
                           {{"reason", std::string(10000, 'x')}, {"bytes", "\xff\xfe"}})
                  .ok());
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LT(lines[0].size(), 600u);
  EXPECT_TRUE(VerifyAuditLog(path_).ok());
}

TEST_F(AuditLogTest, WrongKeySetAndFieldsAreRefused) {
  WriteSignedLog();
  std::vector<std::string> lines = Lines();
  nlohmann::json entry = nlohmann::json::parse(lines[0]);
  entry["extra"] = "x";
  lines[0] = entry.dump();
  WriteLines(lines);
  absl::StatusOr<AuditReport> report = VerifyAuditLog(path_);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::StartsWith(report.status().message(), "entry 1: does not have exactly"))
      << report.status();
}

// Runs cloister-audit; returns its exit status and its stdout and stderr.
int RunAudit(const std::string& arguments, std::string& output) {
  std::string command = absl::StrCat(CLOISTER_AUDIT_BINARY, " ", arguments, " 2>&1");
  FILE* pipe = ::popen(command.c_str(), "r");
  output.clear();
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(AuditLogTest, CommandLineNamesTheFirstBadEntry) {
  WriteSignedLog();
  std::string output;
  std::string key = HexEncode(signer_.public_key());
  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_, " --key ", key), output), 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "7 entries, 1 signed checkpoints")) << output;
  EXPECT_TRUE(absl::StrContains(output, "verdict: pass")) << output;

  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_, " --json --require-signed"), output), 0)
      << output;
  nlohmann::json json = nlohmann::json::parse(output.substr(0, output.find('\n')));
  EXPECT_EQ(json["verdict"], "pass");
  EXPECT_EQ(json["signed_entries"], 6);
  EXPECT_EQ(json["keys_pinned"], false);

  std::vector<std::string> lines = Lines();
  lines.erase(lines.begin() + 1);
  WriteLines(lines);
  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_), output), 1) << output;
  EXPECT_TRUE(absl::StrContains(output, "cloister-audit: entry 2: line 2 holds entry 3")) << output;

  EXPECT_EQ(RunAudit("verify /nonexistent/audit.jsonl", output), 2) << output;
  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_, " --key 1234"), output), 2) << output;
  EXPECT_EQ(RunAudit("check", output), 2) << output;
}

TEST_F(AuditLogTest, RequireSignedFailsOnAnUnsignedTail) {
  WriteSignedLog();
  {
    absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path_, &clock_);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Record(audit_event::kSessionOpened, "acme").ok());
  }
  std::string output;
  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_), output), 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "entries 7..8 are chained but not yet signed")) << output;
  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_, " --require-signed"), output), 1) << output;
}

// cloister-audit receipts: a receipt log written by the host's ReceiptLog, as cloisterd writes it.
class ReceiptsCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    path_ = dir_ + "/receipts/receipts.jsonl";
    auto log = ReceiptLog::Open(dir_);
    ASSERT_TRUE(log.ok()) << log.status();
    const std::string cls(32, 'c'), vad(32, 'v');
    ASSERT_TRUE(
        (*log)->Append("worker0", first_.public_key(), first_.Next("acme", 2, 200, cls)).ok());
    ASSERT_TRUE(
        (*log)->Append("worker1", second_.public_key(), second_.Next("acme", 3, 300, cls)).ok());
    ASSERT_TRUE(
        (*log)->Append("worker0", first_.public_key(), first_.Next("globex", 1, 50, vad)).ok());
    ASSERT_TRUE(
        (*log)->Append("worker0", first_.public_key(), first_.Next("acme", 4, 400, cls)).ok());
  }

  std::vector<std::string> Lines() {
    auto text = ReadFile(path_);
    EXPECT_TRUE(text.ok());
    return absl::StrSplit(*text, '\n', absl::SkipEmpty());
  }
  void WriteLines(const std::vector<std::string>& lines) {
    ASSERT_TRUE(WriteFileAtomic(path_, absl::StrJoin(lines, "\n") + "\n", 0600).ok());
  }

  // The JSON document on stdout (the line that opens with '{'), beside any one-line error on
  // stderr; nothing when there is none.
  static std::optional<nlohmann::json> JsonDocumentIn(const std::string& output) {
    const size_t open = output.find('{');
    if (open == std::string::npos) return std::nullopt;
    return nlohmann::json::parse(output.substr(open, output.find('\n', open) - open));
  }

  std::string dir_, path_;
  testing::ReceiptSigner first_, second_;
};

TEST_F(ReceiptsCommandTest, PrintsEachTenantsUsageOnceTheLogHolds) {
  std::string output;
  ASSERT_EQ(RunAudit(absl::StrCat("receipts ", path_), output), 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "4 receipts from 2 enclave keys")) << output;
  EXPECT_TRUE(absl::StrContains(output, "signing keys were not pinned")) << output;
  EXPECT_TRUE(absl::StrContains(output,
                                "receipts cut off after each key's last one here would "
                                "not show"))
      << output;
  EXPECT_TRUE(absl::StrContains(output, "verdict: pass")) << output;
  // acme on cls: 9 requests in 3 batches over both keys, 900 input bytes, 9 µs.
  EXPECT_TRUE(absl::StrContains(
      output, absl::StrFormat("%-16s %-32s %8d %9d %7d %14d %14d %9.1f ms", "acme",
                              std::string(32, 'c'), 3, 9, 0, 900, 72, 0.009)))
      << output;

  const std::string pinned = absl::StrCat(" --key ", HexEncode(first_.public_key()), " --key ",
                                          HexEncode(second_.public_key()));
  ASSERT_EQ(RunAudit(absl::StrCat("receipts ", path_, pinned, " --json --tenant globex"), output),
            0)
      << output;
  nlohmann::json json = nlohmann::json::parse(output);
  EXPECT_EQ(json["verdict"], "pass");
  EXPECT_EQ(json["receipts"], 4);
  EXPECT_EQ(json["keys"], nlohmann::json::array(
                              {HexEncode(first_.public_key()), HexEncode(second_.public_key())}));
  EXPECT_EQ(json["keys_pinned"], true);
  ASSERT_EQ(json["usage"].size(), 1u) << output;
  EXPECT_EQ(json["usage"][0]["tenant_id"], "globex");
  EXPECT_EQ(json["usage"][0]["model_handle"], std::string(32, 'v'));
  EXPECT_EQ(json["usage"][0]["requests"], 1);
  EXPECT_EQ(json["usage"][0]["input_size"], 50);
  EXPECT_EQ(json["usage"][0]["execution_ns"], 1000);

  ASSERT_EQ(RunAudit(absl::StrCat("receipts ", path_, " --tenant initech"), output), 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "no receipts for tenant initech")) << output;
}

TEST_F(ReceiptsCommandTest, NamesTheFirstBadLine) {
  std::string output;
  // Only the first key pinned: the second key's receipt (line 2) is refused.
  EXPECT_EQ(
      RunAudit(absl::StrCat("receipts ", path_, " --key ", HexEncode(first_.public_key())), output),
      1)
      << output;
  EXPECT_TRUE(absl::StrContains(output, "cloister-audit: " + path_ +
                                            " line 2: receipt signed by a key that is not a "
                                            "trusted enclave key"))
      << output;

  // globex's only receipt removed: its sequence number is missing.
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 4u);
  WriteLines({lines[0], lines[1], lines[3]});
  EXPECT_EQ(RunAudit(absl::StrCat("receipts ", path_, " --json"), output), 1) << output;
  std::optional<nlohmann::json> document = JsonDocumentIn(output);
  ASSERT_TRUE(document.has_value()) << output;
  nlohmann::json& json = *document;
  EXPECT_EQ(json["verdict"], "fail");
  EXPECT_TRUE(
      absl::StrContains(json["error"].get<std::string>(), "line 3: receipt 3 of enclave key"))
      << output;
  EXPECT_FALSE(json.contains("usage"));

  // The host raised acme's input bytes in the decoded copy and the signed one alike: the
  // signature no longer verifies.
  std::string edited = lines[3];
  const size_t at = edited.find("\"receipt\":\"") + 30;
  edited[at] = edited[at] == 'A' ? 'B' : 'A';
  WriteLines({lines[0], lines[1], lines[2], edited});
  EXPECT_EQ(RunAudit(absl::StrCat("receipts ", path_), output), 1) << output;
  EXPECT_TRUE(absl::StrContains(output, "line 4: ")) << output;
  EXPECT_FALSE(absl::StrContains(output, "verdict: pass")) << output;

  // Not a receipt log at all.
  WriteLines({"{\"seq\":1}"});
  EXPECT_EQ(RunAudit(absl::StrCat("receipts ", path_), output), 1) << output;
  EXPECT_TRUE(absl::StrContains(output, "line 1: ")) << output;
}

// A log whose name is not UTF-8 still gets one JSON document (the byte shown as U+FFFD).
TEST_F(ReceiptsCommandTest, JsonOutputSurvivesAFileNameThatIsNotUtf8) {
  const std::string odd = dir_ + "/receipts/log-\xff.jsonl";
  ASSERT_TRUE(WriteFileAtomic(odd, "not a receipt\n", 0600).ok());
  std::string output;
  EXPECT_EQ(RunAudit(absl::StrCat("receipts '", odd, "' --json"), output), 1) << output;
  std::optional<nlohmann::json> document = JsonDocumentIn(output);
  ASSERT_TRUE(document.has_value()) << output;
  nlohmann::json& json = *document;
  EXPECT_EQ(json["verdict"], "fail");
  EXPECT_TRUE(
      absl::StrContains(json["error"].get<std::string>(), "log-\xef\xbf\xbd.jsonl line 1: "))
      << output;
}

TEST_F(ReceiptsCommandTest, BadUsageIsExitTwo) {
  std::string output;
  EXPECT_EQ(RunAudit("receipts /nonexistent/receipts.jsonl", output), 2) << output;
  EXPECT_TRUE(absl::StrContains(output, "cannot read receipt log /nonexistent/receipts.jsonl"))
      << output;
  EXPECT_EQ(RunAudit("receipts", output), 2) << output;
  EXPECT_TRUE(absl::StrContains(output, "receipts needs the receipt log FILE")) << output;
  EXPECT_EQ(RunAudit(absl::StrCat("receipts ", path_, " --require-signed"), output), 2) << output;
  EXPECT_TRUE(absl::StrContains(output, "unknown flag --require-signed for receipts")) << output;
  EXPECT_EQ(RunAudit(absl::StrCat("verify ", path_, " --tenant acme"), output), 2) << output;
  EXPECT_EQ(RunAudit(absl::StrCat("receipts ", path_, " --tenant"), output), 2) << output;
  EXPECT_EQ(RunAudit(absl::StrCat("receipts ", path_, " --key abcd"), output), 2) << output;
}

}  // namespace
}  // namespace cloister::host
