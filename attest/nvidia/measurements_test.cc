#include "attest/nvidia/measurements.h"

#include <nlohmann/json.hpp>

#include "attest/nvidia/test_pki.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::MakeTestReport;
using ::cloister::attest::testing::MakeTestRim;
using ::cloister::attest::testing::ReadNvidiaHex;
using ::cloister::attest::testing::ReadNvidiaText;
using ::cloister::attest::testing::TestDigest;
using ::cloister::attest::testing::TestReportSpec;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// (RIM index, source) pairs, ascending by index.
std::vector<std::pair<uint32_t, std::string>> Mismatches(const MeasurementComparison& c) {
  std::vector<std::pair<uint32_t, std::string>> out;
  for (const MeasurementMismatch& m : c.mismatches)
    out.emplace_back(m.index, RimKindName(m.source));
  return out;
}

// expected.json's "mismatched_rim_indices" list, sorted by index.
std::vector<std::pair<uint32_t, std::string>> ExpectedMismatches(const nlohmann::json& list) {
  std::vector<std::pair<uint32_t, std::string>> out;
  for (const auto& entry : list) out.emplace_back(entry[0].get<uint32_t>(), entry[1]);
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json Expected(const std::string& folder) {
  return nlohmann::json::parse(ReadNvidiaText(folder + "/expected.json"));
}

SpdmReport RealReport(const std::string& path) {
  auto report = ParseSpdmReport(ReadNvidiaHex(path));
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : SpdmReport();
}

Rim RealRim(const std::string& path) {
  auto rim = ParseRim(ReadNvidiaText(path));
  EXPECT_TRUE(rim.ok()) << path << ": " << rim.status();
  return rim.ok() ? *rim : Rim();
}

// ---- real vectors, against their expected.json ----

TEST(MeasurementsRealTest, Hopper545WithTestRimsMatches) {
  nlohmann::json expected = Expected("hopper-545.00-e2e")["compare_with_test_rims"];
  SpdmReport report = RealReport("hopper-545.00-e2e/attestation_report.hex");
  Rim driver = RealRim("hopper-545.00-e2e/driver_rim_545.00_test.swidtag");
  Rim vbios = RealRim("hopper-545.00-e2e/vbios_rim_96005E0001_test.swidtag");
  EXPECT_EQ(driver.colloquial_version, expected["driver_rim_version"]);
  EXPECT_EQ(vbios.colloquial_version, expected["vbios_rim_version"]);
  auto comparison = CompareMeasurements(report, &driver, &vbios);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_EQ(comparison->Matches(), expected["measurements_match"].get<bool>());
  EXPECT_TRUE(comparison->conflicting_indices.empty());
  EXPECT_EQ(expected["index_conflict"].size(), 0u);
  EXPECT_EQ(Mismatches(*comparison), ExpectedMismatches(expected["mismatched_rim_indices"]));
  // NVDEC0 is disabled in this report, so index 35 is not compared.
  EXPECT_TRUE(comparison->nvdec_index_skipped);
  EXPECT_EQ(comparison->golden_count, 33u);  // 21 driver + 12 VBIOS entries
  EXPECT_EQ(comparison->matched_indices.size(), 32u);
}

TEST(MeasurementsRealTest, Hopper545WithProductionVbiosRimMismatches1_2_3_9) {
  nlohmann::json expected = Expected("hopper-545.00-e2e")
      ["compare_with_PROD_vbios_rim(rims/nvtrust-vbios/1010_0200_882_96005E0001_PROD.swidtag)"];
  SpdmReport report = RealReport("hopper-545.00-e2e/attestation_report.hex");
  Rim driver = RealRim("hopper-545.00-e2e/driver_rim_545.00_test.swidtag");
  Rim vbios = RealRim("rims/nvtrust-vbios/1010_0200_882_96005E0001_PROD.swidtag");
  EXPECT_EQ(vbios.colloquial_version, expected["vbios_rim_version"]);
  auto comparison = CompareMeasurements(report, &driver, &vbios);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_FALSE(comparison->Matches());
  EXPECT_EQ(Mismatches(*comparison), ExpectedMismatches(expected["mismatched_rim_indices"]));
  EXPECT_EQ(comparison->MismatchedIndexList(), "1, 2, 3, 9");
  for (const MeasurementMismatch& mismatch : comparison->mismatches) {
    ASSERT_TRUE(mismatch.runtime.has_value());
    EXPECT_EQ(*mismatch.runtime, report.FindBlock(mismatch.index + 1)->value);
    EXPECT_EQ(mismatch.golden, vbios.Find(mismatch.index)->alternatives);
  }
}

TEST(MeasurementsRealTest, Hopper535WithItsRims) {
  const std::string folder = "attestation-sdk-samples/hopper-535.86.09";
  nlohmann::json expected = Expected(folder);
  SpdmReport report = RealReport(folder + "/attestation_report.hex");
  Rim driver = RealRim(folder + "/driver_rim_535.86.09_TAMPERED_measurement_mismatch.xml");
  Rim vbios = RealRim(folder + "/vbios_rim_96005E0001_measurement_mismatch.xml");
  auto comparison = CompareMeasurements(report, &driver, &vbios);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_EQ(comparison->Matches(),
            expected["compare_with_folder_rims"]["measurements_match"].get<bool>());
  EXPECT_EQ(Mismatches(*comparison),
            ExpectedMismatches(expected["compare_with_folder_rims"]["mismatched_rim_indices"]));

  Rim prod = RealRim("rims/nvtrust-vbios/1010_0200_882_96005E0001_PROD.swidtag");
  comparison = CompareMeasurements(report, &driver, &prod);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_EQ(Mismatches(*comparison),
            ExpectedMismatches(expected["compare_with_PROD_vbios_rim"]["mismatched_rim_indices"]));
}

TEST(MeasurementsRealTest, Hopper570WithExpiredDriverRimAndProductionVbios) {
  const std::string folder = "attestation-sdk-samples/hopper-570.124.03";
  nlohmann::json expected = Expected(folder)["compare_with_folder_driver_rim_and_PROD_vbios"];
  SpdmReport report = RealReport(folder + "/attestation_report.hex");
  Rim driver = RealRim(folder + "/driver_rim_570.124.03_EXPIRED_signer.xml");
  Rim vbios = RealRim("rims/nvtrust-vbios/1010_0205_862_96005E0004_PROD.swidtag");
  EXPECT_EQ(driver.colloquial_version, expected["driver_rim_version"]);
  EXPECT_EQ(vbios.colloquial_version, expected["vbios_rim_version"]);
  auto comparison = CompareMeasurements(report, &driver, &vbios);
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_EQ(comparison->Matches(), expected["measurements_match"].get<bool>());
  EXPECT_EQ(Mismatches(*comparison), ExpectedMismatches(expected["mismatched_rim_indices"]));
}

// ---- the rules, on synthetic reports ----

Rim DriverRim(std::vector<std::pair<uint32_t, std::vector<Bytes>>> active) {
  return MakeTestRim("550.90.07", active);
}

TEST(MeasurementsTest, BlockIsRimIndexPlusOne) {
  TestReportSpec spec;
  spec.block_values = {{8, TestDigest(7)}};  // RIM index 7 lives in block 8
  SpdmReport report = MakeTestReport(spec);
  Rim rim = DriverRim({{7, {TestDigest(7)}}});
  auto comparison = CompareMeasurements(report, &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_TRUE(comparison->Matches());
  EXPECT_THAT(comparison->matched_indices, ElementsAre(7u));

  Rim off_by_one = DriverRim({{8, {TestDigest(7)}}});
  comparison = CompareMeasurements(report, &off_by_one, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_FALSE(comparison->Matches());
  EXPECT_EQ(comparison->MismatchedIndexList(), "8");
}

TEST(MeasurementsTest, AnyAlternativeMatches) {
  TestReportSpec spec;
  spec.block_values = {{24, TestDigest(2)}};
  SpdmReport report = MakeTestReport(spec);
  Rim rim = DriverRim({{23, {TestDigest(1), TestDigest(2), TestDigest(3)}}});
  auto comparison = CompareMeasurements(report, &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_TRUE(comparison->Matches());
}

TEST(MeasurementsTest, InactiveEntriesAreIgnored) {
  SpdmReport report = MakeTestReport(TestReportSpec());
  Rim rim = DriverRim({{7, {Bytes(48, 0)}}});
  rim.measurements[3].alternatives = {TestDigest(9)};  // inactive and different: ignored
  auto comparison = CompareMeasurements(report, &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_TRUE(comparison->Matches());
  EXPECT_EQ(comparison->golden_count, 1u);
}

TEST(MeasurementsTest, SizesMustAgree) {
  TestReportSpec spec;
  spec.block_values = {{8, TestDigest(7)}};
  SpdmReport report = MakeTestReport(spec);
  const Bytes digest = TestDigest(7);
  Rim rim = DriverRim({{7, {Bytes(digest.begin(), digest.begin() + 32)}}});
  rim.measurements[7].size = 32;
  auto comparison = CompareMeasurements(report, &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_FALSE(comparison->Matches());
}

TEST(MeasurementsTest, MissingBlockMismatches) {
  SpdmReport report = MakeTestReport(TestReportSpec());
  report.blocks.erase(report.blocks.begin() + 7);  // block 8
  Rim rim = DriverRim({{7, {Bytes(48, 0)}}});
  auto comparison = CompareMeasurements(report, &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  ASSERT_EQ(comparison->mismatches.size(), 1u);
  EXPECT_EQ(comparison->mismatches[0].index, 7u);
  EXPECT_FALSE(comparison->mismatches[0].runtime.has_value());
}

TEST(MeasurementsTest, IndexActiveInBothRimsIsAConflict) {
  SpdmReport report = MakeTestReport(TestReportSpec());
  Rim driver = DriverRim({{7, {Bytes(48, 0)}}, {9, {Bytes(48, 0)}}});
  Rim vbios = MakeTestRim("96.00.9F.00.01", {{9, {Bytes(48, 0)}}, {10, {Bytes(48, 0)}}});
  auto comparison = CompareMeasurements(report, &driver, &vbios);
  ASSERT_TRUE(comparison.ok());
  EXPECT_THAT(comparison->conflicting_indices, ElementsAre(9u));
  EXPECT_TRUE(comparison->mismatches.empty());
  EXPECT_FALSE(comparison->Matches());
}

TEST(MeasurementsTest, NvdecIndexSkippedOnlyWhenDisabled) {
  TestReportSpec spec;
  spec.block_values = {{36, TestDigest(1)}};  // RIM index 35
  Rim rim = DriverRim({{35, {TestDigest(2)}}});

  spec.nvdec0_status = kNvdecDisabled;
  auto comparison = CompareMeasurements(MakeTestReport(spec), &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_TRUE(comparison->Matches());
  EXPECT_TRUE(comparison->nvdec_index_skipped);

  spec.nvdec0_status = kNvdecEnabled;
  comparison = CompareMeasurements(MakeTestReport(spec), &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_FALSE(comparison->Matches());
  EXPECT_EQ(comparison->MismatchedIndexList(), "35");

  spec.nvdec0_status = 0x12;
  auto invalid = CompareMeasurements(MakeTestReport(spec), &rim, nullptr);
  ASSERT_FALSE(invalid.ok());
  EXPECT_THAT(invalid.status().message(), HasSubstr("NVDEC0_STATUS is 0x12"));
}

TEST(MeasurementsTest, MoreGoldenEntriesThanBlocksFails) {
  SpdmReport report = MakeTestReport(TestReportSpec());
  report.blocks.resize(2);
  Rim rim = DriverRim({{0, {Bytes(48, 0)}}, {1, {Bytes(48, 0)}}, {2, {Bytes(48, 0)}}});
  auto comparison = CompareMeasurements(report, &rim, nullptr);
  ASSERT_TRUE(comparison.ok());
  EXPECT_EQ(comparison->golden_count, 3u);
  EXPECT_EQ(comparison->runtime_count, 2u);
  EXPECT_FALSE(comparison->Matches());
}

}  // namespace
}  // namespace cloister::attest
