#include "enclave/llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "enclave/llm/stop_matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<double> Softmax(const std::vector<float>& logits, double temperature = 1.0) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probabilities;
  double sum = 0;
  for (float logit : logits) {
    probabilities.push_back(std::exp((logit - max) / temperature));
    sum += probabilities.back();
  }
  for (double& p : probabilities) p /= sum;
  return probabilities;
}

// Logits whose softmax is exactly `probabilities` (up to rounding).
std::vector<float> LogitsFor(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Frequencies of `draws` tokens from one sampler fed the same logits each time.
std::vector<double> Frequencies(const SamplingParams& params, const std::vector<float>& logits,
                                int draws) {
  Sampler sampler(params);
  std::vector<double> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    std::vector<float> scratch = logits;
    const int32_t id = sampler.Sample(scratch).id;
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<int32_t>(logits.size()));
    counts[id] += 1;
  }
  for (double& count : counts) count /= draws;
  return counts;
}

// Each frequency within five standard deviations of its expected probability.
void ExpectFrequencies(const std::vector<double>& frequencies, const std::vector<double>& expected,
                       int draws) {
  ASSERT_EQ(frequencies.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const double tolerance = 5 * std::sqrt(expected[i] * (1 - expected[i]) / draws) + 1e-12;
    EXPECT_NEAR(frequencies[i], expected[i], tolerance) << "token " << i;
  }
}

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 engine(seed);  // the engine's output is fixed by the standard
  std::vector<float> logits(vocab);
  for (float& logit : logits) {
    logit = scale * (static_cast<float>(engine() % 20001) / 10000.0f - 1.0f);
  }
  return logits;
}

constexpr int kDraws = 20000;

TEST(SamplerTest, GreedyIsArgmaxWithTiesToTheLowestId) {
  SamplingParams params;
  params.temperature = 0;
  Sampler sampler(params);
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(sampler.Sample(logits).id, 1);
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> random = RandomLogits(1000, seed);
    const auto expected = std::max_element(random.begin(), random.end()) - random.begin();
    EXPECT_EQ(sampler.Sample(random).id, expected);
  }
}

TEST(GreedyIdTest, NaNsAreNeverChosenAndNothingPossibleIsTokenZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(GreedyId(std::vector<float>{nan, -2.0f, nan, -1.0f, -1.0f}), 3);
  EXPECT_EQ(GreedyId(std::vector<float>{-inf, nan, -inf, -7.5f}), 3);
  EXPECT_EQ(GreedyId(std::vector<float>{1.0f, inf, nan, inf}), 1);
  EXPECT_EQ(GreedyId(std::vector<float>{nan, nan, nan}), 0);
  EXPECT_EQ(GreedyId(std::vector<float>{nan, -inf, -inf}), 0);
  EXPECT_EQ(GreedyId(std::vector<float>{-inf}), 0);
  // Past the vector lanes of the maximum's search, and on its tail.
  std::vector<float> long_row(37, -inf);
  long_row[36] = -100.0f;
  long_row[20] = nan;
  EXPECT_EQ(GreedyId(long_row), 36);

  // The Sampler's greedy choice is the same; it had answered `vocab`, an id outside the
  // vocabulary, for a row of NaNs.
  SamplingParams params;
  params.temperature = 0;
  Sampler sampler(params);
  std::vector<float> nans(5, nan);
  EXPECT_EQ(sampler.Sample(nans).id, 0);
  std::vector<float> mixed = {nan, -2.0f, nan, -1.0f, -1.0f};
  EXPECT_EQ(sampler.Sample(mixed).id, 3);
}

TEST(SamplerTest, TinyTemperatureIsGreedy) {
  SamplingParams params;
  params.temperature = 1e-6f;
  Sampler sampler(params);
  std::vector<float> logits = {0.5f, 2.0f, 2.0f, -3.0f};
  EXPECT_EQ(sampler.Sample(logits).id, 1);
}

TEST(SamplerTest, TopKOfOneIsGreedy) {
  SamplingParams params;
  params.top_k = 1;
  params.seed = 7;
  Sampler sampler(params);
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    std::vector<float> logits = RandomLogits(5000, seed);
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.Sample(logits).id, expected);
  }
}

