// Tests of the configfs-tsm client (against FakeTsmFs, which plays the kernel), the SNP
// certificate table parser, the firmware response parsers and the /dev/sev-guest error paths.

#include "attest/collectors/tsm.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "attest/collectors/fake_tsm_fs.h"
#include "attest/collectors/sev_guest_abi.h"
#include "attest/snp_report.h"
#include "attest/test_util.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if __has_include(<linux/sev-guest.h>)
#include <linux/sev-guest.h>
// Our declarations must match the kernel's uapi header where the build machine has it.
namespace sev_abi = cloister::attest::sev_guest_abi;
static_assert(sizeof(sev_abi::GuestRequest) == sizeof(struct snp_guest_request_ioctl));
static_assert(offsetof(sev_abi::GuestRequest, req_data) ==
              offsetof(snp_guest_request_ioctl, req_data));
static_assert(offsetof(sev_abi::GuestRequest, exitinfo2) ==
              offsetof(snp_guest_request_ioctl, exitinfo2));
static_assert(sizeof(sev_abi::ReportRequest) == sizeof(struct snp_report_req));
static_assert(offsetof(sev_abi::ReportRequest, vmpl) == offsetof(snp_report_req, vmpl));
static_assert(sizeof(sev_abi::ExtReportRequest) == sizeof(struct snp_ext_report_req));
static_assert(offsetof(sev_abi::ExtReportRequest, certs_len) ==
              offsetof(snp_ext_report_req, certs_len));
static_assert(sizeof(sev_abi::DerivedKeyRequest) == sizeof(struct snp_derived_key_req));
static_assert(offsetof(sev_abi::DerivedKeyRequest, guest_field_select) ==
              offsetof(snp_derived_key_req, guest_field_select));
static_assert(offsetof(sev_abi::DerivedKeyRequest, tcb_version) ==
              offsetof(snp_derived_key_req, tcb_version));
static_assert(sev_abi::kReportResponseSize == sizeof(struct snp_report_resp));
static_assert(sev_abi::kDerivedKeyResponseSize == sizeof(struct snp_derived_key_resp));
static_assert(sev_abi::kGetReport == SNP_GET_REPORT);
static_assert(sev_abi::kGetDerivedKey == SNP_GET_DERIVED_KEY);
static_assert(sev_abi::kGetExtReport == SNP_GET_EXT_REPORT);
#endif

namespace cloister::attest {
namespace {

using testing::BuildSnpCertTableForTest;
using testing::FakeTsmFs;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::SimSnpSignerForTest;

size_t CountEntries(const std::string& dir) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++count;
  }
  return count;
}

class TsmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto signer = SimSnpSignerForTest::Create(dir_.path() + "/sim");
    ASSERT_TRUE(signer.ok()) << signer.status();
    signer_ = std::move(*signer);
    root_ = dir_.path() + "/tsm/report";
    ASSERT_TRUE(MakeDirs(root_).ok());
  }

  FakeTsmFs MakeFs(std::string provider = std::string(kTsmProviderSevGuest),
                   std::optional<Bytes> auxblob = std::nullopt) {
    if (!auxblob.has_value() && provider == kTsmProviderSevGuest) auxblob = signer_->CertTable();
    return FakeTsmFs(
        root_, std::move(provider),
        [this](ByteSpan inblob, std::optional<uint32_t> privlevel) {
          return signer_->Report(inblob, privlevel.value_or(0));
        },
        std::move(auxblob));
  }

  static Bytes Inblob() {
    Bytes inblob(64);
    for (size_t i = 0; i < inblob.size(); ++i) inblob[i] = static_cast<uint8_t>(i * 3 + 1);
    return inblob;
  }

  ScopedTempDir dir_;
  std::string root_;
  std::unique_ptr<SimSnpSignerForTest> signer_;
};

