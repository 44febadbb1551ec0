#include "enclave/llm/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::llm {
namespace {

// vLLM's threshold below which a temperature means greedy decoding.
constexpr float kGreedyTemperature = 1e-5f;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
// top-p sorts this many of the most likely tokens first, then twice as many each round.
constexpr size_t kFirstSortedPrefix = 64;

// e^x for x <= 0 with only IEEE operations (fused multiply-adds, which are exactly rounded,
// and exact power-of-two scaling), so every machine running the binary gets the same bits.
// Relative error about 1e-16; below -708 (where the result would be subnormal) it returns 0.
// Branch-free so that loops over a vocabulary vectorize.
inline double ExpNonPositive(double x) {
  constexpr double kLog2E = 1.4426950408889634;
  constexpr double kLn2High = 0.6931471803691238;  // ln 2 split so k * kLn2High is exact
  constexpr double kLn2Low = 1.9082149292705877e-10;
  constexpr double kRoundingShift = 6755399441055744.0;  // 1.5 * 2^52: rounds to an integer
  const bool representable = x > -708.0;                 // false for NaN too
  double clamped = x > -708.0 ? x : -708.0;              // (selects rather than std::min/max: they
  clamped = clamped < 0.0 ? clamped : 0.0;               // keep the loop from vectorizing)
  // clamped = k ln2 + r with k an integer and |r| <= ln2 / 2.
  const double shifted = std::fma(clamped, kLog2E, kRoundingShift);
  const double k = shifted - kRoundingShift;
  double r = std::fma(-k, kLn2High, clamped);
  r = std::fma(-k, kLn2Low, r);
  // Taylor series of e^r to r^13 (the next term is below 1e-17 for |r| <= ln2 / 2).
  double polynomial = 1.0 / 6227020800;
  polynomial = std::fma(polynomial, r, 1.0 / 479001600);
  polynomial = std::fma(polynomial, r, 1.0 / 39916800);
  polynomial = std::fma(polynomial, r, 1.0 / 3628800);
  polynomial = std::fma(polynomial, r, 1.0 / 362880);
  polynomial = std::fma(polynomial, r, 1.0 / 40320);
  polynomial = std::fma(polynomial, r, 1.0 / 5040);
  polynomial = std::fma(polynomial, r, 1.0 / 720);
  polynomial = std::fma(polynomial, r, 1.0 / 120);
  polynomial = std::fma(polynomial, r, 1.0 / 24);
  polynomial = std::fma(polynomial, r, 1.0 / 6);
  polynomial = std::fma(polynomial, r, 0.5);
  polynomial = std::fma(polynomial, r, 1.0);
  polynomial = std::fma(polynomial, r, 1.0);
  // 2^k for k in [-1022, 0]: the low bits of `shifted` hold k; add the bias, move to the
  // exponent field.
  const uint64_t exponent_bits = (std::bit_cast<uint64_t>(shifted) + 1023) << 52;
  const double result = polynomial * std::bit_cast<double>(exponent_bits);
  const uint64_t keep_mask = 0 - static_cast<uint64_t>(representable);
  return std::bit_cast<double>(std::bit_cast<uint64_t>(result) & keep_mask);
}

uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Orders token ids by value, largest first, ties to the lower id.
struct MoreLikely {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  }
};

// The `count` ids with the largest values among those `include` accepts, most likely first
// (ties to the lower id). One pass with a small sorted buffer: count is at most 20.
template <typename Include>
std::vector<int32_t> TopIds(std::span<const float> values, int32_t count, Include include) {
  std::vector<int32_t> top;
  if (count <= 0) return top;
  top.reserve(count + 1);
  const MoreLikely more_likely{values.data()};
  for (int32_t id = 0; id < static_cast<int32_t>(values.size()); ++id) {
    if (!include(id)) continue;
    if (static_cast<int32_t>(top.size()) == count && !more_likely(id, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), id, more_likely), id);
    if (static_cast<int32_t>(top.size()) > count) top.pop_back();
  }
  return top;
}