std::vector<int32_t> Generate(const SamplingParams& params, int count) {
  Sampler sampler(params);
  std::vector<int32_t> ids;
  for (int i = 0; i < count; ++i) {
    std::vector<float> logits = RandomLogits(256, 1000 + i, 1.0f);
    ids.push_back(sampler.Sample(logits).id);
  }
  return ids;
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  SamplingParams params;
  params.seed = 12345;
  params.top_p = 0.95f;
  const std::vector<int32_t> first = Generate(params, 64);
  EXPECT_EQ(Generate(params, 64), first);
  params.seed = 12346;
  const std::vector<int32_t> other = Generate(params, 64);
  int differing = 0;
  for (size_t i = 0; i < first.size(); ++i) differing += first[i] != other[i];
  EXPECT_GT(differing, 32);  // near-flat logits over 256 tokens: almost every position differs
}

TEST(SamplerTest, OtherSequencesDoNotChangeASequencesTokens) {
  SamplingParams params;
  params.seed = 99;
  const std::vector<int32_t> alone = Generate(params, 32);
  Sampler mine(params);
  SamplingParams other_params;
  other_params.seed = 99;  // even the same seed in another sequence
  Sampler other(other_params);
  std::vector<int32_t> interleaved;
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < i % 3; ++j) {
      std::vector<float> noise = RandomLogits(256, 5000 + i * 7 + j, 1.0f);
      other.Sample(noise);
    }
    std::vector<float> logits = RandomLogits(256, 1000 + i, 1.0f);
    interleaved.push_back(mine.Sample(logits).id);
  }
  EXPECT_EQ(interleaved, alone);
}

TEST(SamplerTest, RandomStreamIsSplitMix64) {
  // Reference values from an independent SplitMix64 (whose seed-0 first output is the
  // published 0xe220a8397b1dcdaf): stream seeded with that generator's first output for `seed`,
  // top 53 bits over 2^53.
  EXPECT_DOUBLE_EQ(Sampler::UniformForTest(0, 0), 0.6524484863740322);
  EXPECT_DOUBLE_EQ(Sampler::UniformForTest(0, 1), 0.7012121095215252);
  EXPECT_DOUBLE_EQ(Sampler::UniformForTest(0, 2), 0.3871241409757855);
  EXPECT_DOUBLE_EQ(Sampler::UniformForTest(42, 0), 0.34329192209867343);
  EXPECT_DOUBLE_EQ(Sampler::UniformForTest(42, 1), 0.9557467261317436);
  EXPECT_DOUBLE_EQ(Sampler::UniformForTest(42, 2), 0.48634953628166855);
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 3.0f, -1.0f, 0.0f};
  SamplingParams params;
  params.seed = 2024;
  ExpectFrequencies(Frequencies(params, logits, kDraws), Softmax(logits), kDraws);
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 3.0f, -1.0f, 0.0f};
  for (float temperature : {0.5f, 1.7f}) {
    SamplingParams params;
    params.seed = 31;
    params.temperature = temperature;
    ExpectFrequencies(Frequencies(params, logits, kDraws), Softmax(logits, temperature), kDraws);
  }
}

TEST(SamplerTest, TopKKeepsTheKMostLikely) {
  const std::vector<float> logits = LogitsFor({0.1, 0.4, 0.05, 0.3, 0.15});
  SamplingParams params;
  params.seed = 5;
  params.top_k = 3;
  // Kept: 1, 3, 4 (0.4, 0.3, 0.15), renormalised over 0.85.
  ExpectFrequencies(Frequencies(params, logits, kDraws),
                    {0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85}, kDraws);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<float> logits = LogitsFor({0.15, 0.5, 0.05, 0.3});
  SamplingParams params;
  params.seed = 11;
  params.top_p = 0.75f;  // 0.5 < 0.75, 0.5 + 0.3 reaches it: {1, 3}
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, kDraws);
  params.top_p = 0.85f;  // needs 0.15 too
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95},
                    kDraws);
  params.top_p = 0.4f;  // the most likely alone
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0, 1, 0, 0}, kDraws);
}

TEST(SamplerTest, TopPRenormalisesOverWhatTopKKept) {
  const std::vector<float> logits = LogitsFor({0.4, 0.3, 0.2, 0.1});
  SamplingParams params;
  params.seed = 3;
  params.top_p = 0.5f;
  // Alone: 0.4 < 0.5 so token 1 stays.
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0.4 / 0.7, 0.3 / 0.7, 0, 0}, kDraws);
  // After top_k = 2 the first has 0.4 / 0.7 = 0.57 >= 0.5: it alone remains.
  params.top_k = 2;
  ExpectFrequencies(Frequencies(params, logits, kDraws), {1, 0, 0, 0}, kDraws);
}

