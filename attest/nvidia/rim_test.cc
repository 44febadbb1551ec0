#include "attest/nvidia/rim.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "attest/nvidia/base64.h"
#include "attest/nvidia/roots.h"
#include "attest/nvidia/test_pki.h"
#include "crypto/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::MakeTestRim;
using ::cloister::attest::testing::MakeTestRimPki;
using ::cloister::attest::testing::NvidiaPath;
using ::cloister::attest::testing::ParseTestTime;
using ::cloister::attest::testing::ReadNvidiaText;
using ::cloister::attest::testing::SignTestRim;
using ::cloister::attest::testing::TestDigest;
using ::testing::HasSubstr;

constexpr char kDriverRim545[] = "hopper-545.00-e2e/driver_rim_545.00_test.swidtag";
constexpr char kVbiosRim545[] = "hopper-545.00-e2e/vbios_rim_96005E0001_test.swidtag";
constexpr char kDriverRim550[] = "rims/NV_GPU_DRIVER_GH100_550.144.03.xml";
constexpr char kExpiredRim[] =
    "attestation-sdk-samples/hopper-570.124.03/driver_rim_570.124.03_EXPIRED_signer.xml";

Certificate CorimRoot() { return *Certificate::FromPem(kNvidiaCorimRootCaPem); }

std::vector<uint32_t> ActiveIndices(const Rim& rim) {
  std::vector<uint32_t> out;
  for (const RimMeasurement* m : rim.ActiveMeasurements()) out.push_back(m->index);
  return out;
}

// ---- parsing real RIMs ----

TEST(RimParseTest, DriverRim545) {
  auto rim = ParseRim(ReadNvidiaText(kDriverRim545));
  ASSERT_TRUE(rim.ok()) << rim.status();
  EXPECT_EQ(rim->colloquial_version, "545.00");  // expected.json driver_rim_version
  EXPECT_EQ(rim->name, "GH100");
  EXPECT_EQ(rim->product, "GH100");
  EXPECT_EQ(rim->firmware_manufacturer_id, "5703");
  EXPECT_EQ(rim->binding_spec, "RIMIM");
  EXPECT_EQ(rim->creator, "NVIDIA Corporation");
  EXPECT_EQ(rim->tag_id.size(), 96u);
  ASSERT_EQ(rim->measurements.size(), 64u);
  std::vector<uint32_t> expected = {7};
  for (uint32_t i = 21; i <= 40; ++i) expected.push_back(i);
  EXPECT_EQ(ActiveIndices(*rim), expected);
  const RimMeasurement* seven = rim->Find(7);
  ASSERT_NE(seven, nullptr);
  EXPECT_EQ(seven->name, "Measurement_7");
  EXPECT_EQ(seven->size, 48u);
  ASSERT_EQ(seven->alternatives.size(), 1u);
  EXPECT_EQ(HexEncode(seven->alternatives[0]),
            "0e0ee161b59bf124ce6b6dca6efa7616d28077862c0e57dca7d5efd63d00eeed4851922941e846a3"
            "8c464cbedbc168d9");
  EXPECT_EQ(rim->Find(35)->alternatives.size(), 2u);
  ASSERT_EQ(rim->signer_chain.size(), 4u);
  EXPECT_EQ(rim->signer_chain[0].SubjectCommonName(), "HCC RIM L4 Signer");
  EXPECT_EQ(rim->signer_chain[3].SubjectCommonName(), "NVIDIA CoRIM signing Root CA");
}

TEST(RimParseTest, VbiosRim545) {
  auto rim = ParseRim(ReadNvidiaText(kVbiosRim545));
  ASSERT_TRUE(rim.ok()) << rim.status();
  EXPECT_EQ(rim->colloquial_version, "96.00.5E.00.01");  // expected.json vbios_rim_version
  EXPECT_EQ(ActiveIndices(*rim), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12}));
  EXPECT_EQ(rim->Find(12)->alternatives.size(), 4u);
}

