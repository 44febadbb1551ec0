// Unit tests for the coalescing, cc-tax and broker-efficiency cases: their flags (the parser
// itself is tested in base/flags_test.cc), the JSON lines and tables, and a tiny run of the
// coalescing case through the real PCIe path.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "bench/broker_efficiency.h"
#include "bench/cc_tax.h"
#include "bench/chaos.h"
#include "bench/llm_cc_tax.h"
#include "bench/llm_broker_efficiency.h"
#include "bench/coalescing.h"
#include "bench/proxy_overhead.h"
#include "bench/tenant_isolation.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

TEST(Chaos, FlagsAndTheirLimits) {
  auto options = ParseChaosFlags({"--duration-s", "15", "--kills=3", "--json", "--check"},
                                 ChaosOptions{});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->duration_s, 15);
  EXPECT_EQ(options->kills, 3);
  EXPECT_TRUE(options->json);
  EXPECT_TRUE(options->check);
  EXPECT_EQ(options->workers, 2);
  EXPECT_FALSE(ParseChaosFlags({"--duration-s", "0"}, ChaosOptions{}).ok());
  EXPECT_FALSE(ParseChaosFlags({"--duration-s", "1", "--kills", "11"}, ChaosOptions{}).ok());
  EXPECT_FALSE(ParseChaosFlags({"--workers", "65"}, ChaosOptions{}).ok());
  EXPECT_FALSE(ParseChaosFlags({"--bogus"}, ChaosOptions{}).ok());
  EXPECT_FALSE(ParseChaosFlags({"--generate-every", "-1"}, ChaosOptions{}).ok());
  auto no_streams = ParseChaosFlags({"--generate-every", "0"}, ChaosOptions{});
  ASSERT_TRUE(no_streams.ok());
  EXPECT_EQ(no_streams->generate_every, 0);
  EXPECT_FALSE(ParseLlmBrokerEfficiencyFlags({"--concurrency", "65"}, {}).ok());
  EXPECT_FALSE(ParseLlmBrokerEfficiencyFlags({"--max-tokens", "0"}, {}).ok());
  auto broker = ParseLlmBrokerEfficiencyFlags({"--concurrency", "8", "--rounds", "2"}, {});
  ASSERT_TRUE(broker.ok());
  EXPECT_EQ(broker->concurrency, 8);
  EXPECT_EQ(broker->rounds, 2);
}

TEST(Chaos, CheckCatchesEveryMissAndJsonHasEveryField) {
  ChaosOptions options;
  options.kills = 2;
  ChaosResult good;
  good.kills = 2;
  good.sent = 10;
  good.ok = 9;
  good.errors = 1;
  good.error_codes["UNAVAILABLE"] = 1;
  good.recovered = true;
  good.streams = 3;
  good.streams_ok = 2;
  EXPECT_TRUE(CheckChaosResult(options, good).ok()) << CheckChaosResult(options, good);
  auto missed = [&](auto change) {
    ChaosResult bad = good;
    change(bad);
    return !CheckChaosResult(options, bad).ok();
  };
  EXPECT_TRUE(missed([](ChaosResult& r) { r.lost = 1; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.duplicated = 1; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.misrouted = 1; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.kills = 1; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.ok = 0; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.recovered = false; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.truncated = 1; }));
  EXPECT_TRUE(missed([](ChaosResult& r) { r.streams_ok = 0; }));
  nlohmann::json line = nlohmann::json::parse(ChaosJsonLine(good));
  for (const char* field : {"sent", "ok", "errors", "lost", "duplicated", "misrouted", "kills",
                            "duration_s", "recovered", "streams", "streams_ok", "truncated"}) {
    EXPECT_TRUE(line.contains(field)) << field;
  }
  EXPECT_EQ(line["sent"], 10);
  EXPECT_EQ(line["error_codes"]["UNAVAILABLE"], 1);
}