TEST_F(TsmTest, ReportCarriesInblobAndPrivlevelAndEntryIsRemoved) {
  FakeTsmFs fs = MakeFs();
  TsmReportRequest request{
      .inblob = Inblob(), .privlevel = 2, .expected_provider = std::string(kTsmProviderSevGuest)};
  auto report = GetTsmReport(fs, root_, request);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->provider, "sev_guest");
  EXPECT_EQ(report->generation, 2u);  // privlevel and inblob writes
  auto parsed = ParseSnpReport(report->outblob);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->report_data, Inblob());
  EXPECT_EQ(parsed->vmpl, 2u);
  EXPECT_EQ(report->auxblob, signer_->CertTable());
  EXPECT_THAT(fs.privlevels_written(), ::testing::ElementsAre(2u));
  EXPECT_EQ(fs.entries_made(), 1);
  EXPECT_EQ(fs.entries_removed(), 1);
  EXPECT_EQ(CountEntries(root_), 0u);
}

TEST_F(TsmTest, PrivlevelIsOnlyWrittenWhenAsked) {
  FakeTsmFs fs = MakeFs();
  auto report = GetTsmReport(fs, root_, {.inblob = Inblob()});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(fs.privlevels_written().empty());
  EXPECT_EQ(report->generation, 1u);
}

TEST_F(TsmTest, ShortInblobIsPassedAsGiven) {
  FakeTsmFs fs = MakeFs();
  Bytes inblob = {1, 2, 3};
  auto report = GetTsmReport(fs, root_, {.inblob = inblob});
  ASSERT_TRUE(report.ok()) << report.status();
  auto parsed = ParseSnpReport(report->outblob);
  ASSERT_TRUE(parsed.ok());
  Bytes expected = inblob;
  expected.resize(64, 0);
  EXPECT_EQ(parsed->report_data, expected);
}

TEST_F(TsmTest, RetriesWhenAnotherWriterChangesTheEntry) {
  FakeTsmFs fs = MakeFs();
  fs.SimulateConcurrentWritesForTest(1);
  auto report = GetTsmReport(fs, root_, {.inblob = Inblob()});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(fs.entries_made(), 2);
  EXPECT_EQ(fs.entries_removed(), 2);
  EXPECT_EQ(fs.outblob_reads(), 2);
  EXPECT_EQ(CountEntries(root_), 0u);
}

TEST_F(TsmTest, GivesUpAfterRepeatedConcurrentWrites) {
  FakeTsmFs fs = MakeFs();
  fs.SimulateConcurrentWritesForTest(kTsmMaxAttempts);
  auto report = GetTsmReport(fs, root_, {.inblob = Inblob()});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(report.status().message(), HasSubstr("generation 1 -> 2"));
  EXPECT_EQ(fs.entries_made(), kTsmMaxAttempts);
  EXPECT_EQ(fs.entries_removed(), kTsmMaxAttempts);
  EXPECT_EQ(CountEntries(root_), 0u);
}

TEST_F(TsmTest, TdxProviderWithoutAuxblob) {
  FakeTsmFs fs(
      root_, std::string(kTsmProviderTdxGuest),
      [](ByteSpan inblob, std::optional<uint32_t>) -> absl::StatusOr<Bytes> {
        Bytes quote = ToBytes("quote:");
        Append(quote, inblob);
        return quote;
      },
      std::nullopt);
  auto report = GetTsmReport(
      fs, root_, {.inblob = Inblob(), .expected_provider = std::string(kTsmProviderTdxGuest)});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->provider, "tdx_guest");
  EXPECT_TRUE(report->auxblob.empty());
  Bytes expected = ToBytes("quote:");
  Append(expected, Inblob());
  EXPECT_EQ(report->outblob, expected);
}

TEST_F(TsmTest, WrongProviderIsRefusedAndEntryRemoved) {
  FakeTsmFs fs = MakeFs(std::string(kTsmProviderTdxGuest), Bytes());
  auto report = GetTsmReport(
      fs, root_, {.inblob = Inblob(), .expected_provider = std::string(kTsmProviderSevGuest)});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(report.status().message(),
            "configfs-tsm provider is 'tdx_guest', expected 'sev_guest'");
  EXPECT_EQ(fs.entries_removed(), 1);
  EXPECT_EQ(CountEntries(root_), 0u);
}