// The largest value, with eight running maxima so the loop vectorizes (exact either way).
float MaxOf(std::span<const float> values) {
  constexpr size_t kLanes = 8;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegativeInfinity);
  size_t i = 0;
  for (; i + kLanes <= values.size(); i += kLanes) {
    for (size_t lane = 0; lane < kLanes; ++lane) {
      lanes[lane] = values[i + lane] > lanes[lane] ? values[i + lane] : lanes[lane];
    }
  }
  float max = kNegativeInfinity;
  for (; i < values.size(); ++i) max = values[i] > max ? values[i] : max;
  for (float lane : lanes) max = lane > max ? lane : max;
  return max;
}

// The sum in a fixed order: four interleaved partial sums, then added in sequence.
double SumOf(std::span<const double> values) {
  double partial[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= values.size(); i += 4) {
    for (size_t lane = 0; lane < 4; ++lane) partial[lane] += values[i + lane];
  }
  double sum = ((partial[0] + partial[1]) + partial[2]) + partial[3];
  for (; i < values.size(); ++i) sum += values[i];
  return sum;
}

// Writes e^(values[id] - max) for every id into `weights` (one vectorizable pass).
void WeighAll(std::span<const float> values, float max, std::vector<double>& weights) {
  weights.resize(values.size());
  const double shift = max;
  for (size_t id = 0; id < values.size(); ++id) {
    weights[id] = ExpNonPositive(static_cast<double>(values[id]) - shift);
  }
}

// log(sum of e^value); -infinity when every value is. `scratch` is overwritten.
double LogSumExp(std::span<const float> values, std::vector<double>& scratch) {
  const float max = MaxOf(values);
  if (max == kNegativeInfinity) return kNegativeInfinity;
  WeighAll(values, max, scratch);
  const double sum = SumOf(scratch);
  return static_cast<double>(max) + std::log(sum);
}

// Fills token.logprob and token.top (the `top_count` most likely ids that `include` accepts)
// with values[id] - log_normalizer.
template <typename Include>
void FillLogprobs(std::span<const float> values, double log_normalizer, int32_t top_count,
                  Include include, SampledToken& token) {
  auto logprob = [&](int32_t id) {
    if (log_normalizer == kNegativeInfinity) return kNegativeInfinity;
    return static_cast<float>(values[id] - log_normalizer);
  };
  token.logprob = logprob(token.id);
  for (int32_t id : TopIds(values, top_count, include)) token.top.push_back({id, logprob(id)});
}

// top-p groups tokens into buckets by how far their logit is below the maximum, so only the
// bucket where the cumulative probability crosses top_p has to be sorted.
constexpr int kBuckets = 1024;
constexpr double kBucketsPerUnit = 32;  // buckets per unit of (temperature-scaled) logit

uint16_t Bucket(float logit, float max) {
  const double position = (static_cast<double>(max) - logit) * kBucketsPerUnit;
  return position < kBuckets - 1 ? static_cast<uint16_t>(position) : kBuckets - 1;
}

// NaN logits become -infinity and +infinity the largest float.
void SanitizeLogits(std::span<float> logits) {
  for (float& logit : logits) {
    logit =
        std::isnan(logit) ? kNegativeInfinity : std::min(logit, std::numeric_limits<float>::max());
  }
}

// The ids still in play after top-k: every id below `vocab`, or those in `ids` (in id order).
struct Candidates {
  bool all;
  int32_t vocab;
  std::span<const int32_t> ids;
  // Calls visit(id) for each candidate in id order until it returns true.
  template <typename Visit>
  void ForEach(Visit&& visit) const {
    if (all) {
      for (int32_t id = 0; id < vocab; ++id) {
        if (visit(id)) return;
      }
    } else {
      for (int32_t id : ids) {
        if (visit(id)) return;
      }
    }
  }
};

