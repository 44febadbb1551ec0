// Generator: continuous batching over one Model. Sequences join (Add) and leave between steps;
// each Step() runs the model once over the decode tokens of running sequences and prefill chunks
// of new ones (chunked prefill under a per-step token budget, so a long prompt never stalls the
// others), samples, detokenizes (whole UTF-8 only) and applies stop strings, eos ids and
// max_tokens. KV blocks come from a BlockManager and are scrubbed when a sequence leaves.
//
// Fairness between tenants is the virtual token counter scheme (VTC, "Fairness in Serving Large
// Language Models", OSDI 2024) inside priority classes: each tenant's counter grows by the
// weighted cost of the tokens computed for it (prompt and generated tokens priced by
// GeneratorOptions) over its weight; admission, decode order and prefill chunks go to the lowest
// counter of the highest class first; a tenant that comes back after a pause has its counter
// lifted to the lowest of those still waiting, so idling earns no credit. A realtime decode keeps
// its step under realtime_step_tokens, and when slots or KV blocks run out for a sequence, the
// newest sequence of a lower class is preempted (blocks freed, recomputed when it comes back).
//
// Threading: not thread-safe; one thread owns a Generator and calls Step in a loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "enclave/llm/engine.h"
#include "enclave/llm/model.h"
#include "enclave/llm/sampler.h"

namespace cloister::llm {

// The fair-share state of tenants (virtual token counters): each Generator keeps its own, or
// several share one so that tenants are served fairly across models too (the enclave steps all
// its models' generators from one thread, the one whose next sequence ranks first). Not
// thread-safe: the generators that share it are driven by one thread.
class TenantCounters {
 public:
  struct Tenant {
    double counter = 0;  // weighted token service so far
    int64_t active = 0;  // sequences added and not finished, over all generators
  };
  // The tenant, created at 0.
  Tenant& at(const std::string& tenant) { return tenants_[tenant]; }
  // A tenant with nothing active comes back at the lowest counter of those with something.
  void Arrive(const std::string& tenant);
  void Leave(const std::string& tenant);
  double counter(const std::string& tenant) const;

 private:
  std::unordered_map<std::string, Tenant> tenants_;
};

struct GeneratorOptions {
  int32_t threads = 1;
  int32_t block_size = 16;
  // Blocks in the KV cache; 0 sizes it for max_sequences full contexts.
  int32_t kv_blocks = 0;
  int32_t max_sequences = 16;
  // Tokens one step may carry (decode tokens first, then prefill chunks).
  int32_t max_step_tokens = 512;
  // While a realtime sequence decodes, the tokens a step may carry in all: other classes'
  // prefill is chunked to fit, so a long prompt never stretches a realtime token's step.
  int32_t realtime_step_tokens = 64;
  // Token costs of the fair share (virtual token counters): what one prompt token and one
  // generated token count for, before the tenant's weight divides them.
  double prompt_token_cost = 1.0;
  double completion_token_cost = 2.0;
  // Shared counters (see TenantCounters); null: the generator's own.
  std::shared_ptr<TenantCounters> counters;
};

// A sequence's scheduling class: realtime before standard before batch, at every step and for
// KV memory (a batch sequence is preempted, its blocks freed and its tokens recomputed later,
// before a realtime one waits).
enum class Priority { kRealtime = 0, kStandard = 1, kBatch = 2 };

enum class FinishReason { kNone, kStop, kLength, kCancelled };
std::string_view FinishReasonName(FinishReason reason);

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;         // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;   // besides the model's eos ids
  bool ignore_eos = false;
  // Whose KV blocks these are (quota) and the tenant's prefix-cache salt, derived in the enclave
  // and never taken from a request; an empty salt turns the prefix cache off for this sequence.
  std::string tenant = "local";
  std::vector<uint8_t> prefix_salt;
  // Fair sharing between tenants (the operator's TenantLimits, passed by the host): within a
  // class, steps go to the tenant that has had the least weighted token service so far.
  Priority priority = Priority::kStandard;
  double weight = 1.0;  // > 0
};

// What one step produced for one sequence.
struct TokenEvent {
  uint64_t sequence = 0;
  SampledToken token;
  std::string text;  // text that became final with this token (whole UTF-8)
  FinishReason finish = FinishReason::kNone;
  // On the finishing event: prompt tokens whose KV came from the prefix cache, tokens generated.
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
};

