#include "enclave/llm/generator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <tuple>
#include <optional>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/llm/block_manager.h"
#include "enclave/llm/stop_matcher.h"
#include "proto/error_reason.h"

namespace cloister::llm {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "none";
}

void TenantCounters::Arrive(const std::string& tenant) {
  Tenant& t = tenants_[tenant];
  if (t.active == 0) {
    double lowest = std::numeric_limits<double>::infinity();
    for (const auto& [name, other] : tenants_) {
      if (other.active > 0) lowest = std::min(lowest, other.counter);
    }
    if (std::isfinite(lowest)) t.counter = std::max(t.counter, lowest);
  }
  ++t.active;
}

void TenantCounters::Leave(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.active > 0) --it->second.active;
}

double TenantCounters::counter(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.counter;
}

namespace {

struct Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t prompt_size = 0;
  int64_t computed = 0;  // tokens whose keys and values are in the cache
  int64_t cached = 0;    // prompt tokens taken from the prefix cache
  std::vector<int32_t> blocks;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  std::unique_ptr<StopMatcher> stop;
  bool admitted = false;
  bool registered_prefix = false;
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_size; }
};

int64_t BlocksFor(int64_t tokens, int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace

class Generator::Impl {
 public:
  Impl(const Model& model, const GeneratorOptions& options, std::unique_ptr<StepEngine> engine)
      : model_(model),
        options_(options),
        engine_(std::move(engine)),
        blocks_(engine_->num_blocks(), options.block_size,
                [this](int32_t block) { engine_->ScrubBlock(block); }),
        counters_(options.counters ? options.counters : std::make_shared<TenantCounters>()) {}

  absl::StatusOr<uint64_t> Add(GenerationRequest request) {
    const ModelConfig& config = model_.config();
    RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
    const int64_t prompt = static_cast<int64_t>(request.prompt_ids.size());
    if (prompt == 0) return absl::InvalidArgumentError("the prompt has no tokens");
    for (int32_t id : request.prompt_ids) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt token id ", id, " is not below the vocabulary size ",
                         config.vocab_size));
      }
    }
    const int64_t context = config.max_position_embeddings;
    if (prompt >= context) {
      return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt,
                                                     " tokens; the model's context holds ",
                                                     context, " (prompt and output together)"));
    }
    if (request.max_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_tokens must be at least 1, got ", request.max_tokens));
    }
    if (prompt + request.max_tokens > context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_tokens ", request.max_tokens, " with a prompt of ", prompt,
          " tokens runs past the model's context of ", context, " tokens (at most ",
          context - prompt, ")"));
    }
    if (!request.prefix_salt.empty() &&
        (request.prefix_salt.size() < BlockManager::kMinSaltSize ||
         request.prefix_salt.size() > BlockManager::kMaxSaltSize)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the prefix-cache salt must be ", BlockManager::kMinSaltSize, " to ",
          BlockManager::kMaxSaltSize, " bytes, got ", request.prefix_salt.size()));
    }
    if (!(request.weight > 0) || !std::isfinite(request.weight)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tenant's weight must be a positive number, got ", request.weight));
    }
    const int64_t needed = BlocksFor(prompt + request.max_tokens, options_.block_size);
    if (auto quota = kv_quotas_.find(request.tenant);
        quota != kv_quotas_.end() && needed > quota->second) {
      return proto::WithReason(
          absl::ResourceExhaustedError(absl::StrCat(
              "the sequence needs ", needed * options_.block_size,
              " tokens of KV cache (prompt and max_tokens); the tenant's KV quota is ",
              quota->second * options_.block_size, " tokens")),
          api::v1::QUOTA_EXCEEDED);
    }
    if (needed > engine_->num_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the sequence needs ", needed, " KV blocks; the cache has ",
                       engine_->num_blocks()));
    }
    auto sequence = std::make_unique<Sequence>();
    sequence->id = next_id_++;
    sequence->tokens = request.prompt_ids;
    sequence->prompt_size = prompt;
    sequence->sampler = std::make_unique<Sampler>(request.sampling);
    sequence->sampler->SetPrompt(request.prompt_ids);
    sequence->decoder = std::make_unique<StreamDecoder>(model_.tokenizer(), true);
    sequence->stop = std::make_unique<StopMatcher>(request.stop);
    // A tenant that had nothing waiting comes back at the lowest counter of those that did:
    // time away earns no credit over tenants that kept the engine busy.
    counters_->Arrive(request.tenant);
    sequence->request = std::move(request);
    const uint64_t id = sequence->id;
    order_.push_back(id);
    sequences_.emplace(id, std::move(sequence));
    return id;
  }

  void Cancel(uint64_t id) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) return;
    Release(*it->second);
    cancelled_.push_back(id);
  }

  bool idle() const { return sequences_.empty() && cancelled_.empty(); }
  size_t active() const { return sequences_.size(); }
  const StepEngine& engine() const { return *engine_; }
  double tenant_service(const std::string& tenant) const { return counters_->counter(tenant); }
  std::optional<Generator::Rank> next_rank() const {
    std::optional<Generator::Rank> best;
    for (const auto& [id, s] : sequences_) {
      Generator::Rank rank{static_cast<int>(s->request.priority),
                           counters_->counter(s->request.tenant)};
      if (!best || rank < *best) best = rank;
    }
    if (!best && !cancelled_.empty()) best = Generator::Rank{0, 0};  // its events are due
    return best;
  }
  int64_t preemptions() const { return preemptions_; }
  int64_t interrupted_steps() const { return interrupted_steps_; }
  void set_interrupt(const std::atomic<bool>* flag) { interrupt_ = flag; }
  const std::vector<Generator::StepPart>& last_step() const { return last_step_; }
  std::vector<Generator::Occupancy> occupancy() const {
    std::map<std::pair<std::string, int>, Generator::Occupancy> by_key;
    for (const auto& [id, s] : sequences_) {
      const auto key = std::make_pair(s->request.tenant, static_cast<int>(s->request.priority));
      Generator::Occupancy& entry = by_key[key];
      entry.tenant = s->request.tenant;
      entry.priority = s->request.priority;
      ++(s->admitted ? entry.running : entry.waiting);
      entry.kv_blocks += static_cast<int64_t>(s->blocks.size());
    }
    std::vector<Generator::Occupancy> out;
    out.reserve(by_key.size());
    for (auto& [key, entry] : by_key) out.push_back(std::move(entry));
    return out;
  }
  int64_t kv_blocks(uint64_t sequence) const {
    auto it = sequences_.find(sequence);
    return it == sequences_.end() ? 0 : static_cast<int64_t>(it->second->blocks.size());
  }
  int32_t kv_blocks_total() const { return engine_->num_blocks(); }
  int32_t block_size() const { return options_.block_size; }
  void set_prefill_cap(int32_t tokens) { prefill_cap_ = tokens; }
  void SetTenantKvQuota(const std::string& tenant, int64_t tokens) {
    if (tokens <= 0) {
      kv_quotas_.erase(tenant);
      blocks_.SetTenantQuota(tenant, engine_->num_blocks());
      return;
    }
    const int64_t blocks = std::min<int64_t>(tokens / options_.block_size, engine_->num_blocks());
    kv_quotas_[tenant] = blocks;
    blocks_.SetTenantQuota(tenant, static_cast<int32_t>(blocks));
  }

  absl::StatusOr<std::vector<TokenEvent>> Step() {
    last_step_.clear();
    std::vector<TokenEvent> events = TakeCancelled();
    Admit();
    std::vector<Scheduled> scheduled = Schedule();
    if (scheduled.empty()) return events;
    std::vector<Sequence*> step;
    for (const Scheduled& part : scheduled) step.push_back(part.sequence);
    std::vector<StepSequence> parts = MakeParts(scheduled);
    // A step with no realtime sequence in it may be given up part-way for a realtime arrival
    // (set_interrupt); nothing of it counts, and its sequences run again in the next step.
    bool interruptible = interrupt_ != nullptr;
    for (const Scheduled& part : scheduled) {
      interruptible &= part.sequence->request.priority != Priority::kRealtime;
    }
    engine_->SetInterrupt(interruptible ? interrupt_ : nullptr);
    absl::Status stepped = engine_->Step(parts, result_);
    if (interruptible && absl::IsCancelled(stepped) && interrupt_->load()) {
      ++interrupted_steps_;
      return events;
    }
    RETURN_IF_ERROR(stepped);
    Charge(scheduled, parts);
    for (const Scheduled& part : scheduled) last_step_.push_back({part.sequence->id, part.count});

    const int64_t vocab = model_.config().vocab_size;
    int64_t logit_index = 0;
    size_t output = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      Sequence& s = *step[i];
      s.computed += static_cast<int64_t>(parts[i].tokens.size());
      if (!s.registered_prefix && s.computed >= s.prompt_size) RegisterPrefix(s);
      if (!parts[i].want_logits) continue;
      TokenEvent event;
      event.sequence = s.id;
      const int32_t chosen = result_.ids[output++];
      if (chosen >= 0) {
        event.token = s.sampler->Accept(chosen);
      } else {
        std::span<float> row(result_.logits.data() + logit_index * vocab, vocab);
        ++logit_index;
        event.token = s.sampler->Sample(row);
      }
      s.tokens.push_back(event.token.id);
      ASSIGN_OR_RETURN(const FinishReason finish, Emit(s, event));
      events.push_back(std::move(event));
      if (finish != FinishReason::kNone) {
        Release(s);
        Remove(s.id);
      }
    }
    return events;
  }

 private:
  // The events of the sequences cancelled since the last step, which are removed.
  std::vector<TokenEvent> TakeCancelled() {
    std::vector<TokenEvent> events;
    for (uint64_t id : cancelled_) {
      TokenEvent event;
      event.sequence = id;
      event.finish = FinishReason::kCancelled;
      if (auto it = sequences_.find(id); it != sequences_.end()) {
        event.completion_tokens = it->second->generated();
        event.cached_tokens = it->second->cached;
      }
      Remove(id);
      events.push_back(std::move(event));
    }
    cancelled_.clear();
    return events;
  }

  // One sequence's share of a step: its next `count` tokens.
  struct Scheduled {
    Sequence* sequence;
    int64_t count;
  };

  static int64_t Remaining(const Sequence& s) {
    return static_cast<int64_t>(s.tokens.size()) - s.computed;
  }
  // Who goes first: the higher class, then the tenant with less service, then arrival.
  auto Rank(const Sequence& s) const {
    return std::make_tuple(static_cast<int>(s.request.priority),
                           counters_->counter(s.request.tenant), s.id);
  }
  void SortByRank(std::vector<Sequence*>& list) const {
    std::sort(list.begin(), list.end(),
              [this](const Sequence* a, const Sequence* b) { return Rank(*a) < Rank(*b); });
  }

  // Decode tokens of running sequences first, then prefill chunks, under the token budget, each
  // in rank order. While a realtime sequence decodes, other classes' prefill only fills the step
  // up to realtime_step_tokens; a step with a realtime prompt in it has no other prefill.
  std::vector<Scheduled> Schedule() const {
    std::vector<Sequence*> decode, prefill;
    for (uint64_t id : order_) {
      Sequence& s = *sequences_.at(id);
      if (!s.admitted) continue;
      (Remaining(s) <= 1 ? decode : prefill).push_back(&s);
    }
    SortByRank(decode);
    SortByRank(prefill);
    std::vector<Scheduled> step;
    int64_t budget = options_.max_step_tokens;
    bool realtime_decodes = false;
    for (Sequence* s : decode) {
      if (budget <= 0) break;
      step.push_back({s, 1});
      budget -= 1;
      realtime_decodes |= s->request.priority == Priority::kRealtime;
    }
    int64_t used = options_.max_step_tokens - budget;
    bool realtime_prefills = false;
    for (Sequence* s : prefill) {
      int64_t room = budget;
      if (s->request.priority != Priority::kRealtime) {
        // A realtime prompt's step carries no other prefill: its first token comes as soon
        // as it would alone, but for the other sequences' decodes.
        if (realtime_prefills) break;
        if (realtime_decodes) room = std::min<int64_t>(room, options_.realtime_step_tokens - used);
        if (prefill_cap_ > 0) room = std::min<int64_t>(room, prefill_cap_ - used);
      }
      if (room <= 0) continue;
      const int64_t count = std::min<int64_t>(room, Remaining(*s));
      step.push_back({s, count});
      budget -= count;
      used += count;
      realtime_prefills |= s->request.priority == Priority::kRealtime;
    }
    return step;
  }

  // Adds each scheduled sequence's cost to its tenant's counter: its prefill tokens at the
  // prompt price, the token it sampled (if any) at the completion price, over its weight.
  void Charge(const std::vector<Scheduled>& scheduled, const std::vector<StepSequence>& parts) {
    for (size_t i = 0; i < scheduled.size(); ++i) {
      const Sequence& s = *scheduled[i].sequence;
      double cost = 0;
      if (scheduled[i].count > 1 || s.computed < s.prompt_size) {
        cost += options_.prompt_token_cost * static_cast<double>(scheduled[i].count);
      }
      if (parts[i].want_logits) cost += options_.completion_token_cost;
      counters_->at(s.request.tenant).counter += cost / s.request.weight;
    }
  }

  // The engine's parts for the scheduled sequences: each its next tokens.
  std::vector<StepSequence> MakeParts(const std::vector<Scheduled>& step) const {
    std::vector<StepSequence> parts;
    for (const Scheduled& scheduled : step) {
      Sequence* s = scheduled.sequence;
      StepSequence part;
      const int64_t count = scheduled.count;
      part.tokens = std::span<const int32_t>(s->tokens).subspan(s->computed, count);
      part.start_position = s->computed;
      part.block_table = s->blocks;
      part.want_logits = s->computed + count == static_cast<int64_t>(s->tokens.size());
      part.argmax = s->sampler->plain_greedy();
      parts.push_back(part);
    }
    return parts;
  }

  // Fills the event's text (and, when the sequence ends, its finish and counts) for the token
  // just appended to `s`; returns why the sequence ends, kNone while it goes on.
  absl::StatusOr<FinishReason> Emit(Sequence& s, TokenEvent& event) {
    FinishReason finish = FinishReason::kNone;
    const ModelConfig& config = model_.config();
    const int32_t id = event.token.id;
    bool is_stop_token = std::find(s.request.stop_token_ids.begin(),
                                   s.request.stop_token_ids.end(), id) !=
                         s.request.stop_token_ids.end();
    if (!s.request.ignore_eos &&
        std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) !=
            config.eos_token_ids.end()) {
      is_stop_token = true;
    }
    if (is_stop_token) {
      finish = FinishReason::kStop;
    } else {
      ASSIGN_OR_RETURN(std::string delta, s.decoder->Push(id));
      StopMatcher::Result emitted = s.stop->Push(delta);
      event.text = std::move(emitted.text);
      if (emitted.stopped) finish = FinishReason::kStop;
    }
    if (finish == FinishReason::kNone &&
        (s.generated() >= s.request.max_tokens ||
         static_cast<int64_t>(s.tokens.size()) >= config.max_position_embeddings)) {
      finish = FinishReason::kLength;
    }
    if (finish != FinishReason::kNone) {
      if (!s.stop->stopped()) {
        StopMatcher::Result tail = s.stop->Push(s.decoder->Finish());
        event.text += tail.text;
        if (!tail.stopped) event.text += s.stop->Finish();
      }
      event.finish = finish;
      event.cached_tokens = s.cached;
      event.completion_tokens = s.generated();
    }
    return finish;
  }

  // Admits waiting sequences in rank order while there are slots and KV blocks for them,
  // preempting lower classes' sequences to make room; the first that cannot get in stops the
  // others behind it (so none overtakes it).
  void Admit() {
    int64_t running = 0;
    std::vector<Sequence*> waiting;
    for (uint64_t id : order_) {
      Sequence& s = *sequences_.at(id);
      if (s.admitted) {
        ++running;
      } else {
        waiting.push_back(&s);
      }
    }
    SortByRank(waiting);
    for (Sequence* next : waiting) {
      Sequence& s = *next;
      if (s.admitted) continue;
      while (running >= options_.max_sequences) {
        if (!PreemptBelow(s.request.priority)) return;
        --running;
      }
      if (OverKvQuota(s)) continue;  // waits for its own tenant's blocks; others may go
      while (!TryAllocate(s)) {
        if (!PreemptBelow(s.request.priority)) return;  // wait for blocks
        --running;
      }
      ++running;
    }
  }

  // Whether `s` needs more fresh blocks than its tenant's KV quota has left (freeing other
  // tenants' blocks would not help it).
  bool OverKvQuota(const Sequence& s) const {
    auto quota = kv_quotas_.find(s.request.tenant);
    if (quota == kv_quotas_.end()) return false;
    const int64_t needed = BlocksFor(s.prompt_size + s.request.max_tokens, options_.block_size);
    return blocks_.used_blocks(s.request.tenant) + needed > quota->second;
  }

  // The newest running sequence of the lowest class below `priority` gives its blocks back and
  // waits to be recomputed; false when there is none.
  bool PreemptBelow(Priority priority) {
    Sequence* victim = nullptr;
    for (uint64_t id : order_) {
      Sequence& s = *sequences_.at(id);
      if (!s.admitted || s.request.priority <= priority) continue;
      if (victim == nullptr || s.request.priority > victim->request.priority ||
          (s.request.priority == victim->request.priority && s.id > victim->id)) {
        victim = &s;
      }
    }
    if (victim == nullptr) return false;
    Release(*victim);
    victim->computed = 0;
    victim->cached = 0;
    ++preemptions_;
    return true;
  }

  // Gives `s` the KV blocks for its whole length (the prefix cache's where they match); false,
  // changing nothing, when the pool or the tenant's quota cannot.
  bool TryAllocate(Sequence& s) {
    {
      const int64_t total = s.prompt_size + s.request.max_tokens;
      std::vector<int32_t> cached;
      if (!s.request.prefix_salt.empty()) {
        cached = blocks_.MatchPrefix(s.request.tenant, s.request.prefix_salt,
                                     std::span<const int32_t>(s.tokens).first(s.prompt_size));
        // Keep the prompt's last token to compute: its logits start the output.
        while (!cached.empty() &&
               static_cast<int64_t>(cached.size()) * options_.block_size >= s.prompt_size) {
          blocks_.Release(s.request.tenant, std::span<const int32_t>(&cached.back(), 1));
          cached.pop_back();
        }
      }
      const int64_t fresh = BlocksFor(total, options_.block_size) - static_cast<int64_t>(cached.size());
      absl::StatusOr<std::vector<int32_t>> allocated =
          blocks_.Allocate(s.request.tenant, static_cast<int32_t>(fresh));
      if (!allocated.ok()) {
        blocks_.Release(s.request.tenant, cached);
        return false;
      }
      s.blocks = std::move(cached);
      s.cached = static_cast<int64_t>(s.blocks.size()) * options_.block_size;
      s.computed = s.cached;
      s.blocks.insert(s.blocks.end(), allocated->begin(), allocated->end());
      s.admitted = true;
      return true;
    }
  }

  void RegisterPrefix(Sequence& s) {
    s.registered_prefix = true;
    if (s.request.prefix_salt.empty()) return;
    std::span<const int32_t> prompt = std::span<const int32_t>(s.tokens).first(s.prompt_size);
    blocks_.RegisterFullBlocks(s.request.tenant, s.request.prefix_salt, prompt, s.blocks);
  }

  void Release(Sequence& s) {
    if (!s.blocks.empty()) blocks_.Release(s.request.tenant, s.blocks);
    s.blocks.clear();
    s.admitted = false;
  }

  void Remove(uint64_t id) {
    if (auto it = sequences_.find(id); it != sequences_.end()) {
      counters_->Leave(it->second->request.tenant);
    }
    sequences_.erase(id);
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  }

  const Model& model_;
  GeneratorOptions options_;
  std::unique_ptr<StepEngine> engine_;
  BlockManager blocks_;
  uint64_t next_id_ = 1;
  std::deque<uint64_t> order_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences_;
  std::vector<uint64_t> cancelled_;
  std::shared_ptr<TenantCounters> counters_;
  int64_t preemptions_ = 0;
  int64_t interrupted_steps_ = 0;
  const std::atomic<bool>* interrupt_ = nullptr;
  int32_t prefill_cap_ = 0;
  std::unordered_map<std::string, int64_t> kv_quotas_;  // blocks, per tenant with a quota
  StepResult result_;
  std::vector<Generator::StepPart> last_step_;
};