// Whether a candidate survives the top-k/top-p cutoff (none when negative) and min-p.
struct KeptFilter {
  MoreLikely more_likely;
  int32_t cutoff;
  double min_weight;
  const double* weights;
  bool operator()(int32_t id) const {
    return (cutoff < 0 || !more_likely(cutoff, id)) && weights[id] >= min_weight;
  }
};

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  // Written as !(in range) so NaN fails too.
  if (!(params.temperature >= 0.0f && params.temperature <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be in [0, 2], got ", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0 (0 turns it off), got ", params.top_k));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", params.top_p));
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", params.min_p));
  }
  if (!(params.repetition_penalty > 0.0f && std::isfinite(params.repetition_penalty))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetition_penalty must be a finite number > 0, got ", params.repetition_penalty));
  }
  if (!(params.presence_penalty >= -2.0f && params.presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty must be in [-2, 2], got ", params.presence_penalty));
  }
  if (!(params.frequency_penalty >= -2.0f && params.frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty must be in [-2, 2], got ", params.frequency_penalty));
  }
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs,
                                                   "], got ", params.top_logprobs));
  }
  if (params.top_logprobs > 0 && !params.logprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs (", params.top_logprobs, ") needs logprobs to be true"));
  }
  if (params.logprobs_mode != LogprobsMode::kRaw &&
      params.logprobs_mode != LogprobsMode::kProcessed) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs_mode must be raw or processed, got ",
                                                   static_cast<int>(params.logprobs_mode)));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {}

void Sampler::SetPrompt(std::span<const int32_t> prompt_ids) {
  prompt_ids_.clear();
  prompt_ids_.insert(prompt_ids.begin(), prompt_ids.end());
}

double Sampler::UniformForTest(uint64_t seed, int64_t position) {
  // SplitMix64: the stream's state advances by the golden-ratio increment; the n-th output is
  // the finalizer of state0 + (n + 1) * increment, so any position is reachable directly.
  constexpr uint64_t kIncrement = 0x9e3779b97f4a7c15ULL;
  const uint64_t state0 = SplitMix64Finalize(seed + kIncrement);
  const uint64_t bits =
      SplitMix64Finalize(state0 + (static_cast<uint64_t>(position) + 1) * kIncrement);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 random bits
}

void Sampler::ApplyPenalties(std::span<float> logits) const {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  const float repetition = params_.repetition_penalty;
  if (repetition != 1.0f) {
    auto penalize = [&](int32_t id) {
      float& logit = logits[id];
      logit = logit > 0.0f ? logit / repetition : logit * repetition;
    };
    for (int32_t id : prompt_ids_) {
      if (in_vocab(id)) penalize(id);
    }
    for (const auto& [id, count] : generated_counts_) {
      if (in_vocab(id) && !prompt_ids_.contains(id)) penalize(id);
    }
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (const auto& [id, count] : generated_counts_) {
      if (!in_vocab(id)) continue;
      float& logit = logits[id];
      // fma: one rounding whatever the compiler contracts, so every build agrees.
      logit = std::fma(-params_.frequency_penalty, static_cast<float>(count), logit);
      logit -= params_.presence_penalty;
    }
  }
}

void Sampler::ComputeBuckets(std::span<const float> logits, float max) {
  buckets_.resize(logits.size());
  for (size_t id = 0; id < logits.size(); ++id) buckets_[id] = Bucket(logits[id], max);
}

void Sampler::Record(int32_t id) {
  ++generated_counts_[id];
  ++step_;
}

bool Sampler::plain_greedy() const {
  return params_.temperature < kGreedyTemperature && params_.repetition_penalty == 1.0f &&
         params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f &&
         !params_.logprobs;
}

SampledToken Sampler::Accept(int32_t id) {
  Record(id);
  SampledToken token;
  token.id = id;
  return token;
}

