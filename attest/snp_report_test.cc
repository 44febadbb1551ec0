#include "attest/snp_report.h"

#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/civil_time.h"
#include "attest/test_util.h"
#include "attest/x509.h"
#include "crypto/ecdsa.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::ReadTestBinary;
using testing::ReadTestHex;
using testing::ReadTestText;

absl::Time Utc(int year, int month, int day) {
  return absl::FromCivil(absl::CivilDay(year, month, day), absl::UTCTimeZone());
}

struct RealVector {
  std::string dir;
  Bytes report;
  std::string measurement;
  uint64_t policy;
  uint64_t tcb;
  SnpTcb tcb_parts;
  std::string chip_id_prefix;
  uint8_t build;
  uint8_t minor;
};

std::vector<RealVector> RealVectors() {
  return {
      {"sev-snp/milan-v2-go-sev-guest",
       ReadTestBinary("sev-snp/milan-v2-go-sev-guest/report.bin"),
       "b07af9620f3b839b47996422ddec6058338951d984e312115131ea82705eaf5b6bdf8a9ece31a5a608eb0cf2e48"
       "72b01",
       0xb0000,
       0x4405000000000002,
       {.bootloader = 2, .tee = 0, .snp = 5, .microcode = 68},
       "3ac3fe21e13fb099",
       3,
       49},
      {"sev-snp/milan-v2-virtee",
       ReadTestHex("sev-snp/milan-v2-virtee/report.hex"),
       "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd8"
       "1841f",
       0x30000,
       0x7308000000000003,
       {.bootloader = 3, .tee = 0, .snp = 8, .microcode = 115},
       "d49554ec717f4e5b",
       4,
       52},
  };
}

TEST(SnpReportRealTest, ParsesAndVerifiesMilanReports) {
  for (const RealVector& v : RealVectors()) {
    auto report = ParseSnpReport(v.report);
    ASSERT_TRUE(report.ok()) << v.dir << ": " << report.status();
    EXPECT_EQ(report->version, 2u);
    EXPECT_EQ(report->policy, v.policy);
    EXPECT_EQ(report->debug_allowed(), (v.policy & (1 << 19)) != 0);
    EXPECT_EQ(report->vmpl, 0u);
    EXPECT_EQ(report->signature_algo, 1u);
    EXPECT_EQ(HexEncode(report->measurement), v.measurement);
    EXPECT_EQ(report->reported_tcb, v.tcb);
    EXPECT_EQ(report->current_tcb, v.tcb);
    EXPECT_EQ(report->launch_tcb, v.tcb);
    EXPECT_EQ(SnpTcb::FromMilanGenoa(report->reported_tcb), v.tcb_parts);
    EXPECT_EQ(SnpTcb::FromMilanGenoa(v.tcb).ToMilanGenoa(), v.tcb);
    EXPECT_TRUE(absl::StartsWith(HexEncode(report->chip_id), v.chip_id_prefix));
    EXPECT_EQ(report->current_build, v.build);
    EXPECT_EQ(report->current_minor, v.minor);
    EXPECT_EQ(report->current_major, 1);
    EXPECT_FALSE(report->cpuid_family.has_value());  // version 2
    EXPECT_EQ(report->signing_key(), kSnpSigningKeyVcek);

    // The real VCEK signs the report, chains to AMD's ARK, and was issued for this chip+TCB.
    auto vcek = Certificate::FromDer(ReadTestBinary(v.dir + "/vcek.der"));
    ASSERT_TRUE(vcek.ok()) << vcek.status();
    EXPECT_TRUE(VerifyP1363WithCertificate(*vcek, crypto::HashAlg::kSha384,
                                           ByteSpan(v.report).first(kSnpSignedSize),
                                           report->signature)
                    .ok())
        << v.dir;
    auto ask_ark = ParsePemChain(ReadTestText(v.dir + "/ask_ark_milan.pem"));
    ASSERT_TRUE(ask_ark.ok());
    ASSERT_EQ(ask_ark->size(), 2u);
    std::vector<Certificate> chain = {*vcek, (*ask_ark)[0], (*ask_ark)[1]};
    absl::Status chain_status = VerifyChain(chain, (*ask_ark)[1], Utc(2025, 6, 1));
    EXPECT_TRUE(chain_status.ok()) << chain_status;
    auto info = ReadVcekExtensions(*vcek);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->product_name, "Milan-B0");
    EXPECT_EQ(info->tcb, v.tcb_parts);
    EXPECT_TRUE(CheckVcekMatchesReport(*info, *report).ok());

    // A changed signed byte breaks the signature.
    Bytes tampered = v.report;
    tampered[0x90] ^= 1;  // MEASUREMENT
    auto tampered_report = ParseSnpReport(tampered);
    ASSERT_TRUE(tampered_report.ok());
    EXPECT_FALSE(VerifyP1363WithCertificate(*vcek, crypto::HashAlg::kSha384,
                                            ByteSpan(tampered).first(kSnpSignedSize),
                                            tampered_report->signature)
                     .ok());
  }
}

