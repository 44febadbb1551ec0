// Sampler: turns one sequence's next-token logits into a token id, with the sampling controls
// of the OpenAI API and Hugging Face's generate (temperature, top-k, top-p, min-p, repetition,
// presence and frequency penalties, a seed) and, on request, log-probabilities.
//
// Order of processing, as Hugging Face's generate and vLLM do it:
//   1. penalties on the model's logits: the repetition penalty (Hugging Face semantics: a
//      positive logit is divided by it, a negative one multiplied) once for every distinct
//      token of the prompt and of the generated text; then the frequency penalty (times the
//      number of times the token was generated) and the presence penalty (once, if it was
//      generated at all) subtracted, OpenAI semantics, over generated tokens only;
//   2. temperature: logits divided by it; a temperature below 1e-5 (as in vLLM) means greedy,
//      the argmax of the penalised logits, ties going to the lowest id, and skips 3 and 4;
//   3. filters, in Hugging Face's order: top-k keeps the k largest; top-p keeps the smallest
//      set of the most likely tokens (probabilities renormalised over what top-k kept) whose
//      probability reaches top_p; min-p keeps tokens whose probability is at least min_p times
//      the most likely token's;
//   4. one draw from the softmax of what is left.
// NaN logits count as -infinity and +infinity as the largest float, so a broken model yields a
// token rather than undefined behaviour; if every logit is -infinity the lowest id is returned.
//
// Log-probabilities (when `logprobs` is set) follow vLLM's default (logprobs_mode
// "raw_logprobs", its V1 engine): the log-softmax of the model's logits as they came in, before
// penalties, temperature and filters, so they describe the model rather than the sampling
// settings. `LogprobsMode::kProcessed` gives instead the log-softmax of the distribution that
// was sampled from (after penalties, temperature and filters; filtered-out tokens are not
// listed); for greedy decoding that is the log-softmax of the penalised logits.
//
// Determinism: the random number for the n-th token of a sequence is SplitMix64 at position n
// of a stream seeded from `seed` alone (counter-based), so it does not depend on other
// sequences in the batch or on how often other samplers ran. The choice of id uses only IEEE
// arithmetic in a fixed order and the sampler's own exponential (no libm, no
// std::*_distribution, whose output is implementation-defined), so the same binary gives the
// same ids for the same params and logits on every machine, whatever its C library (the
// reported log-probabilities use std::log and may differ in the last bit). The caller picks a
// random seed when a request names none.
//
// Speed: a few linear passes over the vocabulary per token (the exponential vectorizes); no
// full sort. Tokens are grouped into buckets of 1/32 (scaled) logit below the maximum; top-k
// counts tokens per bucket and runs nth_element only inside the bucket holding the k-th;
// top-p sums each bucket's probability and sorts only the bucket where the cumulative
// probability crosses top_p (a growing prefix of it, 64 tokens then doubling).
//
// Threading: a Sampler belongs to one sequence; not safe to call from several threads at once.
// Different Samplers are independent.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"

namespace cloister::llm {

// Which distribution the reported log-probabilities come from (see the header comment).
enum class LogprobsMode { kRaw, kProcessed };

struct SamplingParams {
  float temperature = 1.0f;         // [0, 2]; below 1e-5: greedy (argmax, ties to the lowest id)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; HF semantics over prompt and generated tokens
  float presence_penalty = 0.0f;    // [-2, 2]; OpenAI semantics over generated tokens
  float frequency_penalty = 0.0f;   // [-2, 2]
  uint64_t seed = 0;
  bool logprobs = false;
  int32_t top_logprobs = 0;  // 0..20; needs logprobs
  LogprobsMode logprobs_mode = LogprobsMode::kRaw;
};

// The largest top_logprobs accepted (OpenAI's limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// OK, or InvalidArgument with a one-line message naming the first bad field and its value,
// e.g. "temperature must be in [0, 2], got 3".
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0;              // of `id`; 0 unless params.logprobs
  std::vector<TokenLogprob> top;  // the top_logprobs most likely, most likely first
};

class Sampler {
 public:
  // `params` should have passed ValidateSamplingParams; out-of-range values are not rejected
  // here but give unspecified (still memory-safe) sampling.
  explicit Sampler(const SamplingParams& params);

  // Records the prompt for the repetition penalty, replacing an earlier prompt. Ids outside
  // the vocabulary of a later Sample call are ignored there.
  void SetPrompt(std::span<const int32_t> prompt_ids);

  // Samples from `logits` (one float per vocabulary entry, at least one; the contents are used
  // as scratch and changed), then records the token as generated.
  SampledToken Sample(std::span<float> logits);

  // Greedy decoding without penalties or log-probabilities: the token is then the argmax of
  // the logits as they come, which an engine may pick itself (StepSequence::argmax).
  bool plain_greedy() const;
  // Records `id`, picked by an engine for a plain_greedy() sampler, as generated.
  SampledToken Accept(int32_t id);

  // How many tokens Sample has produced (the position in the random stream).
  int64_t generated_count() const { return step_; }

  // The uniform number in [0, 1) that Sample uses for the token at `position` of a sequence
  // with `seed` (exposed so tests can check the stream).
  static double UniformForTest(uint64_t seed, int64_t position);

 private:
  void ApplyPenalties(std::span<float> logits) const;
  void Record(int32_t id);
  // buckets_[id]: how far logits[id] is below `max`, in top-k/top-p buckets (see the .cc).
  void ComputeBuckets(std::span<const float> logits, float max);
  // The sampling steps after temperature, for logits whose maximum `max` is finite.
  // top-k: fills candidates_ (the k most likely ids, in id order) and their weights_; returns
  // the k-th most likely id.
  int32_t SelectTopK(std::span<const float> logits, float max);
  // top-p over the candidates (weights_ filled): the least likely id to keep, or `cutoff` when
  // rounding keeps every bucket.
  int32_t TopPCutoff(std::span<const float> logits, float max, bool all_candidates,
                     int32_t cutoff);
  // min-p and the draw among the kept candidates; `kept_total` gets their summed weight.
  int32_t Draw(std::span<const float> logits, bool all_candidates, int32_t cutoff,
               double& kept_total);

  SamplingParams params_;
  int64_t step_ = 0;
  std::unordered_set<int32_t> prompt_ids_;
  std::unordered_map<int32_t, int32_t> generated_counts_;
  // Scratch reused across calls so a 128k vocabulary does not allocate per token.
  std::vector<uint16_t> buckets_;      // by id
  std::vector<int32_t> bucket_count_;  // top-k: tokens per bucket
  std::vector<double> bucket_mass_;    // top-p: probability mass per bucket
  std::vector<int32_t> members_;       // the tokens of the bucket where top-k/top-p cut
  std::vector<int32_t> candidates_;    // the top-k ids in id order
  std::vector<double> weights_;        // e^(logit - max) by id
  std::vector<float> raw_;             // the logits as they came, for raw logprobs
};

// The greedy token of `logits`: the first maximum (ties go to the lowest id), a NaN never chosen
// over a number; 0 when no entry is above -infinity (all -inf or NaN). The Sampler's greedy
// choice and the CPU engine's pick for StepSequence::argmax are both this.
int32_t GreedyId(std::span<const float> logits);

}  // namespace cloister::llm