TEST(SamplerTest, MinPKeepsTokensAboveAFractionOfTheMostLikely) {
  const std::vector<float> logits = LogitsFor({0.05, 0.5, 0.15, 0.3});
  SamplingParams params;
  params.seed = 17;
  params.min_p = 0.25f;  // threshold 0.125: drops 0.05
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95},
                    kDraws);
  params.min_p = 0.5f;  // threshold 0.25: keeps 0.5 and 0.3
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, kDraws);
  params.top_k = 3;  // the sorted path gives the same set
  ExpectFrequencies(Frequencies(params, logits, kDraws), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, kDraws);
}

// The reference kept set of top-p over a whole vocabulary: full sort, keep while the
// probability before each token is below p.
std::vector<int32_t> ReferenceTopP(const std::vector<float>& logits, double top_p) {
  const std::vector<double> probabilities = Softmax(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<int32_t> kept;
  double cumulative = 0;
  for (int32_t id : order) {
    if (!kept.empty() && cumulative >= top_p) break;
    kept.push_back(id);
    cumulative += probabilities[id];
  }
  return kept;
}

TEST(SamplerTest, TopPOverALargeVocabularyMatchesAFullSort) {
  // Flat enough that top-p needs several hundred tokens: the prefix sort has to grow.
  const std::vector<float> logits = RandomLogits(128 * 1024, 77, 2.0f);
  const std::vector<int32_t> kept = ReferenceTopP(logits, static_cast<double>(0.9f));
  ASSERT_GT(kept.size(), 1000u);
  double kept_mass = 0;
  const std::vector<double> probabilities = Softmax(logits);
  for (int32_t id : kept) kept_mass += probabilities[id];

  SamplingParams params;
  params.seed = 8;
  params.top_p = 0.9f;
  params.logprobs = true;
  params.top_logprobs = 5;
  params.logprobs_mode = LogprobsMode::kProcessed;
  Sampler sampler(params);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> scratch = logits;
    const SampledToken token = sampler.Sample(scratch);
    EXPECT_NE(std::find(kept.begin(), kept.end(), token.id), kept.end());
    // Processed log-probabilities are renormalised over exactly the kept set.
    EXPECT_NEAR(token.logprob, std::log(probabilities[token.id] / kept_mass), 1e-4);
    ASSERT_EQ(token.top.size(), 5u);
    for (int j = 0; j < 5; ++j) EXPECT_EQ(token.top[j].id, kept[j]);
  }
}

TEST(SamplerTest, TopKOverALargeVocabularyMatchesAFullSort) {
  // Values on a 1e-4 grid over 128k tokens: many ties, which go to the lower id.
  const std::vector<float> logits = RandomLogits(128 * 1024, 79, 4.0f);
  const std::vector<double> probabilities = Softmax(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int32_t top_k : {20, 5000}) {
    const std::vector<int32_t> kept(order.begin(), order.begin() + top_k);
    double kept_mass = 0;
    for (int32_t id : kept) kept_mass += probabilities[id];
    SamplingParams params;
    params.seed = 10;
    params.top_k = top_k;
    params.logprobs = true;
    params.top_logprobs = 20;
    params.logprobs_mode = LogprobsMode::kProcessed;
    Sampler sampler(params);
    for (int i = 0; i < 10; ++i) {
      std::vector<float> scratch = logits;
      const SampledToken token = sampler.Sample(scratch);
      EXPECT_NE(std::find(kept.begin(), kept.end(), token.id), kept.end());
      EXPECT_NEAR(token.logprob, std::log(probabilities[token.id] / kept_mass), 1e-4);
      ASSERT_EQ(token.top.size(), 20u);
      for (int j = 0; j < 20; ++j) EXPECT_EQ(token.top[j].id, kept[j]) << "top_k " << top_k;
    }
  }
}

TEST(SamplerTest, TopKAndTopPOverALargeVocabulary) {
  const std::vector<float> logits = RandomLogits(128 * 1024, 78, 8.0f);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  SamplingParams params;
  params.seed = 9;
  params.top_k = 40;
  params.top_p = 0.9f;
  Sampler sampler(params);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> scratch = logits;
    const int32_t id = sampler.Sample(scratch).id;
    EXPECT_NE(std::find(order.begin(), order.begin() + 40, id), order.begin() + 40);
  }
}

// Forces the next token by making it overwhelmingly likely (in greedy mode).
void Force(Sampler& sampler, int vocab, int32_t id) {
  std::vector<float> logits(vocab, 0.0f);
  logits[id] = 100.0f;
  ASSERT_EQ(sampler.Sample(logits).id, id);
}