TEST(SnpReportRealTest, VcekOfAnotherChipDoesNotMatch) {
  std::vector<RealVector> vectors = RealVectors();
  auto report = ParseSnpReport(vectors[0].report);
  auto other_vcek = Certificate::FromDer(ReadTestBinary(vectors[1].dir + "/vcek.der"));
  ASSERT_TRUE(report.ok() && other_vcek.ok());
  auto info = ReadVcekExtensions(*other_vcek);
  ASSERT_TRUE(info.ok());
  absl::Status status = CheckVcekMatchesReport(*info, *report);
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_FALSE(VerifyP1363WithCertificate(*other_vcek, crypto::HashAlg::kSha384,
                                          ByteSpan(vectors[0].report).first(kSnpSignedSize),
                                          report->signature)
                   .ok());
}

TEST(SnpReportRealTest, ChainToAnotherProductsRootFails) {
  RealVector v = RealVectors()[0];
  auto vcek = Certificate::FromDer(ReadTestBinary(v.dir + "/vcek.der"));
  auto milan = ParsePemChain(ReadTestText(v.dir + "/ask_ark_milan.pem"));
  auto genoa = ParsePemChain(ReadTestText("sev-snp/amd-roots/ask_ark_genoa.pem"));
  ASSERT_TRUE(vcek.ok() && milan.ok() && genoa.ok());
  std::vector<Certificate> chain = {*vcek, (*milan)[0], (*milan)[1]};
  absl::Status status = VerifyChain(chain, (*genoa)[1], Utc(2025, 6, 1));
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
}

SnpReport SampleReport(uint32_t version) {
  SnpReport r;
  r.version = version;
  r.guest_svn = 7;
  r.policy = kSnpPolicyReservedOne | kSnpPolicySmtAllowed;
  r.family_id = Bytes(16, 0x10);
  r.image_id = Bytes(16, 0x20);
  r.vmpl = 1;
  r.signature_algo = 1;
  r.current_tcb = 0x1122000000003344;
  r.platform_info = 3;
  r.signer_info = 0x3;
  r.report_data = Bytes(64, 0x50);
  r.measurement = Bytes(48, 0x90);
  r.host_data = Bytes(32, 0xC0);
  r.id_key_digest = Bytes(48, 0xE0);
  r.author_key_digest = Bytes(48, 0xF0);
  r.report_id = Bytes(32, 0x40);
  r.report_id_ma = Bytes(32, 0x60);
  r.reported_tcb = 0x5566000000007788;
  if (version >= 3) {
    r.cpuid_family = 0x19;
    r.cpuid_model = 0x11;
    r.cpuid_stepping = 1;
  }
  r.chip_id = Bytes(64, 0xA0);
  r.committed_tcb = 0x0102000000000304;
  r.current_build = 5;
  r.current_minor = 6;
  r.current_major = 1;
  r.committed_build = 4;
  r.committed_minor = 5;
  r.committed_major = 1;
  r.launch_tcb = 0x0A0B000000000C0D;
  if (version >= 5) {
    r.launch_mitigation_vector = 0x99;
    r.current_mitigation_vector = 0x98;
  }
  return r;
}

Bytes SignedSample(uint32_t version) {
  auto bytes = EncodeSnpReportToSign(SampleReport(version));
  EXPECT_TRUE(bytes.ok());
  Bytes signature(96);
  for (size_t i = 0; i < 96; ++i) signature[i] = static_cast<uint8_t>(i + 1);
  EXPECT_TRUE(SetSnpSignature(*bytes, signature).ok());
  return *bytes;
}