TEST(LlmCcTaxFlags, ParseAndRefuse) {
  auto options = ParseLlmCcTaxFlags(
      {"--concurrency", "8,32", "--same-mode", "emulated", "--model-dir", "/models/m"}, {});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->concurrency, (std::vector<int>{8, 32}));
  EXPECT_EQ(options->same_mode, "emulated");
  EXPECT_EQ(options->model_dir, "/models/m");
  EXPECT_EQ(ParseLlmCcTaxFlags({"--same-mode", "driver"}, {}).status().message(),
            "--same-mode must be off or emulated, not 'driver'");
  EXPECT_FALSE(ParseLlmCcTaxFlags({"--concurrency", "0"}, {}).ok());
  EXPECT_FALSE(ParseLlmCcTaxFlags({"--rounds", "0"}, {}).ok());
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
  EXPECT_EQ(ParseBrokerEfficiencyFlags({"--models", "cls,rec"}, {}).status().message(),
            "--models: no model named \"rec\" (cls, bert_mini)");
  auto broker = ParseBrokerEfficiencyFlags({}, {});
  ASSERT_TRUE(broker.ok());
  EXPECT_EQ(broker->models, (std::vector<std::string>{"cls", "bert_mini"}));
  broker = ParseBrokerEfficiencyFlags({"--model", "bert_mini"}, {});
  ASSERT_TRUE(broker.ok());
  EXPECT_EQ(broker->models, std::vector<std::string>{"bert_mini"});
  EXPECT_EQ(ParseBrokerEfficiencyFlags({"--requests", "2", "--rounds", "3"}, {}).status().message(),
            "--requests (2) must be at least --rounds (3)");
}

TEST(TenantIsolationFlags, ParseAndRefuse) {
  auto fairness = ParseFairnessFlags(
      {"--executor", "spin", "--spin-us", "100", "--heavy-weight", "5", "--duration-ms=10"}, {});
  ASSERT_TRUE(fairness.ok()) << fairness.status();
  EXPECT_EQ(fairness->executor.executor, "spin");
  EXPECT_EQ(fairness->executor.spin_us, 100);
  EXPECT_EQ(fairness->heavy_weight, 5);
  EXPECT_EQ(fairness->duration_ms, 10);
  EXPECT_EQ(ParseFairnessFlags({"--executor", "gpu"}, {}).status().message(),
            "--executor must be one of cls, spin, not \"gpu\"");
  EXPECT_FALSE(ParseFairnessFlags({"--light-weight", "0"}, {}).ok());
  auto noisy =
      ParseNoisyNeighbourFlags({"--rate", "20", "--loads", "0", "--be-max-batch", "2"}, {});
  ASSERT_TRUE(noisy.ok()) << noisy.status();
  EXPECT_EQ(noisy->realtime_rate, 20);
  EXPECT_EQ(noisy->loads, 0);
  EXPECT_EQ(noisy->best_effort_max_batch_size, 2);
  EXPECT_FALSE(ParseNoisyNeighbourFlags({"--rate", "0"}, {}).ok());
  EXPECT_FALSE(ParseNoisyNeighbourFlags({"--rounds", "0"}, {}).ok());
}

TEST(TenantIsolationOutput, JsonLinesAndTables) {
  FairnessResult fairness;
  fairness.share_ratio = 2.9;
  fairness.heavy_weight = 3;
  fairness.light_weight = 1;
  fairness.executor = "spin";
  const auto line = nlohmann::json::parse(FairnessJsonLine(fairness));
  EXPECT_DOUBLE_EQ(line["share_ratio"].get<double>(), 2.9);
  EXPECT_EQ(line["executor"], "spin");
  EXPECT_NE(FairnessTable(fairness).find("target 3.00 within 10 %: met"), std::string::npos);
  fairness.share_ratio = 2.6;
  EXPECT_NE(FairnessTable(fairness).find("missed"), std::string::npos);

  NoisyNeighbourResult noisy;
  noisy.p99_inflation = 1.2;
  noisy.be_throughput_share = 0.8;
  const auto noisy_line = nlohmann::json::parse(NoisyNeighbourJsonLine(noisy));
  EXPECT_DOUBLE_EQ(noisy_line["p99_inflation"].get<double>(), 1.2);
  EXPECT_TRUE(noisy_line.contains("be_throughput_share"));
  const std::string table = NoisyNeighbourTable(noisy);
  EXPECT_NE(table.find("p99 inflation 1.200 (target <= 1.10: missed)"), std::string::npos);
  EXPECT_NE(table.find("best-effort share 0.800 (target >= 0.7: met)"), std::string::npos);
}