TEST_F(TsmTest, MissingRootSaysConfigfsTsmIsNotAvailable) {
  FakeTsmFs fs = MakeFs();
  auto report = GetTsmReport(fs, dir_.path() + "/no-such-root", {.inblob = Inblob()});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("configfs-tsm is not available"));
  EXPECT_EQ(fs.entries_made(), 0);
}

TEST_F(TsmTest, BadRequestsAreRefusedBeforeAnyEntryIsMade) {
  FakeTsmFs fs = MakeFs();
  auto long_inblob = GetTsmReport(fs, root_, {.inblob = Bytes(65, 1)});
  EXPECT_EQ(long_inblob.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_level = GetTsmReport(fs, root_, {.inblob = Inblob(), .privlevel = 4});
  EXPECT_EQ(bad_level.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs.entries_made(), 0);
}

TEST_F(TsmTest, OutblobFailureIsReportedAndEntryRemoved) {
  FakeTsmFs fs(
      root_, std::string(kTsmProviderSevGuest),
      [](ByteSpan, std::optional<uint32_t>) -> absl::StatusOr<Bytes> {
        return absl::UnavailableError("reading outblob: Input/output error");
      },
      Bytes());
  auto report = GetTsmReport(fs, root_, {.inblob = Inblob()});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fs.entries_removed(), 1);
}

TEST_F(TsmTest, EmptyOutblobIsDataLoss) {
  FakeTsmFs fs(
      root_, std::string(kTsmProviderSevGuest),
      [](ByteSpan, std::optional<uint32_t>) -> absl::StatusOr<Bytes> { return Bytes(); }, Bytes());
  auto report = GetTsmReport(fs, root_, {.inblob = Inblob()});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(report.status().message(), HasSubstr("outblob is empty"));
}

TEST(RealTsmFsTest, ReadsWritesAndReportsErrors) {
  ScopedTempDir dir;
  TsmFs& fs = TsmFs::Real();
  std::string entry = dir.path() + "/entry";
  EXPECT_FALSE(fs.IsDirectory(entry));
  ASSERT_TRUE(fs.MakeDir(entry).ok());
  EXPECT_TRUE(fs.IsDirectory(entry));
  EXPECT_EQ(fs.MakeDir(entry).code(), absl::StatusCode::kAlreadyExists);
  // Write opens an existing attribute; it does not create files.
  EXPECT_EQ(fs.Write(entry + "/inblob", Bytes{1}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteFileAtomic(entry + "/inblob", "").ok());
  Bytes data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(fs.Write(entry + "/inblob", data).ok());
  auto read = fs.Read(entry + "/inblob", data.size());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data);
  EXPECT_EQ(fs.Read(entry + "/inblob", data.size() - 1).status().code(),
            absl::StatusCode::kOutOfRange);
  auto missing = fs.Read(entry + "/outblob", 100);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(entry + "/outblob"));
  EXPECT_FALSE(fs.RemoveDir(entry).ok());  // not empty
  ASSERT_EQ(::unlink((entry + "/inblob").c_str()), 0);
  EXPECT_TRUE(fs.RemoveDir(entry).ok());
  EXPECT_FALSE(fs.IsDirectory(entry));
}

// ---- certificate table ----

class CertTableTest : public TsmTest {
 protected:
  Bytes VcekDer() const { return signer_->certificates().cvm_chain[0].ToDer(); }
  Bytes AskDer() const { return signer_->certificates().cvm_chain[1].ToDer(); }
  Bytes ArkDer() const { return signer_->certificates().cvm_chain[2].ToDer(); }

  // A table with explicit (GUID, offset, length) entries over `size` bytes of zeros, with
  // `payloads` copied to their offsets; `terminate` adds the all-zero entry.
  static Bytes RawTable(
      const std::vector<std::tuple<std::string_view, uint32_t, uint32_t>>& entries, size_t size,
      bool terminate = true) {
    Bytes table;
    for (const auto& [guid, offset, length] : entries) {
      Append(table, *SnpGuidBytes(guid));
      for (uint32_t value : {offset, length}) {
        for (int i = 0; i < 4; ++i) table.push_back(static_cast<uint8_t>(value >> (8 * i)));
      }
    }
    if (terminate) table.resize(table.size() + kSnpCertTableEntrySize, 0);
    if (table.size() < size) table.resize(size, 0);
    return table;
  }
};