// The KV blocks `options` ask for: kv_blocks, or (0) enough for max_sequences full contexts.
absl::StatusOr<int32_t> KvBlocksFor(const ModelConfig& config, const GeneratorOptions& options);

class Generator {
 public:
  // On the CPU engine with options.threads threads.
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const Model& model,
                                                          const GeneratorOptions& options);
  // On `engine` (its block size must be options.block_size; its blocks are the cache).
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const Model& model,
                                                          const GeneratorOptions& options,
                                                          std::unique_ptr<StepEngine> engine);
  ~Generator();

  // Queues a sequence; refuses a prompt that does not fit the context or bad sampling values.
  absl::StatusOr<uint64_t> Add(GenerationRequest request);
  // Stops the sequence before the next step and frees its blocks at once.
  void Cancel(uint64_t sequence);
  bool idle() const;
  // One engine step; events for the sequences that sampled a token (or were cancelled).
  absl::StatusOr<std::vector<TokenEvent>> Step();
  // The sequences the last Step ran and the tokens it computed for each (a prefill chunk's
  // length, 1 for a decode), in step order; empty when it ran nothing or failed. What a step's
  // time is shared by: a sequence waiting, or cancelled before the step, had no part in it.
  struct StepPart {
    uint64_t sequence = 0;
    int64_t tokens = 0;
  };
  const std::vector<StepPart>& last_step() const;
  // A flag (owned by the caller, null: none) that, once set, lets the engine give up a step in
  // which no realtime sequence runs, part-way (StepEngine::SetInterrupt): a realtime request
  // that arrives then waits for a layer of a best-effort step, not all of it. The step counts
  // for nothing (no tokens, no service, no time in last_step) and its sequences run again in
  // the next; the caller clears the flag. Engines that cannot stop a step ignore it.
  void set_interrupt(const std::atomic<bool>* flag);
  // Steps given up so far for the flag.
  int64_t interrupted_steps() const;

  const StepEngine& engine() const;
  // Sequences added and not yet finished (waiting or running).
  size_t active() const;
  // A tenant's virtual token counter (0 for one never seen), and how many sequences were
  // preempted so far: for tests and benchmarks.
  double tenant_service(const std::string& tenant) const;
  int64_t preemptions() const;
  // What each tenant's sequences of each class hold now, for the operator's gauges: sequences
  // running (admitted, with their KV blocks) and waiting, and the KV blocks they hold. One
  // entry per tenant and class with a sequence; sorted by tenant, then class.
  struct Occupancy {
    std::string tenant;
    Priority priority = Priority::kStandard;
    int64_t running = 0;
    int64_t waiting = 0;
    int64_t kv_blocks = 0;
  };
  std::vector<Occupancy> occupancy() const;
  // The KV blocks sequence `sequence` holds now (0 for one waiting, finished or unknown).
  int64_t kv_blocks(uint64_t sequence) const;
  // The KV cache's blocks in all, and the tokens one holds.
  int32_t kv_blocks_total() const;
  int32_t block_size() const;
  // Where this generator's next step would rank against another's (lower goes first): the
  // class and tenant counter of its best-ranked sequence, running or waiting; nothing when idle.
  struct Rank {
    int priority;
    double counter;
    bool operator<(const Rank& other) const {
      return priority != other.priority ? priority < other.priority : counter < other.counter;
    }
  };
  std::optional<Rank> next_rank() const;
  // While a realtime sequence runs elsewhere (another model's generator on the same cores), the
  // caller caps this generator's non-realtime prefill per step, as a realtime decode here does
  // (GeneratorOptions::realtime_step_tokens); 0 lifts the cap.
  void set_prefill_cap(int32_t tokens);
  // The KV memory a tenant's sequences may hold at once, in tokens (rounded down to whole
  // blocks; the host passes the operator's limit); a sequence that could never fit it is refused
  // by Add, one that does not fit now waits for the tenant's own blocks. 0: no quota.
  void SetTenantKvQuota(const std::string& tenant, int64_t tokens);

  class Impl;

 private:
  explicit Generator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cloister::llm