TEST(RimParseTest, EveryProductionVbiosRimParses) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(NvidiaPath("rims/nvtrust-vbios"))) {
    auto rim = ParseRim(ReadNvidiaText("rims/nvtrust-vbios/" + entry.path().filename().string()));
    ASSERT_TRUE(rim.ok()) << entry.path() << ": " << rim.status();
    // The file name carries the version without dots: ..._96005E0001_PROD.swidtag.
    std::string version = absl::StrReplaceAll(rim->colloquial_version, {{".", ""}});
    EXPECT_THAT(entry.path().filename().string(), HasSubstr(version));
    ++count;
  }
  EXPECT_EQ(count, 24u);
}

// ---- signatures of real RIMs ----

TEST(RimSignatureTest, TestRims545VerifyWhileTheirSignersWereValid) {
  for (const char* path : {kDriverRim545, kVbiosRim545}) {
    auto info = VerifyRimSignature(ReadNvidiaText(path), CorimRoot(),
                                   ParseTestTime("2024-06-01T00:00:00Z"));
    ASSERT_TRUE(info.ok()) << path << ": " << info.status();
    EXPECT_EQ(info->signer, "HCC RIM L4 Signer");
    EXPECT_FALSE(info->expired_but_allowed);
    EXPECT_EQ(info->chain.size(), 4u);
  }
  auto driver = VerifyRimSignature(ReadNvidiaText(kDriverRim545), CorimRoot(),
                                   ParseTestTime("2024-06-01T00:00:00Z"));
  EXPECT_EQ(driver->earliest_expiry, ParseTestTime("2025-06-26T06:10:12Z"));
}

