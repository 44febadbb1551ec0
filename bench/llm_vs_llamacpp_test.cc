// Tests of cloister-bench llm-vs-llamacpp: flags and their refusals, the prompts, the id
// comparison, the bandwidth probe, parsing the peer's document, the JSON document and table; and
// (ctest bench_llm_vs_llamacpp_tiny, label slow) one short run of the tiny model through our
// engine and llama.cpp, skipped when node-llama-cpp is not installed.
#include "bench/llm_cuda.h"
#include "bench/llm_vs_llamacpp.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

using nlohmann::json;

TEST(LlmVsLlamaCppFlags, ParsesListsAndValues) {
  auto options = ParseLlmVsLlamaCppFlags(
      {"--json", "--models", "tiny", "--precisions=bf16", "--threads", "1,2,4", "--sequences",
       "1,8", "--prompt-tokens", "32", "--decode-tokens=16", "--flash-attention", "on", "--seed",
       "7", "--llama-dir", "/peer"},
      LlmVsLlamaCppOptions{});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->json);
  EXPECT_EQ(options->models, std::vector<std::string>({"tiny"}));
  EXPECT_EQ(options->precisions, std::vector<std::string>({"bf16"}));
  EXPECT_EQ(options->threads, std::vector<int>({1, 2, 4}));
  EXPECT_EQ(options->sequences, std::vector<int>({1, 8}));
  EXPECT_EQ(options->prompt_tokens, 32);
  EXPECT_EQ(options->decode_tokens, 16);
  EXPECT_EQ(options->flash_attention, "on");
  EXPECT_EQ(options->seed, 7u);
  EXPECT_EQ(options->llama_dir, "/peer");
}

TEST(LlmVsLlamaCppFlags, DefaultsAreTheDocumentedCases) {
  auto options = ParseLlmVsLlamaCppFlags({}, LlmVsLlamaCppOptions{});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->models, std::vector<std::string>({"tiny", "synthetic"}));
  EXPECT_EQ(options->precisions, std::vector<std::string>({"f32", "bf16"}));
  EXPECT_EQ(options->threads, std::vector<int>({1, 2}));
  EXPECT_EQ(options->sequences, std::vector<int>({1, 16}));
}

TEST(LlmVsLlamaCppFlags, RefusesBadValues) {
  const LlmVsLlamaCppOptions defaults;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--models", "gpt2"},
           {"--models", ","},
           {"--precisions", "f16"},
           {"--threads", "0"},
           {"--sequences", "1,x"},
           {"--decode-tokens", "1"},
           {"--prompt-tokens", "500", "--decode-tokens", "64"},
           {"--flash-attention", "maybe"},
           {"--seed", "-3"},
           {"--bogus"},
       }) {
    auto options = ParseLlmVsLlamaCppFlags(args, defaults);
    EXPECT_FALSE(options.ok()) << args[0];
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
  }
  EXPECT_NE(ParseLlmVsLlamaCppFlags({"--models", "gpt2"}, defaults).status().message().find("gpt2"),
            std::string::npos);
}

TEST(LlmVsLlamaCppPrompts, DeterministicPrefixStableAndAvoidingSpecials) {
  const std::vector<int32_t> eos = {2044, 2047};
  auto four = MakeBenchPrompts(4, 64, 2048, 2043, eos, 11);
  auto two = MakeBenchPrompts(2, 64, 2048, 2043, eos, 11);
  auto other_seed = MakeBenchPrompts(2, 64, 2048, 2043, eos, 12);
  ASSERT_EQ(four.size(), 4u);
  EXPECT_EQ(four[0], two[0]);
  EXPECT_EQ(four[1], two[1]);
  EXPECT_NE(four[0], four[1]);
  EXPECT_NE(two[0], other_seed[0]);
  for (const auto& prompt : four) {
    ASSERT_EQ(prompt.size(), 64u);
    EXPECT_EQ(prompt[0], 2043);
    for (size_t i = 1; i < prompt.size(); ++i) {
      EXPECT_GE(prompt[i], 0);
      EXPECT_LT(prompt[i], 2048);
      EXPECT_NE(prompt[i], 2043);
      EXPECT_NE(prompt[i], 2044);
      EXPECT_NE(prompt[i], 2047);
    }
  }
  auto without_bos = MakeBenchPrompts(1, 8, 100, std::nullopt, {}, 3);
  ASSERT_EQ(without_bos[0].size(), 8u);
}

