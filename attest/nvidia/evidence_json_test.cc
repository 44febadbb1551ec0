#include "attest/nvidia/evidence_json.h"

#include <nlohmann/json.hpp>

#include "attest/nvidia/base64.h"
#include "attest/nvidia/test_pki.h"
#include "attest/spdm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::ReadNvidiaHex;
using ::cloister::attest::testing::ReadNvidiaText;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kCertHold[] = "attestation-sdk-samples/hopper-570.86.10-cert-hold";

TEST(EvidenceJsonTest, NvidiaSample) {
  Json expected =
      Json::parse(ReadNvidiaText(std::string(kCertHold) + "/expected.json"))["evidence_items"];
  auto items =
      ParseNvidiaEvidenceJson(ReadNvidiaText(std::string(kCertHold) + "/gpu_evidence.json"));
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), expected.size());
  const NvidiaEvidenceItem& item = (*items)[0];
  EXPECT_EQ(item.arch, expected[0]["json_arch_field"]);
  EXPECT_EQ(HexEncode(item.nonce), expected[0]["json_nonce_field"]);
  EXPECT_EQ(item.report.size(), expected[0]["total_length"].get<size_t>());
  auto report = ParseSpdmReport(item.report);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(HexEncode(report->requester_nonce), expected[0]["request"]["nonce"]);
  EXPECT_EQ(HexEncode(report->responder_nonce), expected[0]["response"]["responder_nonce"]);
  EXPECT_EQ(report->driver_version, expected[0]["opaque"]["driver_version"]);
  auto chain = ParsePemChain(item.cert_chain_pem);
  ASSERT_TRUE(chain.ok()) << chain.status();
  std::vector<std::string> names;
  for (const Certificate& cert : *chain) names.push_back(cert.SubjectCommonName());
  EXPECT_EQ(names, expected[0]["cert_chain_subject_cns"].get<std::vector<std::string>>());
}

TEST(EvidenceJsonTest, RoundTrip) {
  NvidiaEvidenceItem item;
  item.arch = "HOPPER";
  item.nonce = Bytes(32, 7);
  item.report = ReadNvidiaHex("hopper-545.00-e2e/attestation_report.hex");
  item.cert_chain_pem = ReadNvidiaText("hopper-545.00-e2e/cert_chain.pem");
  std::vector<NvidiaEvidenceItem> items = {item, item};
  items[1].arch = "BLACKWELL";
  auto parsed = ParseNvidiaEvidenceJson(NvidiaEvidenceToJson(items));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, items);
}

TEST(EvidenceJsonTest, NrasRequestForm) {
  Json request = {{"arch", "HOPPER"},
                  {"nonce", std::string(64, 'a')},
                  {"claims_version", "3.0"},
                  {"evidence_list",
                   {{{"evidence", Base64Encode(Bytes{1, 2, 3})},
                     {"certificate", Base64Encode(AsBytes("-----BEGIN CERTIFICATE-----\n"))}},
                    {{"arch", "BLACKWELL"},
                     {"evidence", Base64Encode(Bytes{4})},
                     {"certificate", Base64Encode(AsBytes("-----BEGIN CERTIFICATE-----\n"))}}}}};
  auto items = ParseNvidiaEvidenceJson(request.dump());
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 2u);
  EXPECT_EQ((*items)[0].arch, "HOPPER");
  EXPECT_EQ((*items)[1].arch, "BLACKWELL");
  EXPECT_EQ((*items)[1].nonce, Bytes(32, 0xaa));
  EXPECT_EQ((*items)[0].report, (Bytes{1, 2, 3}));
}

TEST(EvidenceJsonTest, RefusesMalformedDocuments) {
  const std::string pem = Base64Encode(AsBytes("-----BEGIN CERTIFICATE-----\n"));
  auto item = [&](Json changes) {
    Json entry = {{"arch", "HOPPER"},
                  {"nonce", std::string(64, '0')},
                  {"evidence", "AQID"},
                  {"certificate", pem}};
    for (const auto& [key, value] : changes.items()) {
      if (value.is_null()) {
        entry.erase(key);
      } else {
        entry[key] = value;
      }
    }
    return Json::array({entry}).dump();
  };
  struct Case {
    std::string json;
    std::string message;
  };
  std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"[", "not valid JSON"},
      {"[]", "empty"},
      {"42", "expected a list"},
      {"[1]", "item 0: not an object"},
      {item({{"nonce", nullptr}}), "missing member 'nonce'"},
      {item({{"nonce", "abcd"}}), "'nonce' is not 64 hex digits"},
      {item({{"nonce", 5}}), "'nonce' is not a string"},
      {item({{"arch", ""}}), "'arch' is empty"},
      {item({{"evidence", "AQI"}}), "'evidence': base64"},
      {item({{"evidence", ""}}), "'evidence' is empty"},
      {item({{"certificate", "AQID"}}), "does not decode to PEM"},
      {item({{"extra", 1}}), "unknown member 'extra'"},
      {"{\"arch\":\"HOPPER\",\"nonce\":\"" + std::string(64, '0') + "\",\"evidence_list\":[]}",
       "'evidence_list' is missing"},
  };
  for (const Case& c : cases) {
    auto items = ParseNvidiaEvidenceJson(c.json);
    ASSERT_FALSE(items.ok()) << c.json;
    EXPECT_EQ(items.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(items.status().message(), HasSubstr(c.message)) << c.json;
  }
}

}  // namespace
}  // namespace cloister::attest