TEST_F(CertTableTest, GuidBytesAreInTextOrder) {
  auto vcek = SnpGuidBytes(kSnpVcekGuid);
  ASSERT_TRUE(vcek.ok());
  EXPECT_EQ(HexEncode(*vcek), "63da758de6644564adc5f4b93be8accd");
  EXPECT_FALSE(SnpGuidBytes("63da758d-e664-4564-adc5-f4b93be8acc").ok());
  EXPECT_FALSE(SnpGuidBytes("63da758d_e664-4564-adc5-f4b93be8accd").ok());
  EXPECT_FALSE(SnpGuidBytes("63da758d-e664-4564-adc5-f4b93be8accz").ok());
}

TEST_F(CertTableTest, ParsesVcekAskArkIntoALeafFirstChain) {
  auto entries = ParseSnpCertTable(signer_->CertTable());
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].kind, SnpCertKind::kVcek);
  EXPECT_EQ((*entries)[0].guid, kSnpVcekGuid);
  EXPECT_EQ((*entries)[1].kind, SnpCertKind::kAsk);
  EXPECT_EQ((*entries)[2].kind, SnpCertKind::kArk);
  for (const auto& entry : *entries) EXPECT_TRUE(entry.certificate.has_value());
  EXPECT_EQ(SnpCertChainPem(*entries, kSnpSigningKeyVcek),
            ChainToPem(signer_->certificates().cvm_chain));
  // A VLEK-signed report needs a VLEK, which this table lacks.
  EXPECT_EQ(SnpCertChainPem(*entries, kSnpSigningKeyVlek), "");
}

TEST_F(CertTableTest, VlekLeadsTheChainForVlekReports) {
  // Any certificate serves to check the ordering; the verifier checks what it is.
  Bytes table = BuildSnpCertTableForTest(
      {{kSnpArkGuid, ArkDer()}, {kSnpVlekGuid, VcekDer()}, {kSnpAskGuid, AskDer()}});
  auto entries = ParseSnpCertTable(table);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ(SnpCertChainPem(*entries, kSnpSigningKeyVlek),
            ChainToPem(signer_->certificates().cvm_chain));
  EXPECT_EQ(SnpCertChainPem(*entries, kSnpSigningKeyVcek), "");
  EXPECT_EQ(SnpCertChainPem(*entries, kSnpSigningKeyNone), "");
}

TEST_F(CertTableTest, EmptyTablesMeanNoCertificates) {
  auto none = ParseSnpCertTable(Bytes());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto terminator_only = ParseSnpCertTable(Bytes(4096, 0));
  ASSERT_TRUE(terminator_only.ok());
  EXPECT_TRUE(terminator_only->empty());
}

TEST_F(CertTableTest, AcceptsPemAndZeroPaddedDerAndKeepsUnknownEntriesRaw) {
  Bytes padded = VcekDer();
  padded.resize(padded.size() + 100, 0);
  Bytes unknown = ToBytes("opaque vendor data");
  Bytes table = BuildSnpCertTableForTest(
      {{kSnpVcekGuid, padded},
       {kSnpAskGuid, ToBytes(signer_->certificates().cvm_chain[1].ToPem())},
       {"01234567-89ab-cdef-0123-456789abcdef", unknown}});
  auto entries = ParseSnpCertTable(table);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].certificate->ToDer(), VcekDer());
  EXPECT_EQ((*entries)[1].certificate->ToDer(), AskDer());
  EXPECT_EQ((*entries)[2].kind, SnpCertKind::kOther);
  EXPECT_EQ((*entries)[2].guid, "01234567-89ab-cdef-0123-456789abcdef");
  EXPECT_EQ((*entries)[2].data, unknown);
  EXPECT_FALSE((*entries)[2].certificate.has_value());
}

void ExpectTableError(const Bytes& table, std::string_view message_part) {
  auto entries = ParseSnpCertTable(table);
  EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument) << message_part;
  EXPECT_THAT(entries.status().message(), HasSubstr(message_part));
}