TEST(LlmVsLlamaCppOutputs, ComparisonFindsTheFirstMismatch) {
  IdComparison same = CompareGeneratedIds({{1, 2, 3}, {4, 5}}, {{1, 2, 3}, {4, 5}});
  EXPECT_TRUE(same.match);
  EXPECT_EQ(same.matching_tokens, 5);
  EXPECT_EQ(same.compared_tokens, 5);
  EXPECT_EQ(same.first_mismatch_sequence, -1);

  IdComparison differ = CompareGeneratedIds({{1, 2, 3}, {4, 5, 6}}, {{1, 2, 3}, {4, 9, 6}});
  EXPECT_FALSE(differ.match);
  EXPECT_EQ(differ.matching_tokens, 4);
  EXPECT_EQ(differ.compared_tokens, 6);
  EXPECT_EQ(differ.first_mismatch_sequence, 1);
  EXPECT_EQ(differ.first_mismatch_step, 1);

  IdComparison shorter = CompareGeneratedIds({{1, 2}}, {{1, 2, 3}});
  EXPECT_FALSE(shorter.match);
  EXPECT_EQ(shorter.first_mismatch_step, 2);
  EXPECT_FALSE(CompareGeneratedIds({{1}}, {{1}, {2}}).match);
}

TEST(LlmVsLlamaCppBandwidth, MeasuresAPlausibleRateAndRefusesBadSizes) {
  auto rate = MeasureReadBandwidth(size_t{64} << 20, 2, 2);
  ASSERT_TRUE(rate.ok()) << rate.status();
  // Any machine this runs on reads faster than 100 MB/s and slower than 10 TB/s.
  EXPECT_GT(*rate, 1e8);
  EXPECT_LT(*rate, 1e13);
  EXPECT_FALSE(MeasureReadBandwidth(1024, 1, 1).ok());
  EXPECT_FALSE(MeasureReadBandwidth(size_t{1} << 20, 0, 1).ok());
  EXPECT_FALSE(MeasureReadBandwidth(size_t{1} << 20, 1, 0).ok());
}

json PeerDocument() {
  return {{"peer", "node-llama-cpp"},
          {"version", "3.21.1"},
          {"llama_cpp_release", "b0000"},
          {"system_info", "CPU : AVX2 = 1"},
          {"model_file_bytes", 1000},
          {"kv_bytes_per_token", 2048},
          {"runs",
           {{{"sequences", 1},
             {"prefill_tokens_per_s", 100.0},
             {"decode_tokens_per_s", 10.0},
             {"ids_stable", true},
             {"peak_rss_bytes", 5000},
             {"generated_ids", {{1, 2, 3}}}},
            {{"sequences", 2},
             {"prefill_tokens_per_s", 150.0},
             {"decode_tokens_per_s", 18.0},
             {"ids_stable", false},
             {"peak_rss_bytes", 6000},
             {"generated_ids", {{1, 2, 3}, {4, 5, 6}}}}}}};
}

TEST(LlmVsLlamaCppPeer, ParsesItsDocument) {
  LlamaPeerInfo info;
  int64_t file_bytes = 0;
  auto runs = ParseLlamaPeerDocument(PeerDocument().dump(), {1, 2}, 3, &info, &file_bytes);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ(info.version, "3.21.1");
  EXPECT_EQ(file_bytes, 1000);
  EXPECT_DOUBLE_EQ((*runs)[1].prefill_tokens_per_s, 150.0);
  EXPECT_DOUBLE_EQ((*runs)[1].decode_tokens_per_s, 18.0);
  EXPECT_TRUE((*runs)[0].ids_stable);
  EXPECT_FALSE((*runs)[1].ids_stable);
  EXPECT_EQ((*runs)[1].generated_ids, std::vector<std::vector<int32_t>>({{1, 2, 3}, {4, 5, 6}}));
  EXPECT_EQ((*runs)[0].kv_bytes_per_token, 2048);
  EXPECT_EQ((*runs)[1].peak_rss_bytes, 6000);
}

TEST(LlmVsLlamaCppPeer, RefusesDocumentsThatDoNotFit) {
  EXPECT_FALSE(ParseLlamaPeerDocument("not json", {1, 2}, 3, nullptr, nullptr).ok());
  EXPECT_FALSE(ParseLlamaPeerDocument(PeerDocument().dump(), {1}, 3, nullptr, nullptr).ok());
  EXPECT_FALSE(ParseLlamaPeerDocument(PeerDocument().dump(), {1, 4}, 3, nullptr, nullptr).ok());
  EXPECT_FALSE(ParseLlamaPeerDocument(PeerDocument().dump(), {1, 2}, 4, nullptr, nullptr).ok());
  json broken = PeerDocument();
  broken["runs"][0]["generated_ids"][0][1] = "two";
  EXPECT_FALSE(ParseLlamaPeerDocument(broken.dump(), {1, 2}, 3, nullptr, nullptr).ok());
  broken = PeerDocument();
  broken["runs"][1].erase("decode_tokens_per_s");
  EXPECT_FALSE(ParseLlamaPeerDocument(broken.dump(), {1, 2}, 3, nullptr, nullptr).ok());
}