absl::StatusOr<int32_t> KvBlocksFor(const ModelConfig& config, const GeneratorOptions& options) {
  if (options.block_size < 1 || options.max_sequences < 1) {
    return absl::InvalidArgumentError("block_size and max_sequences must be at least 1");
  }
  int64_t blocks = options.kv_blocks;
  if (blocks == 0) {
    blocks = options.max_sequences * BlocksFor(config.max_position_embeddings, options.block_size);
  }
  if (blocks < 1 || blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("kv_blocks ", blocks, " is out of range"));
  }
  return static_cast<int32_t>(blocks);
}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(const Model& model,
                                                            const GeneratorOptions& options) {
  if (options.threads < 1 || options.block_size < 1 || options.max_sequences < 1 ||
      options.max_step_tokens < 1) {
    return absl::InvalidArgumentError(
        "threads, block_size, max_sequences and max_step_tokens must be at least 1");
  }
  ASSIGN_OR_RETURN(int32_t blocks, KvBlocksFor(model.config(), options));
  EngineOptions engine_options;
  engine_options.threads = options.threads;
  engine_options.num_blocks = blocks;
  engine_options.block_size = options.block_size;
  ASSIGN_OR_RETURN(std::unique_ptr<StepEngine> engine, MakeCpuEngine(model, engine_options));
  return Create(model, options, std::move(engine));
}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(const Model& model,
                                                            const GeneratorOptions& options,
                                                            std::unique_ptr<StepEngine> engine) {
  if (options.threads < 1 || options.block_size < 1 || options.max_sequences < 1 ||
      options.max_step_tokens < 1) {
    return absl::InvalidArgumentError(
        "threads, block_size, max_sequences and max_step_tokens must be at least 1");
  }
  if (engine == nullptr || engine->block_size() != options.block_size) {
    return absl::InvalidArgumentError("the engine's block size differs from the generator's");
  }
  return std::unique_ptr<Generator>(
      new Generator(std::make_unique<Impl>(model, options, std::move(engine))));
}