// A short saturated run with the spin executor: both tenants execute, the heavier more, and the
// reported ratios are the quotients of the reported times.
TEST(TenantIsolationRun, FairnessWithSpinExecutor) {
  FairnessOptions options;
  options.executor.executor = "spin";
  options.executor.spin_us = 500;
  options.duration_ms = 300;
  options.warmup_ms = 50;
  options.queue_depth = 16;  // deep enough to stay backlogged when the machine is busy
  options.max_batch_size = 2;
  options.json = true;
  std::FILE* sink = std::tmpfile();
  ASSERT_NE(sink, nullptr);
  auto result = RunFairness(options, sink, sink);
  std::fclose(sink);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->light_requests, 0);
  // The scheduler shares measured execution time by weight (the request counts follow it only
  // as far as every request spins equally long, which a busy machine breaks).
  EXPECT_GT(result->heavy_exec_ms, result->light_exec_ms)
      << "heavy " << result->heavy_requests << " requests, light " << result->light_requests;
  EXPECT_DOUBLE_EQ(result->share_ratio, result->heavy_exec_ms / result->light_exec_ms);
  EXPECT_DOUBLE_EQ(result->charged_ratio, result->heavy_charged_ms / result->light_charged_ms);
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

// 10 requests of 16 rows: 2 s through the broker, 1 s direct, and the CPU each side used.
BrokerEfficiencyResult SampleBrokerResult() {
  return BrokerEfficiencyResult{.model = "cls",
                                .batch = 16,
                                .requests = 10,
                                .broker_seconds = 2,
                                .direct_seconds = 1,
                                .broker_enclave_cpu_seconds = 0.25,
                                .broker_cloisterd_cpu_seconds = 0.05,
                                .broker_client_cpu_seconds = 0.04,
                                .direct_cpu_seconds = 0.2};
}

