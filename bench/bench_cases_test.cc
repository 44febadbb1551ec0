// Unit tests for the coalescing, cc-tax and broker-efficiency cases: flag parsing (and its
// refusals), the JSON lines and tables, and a tiny run of the coalescing case through the real
// PCIe path.
#include <cstdio>
#include <string>

#include "bench/broker_efficiency.h"
#include "bench/case_flags.h"
#include "bench/cc_tax.h"
#include "bench/coalescing.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

TEST(CaseFlags, FillsEveryKindAndRefusesBadInput) {
  int count = 0;
  std::vector<int> list;
  bool on = false;
  std::string word;
  const std::vector<FlagSpec> specs = {{"--count", IntFlag{&count, 1}},
                                       {"--list", IntListFlag{&list, 1}},
                                       {"--on", SwitchFlag{&on}},
                                       {"--word", StringFlag{&word, {"a", "b"}}}};
  ASSERT_TRUE(ParseCaseFlags({"--count", "3", "--list=1,2", "--on", "--word", "b"}, specs).ok());
  EXPECT_EQ(count, 3);
  EXPECT_EQ(list, (std::vector<int>{1, 2}));
  EXPECT_TRUE(on);
  EXPECT_EQ(word, "b");

  EXPECT_EQ(ParseCaseFlags({"--count", "0"}, specs).message(),
            "--count needs an integer >= 1, got \"0\"");
  EXPECT_EQ(ParseCaseFlags({"--count"}, specs).message(), "--count needs a value");
  EXPECT_EQ(ParseCaseFlags({"--list", "1,x"}, specs).message(),
            "--list needs an integer >= 1, got \"x\"");
  EXPECT_EQ(ParseCaseFlags({"--on=1"}, specs).message(), "--on takes no value");
  EXPECT_EQ(ParseCaseFlags({"--word", "c"}, specs).message(),
            "--word must be one of a, b, not \"c\"");
  EXPECT_EQ(ParseCaseFlags({"--other"}, specs).message(), "unknown flag \"--other\"");
  EXPECT_TRUE(WantsHelp({"--x", "-h"}));
  EXPECT_FALSE(WantsHelp({"--x"}));
}

TEST(CaseFlags, EachCaseRefusesBadValues) {
  EXPECT_FALSE(ParseCoalescingFlags({"--mode", "on"}, {}).ok());
  EXPECT_FALSE(ParseCoalescingFlags({"--payloads", "0"}, {}).ok());
  EXPECT_FALSE(ParseCcTaxFlags({"--models", "cls,nope"}, {}).ok());
  auto cc = ParseCcTaxFlags({"--models", "bert_mini", "--batches", "16"}, {});
  ASSERT_TRUE(cc.ok());
  EXPECT_EQ(cc->models, std::vector<std::string>{"bert_mini"});
  EXPECT_EQ(cc->batches, std::vector<int>{16});
  EXPECT_FALSE(ParseBrokerEfficiencyFlags({"--model", "rec"}, {}).ok());
  EXPECT_EQ(ParseBrokerEfficiencyFlags({"--requests", "2", "--rounds", "3"}, {}).status().message(),
            "--requests (2) must be at least --rounds (3)");
}

TEST(CoalescingOutput, JsonLineAndTable) {
  CoalescingResult result;
  result.payload_size = 64;
  result.requests = 64;
  result.mode = "emulated";
  result.separate = Summarize({2.0, 2.0, 4.0});
  result.coalesced = Summarize({0.25, 0.25, 0.5});
  const auto line = nlohmann::json::parse(CoalescingJsonLine(result));
  EXPECT_EQ(line["payload"], 64);
  EXPECT_DOUBLE_EQ(line["separate_us"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(line["coalesced_us"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(line["gain"].get<double>(), 8.0);
  EXPECT_NE(CoalescingTable({result}).find("gain at 64 B: 8.00 (target at least 5: met)"),
            std::string::npos);
}

TEST(CcTaxOutput, RatioIsEmulatedOverOff) {
  CcTaxResult result;
  result.model = "cls";
  result.batch = 16;
  result.off = Summarize({10.0});
  result.emulated = Summarize({20.0});
  result.off_transfer_ms = 1.0;
  result.emulated_transfer_ms = 3.0;
  const auto line = nlohmann::json::parse(CcTaxJsonLine(result));
  EXPECT_DOUBLE_EQ(line["rps_off"].get<double>(), 1600.0);
  EXPECT_DOUBLE_EQ(line["rps_emulated"].get<double>(), 800.0);
  EXPECT_DOUBLE_EQ(line["ratio"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(line["transfer_ratio"].get<double>(), 10.0 / 12.0);
  EXPECT_NE(CcTaxTable({result}).find("0 of 1 with transfer_ratio >= 0.95"), std::string::npos);
  EXPECT_NE(CcTaxTable({result}).find("0 of 1 lines at batch >= 16 with ratio >= 0.95; below: "
                                      "cls b16 (0.500)"),
            std::string::npos);
}

TEST(BrokerEfficiencyOutput, RatioIsBrokerOverDirect) {
  BrokerEfficiencyResult result;
  result.model = "cls";
  result.batch = 16;
  result.requests = 10;
  result.broker_seconds = 2;
  result.direct_seconds = 1;
  const auto line = nlohmann::json::parse(BrokerEfficiencyJsonLine(result));
  EXPECT_DOUBLE_EQ(line["ratio"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(line["broker_rows_per_s"].get<double>(), 80.0);
  EXPECT_EQ(line["request"], "one tensor of 16 rows");
}

TEST(Coalescing, RunsThroughTheRealPath) {
  CoalescingOptions options;
  options.requests = 4;
  options.payload_sizes = {64, 5000};
  options.iterations = 1;
  options.warmup = 0;
  options.json = true;
  std::FILE* sink = std::tmpfile();
  ASSERT_NE(sink, nullptr);
  auto results = RunCoalescing(options, sink, sink);
  std::fclose(sink);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  EXPECT_EQ((*results)[1].payload_size, 5000);
  EXPECT_EQ((*results)[1].mode, "emulated");
  EXPECT_GT((*results)[1].gain(), 0);

  options.mode = "off";
  options.payload_sizes = {0};
  EXPECT_FALSE(ParseCoalescingFlags({"--payloads", "0"}, options).ok());
}

}  // namespace
}  // namespace cloister::bench