Generator::Generator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Generator::~Generator() = default;
absl::StatusOr<uint64_t> Generator::Add(GenerationRequest request) {
  return impl_->Add(std::move(request));
}
void Generator::Cancel(uint64_t sequence) { impl_->Cancel(sequence); }
bool Generator::idle() const { return impl_->idle(); }
size_t Generator::active() const { return impl_->active(); }
double Generator::tenant_service(const std::string& tenant) const {
  return impl_->tenant_service(tenant);
}
int64_t Generator::preemptions() const { return impl_->preemptions(); }
std::vector<Generator::Occupancy> Generator::occupancy() const { return impl_->occupancy(); }
int32_t Generator::kv_blocks_total() const { return impl_->kv_blocks_total(); }
int64_t Generator::kv_blocks(uint64_t sequence) const { return impl_->kv_blocks(sequence); }
int32_t Generator::block_size() const { return impl_->block_size(); }
std::optional<Generator::Rank> Generator::next_rank() const { return impl_->next_rank(); }
void Generator::set_prefill_cap(int32_t tokens) { impl_->set_prefill_cap(tokens); }
void Generator::SetTenantKvQuota(const std::string& tenant, int64_t tokens) {
  impl_->SetTenantKvQuota(tenant, tokens);
}
absl::StatusOr<std::vector<TokenEvent>> Generator::Step() { return impl_->Step(); }
void Generator::set_interrupt(const std::atomic<bool>* flag) { impl_->set_interrupt(flag); }
int64_t Generator::interrupted_steps() const { return impl_->interrupted_steps(); }
const std::vector<Generator::StepPart>& Generator::last_step() const {
  return impl_->last_step();
}
const StepEngine& Generator::engine() const { return impl_->engine(); }

}  // namespace cloister::llm