TEST(RimSignatureTest, ExpiredSignerFailsNamingExpiry) {
  auto info = VerifyRimSignature(ReadNvidiaText(kVbiosRim545), CorimRoot(),
                                 ParseTestTime("2026-01-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(info.status().message(), HasSubstr("'HCC RIM L4 Signer' expired on 2025-06-22"));
}

TEST(RimSignatureTest, ExpiredSignerAcceptedWhenAllowed) {
  auto info = VerifyRimSignature(ReadNvidiaText(kVbiosRim545), CorimRoot(),
                                 ParseTestTime("2026-01-01T00:00:00Z"), /*allow_expired=*/true);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->expired_but_allowed);
}

TEST(RimSignatureTest, NotYetValidIsNotExcusedByAllowExpired) {
  auto info = VerifyRimSignature(ReadNvidiaText(kDriverRim550), CorimRoot(),
                                 ParseTestTime("2024-06-01T00:00:00Z"), /*allow_expired=*/true);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(RimSignatureTest, EveryProductionVbiosRimVerifiesIn2024) {
  for (const auto& entry : std::filesystem::directory_iterator(NvidiaPath("rims/nvtrust-vbios"))) {
    auto info =
        VerifyRimSignature(ReadNvidiaText("rims/nvtrust-vbios/" + entry.path().filename().string()),
                           CorimRoot(), ParseTestTime("2024-06-01T00:00:00Z"));
    EXPECT_TRUE(info.ok()) << entry.path() << ": " << info.status();
  }
}

TEST(RimSignatureTest, DriverRim550_144_03) {
  auto info = VerifyRimSignature(ReadNvidiaText(kDriverRim550), CorimRoot(),
                                 ParseTestTime("2025-06-01T00:00:00Z"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->chain[1].SubjectCommonName(), "NVIDIA Reference Value L3 GH100 002");
}

TEST(RimSignatureTest, AlteredSignatureValueFails) {
  auto info =
      VerifyRimSignature(ReadNvidiaText("rims/negative/driver_rim_550.144.03_BAD_SIGNATURE.xml"),
                         CorimRoot(), ParseTestTime("2025-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(info.status().message(), HasSubstr("does not verify"));
}

TEST(RimSignatureTest, DebugSignerDoesNotChainToTheCorimRoot) {
  auto info =
      VerifyRimSignature(ReadNvidiaText("rims/negative/driver_rim_BAD_CERT_CHAIN_debug_signer.xml"),
                         CorimRoot(), ParseTestTime("2025-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(info.status().message(), HasSubstr("RIM signer chain"));
  EXPECT_THAT(info.status().message(), HasSubstr("NVIDIA CoRIM signing Root CA"));
}

TEST(RimSignatureTest, WrongTrustAnchorFails) {
  auto wrong_root = Certificate::FromPem(ReadNvidiaText("rims/negative/wrong_rim_root.pem"));
  ASSERT_TRUE(wrong_root.ok()) << wrong_root.status();
  auto info = VerifyRimSignature(ReadNvidiaText(kDriverRim550), *wrong_root,
                                 ParseTestTime("2025-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(RimSignatureTest, ExpiredSdkSample570) {
  // NVIDIA's SDK pairs this RIM with an expiry test. Its signer lived one day (2025-01-01 to
  // 2025-01-02); its content is an edited copy of the 545.00 test RIM, so even while the
  // signer was valid the document digest does not match. Expiry is reported first.
  const std::string xml = ReadNvidiaText(kExpiredRim);
  auto after = VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2025-06-01T00:00:00Z"));
  ASSERT_FALSE(after.ok());
  EXPECT_THAT(after.status().message(), HasSubstr("'RIM L4 Signer' expired on 2025-01-02"));
  auto during = VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2025-01-01T12:00:00Z"));
  ASSERT_FALSE(during.ok());
  EXPECT_THAT(during.status().message(), HasSubstr("digest of the document does not match"));
  auto allowed = VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2025-06-01T00:00:00Z"),
                                    /*allow_expired=*/true);
  ASSERT_FALSE(allowed.ok());
  EXPECT_THAT(allowed.status().message(), HasSubstr("digest of the document does not match"));
}

TEST(RimSignatureTest, SdkSamples535) {
  auto tampered =
      VerifyRimSignature(ReadNvidiaText("attestation-sdk-samples/hopper-535.86.09/"
                                        "driver_rim_535.86.09_TAMPERED_measurement_mismatch.xml"),
                         CorimRoot(), ParseTestTime("2025-06-01T00:00:00Z"));
  ASSERT_FALSE(tampered.ok());
  EXPECT_THAT(tampered.status().message(), HasSubstr("digest"));
  auto vbios = VerifyRimSignature(
      ReadNvidiaText(
          "attestation-sdk-samples/hopper-535.86.09/vbios_rim_96005E0001_measurement_mismatch.xml"),
      CorimRoot(), ParseTestTime("2025-06-01T00:00:00Z"));
  EXPECT_TRUE(vbios.ok()) << vbios.status();
}

TEST(RimSignatureTest, EditedMeasurementFails) {
  std::string xml = ReadNvidiaText(kDriverRim545);
  const std::string original = "0e0ee161b59bf124ce6b6dca6efa7616";
  ASSERT_NE(xml.find(original), std::string::npos);
  xml.replace(xml.find(original), original.size(), "1e0ee161b59bf124ce6b6dca6efa7616");
  ASSERT_TRUE(ParseRim(xml).ok());
  auto info = VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("digest of the document does not match"));
}

TEST(RimSignatureTest, ExternalReferenceIsRefusedNotFetched) {
  std::string xml = ReadNvidiaText(kDriverRim545);
  xml = absl::StrReplaceAll(
      xml, {{"<ds:Reference URI=\"\">", "<ds:Reference URI=\"http://127.0.0.1:9/rim.xml\">"}});
  auto info = VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(RimSignatureTest, ReorderedKeyInfoUsesTheFirstCertificateAndFails) {
  // Move the signer's certificate to the end: the first certificate (a CA) is now taken as the
  // signer, and it neither is a valid leaf nor made the signature.
  std::string xml = ReadNvidiaText(kVbiosRim545);
  size_t first = xml.find("<ds:X509Certificate>");
  size_t end = xml.find("</ds:X509Certificate>") + std::string("</ds:X509Certificate>").size();
  std::string signer = xml.substr(first, end - first);
  xml.erase(first, end - first);
  xml.insert(xml.find("</ds:X509Data>"), signer);
  auto info = VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(RimSignatureTest, RejectsUnsignedAndDoublySigned) {
  auto pki = MakeTestRimPki();
  std::string unsigned_xml = RimToXml(MakeTestRim("550.90.07", {{7, {TestDigest(7)}}}));
  auto info =
      VerifyRimSignature(unsigned_xml, pki.root.cert, ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("no ds:Signature"));

  std::string xml = SignTestRim(MakeTestRim("550.90.07", {{7, {TestDigest(7)}}}), pki);
  size_t start = xml.find("<ds:Signature");
  size_t end = xml.find("</ds:Signature>") + std::string("</ds:Signature>").size();
  std::string doubled = xml;
  doubled.insert(end, xml.substr(start, end - start));
  info = VerifyRimSignature(doubled, pki.root.cert, ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("exactly one is accepted"));
}

// ---- RIMs we sign ----

TEST(RimSignTest, RoundTrip) {
  auto pki = MakeTestRimPki();
  Rim rim =
      MakeTestRim("550.90.07", {{7, {TestDigest(7)}}, {21, {TestDigest(21), TestDigest(22)}}});
  std::string xml = SignTestRim(rim, pki);
  auto parsed = ParseRim(xml);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->measurements, rim.measurements);
  EXPECT_EQ(parsed->colloquial_version, "550.90.07");
  EXPECT_EQ(parsed->firmware_manufacturer_id, "5703");
  ASSERT_EQ(parsed->signer_chain.size(), 4u);
  auto info = VerifyRimSignature(xml, pki.root.cert, ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_TRUE(info.ok()) << info.status();
  // Another root is not trusted, NVIDIA's included.
  EXPECT_FALSE(VerifyRimSignature(xml, CorimRoot(), ParseTestTime("2024-06-01T00:00:00Z")).ok());
  EXPECT_FALSE(
      VerifyRimSignature(xml, MakeTestRimPki().root.cert, ParseTestTime("2024-06-01T00:00:00Z"))
          .ok());
}

TEST(RimSignTest, KeyInfoChainOfAnotherSignerFails) {
  // Signed with one signer's key, but carrying another (valid) signer's chain: the key that
  // must verify the signature is the chain's first certificate, so this fails.
  auto pki = MakeTestRimPki();
  auto other = testing::IssueTestCert(pki.l3, "HCC RIM L4 Signer", false);
  Rim rim = MakeTestRim("550.90.07", {{7, {TestDigest(7)}}});
  auto xml = SignRimXml(RimToXml(rim), *pki.signer.key, pki.Chain());
  ASSERT_TRUE(xml.ok());
  std::string forged = *xml;
  std::string genuine = Base64Encode(pki.signer.cert.ToDer());
  ASSERT_NE(forged.find(genuine), std::string::npos);
  forged.replace(forged.find(genuine), genuine.size(), Base64Encode(other.cert.ToDer()));
  auto info = VerifyRimSignature(forged, pki.root.cert, ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("does not verify with the key of"));
  // And SignRimXml refuses a chain whose first certificate is not the key's.
  EXPECT_FALSE(SignRimXml(RimToXml(rim), *other.key, pki.Chain()).ok());
}

TEST(RimSignTest, ExpiredSyntheticSigner) {
  auto pki =
      MakeTestRimPki(ParseTestTime("2023-01-01T00:00:00Z"), ParseTestTime("2024-01-01T00:00:00Z"));
  std::string xml = SignTestRim(MakeTestRim("550.90.07", {{7, {TestDigest(7)}}}), pki);
  EXPECT_TRUE(VerifyRimSignature(xml, pki.root.cert, ParseTestTime("2023-06-01T00:00:00Z")).ok());
  auto late = VerifyRimSignature(xml, pki.root.cert, ParseTestTime("2024-06-01T00:00:00Z"));
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(),
              HasSubstr("'HCC RIM L4 Signer' expired on 2024-01-01T00:00:00Z"));
  EXPECT_TRUE(
      VerifyRimSignature(xml, pki.root.cert, ParseTestTime("2024-06-01T00:00:00Z"), true).ok());
  EXPECT_FALSE(
      VerifyRimSignature(xml, pki.root.cert, ParseTestTime("2022-06-01T00:00:00Z"), true).ok());
}

TEST(RimSignTest, ConcurrentVerificationInitialisesOnce) {
  const std::string xml = ReadNvidiaText(kDriverRim545);
  const Certificate root = CorimRoot();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        if (VerifyRimSignature(xml, root, ParseTestTime("2024-06-01T00:00:00Z")).ok()) ++ok;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ok.load(), 12);
}

// ---- strict parsing ----

std::string Resource(const std::string& attributes) {
  return absl::StrCat(
      "<SoftwareIdentity xmlns=\"http://standards.iso.org/iso/19770/-2/2015/schema.xsd\" "
      "xmlns:h=\"http://www.w3.org/2001/04/xmlenc#sha384\" name=\"GH100\">"
      "<Meta colloquialVersion=\"1.0\"/><Payload><Resource ",
      attributes, "/></Payload></SoftwareIdentity>");
}

std::string Hash(uint8_t seed) { return HexEncode(TestDigest(seed)); }

TEST(RimParseTest, MinimalDocument) {
  auto rim = ParseRim(Resource(absl::StrCat(
      "type=\"Measurement\" index=\"3\" active=\"true\" alternatives=\"2\" size=\"48\" h:Hash0=\"",
      Hash(1), "\" h:Hash1=\"", Hash(2), "\"")));
  ASSERT_TRUE(rim.ok()) << rim.status();
  ASSERT_EQ(rim->measurements.size(), 1u);
  EXPECT_EQ(rim->measurements[0].index, 3u);
  EXPECT_TRUE(rim->measurements[0].active);
  EXPECT_EQ(rim->measurements[0].alternatives, (std::vector<Bytes>{TestDigest(1), TestDigest(2)}));
  EXPECT_TRUE(rim->signer_chain.empty());
}

TEST(RimParseTest, RefusesMalformedEntries) {
  const std::string ok_hash = absl::StrCat(" h:Hash0=\"", Hash(1), "\"");
  struct Case {
    std::string attributes;
    std::string message;
  };
  std::vector<Case> cases = {
      {"type=\"File\" index=\"1\" active=\"True\" alternatives=\"1\" size=\"48\"" + ok_hash,
       "only 'Measurement'"},
      {"type=\"Measurement\" active=\"True\" alternatives=\"1\" size=\"48\"" + ok_hash,
       "no 'index'"},
      {"type=\"Measurement\" index=\"255\" active=\"True\" alternatives=\"1\" size=\"48\"" +
           ok_hash,
       "expected 0 to 254"},
      {"type=\"Measurement\" index=\"+1\" active=\"True\" alternatives=\"1\" size=\"48\"" + ok_hash,
       "has index '+1'"},
      {"type=\"Measurement\" index=\"01\" active=\"True\" alternatives=\"1\" size=\"48\"" + ok_hash,
       "has index '01'"},
      {"type=\"Measurement\" index=\"1\" active=\"yes\" alternatives=\"1\" size=\"48\"" + ok_hash,
       "expected True or False"},
      {"type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"0\" size=\"48\"" + ok_hash,
       "alternatives='0'"},
      {"type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"2\" size=\"48\"" + ok_hash,
       "no Hash1"},
      {"type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"1\" size=\"48\"" + ok_hash +
           " h:Hash3=\"00\"",
       "unexpected hash attribute 'Hash3'"},
      {"type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"1\" size=\"32\"" + ok_hash,
       "Hash0 is not 32 bytes"},
      {"type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"1\" size=\"48\" "
       "h:Hash0=\"zz\"",
       "Hash0 is not 48 bytes"},
      {"type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"1\" size=\"0\"" + ok_hash,
       "size='0'"},
  };
  for (const Case& c : cases) {
    auto rim = ParseRim(Resource(c.attributes));
    ASSERT_FALSE(rim.ok()) << c.attributes;
    EXPECT_EQ(rim.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(rim.status().message(), HasSubstr(c.message)) << c.attributes;
  }
}

TEST(RimParseTest, RefusesBadDocuments) {
  const std::string entry = absl::StrCat(
      "<Resource type=\"Measurement\" index=\"1\" active=\"True\" alternatives=\"1\" "
      "size=\"48\" h:Hash0=\"",
      Hash(1), "\"/>");
  const std::string open =
      "<SoftwareIdentity xmlns=\"http://standards.iso.org/iso/19770/-2/2015/schema.xsd\" "
      "xmlns:h=\"http://www.w3.org/2001/04/xmlenc#sha384\">";
  struct Case {
    std::string xml;
    std::string message;
  };
  std::vector<Case> cases = {
      {"", "empty"},
      {"<SoftwareIdentity", "malformed XML"},
      {"<SoftwareIdentity/>", "not a SWID SoftwareIdentity"},
      {open + "<Payload>" + entry + "</Payload></SoftwareIdentity>", "no Meta"},
      {open + "<Meta colloquialVersion=\"1\"/></SoftwareIdentity>", "no Payload"},
      {open + "<Meta/><Payload/></SoftwareIdentity>", "no colloquialVersion"},
      {open + "<Meta colloquialVersion=\"1\"/><Meta colloquialVersion=\"1\"/><Payload/>"
              "</SoftwareIdentity>",
       "more than one Meta"},
      {open + "<Meta colloquialVersion=\"1\"/><Payload>" + entry + entry +
           "</Payload></SoftwareIdentity>",
       "index 1 appears twice"},
      {open + "<Meta colloquialVersion=\"1\"/><Payload><File name=\"x\"/></Payload>"
              "</SoftwareIdentity>",
       "unsupported element 'File'"},
      // External entities: refused before anything could be resolved or fetched.
      {"<?xml version=\"1.0\"?><!DOCTYPE r [<!ENTITY x SYSTEM \"http://127.0.0.1:9/x\">]>" + open +
           "<Meta colloquialVersion=\"&x;\"/><Payload/></SoftwareIdentity>",
       "document type declarations are refused"},
      {"<!DOCTYPE SoftwareIdentity SYSTEM \"file:///etc/passwd\">" + open +
           "<Meta colloquialVersion=\"1\"/><Payload/></SoftwareIdentity>",
       "document type declarations are refused"},
  };
  for (const Case& c : cases) {
    auto rim = ParseRim(c.xml);
    ASSERT_FALSE(rim.ok()) << c.xml;
    EXPECT_EQ(rim.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(rim.status().message(), HasSubstr(c.message)) << c.xml;
  }
  std::string huge(kMaxRimXmlSize + 1, ' ');
  EXPECT_THAT(ParseRim(huge).status().message(), HasSubstr("at most"));
}

TEST(RimParseTest, RefusesDoctypeInUtf16) {
  // The byte scan for "<!DOCTYPE" cannot see UTF-16 text; the parsed document is checked too.
  auto utf16 = [](const std::string& utf8) {
    std::string out = "\xFF\xFE";
    for (char c : utf8) {
      out.push_back(c);
      out.push_back('\0');
    }
    return out;
  };
  const std::string document =
      "<?xml version=\"1.0\" encoding=\"UTF-16\"?><!DOCTYPE r [<!ENTITY x SYSTEM "
      "\"file:///etc/hostname\">]><SoftwareIdentity "
      "xmlns=\"http://standards.iso.org/iso/19770/-2/2015/schema.xsd\"><Meta "
      "colloquialVersion=\"VERSION\"/><Payload/></SoftwareIdentity>";
  auto rim = ParseRim(utf16(absl::StrReplaceAll(document, {{"VERSION", "1"}})));
  ASSERT_FALSE(rim.ok());
  EXPECT_THAT(rim.status().message(), HasSubstr("document type declarations are refused"));
  // Referencing the external entity is refused by the parser itself.
  rim = ParseRim(utf16(absl::StrReplaceAll(document, {{"VERSION", "&x;"}})));
  ASSERT_FALSE(rim.ok());
  EXPECT_THAT(rim.status().message(), HasSubstr("external entity"));
}

TEST(RimParseTest, ToXmlEscapesText) {
  Rim rim = MakeTestRim("5\"<&>\t1", {{7, {TestDigest(7)}}});
  rim.measurements[7].name = "a\nb\"c";
  auto parsed = ParseRim(RimToXml(rim));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->colloquial_version, "5\"<&>\t1");
  EXPECT_EQ(parsed->measurements, rim.measurements);
}

TEST(Base64Test, StrictDecoding) {
  EXPECT_EQ(ToString(*Base64Decode("aGVsbG8=")), "hello");
  EXPECT_EQ(ToString(*Base64Decode("aGVsbA==")), "hell");
  EXPECT_EQ(ToString(*Base64Decode("aGVs")), "hel");
  EXPECT_EQ(Base64Encode(ToBytes("hello")), "aGVsbG8=");
  EXPECT_EQ(ToString(*Base64Decode("aGVs\nbG8=", true)), "hello");
  EXPECT_FALSE(Base64Decode("aGVs\nbG8=").ok());
  EXPECT_FALSE(Base64Decode("aGVsbG8").ok());   // length
  EXPECT_FALSE(Base64Decode("aGVsbG9=").ok());  // non-zero padding bits
  EXPECT_FALSE(Base64Decode("aG=sbG8=").ok());  // '=' inside
  EXPECT_FALSE(Base64Decode("aGVs=G8=").ok());  // '=' in a middle group
  EXPECT_FALSE(Base64Decode("a===").ok());
  EXPECT_FALSE(Base64Decode("aGV*bG8=").ok());
  EXPECT_TRUE(Base64Decode("").ok());
}

TEST(RootsTest, EmbeddedRootsEqualTheSharedCopies) {
  auto device = Certificate::FromPem(kNvidiaDeviceIdentityCaPem);
  auto corim = Certificate::FromPem(kNvidiaCorimRootCaPem);
  ASSERT_TRUE(device.ok() && corim.ok());
  EXPECT_EQ(device->ToDer(),
            Certificate::FromPem(ReadNvidiaText("roots/nvidia_device_identity_ca.pem"))->ToDer());
  EXPECT_EQ(
      corim->ToDer(),
      Certificate::FromPem(ReadNvidiaText("roots/nvidia_corim_signing_root_ca.pem"))->ToDer());
  EXPECT_EQ(HexEncode(crypto::Sha256(device->ToDer())),
            "102bf659d5419614c9d8e6aecebc80454eb26b1df6a769ac720b9a690b167b48");
  EXPECT_EQ(HexEncode(crypto::Sha256(corim->ToDer())),
            "12977b5115acb0381179279fffeb5a8c4d264971ebb32298023a465fa41df5d1");
  EXPECT_EQ(device->SubjectCommonName(), "NVIDIA Device Identity CA");
  EXPECT_EQ(corim->SubjectCommonName(), "NVIDIA CoRIM signing Root CA");
}

}  // namespace
}  // namespace cloister::attest