TEST(SamplerTest, PenaltiesChangeExactlyTheLogitsTheyShould) {
  SamplingParams params;
  params.temperature = 0;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  params.logprobs = true;
  params.top_logprobs = 6;
  params.logprobs_mode = LogprobsMode::kProcessed;  // greedy: log-softmax of penalised logits
  Sampler sampler(params);
  const std::vector<int32_t> prompt = {0, 1, 1, 500};  // 500 is outside the vocabulary
  sampler.SetPrompt(prompt);
  Force(sampler, 6, 2);
  Force(sampler, 6, 2);
  Force(sampler, 6, 3);
  std::vector<float> logits = {2.0f, -1.0f, 3.0f, 0.5f, -2.0f, 1.0f};
  const SampledToken token = sampler.Sample(logits);
  // By hand: 0 in the prompt: 2 / 2 = 1. 1 in the prompt: -1 * 2 = -2. 2 generated twice:
  // 3 / 2 - 2 * 0.25 - 0.5 = 0.5. 3 generated once: 0.5 / 2 - 0.25 - 0.5 = -0.5. 4, 5 untouched.
  const std::vector<float> penalised = {1.0f, -2.0f, 0.5f, -0.5f, -2.0f, 1.0f};
  const std::vector<double> expected = Softmax(penalised);
  EXPECT_EQ(token.id, 0);  // 0 and 5 tie at 1.0: the lower id
  ASSERT_EQ(token.top.size(), 6u);
  for (const TokenLogprob& entry : token.top) {
    EXPECT_NEAR(entry.logprob, std::log(expected[entry.id]), 1e-5) << "token " << entry.id;
  }
  EXPECT_EQ(token.top[0].id, 0);
  EXPECT_EQ(token.top[1].id, 5);
  EXPECT_EQ(sampler.generated_count(), 4);
}

TEST(SamplerTest, RawLogprobsIgnorePenaltiesAndTemperature) {
  SamplingParams params;
  params.temperature = 0.3f;
  params.repetition_penalty = 1.5f;
  params.frequency_penalty = 1.0f;
  params.top_k = 2;
  params.logprobs = true;
  params.top_logprobs = 4;
  Sampler sampler(params);
  sampler.SetPrompt(std::vector<int32_t>{2});
  const std::vector<float> logits = {0.0f, 1.0f, 2.5f, -1.0f};
  const std::vector<double> expected = Softmax(logits);
  for (int i = 0; i < 5; ++i) {
    std::vector<float> scratch = logits;
    const SampledToken token = sampler.Sample(scratch);
    EXPECT_NEAR(token.logprob, std::log(expected[token.id]), 1e-5);
    ASSERT_EQ(token.top.size(), 4u);
    EXPECT_THAT(
        std::vector<int32_t>({token.top[0].id, token.top[1].id, token.top[2].id, token.top[3].id}),
        ElementsAre(2, 1, 0, 3));
    for (const TokenLogprob& entry : token.top) {
      EXPECT_NEAR(entry.logprob, std::log(expected[entry.id]), 1e-5);
    }
  }
}