TEST(SnpReportTest, EncodeParseRoundTrip) {
  for (uint32_t version : {2u, 3u, 5u}) {
    Bytes bytes = SignedSample(version);
    auto parsed = ParseSnpReport(bytes);
    ASSERT_TRUE(parsed.ok()) << version << ": " << parsed.status();
    SnpReport expected = SampleReport(version);
    EXPECT_EQ(parsed->guest_svn, 7u);
    EXPECT_EQ(parsed->vmpl, 1u);
    EXPECT_EQ(parsed->report_data, expected.report_data);
    EXPECT_EQ(parsed->measurement, expected.measurement);
    EXPECT_EQ(parsed->chip_id, expected.chip_id);
    EXPECT_EQ(parsed->reported_tcb, expected.reported_tcb);
    EXPECT_EQ(parsed->launch_tcb, expected.launch_tcb);
    EXPECT_EQ(parsed->cpuid_family, expected.cpuid_family);
    EXPECT_EQ(parsed->launch_mitigation_vector, expected.launch_mitigation_vector);
    EXPECT_TRUE(parsed->chip_key_masked());
    EXPECT_EQ(parsed->committed_build, 4);
    // Little-endian zero-padded r and s come back as big-endian r || s.
    Bytes signature(96);
    for (size_t i = 0; i < 96; ++i) signature[i] = static_cast<uint8_t>(i + 1);
    EXPECT_EQ(parsed->signature, signature);
    auto again = EncodeSnpReportToSign(*parsed);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(Bytes(again->begin(), again->begin() + kSnpSignedSize),
              Bytes(bytes.begin(), bytes.begin() + kSnpSignedSize));
  }
  // The layout puts R's least significant byte first at 0x2A0.
  Bytes bytes = SignedSample(3);
  EXPECT_EQ(bytes[0x2A0], 48);
  EXPECT_EQ(bytes[0x2A0 + 47], 1);
  EXPECT_EQ(bytes[0x2A0 + 72], 96);
}

TEST(SnpReportTest, RefusesMalformedReports) {
  struct Case {
    std::string name;
    std::function<void(Bytes&)> apply;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"short", [](Bytes& b) { b.pop_back(); }, "1183 bytes"},
      {"long", [](Bytes& b) { b.push_back(0); }, "1185 bytes"},
      {"version 1", [](Bytes& b) { b[0] = 1; }, "version 1"},
      {"version 6", [](Bytes& b) { b[0] = 6; }, "version 6"},
      {"algorithm", [](Bytes& b) { b[0x34] = 2; }, "SIGNATURE_ALGO 2"},
      {"policy bit 17", [](Bytes& b) { b[0x0A] &= ~0x02; }, "bit 17"},
      {"signer info reserved", [](Bytes& b) { b[0x48] |= 0x20; }, "signer-info"},
      {"reserved 0x4C", [](Bytes& b) { b[0x4D] = 1; }, "0x4d"},
      {"reserved 0x18B", [](Bytes& b) { b[0x190] = 1; }, "0x190"},
      {"mitigation in v3", [](Bytes& b) { b[0x1F8] = 1; }, "mitigation"},
      {"reserved 0x208", [](Bytes& b) { b[0x250] = 1; }, "0x250"},
      {"R padding", [](Bytes& b) { b[0x2A0 + 60] = 1; }, "signature R padding"},
      {"S padding", [](Bytes& b) { b[0x2A0 + 72 + 71] = 1; }, "signature S padding"},
      {"signature tail", [](Bytes& b) { b[0x49F] = 1; }, "reserved signature area"},
  };
  for (const Case& c : cases) {
    Bytes bytes = SignedSample(3);
    c.apply(bytes);
    auto parsed = ParseSnpReport(bytes);
    ASSERT_FALSE(parsed.ok()) << c.name;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), c.expected))
        << c.name << ": " << parsed.status();
  }
  // CPUID bytes are reserved in version 2.
  Bytes v2 = SignedSample(2);
  v2[0x188] = 0x19;
  EXPECT_FALSE(ParseSnpReport(v2).ok());
}

TEST(SnpReportTest, TurinTcbLayout) {
  SnpTcb tcb = SnpTcb::FromTurin(0x4800000004030201);
  EXPECT_EQ(tcb.fmc, 1);
  EXPECT_EQ(tcb.bootloader, 2);
  EXPECT_EQ(tcb.tee, 3);
  EXPECT_EQ(tcb.snp, 4);
  EXPECT_EQ(tcb.microcode, 0x48);
}

TEST(SnpReportRealTest, TurinVcekExtensions) {
  auto vcek = Certificate::FromDer(ReadTestBinary("sev-snp/turin-vcek-only-virtee/vcek.der"));
  ASSERT_TRUE(vcek.ok()) << vcek.status();
  auto info = ReadVcekExtensions(*vcek);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->tcb.fmc.has_value());
  EXPECT_EQ(info->hwid.size(), 8u);
}

}  // namespace
}  // namespace cloister::attest