TEST(BrokerEfficiencyOutput, RatioIsBrokerOverDirect) {
  const auto line = nlohmann::json::parse(BrokerEfficiencyJsonLine(SampleBrokerResult()));
  EXPECT_DOUBLE_EQ(line["ratio"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(line["broker_rows_per_s"].get<double>(), 80.0);
  EXPECT_EQ(line["request"], "one tensor of 16 rows");
}

TEST(BrokerEfficiencyOutput, CpuPerRequestByProcess) {
  const BrokerEfficiencyResult result = SampleBrokerResult();
  const auto line = nlohmann::json::parse(BrokerEfficiencyJsonLine(result));
  std::map<std::string, double> per_request;
  for (const char* field : {"enclave_cpu_ms", "cloisterd_cpu_ms", "client_cpu_ms", "direct_cpu_ms"}) {
    per_request[field] = line[field].get<double>();
  }
  EXPECT_EQ(per_request, (std::map<std::string, double>{{"client_cpu_ms", 4.0},
                                                        {"cloisterd_cpu_ms", 5.0},
                                                        {"direct_cpu_ms", 20.0},
                                                        {"enclave_cpu_ms", 25.0}}));
  EXPECT_NE(BrokerEfficiencyTable(result).find(
                "CPU per request: enclave 25.0 ms, cloisterd 5.0 ms, SDK callers 4.0 ms (broker); "
                "runtime 20.0 ms (direct)"),
            std::string::npos)
      << BrokerEfficiencyTable(result);
  // 0.2 s of CPU direct against 0.34 s through the broker.
  EXPECT_DOUBLE_EQ(line["cpu_ceiling"].get<double>(), 0.2 / 0.34);
  EXPECT_NE(BrokerEfficiencyTable(result).find("CPU ceiling 0.588 "), std::string::npos)
      << BrokerEfficiencyTable(result);
  BrokerEfficiencyResult idle = result;
  idle.broker_enclave_cpu_seconds = idle.broker_cloisterd_cpu_seconds =
      idle.broker_client_cpu_seconds = 0;
  EXPECT_EQ(idle.cpu_ceiling(), 0);
}

TEST(BrokerEfficiencyOutput, ProcessCpuSecondsCountsThisProcessAndNotAMissingOne) {
  const double before = testing::ProcessCpuSeconds(::getpid());
  // Spin for 100 ms of this thread's CPU (a few clock ticks), not of the wall clock: on a
  // loaded machine 100 ms of wall time held less than the 50 ms expected.
  auto thread_cpu_seconds = [] {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
  };
  const double start = thread_cpu_seconds();
  volatile uint64_t sink = 0;
  while (thread_cpu_seconds() - start < 0.1) sink = sink + 1;
  EXPECT_GE(testing::ProcessCpuSeconds(::getpid()) - before, 0.05);
  EXPECT_EQ(testing::ProcessCpuSeconds(999999999), 0.0);
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

TEST(ProxyOverhead, FlagsAndTheirLimits) {
  auto defaults = ParseProxyOverheadFlags({}, ProxyOverheadOptions{});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->concurrency, (std::vector<int>{1, 16}));
  EXPECT_EQ(defaults->max_tokens, 64);
  EXPECT_EQ(defaults->rounds, 3);
  auto options = ParseProxyOverheadFlags(
      {"--concurrency", "2,8", "--max-tokens=16", "--rounds", "1", "--json", "--cloister", "/x"},
      ProxyOverheadOptions{});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->concurrency, (std::vector<int>{2, 8}));
  EXPECT_EQ(options->max_tokens, 16);
  EXPECT_EQ(options->rounds, 1);
  EXPECT_TRUE(options->json);
  EXPECT_EQ(options->cloister, "/x");
  // A bad --concurrency is refused, saying which flag.
  for (const char* bad : {"0", "-1", "abc", "1,,2", ""}) {
    auto refused = ParseProxyOverheadFlags({"--concurrency", bad}, ProxyOverheadOptions{});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("--concurrency"), std::string::npos)
        << refused.status();
  }
  auto too_many = ParseProxyOverheadFlags({"--concurrency", "1,65"}, ProxyOverheadOptions{});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().message(),
            "--concurrency 65 is above 64 (cloisterd's default max_generations per tenant)");
  EXPECT_FALSE(ParseProxyOverheadFlags({"--max-tokens", "0"}, ProxyOverheadOptions{}).ok());
  EXPECT_FALSE(ParseProxyOverheadFlags({"--rounds", "0"}, ProxyOverheadOptions{}).ok());
  EXPECT_FALSE(ParseProxyOverheadFlags({"--bogus"}, ProxyOverheadOptions{}).ok());
  EXPECT_EQ(defaults->tokens_per_chunk, 0);
  auto chunked = ParseProxyOverheadFlags({"--tokens-per-chunk", "8"}, ProxyOverheadOptions{});
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_EQ(chunked->tokens_per_chunk, 8);
  EXPECT_FALSE(ParseProxyOverheadFlags({"--tokens-per-chunk", "0"}, ProxyOverheadOptions{}).ok());
  auto huge = ParseProxyOverheadFlags({"--tokens-per-chunk", "5000"}, ProxyOverheadOptions{});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().message(), "--tokens-per-chunk 5000 is above 4096");
}

TEST(ProxyOverhead, JsonLineAndTableCarryTheRatios) {
  ProxyOverheadLine line;
  line.model = "tiny-llama";
  line.concurrency = 16;
  line.max_tokens = 64;
  line.rounds = 3;
  line.sdk_tokens = 3072;
  line.sdk_seconds = 2;  // 1536 tokens/s
  line.proxy_tokens = 3072;
  line.proxy_seconds = 2.5;  // 1228.8 tokens/s
  line.ttft_p50_ms_sdk = 9;
  line.ttft_p50_ms_proxy = 10;
  line.texts_match = true;
  nlohmann::json json = nlohmann::json::parse(ProxyOverheadJsonLine(line));
  EXPECT_EQ(json["case"], "proxy-overhead");
  EXPECT_EQ(json["concurrency"], 16);
  EXPECT_DOUBLE_EQ(json["tokens_per_s_sdk"].get<double>(), 1536);
  EXPECT_DOUBLE_EQ(json["tokens_per_s_proxy"].get<double>(), 1228.8);
  EXPECT_DOUBLE_EQ(json["tokens_per_s_ratio"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(json["ttft_p50_ratio"].get<double>(), 0.9);
  EXPECT_EQ(json["texts_match"], true);
  const std::string table = ProxyOverheadTable({line});
  EXPECT_NE(table.find("0.800"), std::string::npos) << table;
  EXPECT_NE(table.find("0.900"), std::string::npos) << table;
  EXPECT_NE(table.find("match"), std::string::npos) << table;
}

}  // namespace
}  // namespace cloister::bench