TEST(SamplerTest, LogprobsSumToOne) {
  const std::vector<float> logits = RandomLogits(20, 4);
  SamplingParams params;
  params.seed = 1;
  params.logprobs = true;
  params.top_logprobs = 20;
  {
    Sampler sampler(params);
    std::vector<float> scratch = logits;
    const SampledToken token = sampler.Sample(scratch);
    ASSERT_EQ(token.top.size(), 20u);
    double sum = 0;
    for (const TokenLogprob& entry : token.top) sum += std::exp(entry.logprob);
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (size_t i = 1; i < token.top.size(); ++i) {
      EXPECT_GE(token.top[i - 1].logprob, token.top[i].logprob);
    }
  }
  {
    // Processed, after top_k = 5: only the five kept are listed, and they sum to one.
    params.logprobs_mode = LogprobsMode::kProcessed;
    params.top_k = 5;
    params.temperature = 0.7f;
    Sampler sampler(params);
    std::vector<float> scratch = logits;
    const SampledToken token = sampler.Sample(scratch);
    ASSERT_EQ(token.top.size(), 5u);
    double sum = 0;
    bool listed = false;
    for (const TokenLogprob& entry : token.top) {
      sum += std::exp(entry.logprob);
      if (entry.id == token.id) {
        listed = true;
        EXPECT_FLOAT_EQ(entry.logprob, token.logprob);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    EXPECT_TRUE(listed);
  }
}

TEST(SamplerTest, NoLogprobsUnlessAsked) {
  Sampler sampler(SamplingParams{});
  std::vector<float> logits = {1.0f, 2.0f};
  const SampledToken token = sampler.Sample(logits);
  EXPECT_EQ(token.logprob, 0.0f);
  EXPECT_TRUE(token.top.empty());
}

TEST(SamplerTest, NanAndInfinityAreHandled) {
  SamplingParams params;
  params.seed = 4;
  Sampler sampler(params);
  const float nan = std::nanf("");
  const float infinity = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 200; ++i) {
    std::vector<float> logits = {nan, 0.0f, nan, 0.0f};
    const int32_t id = sampler.Sample(logits).id;
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
  std::vector<float> with_infinity = {0.0f, infinity, 5.0f};
  EXPECT_EQ(sampler.Sample(with_infinity).id, 1);
  std::vector<float> impossible = {-infinity, -infinity, nan};
  EXPECT_EQ(sampler.Sample(impossible).id, 0);
}

TEST(SamplerTest, ValidationNamesTheBadField) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  struct Case {
    void (*mutate)(SamplingParams&);
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](SamplingParams& p) { p.temperature = 3; }, "temperature must be in [0, 2], got 3"},
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature must be in [0, 2], got -0.5"},
      {[](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature must be in [0, 2]"},
      {[](SamplingParams& p) { p.top_k = -1; }, "top_k must be >= 0 (0 turns it off), got -1"},
      {[](SamplingParams& p) { p.top_p = 0; }, "top_p must be in (0, 1], got 0"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5"},
      {[](SamplingParams& p) { p.min_p = 2; }, "min_p must be in [0, 1], got 2"},
      {[](SamplingParams& p) { p.repetition_penalty = 0; },
       "repetition_penalty must be a finite number > 0, got 0"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; },
       "presence_penalty must be in [-2, 2], got 2.5"},
      {[](SamplingParams& p) { p.frequency_penalty = -3; },
       "frequency_penalty must be in [-2, 2], got -3"},
      {[](SamplingParams& p) {
         p.logprobs = true;
         p.top_logprobs = 21;
       },
       "top_logprobs must be in [0, 20], got 21"},
      {[](SamplingParams& p) { p.top_logprobs = 3; }, "top_logprobs (3) needs logprobs to be true"},
  };
  for (const Case& test_case : cases) {
    SamplingParams params;
    test_case.mutate(params);
    const absl::Status status = ValidateSamplingParams(params);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << test_case.message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(test_case.message));
  }
  SamplingParams edges;
  edges.temperature = 2;
  edges.top_p = 1;
  edges.min_p = 1;
  edges.presence_penalty = -2;
  edges.frequency_penalty = 2;
  edges.logprobs = true;
  edges.top_logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(edges).ok());
}

// ---- StopMatcher ----

// Feeds `deltas` and returns everything emitted (including Finish when no stop happened).
std::string Stream(StopMatcher& matcher, const std::vector<std::string>& deltas,
                   bool* stopped = nullptr) {
  std::string out;
  bool any_stop = false;
  for (const std::string& delta : deltas) {
    StopMatcher::Result result = matcher.Push(delta);
    out += result.text;
    any_stop = any_stop || result.stopped;
  }
  if (!any_stop) out += matcher.Finish();
  if (stopped != nullptr) *stopped = any_stop;
  return out;
}

TEST(StopMatcherTest, NoStopPassesEverything) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.Push("Hello, ").text, "Hello, ");
  EXPECT_EQ(matcher.Push("world").text, "world");
  EXPECT_EQ(matcher.Finish(), "");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, StopSplitAcrossManyDeltas) {
  StopMatcher matcher({"STOP"});
  StopMatcher::Result result = matcher.Push("Hello S");
  EXPECT_EQ(result.text, "Hello ");  // "S" might start STOP
  EXPECT_FALSE(result.stopped);
  EXPECT_EQ(matcher.Push("T").text, "");
  EXPECT_EQ(matcher.Push("O").text, "");
  result = matcher.Push("P and more");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.text, "");
  result = matcher.Push("later");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.text, "");
  EXPECT_EQ(matcher.Finish(), "");
}

TEST(StopMatcherTest, FalseStartIsReleased) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.Push("aST").text, "a");
  EXPECT_EQ(matcher.Push("Ox").text, "STOx");
  EXPECT_EQ(matcher.Push("ST").text, "");
  EXPECT_EQ(matcher.Finish(), "ST");  // the end of the stream releases the held text
}