TEST_F(CertTableTest, MissingTerminator) {
  Bytes table = RawTable({{kSnpVcekGuid, 24, 10}}, 34, /*terminate=*/false);
  ExpectTableError(table, "no all-zero terminating entry");
  // Entries that fill the buffer exactly, with no room for the terminator.
  ExpectTableError(RawTable({{kSnpVcekGuid, 0, 1}}, 0, false), "no all-zero terminating entry");
}

TEST_F(CertTableTest, OverlappingEntries) {
  Bytes vcek = VcekDer();
  Bytes table = RawTable({{kSnpVcekGuid, 72, static_cast<uint32_t>(vcek.size())},
                          {kSnpAskGuid, 72 + static_cast<uint32_t>(vcek.size()) - 1, 10}},
                         72 + vcek.size() + 20);
  ExpectTableError(table, "entry 0 (VCEK) and entry 1 (ASK) overlap");
  // The same data for two entries is an overlap too.
  ExpectTableError(RawTable({{kSnpVcekGuid, 72, 100}, {kSnpAskGuid, 72, 100}}, 300), "overlap");
}

TEST_F(CertTableTest, DataInsideTheEntries) {
  ExpectTableError(
      RawTable({{kSnpVcekGuid, 24, 100}}, 200),
      "entry 0 (VCEK): data at offset 24 overlaps the table's entries, which end at 48");
  ExpectTableError(RawTable({{kSnpVcekGuid, 0, 100}}, 200), "overlaps the table's entries");
}

TEST_F(CertTableTest, OutOfRangeOffsetsAndLengths) {
  ExpectTableError(RawTable({{kSnpVcekGuid, 48, 1000}}, 200),
                   "entry 0 (VCEK): offset 48 + length 1000 runs past the table's 200 bytes");
  ExpectTableError(RawTable({{kSnpAskGuid, 500, 1}}, 200), "runs past");
  // offset + length wraps around 32 bits.
  ExpectTableError(RawTable({{kSnpArkGuid, 0xFFFFFFF0u, 0x20}}, 200), "runs past");
}

TEST_F(CertTableTest, ZeroLengthRepeatedGuidAndZeroGuid) {
  ExpectTableError(RawTable({{kSnpVcekGuid, 48, 0}}, 100), "entry 0 (VCEK) has length 0");
  ExpectTableError(RawTable({{kSnpAskGuid, 72, 10}, {kSnpAskGuid, 82, 10}}, 200),
                   "entry 1 (ASK) repeats the GUID of entry 0");
  ExpectTableError(RawTable({{"00000000-0000-0000-0000-000000000000", 48, 10}}, 100),
                   "entry 0 has a zero GUID");
}

TEST_F(CertTableTest, TooManyEntries) {
  std::vector<std::tuple<std::string_view, uint32_t, uint32_t>> entries;
  std::vector<std::string> guids;
  for (int i = 0; i <= static_cast<int>(kSnpCertTableMaxEntries); ++i) {
    guids.push_back(absl::StrCat("01234567-89ab-cdef-0123-4567", absl::Hex(0x10000000 + i)));
  }
  const uint32_t data_start = (kSnpCertTableMaxEntries + 2) * kSnpCertTableEntrySize;
  for (size_t i = 0; i < guids.size(); ++i) {
    entries.emplace_back(guids[i], data_start + i, 1);
  }
  ExpectTableError(RawTable(entries, data_start + guids.size()), "more than 64 entries");
}

TEST_F(CertTableTest, CertificateThatDoesNotParse) {
  ExpectTableError(BuildSnpCertTableForTest({{kSnpVcekGuid, ToBytes("not a certificate")}}),
                   "entry 0 (VCEK): neither a DER certificate nor PEM");
  Bytes truncated = AskDer();
  truncated.resize(truncated.size() - 10);
  ExpectTableError(BuildSnpCertTableForTest({{kSnpVcekGuid, VcekDer()}, {kSnpAskGuid, truncated}}),
                   "entry 1 (ASK): DER certificate of");
  Bytes trailing = ArkDer();
  trailing.push_back(0x01);
  ExpectTableError(BuildSnpCertTableForTest({{kSnpArkGuid, trailing}}),
                   "entry 0 (ARK): non-zero bytes after the DER certificate");
  ExpectTableError(
      BuildSnpCertTableForTest({{kSnpVcekGuid, ToBytes("-----BEGIN CERTIFICATE-----\nAAAA\n")}}),
      "entry 0 (VCEK)");
}