SampledToken Sampler::Sample(std::span<float> logits) {
  CLOISTER_CHECK(!logits.empty());
  CLOISTER_CHECK(logits.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()));
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SanitizeLogits(logits);
  const bool raw_logprobs = params_.logprobs && params_.logprobs_mode == LogprobsMode::kRaw;
  const int32_t top_count = params_.logprobs ? std::clamp(params_.top_logprobs, 0, vocab) : 0;
  double raw_log_normalizer = 0;
  if (raw_logprobs) {
    raw_.assign(logits.begin(), logits.end());
    raw_log_normalizer = LogSumExp(raw_, weights_);
  }
  auto everything = [](int32_t) { return true; };
  ApplyPenalties(logits);

  SampledToken token;
  if (params_.temperature < kGreedyTemperature || vocab == 1) {
    token.id = GreedyId(logits);
    if (raw_logprobs) {
      FillLogprobs(std::span<const float>(raw_), raw_log_normalizer, top_count, everything, token);
    } else if (params_.logprobs) {
      FillLogprobs(logits, LogSumExp(logits, weights_), top_count, everything, token);
    }
    Record(token.id);
    return token;
  }

  if (params_.temperature != 1.0f) {
    for (float& logit : logits) logit /= params_.temperature;
  }
  const float max = MaxOf(logits);
  if (max == kNegativeInfinity) {  // nothing is possible; answer deterministically
    token.id = 0;
    if (params_.logprobs) {
      FillLogprobs(raw_logprobs ? std::span<const float>(raw_) : logits,
                   raw_logprobs ? raw_log_normalizer : kNegativeInfinity, top_count, everything,
                   token);
    }
    Record(token.id);
    return token;
  }

  // The candidates: every id, or (top-k) the k most likely in id order. weights_[id] is
  // e^(logit - max) = p(id) / p(most likely) for each candidate.
  const int32_t top_k = params_.top_k;
  const bool all_candidates = !(top_k > 0 && top_k < vocab);
  // When >= 0, only ids at least as likely as `cutoff` are kept: top-k and top-p both keep a
  // prefix of the tokens ordered by MoreLikely.
  int32_t cutoff = -1;
  if (all_candidates) {
    WeighAll(logits, max, weights_);
  } else {
    cutoff = SelectTopK(logits, max);
  }
  if (params_.top_p < 1.0f) cutoff = TopPCutoff(logits, max, all_candidates, cutoff);

  double kept_total = 0;
  token.id = Draw(logits, all_candidates, cutoff, kept_total);

  if (raw_logprobs) {
    FillLogprobs(std::span<const float>(raw_), raw_log_normalizer, top_count, everything, token);
  } else if (params_.logprobs) {
    // log(weight / kept_total), with log(weight) = logit - max.
    const KeptFilter kept{MoreLikely{logits.data()}, cutoff, params_.min_p, weights_.data()};
    FillLogprobs(logits, static_cast<double>(max) + std::log(kept_total), top_count, kept, token);
  }
  Record(token.id);
  return token;
}

int32_t Sampler::SelectTopK(std::span<const float> logits, float max) {
  // Count tokens per bucket to find the bucket holding the k-th most likely token, then
  // select inside that bucket only.
  const MoreLikely more_likely{logits.data()};
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const int32_t top_k = params_.top_k;
  ComputeBuckets(logits, max);
  bucket_count_.assign(kBuckets, 0);
  for (uint16_t bucket : buckets_) ++bucket_count_[bucket];
  int crossing = 0;
  int32_t before = 0;
  while (before + bucket_count_[crossing] < top_k) before += bucket_count_[crossing++];
  members_.clear();
  for (int32_t id = 0; id < vocab; ++id) {
    if (buckets_[id] == crossing) members_.push_back(id);
  }
  const int32_t needed = top_k - before;
  std::nth_element(members_.begin(), members_.begin() + (needed - 1), members_.end(),
                   more_likely);
  const int32_t cutoff = members_[needed - 1];
  candidates_.clear();
  for (int32_t id = 0; id < vocab; ++id) {
    if (buckets_[id] < crossing || (buckets_[id] == crossing && !more_likely(cutoff, id))) {
      candidates_.push_back(id);
    }
  }
  weights_.resize(vocab);
  for (int32_t id : candidates_) {
    weights_[id] = ExpNonPositive(static_cast<double>(logits[id]) - max);
  }
  return cutoff;
}