LlmVsLlamaCppReport SampleReport() {
  LlmVsLlamaCppReport report;
  report.peer = {"3.21.1", "b0000", "CPU"};
  report.bandwidth_bytes_per_s = 10e9;
  report.bandwidth_threads = 2;
  report.bandwidth_by_threads = {{1, 6e9}, {2, 10e9}};
  LlmVsLlamaCppLine line;
  line.model = "synthetic";
  line.precision = "bf16";
  line.threads = 2;
  line.sequences = 4;
  line.prompt_tokens = 128;
  line.decode_tokens = 64;
  line.ours.prefill_tokens_per_s = 300;
  line.ours.decode_tokens_per_s = 100;
  line.ours.kv_bytes_per_token = 73728;
  line.ours.peak_rss_bytes = 1 << 28;
  line.llama.prefill_tokens_per_s = 200;
  line.llama.decode_tokens_per_s = 80;
  line.outputs = CompareGeneratedIds({{1, 2}}, {{1, 3}});
  line.weight_bytes = 200'000'000;
  line.llama_model_file_bytes = 210'000'000;
  line.bandwidth_bytes_per_s = 10e9;
  report.lines.push_back(line);
  return report;
}

TEST(LlmVsLlamaCppReport, RatiosAndBandwidthFractions) {
  const LlmVsLlamaCppLine& line = SampleReport().lines[0];
  EXPECT_DOUBLE_EQ(line.prefill_ratio(), 1.5);
  EXPECT_DOUBLE_EQ(line.decode_ratio(), 1.25);
  // 200 MB per step, 25 steps/s (100 tokens/s over 4 sequences), 10 GB/s.
  EXPECT_DOUBLE_EQ(line.bandwidth_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(line.llama_bandwidth_fraction(), 210e6 * 20 / 10e9);
}

TEST(LlmVsLlamaCppReport, JsonDocumentHasEveryField) {
  LlmVsLlamaCppOptions options;
  json document = json::parse(LlmVsLlamaCppJsonDocument(options, SampleReport()));
  EXPECT_EQ(document["benchmark"], "llm-vs-llamacpp");
  EXPECT_EQ(document["peer"]["version"], "3.21.1");
  EXPECT_DOUBLE_EQ(document["bandwidth"]["bytes_per_s"].get<double>(), 10e9);
  EXPECT_DOUBLE_EQ(document["bandwidth"]["by_threads"]["1"].get<double>(), 6e9);
  ASSERT_EQ(document["lines"].size(), 1u);
  const json& line = document["lines"][0];
  for (const char* key : {"model",
                          "precision",
                          "threads",
                          "sequences",
                          "prompt_tokens",
                          "decode_tokens",
                          "ours_prefill_tokens_per_s",
                          "llama_prefill_tokens_per_s",
                          "ours_decode_tokens_per_s",
                          "llama_decode_tokens_per_s",
                          "prefill_ratio",
                          "decode_ratio",
                          "outputs_match",
                          "matching_tokens",
                          "compared_tokens",
                          "first_mismatch",
                          "bandwidth_fraction",
                          "llama_bandwidth_fraction",
                          "kv_bytes_per_token",
                          "llama_kv_bytes_per_token",
                          "ours_peak_rss_bytes",
                          "llama_peak_rss_bytes",
                          "weight_bytes"}) {
    EXPECT_TRUE(line.contains(key)) << key;
  }
  EXPECT_EQ(line["outputs_match"], false);
  EXPECT_EQ(line["first_mismatch"]["step"], 1);
  EXPECT_DOUBLE_EQ(line["decode_ratio"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(line["bandwidth_fraction"].get<double>(), 0.5);
}

TEST(LlmVsLlamaCppReport, TableHasARowPerLine) {
  const std::string table = LlmVsLlamaCppTable(SampleReport());
  EXPECT_NE(table.find("synthetic"), std::string::npos);
  EXPECT_NE(table.find("1/2"), std::string::npos);  // matching / compared tokens
  EXPECT_NE(table.find("1.25"), std::string::npos);
}

TEST(LlmVsLlamaCppRun, MissingPeerIsFailedPrecondition) {
  LlmVsLlamaCppOptions options;
  options.llama_dir = ::testing::TempDir() + "/no-such-node-modules";
  options.peer_script = CLOISTER_BENCH_LLAMA_PEER_SCRIPT;
  std::FILE* sink = std::tmpfile();
  auto report = RunLlmVsLlamaCpp(options, sink, sink);
  std::fclose(sink);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(report.status().message().find("node-llama-cpp"), std::string::npos);
}

// The tiny model at F32 through both sides: both must give the same greedy ids (llama.cpp
// matches the tiny model's reference ids at F32, see models/llm/tiny-llama/checks), and every
// figure must be there.
TEST(LlmVsLlamaCppEndToEnd, TinyModelMatchesLlamaCpp) {
  if (std::getenv("CLOISTER_BENCH_LLM_END_TO_END") == nullptr) {
    GTEST_SKIP() << "run by ctest bench_llm_vs_llamacpp_tiny";
  }
  if (!std::filesystem::exists(std::filesystem::path(CLOISTER_BENCH_LLAMA_DIR) /
                               "node-llama-cpp")) {
    GTEST_SKIP() << "node-llama-cpp is not installed (scripts/install-bench-deps.sh)";
  }
  LlmVsLlamaCppOptions options;
  options.models_dir = std::string(CLOISTER_SHARED_DIR) + "/models";
  options.cache_dir = ::testing::TempDir() + "/llm-bench-cache";
  options.llama_dir = CLOISTER_BENCH_LLAMA_DIR;
  options.peer_script = CLOISTER_BENCH_LLAMA_PEER_SCRIPT;
  options.generator_script = CLOISTER_BENCH_LLM_GENERATOR;
  options.models = {"tiny"};
  options.precisions = {"f32"};
  options.threads = {1};
  options.sequences = {1, 4};
  options.prompt_tokens = 24;
  options.decode_tokens = 12;
  options.warmup = 0;
  options.repeats = 1;
  options.bandwidth_mib = 64;
  options.bandwidth_passes = 1;
  options.json = true;
  std::FILE* out = std::tmpfile();
  auto report = RunLlmVsLlamaCpp(options, out, stderr);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->lines.size(), 2u);
  for (const LlmVsLlamaCppLine& line : report->lines) {
    EXPECT_TRUE(line.outputs.match)
        << line.sequences << " sequences: first mismatch in sequence "
        << line.outputs.first_mismatch_sequence << " at step " << line.outputs.first_mismatch_step;
    EXPECT_GT(line.ours.prefill_tokens_per_s, 0);
    EXPECT_GT(line.ours.decode_tokens_per_s, 0);
    EXPECT_GT(line.llama.prefill_tokens_per_s, 0);
    EXPECT_GT(line.llama.decode_tokens_per_s, 0);
    EXPECT_TRUE(line.llama.ids_stable);
    EXPECT_TRUE(line.ours.ids_stable);
    // Both keep float32 keys and values: 4 layers x 2 kv heads x 32 x (key + value) x 4 bytes.
    EXPECT_EQ(line.ours.kv_bytes_per_token, 2048);
    EXPECT_EQ(line.llama.kv_bytes_per_token, 2048);
    EXPECT_GT(line.bandwidth_fraction(), 0);
    EXPECT_GT(line.ours.peak_rss_bytes, 0);
  }
  // The document on `out` is one JSON object holding the same lines.
  std::rewind(out);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), out)) > 0;) text.append(buffer, n);
  std::fclose(out);
  json document = json::parse(text);
  EXPECT_EQ(document["lines"].size(), 2u);
}