// ---- firmware responses ----

Bytes Le32(uint32_t value) {
  return {static_cast<uint8_t>(value), static_cast<uint8_t>(value >> 8),
          static_cast<uint8_t>(value >> 16), static_cast<uint8_t>(value >> 24)};
}

TEST(SnpResponseTest, ReportResponse) {
  Bytes report(kSnpReportSize);
  for (size_t i = 0; i < report.size(); ++i) report[i] = static_cast<uint8_t>(i * 7);
  Bytes response = Le32(0);
  Append(response, Le32(kSnpReportSize));
  response.resize(0x20, 0);
  Append(response, report);
  response.resize(4000, 0);
  auto parsed = ParseSnpReportResponse(response);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, report);

  Bytes refused = response;
  refused[0] = 0x16;
  auto status = ParseSnpReportResponse(refused).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("status 0x16"));

  Bytes zero_size = response;
  std::fill(zero_size.begin() + 4, zero_size.begin() + 8, 0);
  EXPECT_EQ(ParseSnpReportResponse(zero_size).status().code(), absl::StatusCode::kDataLoss);
  Bytes too_big = response;
  Bytes size = Le32(4000 - 0x20 + 1);
  std::copy(size.begin(), size.end(), too_big.begin() + 4);
  EXPECT_EQ(ParseSnpReportResponse(too_big).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseSnpReportResponse(Bytes(0x1F, 0)).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SnpResponseTest, DerivedKeyResponse) {
  Bytes response(64, 0);
  for (size_t i = 0; i < 32; ++i) response[0x20 + i] = static_cast<uint8_t>(0xA0 + i);
  auto key = ParseSnpDerivedKeyResponse(response);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(Bytes(key->span().begin(), key->span().end()),
            Bytes(response.begin() + 0x20, response.end()));
  response[0] = 0x07;
  EXPECT_EQ(ParseSnpDerivedKeyResponse(response).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ParseSnpDerivedKeyResponse(Bytes(63, 0)).status().code(), absl::StatusCode::kDataLoss);
}

// ---- /dev/sev-guest without the device ----

TEST(SevGuestTest, MissingDeviceIsNotFound) {
  ScopedTempDir dir;
  std::string device = dir.path() + "/sev-guest";
  auto report = GetSevGuestReport(device, Bytes(64, 1));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(report.status().message(),
            device + " not found: not an SEV-SNP guest, or the sev-guest driver is not loaded");
  auto key = GetSnpDerivedKey(device, {});
  EXPECT_EQ(key.status().code(), absl::StatusCode::kNotFound);
}

TEST(SevGuestTest, BadArgumentsAreRefused) {
  EXPECT_EQ(GetSevGuestReport("/nonexistent", Bytes(63, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetSevGuestReport("/nonexistent", Bytes(64, 1), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  SnpDerivedKeyRequest bad_fields;
  bad_fields.guest_field_select = uint64_t{1} << 6;
  EXPECT_EQ(GetSnpDerivedKey("/nonexistent", bad_fields).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A regular file answers every ioctl with ENOTTY: the extended request falls back to the
// plain one, whose failure names the ioctl and the error codes.
TEST(SevGuestTest, IoctlFailuresNameTheRequest) {
  ScopedTempDir dir;
  std::string device = dir.path() + "/not-a-device";
  ASSERT_TRUE(WriteFileAtomic(device, "", 0600).ok());
  auto report = GetSevGuestReport(device, Bytes(64, 1));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(report.status().message(), HasSubstr("SNP_GET_REPORT on " + device + " failed"));
  EXPECT_THAT(report.status().message(), HasSubstr("firmware error 0x0, VMM error 0x0"));
  auto key = GetSnpDerivedKey(device, {});
  EXPECT_THAT(key.status().message(), HasSubstr("SNP_GET_DERIVED_KEY on " + device + " failed"));
}

}  // namespace
}  // namespace cloister::attest