int32_t Sampler::TopPCutoff(std::span<const float> logits, float max, bool all_candidates,
                            int32_t cutoff) {
  const MoreLikely more_likely{logits.data()};
  const Candidates candidates{all_candidates, static_cast<int32_t>(logits.size()), candidates_};
  if (all_candidates) ComputeBuckets(logits, max);
  double total = 0;
  bucket_mass_.assign(kBuckets, 0.0);
  candidates.ForEach([&](int32_t id) {
    total += weights_[id];
    bucket_mass_[buckets_[id]] += weights_[id];
    return false;
  });
  // Tokens are kept, most likely first, while the probability before each is below top_p.
  // Find the bucket where that stops: every bucket before it is kept whole.
  const double threshold = static_cast<double>(params_.top_p) * total;
  double cumulative = 0;
  int crossing = 0;
  while (crossing < kBuckets && cumulative + bucket_mass_[crossing] < threshold) {
    cumulative += bucket_mass_[crossing++];
  }
  if (crossing == kBuckets) return cutoff;  // (only through rounding: then keep everything)
  members_.clear();
  candidates.ForEach([&](int32_t id) {
    if (buckets_[id] == crossing) members_.push_back(id);
    return false;
  });
  // Sort a growing prefix of the crossing bucket's tokens until the walk stops.
  size_t sorted = 0;
  size_t kept = 0;
  while (kept < members_.size() && cumulative < threshold) {
    if (kept == sorted) {
      const size_t next = std::min(members_.size(), std::max(kFirstSortedPrefix, 2 * sorted));
      if (next < members_.size()) {
        std::nth_element(members_.begin() + sorted, members_.begin() + next, members_.end(),
                         more_likely);
      }
      std::sort(members_.begin() + sorted, members_.begin() + next, more_likely);
      sorted = next;
    }
    cumulative += weights_[members_[kept++]];
  }
  CLOISTER_CHECK(kept > 0);  // the bucket's mass made the cumulative reach the threshold
  return members_[kept - 1];
}

int32_t Sampler::Draw(std::span<const float> logits, bool all_candidates, int32_t cutoff,
                      double& kept_total) {
  const Candidates candidates{all_candidates, static_cast<int32_t>(logits.size()), candidates_};
  // min-p: p(id) >= min_p * p(most likely), that is weight >= min_p; the most likely token
  // (weight 1) always stays.
  const KeptFilter kept{MoreLikely{logits.data()}, cutoff, params_.min_p, weights_.data()};
  kept_total = 0;
  if (all_candidates && cutoff < 0 && kept.min_weight == 0.0) {
    kept_total = SumOf(weights_);
  } else {
    candidates.ForEach([&](int32_t id) {
      if (kept(id)) kept_total += weights_[id];
      return false;
    });
  }
  // Inverse CDF over the kept tokens in id order; a token of weight 0 is never chosen.
  const double target = UniformForTest(params_.seed, step_) * kept_total;
  double cumulative = 0;
  int32_t chosen = -1;
  int32_t last_positive = -1;
  candidates.ForEach([&](int32_t id) {
    if (!kept(id) || weights_[id] <= 0.0) return false;
    cumulative += weights_[id];
    last_positive = id;
    if (target < cumulative) {
      chosen = id;
      return true;
    }
    return false;
  });
  const int32_t id = chosen >= 0 ? chosen : last_positive;  // rounding at the very end
  CLOISTER_CHECK(id >= 0);                                  // the most likely token has weight 1
  return id;
}

int32_t GreedyId(std::span<const float> logits) {
  const float max = MaxOf(logits);
  if (!(max > kNegativeInfinity)) return 0;
  return static_cast<int32_t>(std::find(logits.begin(), logits.end(), max) - logits.begin());
}

}  // namespace cloister::llm