TEST(LlmCudaFlags, ParsesListsAndRefusesUnknownModelsAndPrecisions) {
  auto options = ParseLlmCudaFlags(
      {"--models", "tiny,synthetic-1b", "--precisions", "f32", "--sequences", "1,8,32", "--json"},
      LlmCudaOptions{});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->models, (std::vector<std::string>{"tiny", "synthetic-1b"}));
  EXPECT_EQ(options->precisions, (std::vector<std::string>{"f32"}));
  EXPECT_EQ(options->sequences, (std::vector<int>{1, 8, 32}));
  EXPECT_TRUE(options->json);
  auto model = ParseLlmCudaFlags({"--models", "gpt2"}, LlmCudaOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("unknown model gpt2"), std::string::npos);
  auto precision = ParseLlmCudaFlags({"--precisions", "fp8"}, LlmCudaOptions{});
  ASSERT_FALSE(precision.ok());
  EXPECT_NE(precision.status().message().find("unknown precision fp8"), std::string::npos);
}

TEST(LlmCudaJson, LineCarriesTheFiguresAndTheFraction) {
  LlmCudaLine line;
  line.model = "synthetic-1b";
  line.precision = "bf16";
  line.sequences = 4;
  line.decode_tokens_per_s = 800;
  line.weight_bytes = 2'000'000'000;
  line.read_bandwidth_bytes_per_s = 4e12;
  nlohmann::json doc = nlohmann::json::parse(LlmCudaJsonLine(line));
  EXPECT_EQ(doc["case"], "llm-cuda");
  EXPECT_EQ(doc["sequences"], 4);
  // 2e9 bytes per step * (800 / 4) steps/s over 4e12 bytes/s.
  EXPECT_DOUBLE_EQ(doc["bandwidth_fraction"].get<double>(), 0.1);
}

}  // namespace
}  // namespace cloister::bench