TEST(StopMatcherTest, StopAtTheVeryStart) {
  StopMatcher matcher({"<end>"});
  const StopMatcher::Result result = matcher.Push("<end>tail");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.text, "");
}

TEST(StopMatcherTest, TextBeforeTheStopInTheSameDelta) {
  StopMatcher matcher({"\n\n"});
  const StopMatcher::Result result = matcher.Push("line one\n\nline two");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.text, "line one");
}

TEST(StopMatcherTest, OverlappingStops) {
  {
    // "bc" completes before "abcd" would: it wins, however the text is cut.
    StopMatcher matcher({"abcd", "bc"});
    const StopMatcher::Result result = matcher.Push("xabcd");
    EXPECT_TRUE(result.stopped);
    EXPECT_EQ(result.text, "xa");
  }
  {
    // Both end at the same byte: the longer one, which starts first.
    StopMatcher matcher({"cd", "bcd"});
    bool stopped = false;
    EXPECT_EQ(Stream(matcher, {"ab", "c", "d!"}, &stopped), "a");
    EXPECT_TRUE(stopped);
  }
  {
    // A stop that overlaps itself: "aab" inside "aaab".
    StopMatcher matcher({"aab"});
    bool stopped = false;
    EXPECT_EQ(Stream(matcher, {"a", "a", "a", "b"}, &stopped), "a");
    EXPECT_TRUE(stopped);
  }
}

TEST(StopMatcherTest, ResultDoesNotDependOnHowTextIsCut) {
  const std::string text = "The cat sat. On the mat!! Then: the END, really END.";
  const std::vector<std::string> stops = {"the END", "mat!!!", "n: th", "ENDING"};
  StopMatcher whole(stops);
  bool whole_stopped = false;
  const std::string expected = Stream(whole, {text}, &whole_stopped);
  EXPECT_TRUE(whole_stopped);
  EXPECT_EQ(expected, "The cat sat. On the mat!! The");  // "n: th" ends first
  std::mt19937 engine(123);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> deltas;
    for (size_t at = 0; at < text.size();) {
      const size_t length = std::min<size_t>(text.size() - at, engine() % 6);
      deltas.push_back(text.substr(at, length));
      at += length;
    }
    StopMatcher matcher(stops);
    bool stopped = false;
    EXPECT_EQ(Stream(matcher, deltas, &stopped), expected) << "trial " << trial;
    EXPECT_TRUE(stopped);
  }
}

TEST(StopMatcherTest, MultibyteCharactersStayWhole) {
  {
    // A delta that ends inside "é" (C3 A9): the lead byte waits for the rest.
    StopMatcher matcher({"STOP"});
    EXPECT_EQ(matcher.Push("caf\xC3").text, "caf");
    EXPECT_EQ(matcher.Push("\xA9!").text, "\xC3\xA9!");
  }
  {
    // A stop starting with the same lead byte as the text: "ö" (C3 B6) is not "ü" (C3 BC).
    StopMatcher matcher({"\xC3\xBC"});
    EXPECT_EQ(matcher.Push("\xC3").text, "");
    EXPECT_EQ(matcher.Push("\xB6").text, "\xC3\xB6");
    const StopMatcher::Result result = matcher.Push("x\xC3\xBCy");
    EXPECT_TRUE(result.stopped);
    EXPECT_EQ(result.text, "x");
  }
  {
    // A four-byte character arriving a byte at a time, then a multibyte stop string.
    StopMatcher matcher({"\xE2\x80\x94"});  // em dash
    std::string out;
    for (char byte : std::string("\xF0\x9F\x98\x80"))
      out += matcher.Push(std::string(1, byte)).text;
    EXPECT_EQ(out, "\xF0\x9F\x98\x80");
    EXPECT_EQ(matcher.Push("\xE2\x80").text, "");
    const StopMatcher::Result result = matcher.Push("\x94 rest");
    EXPECT_TRUE(result.stopped);
    EXPECT_EQ(result.text, "");
  }
  {
    // Invalid bytes still come out (continuation bytes with no lead).
    StopMatcher matcher({});
    EXPECT_EQ(matcher.Push("a\x80\x80\x80\x80z").text, "a\x80\x80\x80\x80z");
  }
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  StopMatcher matcher({"", ""});
  const StopMatcher::Result result = matcher.Push("anything");
  EXPECT_FALSE(result.stopped);
  EXPECT_EQ(result.text, "anything");
}

}  // namespace
}  // namespace cloister::llm
