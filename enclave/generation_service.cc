#include "enclave/generation_service.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/channel.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "crypto/receipt.h"
#include "enclave/llm/chat_template.h"
#include "enclave/llm/generator.h"
#include "enclave/step_transfer.h"
#include "nlohmann/json.hpp"
#include "proto/error_reason.h"
#include "proto/sealing.h"
#include "proto/wipe.h"

namespace cloister::enclave {

using api::v1::GenerateChunk;
using boundary::v1::EnclaveToHost;

namespace {

// How long a model's worker keeps its generator (KV cache, prefix cache) with nothing to run.
constexpr absl::Duration kIdleRelease = absl::Seconds(30);
constexpr char kPrefixSaltLabel[] = "cloister/v1 prefix cache salt";

// Bytes of a protobuf varint.
size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

// Zeros in `padding` so that the chunk serializes to a multiple of `pad_to` bytes (field 15 has
// a one-byte tag). pad_to 0 or 1: none.
void PadChunk(GenerateChunk& chunk, uint32_t pad_to) {
  chunk.clear_padding();
  if (pad_to <= 1) return;
  const size_t base = chunk.ByteSizeLong();
  if (base % pad_to == 0) return;
  size_t n = 1;
  while ((base + 1 + VarintSize(n) + n) % pad_to != 0) ++n;
  chunk.mutable_padding()->assign(n, '\0');
}

// The prompt's token ids: text through the tokenizer (with its special tokens), ids as given,
// chat messages through the model's template with the generation prompt.
absl::StatusOr<std::vector<int32_t>> PromptIds(const llm::Model& model,
                                               const api::v1::GenerateRequest& request) {
  switch (request.prompt_case()) {
    case api::v1::GenerateRequest::kText:
      return model.tokenizer().Encode(request.text(), /*add_special_tokens=*/true);
    case api::v1::GenerateRequest::kIds:
      return std::vector<int32_t>(request.ids().ids().begin(), request.ids().ids().end());
    case api::v1::GenerateRequest::kChat: {
      if (model.chat_template() == nullptr) {
        return absl::InvalidArgumentError(
            "the model's tokenizer_config.json has no chat_template: send text or token ids");
      }
      if (request.chat().messages().empty()) {
        return absl::InvalidArgumentError("the chat prompt has no messages");
      }
      nlohmann::json messages = nlohmann::json::array();
      for (const api::v1::ChatMessage& message : request.chat().messages()) {
        if (message.role().empty()) {
          return absl::InvalidArgumentError("every chat message needs a role");
        }
        messages.push_back({{"role", message.role()}, {"content", message.content()}});
      }
      nlohmann::json context = {{"messages", std::move(messages)},
                                {"add_generation_prompt", true},
                                {"bos_token", model.tokenizer().bos_token()},
                                {"eos_token", model.tokenizer().eos_token()}};
      ASSIGN_OR_RETURN(std::string rendered, model.chat_template()->Render(context));
      return model.tokenizer().Encode(rendered, /*add_special_tokens=*/false);
    }
    case api::v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the generate request has no prompt (text, ids or chat)");
}

llm::SamplingParams SamplingOf(const api::v1::SamplingParameters& p) {
  llm::SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  if (p.has_seed()) {
    s.seed = p.seed();
  } else {
    Bytes seed = crypto::RandomBytes(8);
    for (uint8_t b : seed) s.seed = (s.seed << 8) | b;
  }
  s.logprobs = p.logprobs();
  s.top_logprobs = p.top_logprobs();
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<llm::Generator>> GenerationService::MakeGenerator(
    const StoredModel& model, const llm::GeneratorOptions& options) {
  const llm::Model& llm = *model.llm;
  ASSIGN_OR_RETURN(int32_t blocks, llm::KvBlocksFor(llm.config(), options));
  llm::EngineOptions engine_options;
  engine_options.executor = model.llm_executor;
  engine_options.threads = options.threads;
  engine_options.num_blocks = blocks;
  engine_options.block_size = options.block_size;
  // The CPU engine computes from the model's weights; a device engine reads them from the
  // package the store kept for it (llm_files, empty for the CPU engine).
  ASSIGN_OR_RETURN(std::unique_ptr<llm::StepEngine> engine,
                   llm::CreateEngine(llm, model.llm_files, engine_options));
  if (options_.transfer != nullptr) {
    engine = MakeStepTransferEngine(std::move(engine), options_.transfer);
  }
  return llm::Generator::Create(llm, options, std::move(engine));
}

// One generation on its way: the request, where its chunks go and what they have said so far.
struct GenerationService::Stream {
  Request r;
  uint64_t sequence = 0;  // the Generator's id, once added
  uint64_t next_chunk = 0;
  uint32_t pad_to = kDefaultChunkPadding;
  uint32_t tokens_per_chunk = 1;
  // A fixed cadence (StreamShape.interval_ms): one chunk per tick; zero: none.
  absl::Duration interval = absl::ZeroDuration();
  absl::Time next_tick = absl::InfiniteFuture();
  // Once the final chunk is in `pending`, waiting for the next tick (a fixed cadence): its
  // receipt, when it has one.
  std::optional<boundary::v1::SignedUsageReceipt> held_receipt;
  GenerateChunk pending;  // tokens not yet sent
  uint32_t pending_tokens = 0;
  uint64_t prompt_tokens = 0;
  uint64_t tokens = 0;   // sampled so far
  double charged = 0;    // tokens taken from the tenant's bucket at admission
  bool added = false;    // in the Generator (its prompt counts as used)
  double execution_ns = 0;  // this sequence's share of the steps it was in
  double kv_block_ns = 0;   // KV blocks held times the steps' wall time
  // Why the stream is being cut short (a deadline), sent once its sequence has left.
  absl::Status cut;
  bool ended = false;
};

// One model's generator and the streams in it. Owned by the stepping thread.
struct GenerationService::Engine {
  std::shared_ptr<const StoredModel> model;
  std::unique_ptr<llm::Generator> generator;
  std::map<uint64_t, std::unique_ptr<Stream>> running;  // by the Generator's sequence id
  absl::Time idle_since = absl::InfinitePast();
};

void GenerationService::Loop() {
  while (true) {
    std::deque<std::unique_ptr<Stream>> incoming;
    std::vector<uint64_t> cancels;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      bool busy = false;
      for (const auto& [handle, engine] : engines_) busy |= !engine->generator->idle();
      if (!busy) {
        // Nothing to step: wait for work (or the next tick of a fixed-cadence stream), and let
        // generators (their KV caches) and models go when none comes for a while.
        const absl::Duration until_tick = next_tick_ - absl::Now();
        mu_.AwaitWithTimeout(absl::Condition(this, &GenerationService::HasWorkLocked),
                             std::max(absl::ZeroDuration(), std::min(kIdleRelease, until_tick)));
      }
      incoming.swap(incoming_);
      interrupt_.store(false);  // what set it is in `incoming` now
      cancels.swap(cancels_);
      stopping = stopping_;
    }
    for (auto& stream : incoming) Admit(std::move(stream));
    for (uint64_t call_id : cancels) {
      for (auto& [handle, engine] : engines_) {
        for (auto& [sequence, stream] : engine->running) {
          if (stream->r.call_id == call_id) engine->generator->Cancel(sequence);
        }
      }
    }
    if (stopping) {
      Tick(absl::Now(), /*all_final=*/true);
      for (auto& [handle, engine] : engines_) {
        for (auto& [sequence, stream] : engine->running) {
          Fail(*stream, proto::WithReason(absl::UnavailableError("the enclave worker is stopping"),
                                          api::v1::WORKER_EXITED));
        }
      }
      engines_.clear();
      return;
    }
    const absl::Time now = clock_->Now();
    for (auto& [handle, engine] : engines_) {
      for (auto& [sequence, stream] : engine->running) {
        if (stream->cut.ok() && stream->r.deadline && now >= *stream->r.deadline) {
          stream->cut = absl::DeadlineExceededError(
              absl::StrCat("generation passed its deadline after ", stream->tokens, " tokens"));
          engine->generator->Cancel(sequence);
        }
      }
    }
    // The model whose next sequence ranks first (class, then its tenant's service) steps.
    Engine* next = nullptr;
    std::optional<llm::Generator::Rank> best;
    for (auto& [handle, engine] : engines_) {
      std::optional<llm::Generator::Rank> rank = engine->generator->next_rank();
      if (rank && (!best || *rank < *best)) {
        best = rank;
        next = engine.get();
      }
    }
    const absl::Time wall = absl::Now();
    if (best && best->priority == static_cast<int>(llm::Priority::kRealtime)) last_realtime_ = wall;
    if (next != nullptr) {
      // Realtime work now or lately: the other classes' prefill goes in short chunks.
      next->generator->set_prefill_cap(
          wall - last_realtime_ < options_.realtime_guard ? options_.realtime_step_tokens : 0);
      Step(*next);
    }
    next_tick_ = Tick(absl::Now());
    PublishOccupancy();
    for (auto it = engines_.begin(); it != engines_.end();) {
      Engine& engine = *it->second;
      if (!engine.generator->idle()) {
        engine.idle_since = absl::InfinitePast();
      } else if (engine.idle_since == absl::InfinitePast()) {
        engine.idle_since = wall;
      }
      if (engine.generator->idle() && wall - engine.idle_since >= kIdleRelease) {
        it = engines_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void GenerationService::PublishOccupancy() {
  std::map<std::pair<std::string, int>, llm::Generator::Occupancy> by_key;
  Occupancy occupancy;
  occupancy.interrupted_steps = interrupted_steps_;
  for (const auto& [handle, engine] : engines_) {
    occupancy.kv_blocks_total += engine->generator->kv_blocks_total();
    occupancy.kv_block_size = engine->generator->block_size();
    for (llm::Generator::Occupancy& entry : engine->generator->occupancy()) {
      llm::Generator::Occupancy& sum =
          by_key[{entry.tenant, static_cast<int>(entry.priority)}];
      sum.tenant = entry.tenant;
      sum.priority = entry.priority;
      sum.running += entry.running;
      sum.waiting += entry.waiting;
      sum.kv_blocks += entry.kv_blocks;
    }
  }
  for (auto& [key, entry] : by_key) occupancy.tenants.push_back(std::move(entry));
  absl::MutexLock lock(&occupancy_mu_);
  occupancy_ = std::move(occupancy);
}

GenerationService::Occupancy GenerationService::occupancy() {
  absl::MutexLock lock(&occupancy_mu_);
  return occupancy_;
}

bool GenerationService::HasWorkLocked() const {
  return stopping_ || !incoming_.empty() || !cancels_.empty();
}

void GenerationService::Admit(std::unique_ptr<Stream> stream) {
  const auto& model = stream->r.model;
  std::unique_ptr<Engine>& slot = engines_[stream->r.model_handle];
  if (slot != nullptr && slot->model != model) {
    // A model reloaded under the same handle starts afresh once the old one's sequences are
    // done; a request that comes before then is refused.
    if (!slot->running.empty()) {
      Fail(*stream, absl::UnavailableError("the model was reloaded; send the request again"));
      return;
    }
    slot.reset();
  }
  if (slot == nullptr) {
    llm::GeneratorOptions options;
    options.threads = options_.threads;
    options.max_sequences = options_.max_sequences;
    options.max_step_tokens = options_.max_step_tokens;
    options.realtime_step_tokens = options_.realtime_step_tokens;
    options.counters = counters_;
    absl::StatusOr<std::unique_ptr<llm::Generator>> generator = MakeGenerator(*model, options);
    if (!generator.ok()) {
      engines_.erase(stream->r.model_handle);
      Fail(*stream, generator.status());
      return;
    }
    slot = std::make_unique<Engine>();
    slot->model = model;
    slot->generator = *std::move(generator);
    slot->generator->set_interrupt(&interrupt_);
  }
  Engine& engine = *slot;
  const api::v1::GenerateRequest& request = stream->r.request;
  const llm::Model& llm = *model->llm;
  absl::StatusOr<std::vector<int32_t>> prompt = PromptIds(llm, request);
  if (!prompt.ok()) {
    Fail(*stream, prompt.status());
    return;
  }
  stream->prompt_tokens = prompt->size();
  llm::GenerationRequest g;
  const int64_t context = llm.config().max_position_embeddings;
  const int64_t room = std::max<int64_t>(context - static_cast<int64_t>(prompt->size()), 1);
  const uint64_t limit = stream->r.max_tokens_limit;
  if (limit != 0 && request.max_tokens() > limit) {
    Fail(*stream, proto::WithReason(absl::ResourceExhaustedError(absl::StrCat(
                                        "max_tokens ", request.max_tokens(),
                                        " is over the tenant's limit of ", limit)),
                                    api::v1::TOO_LARGE));
    return;
  }
  if (request.max_tokens() > static_cast<uint64_t>(INT64_MAX)) {
    Fail(*stream, absl::InvalidArgumentError("max_tokens is out of range"));
    return;
  }
  g.max_tokens = request.max_tokens() != 0 ? static_cast<int64_t>(request.max_tokens()) : room;
  if (request.max_tokens() == 0 && limit != 0) {
    g.max_tokens = std::min<int64_t>(g.max_tokens, static_cast<int64_t>(limit));
  }
  const double cost = static_cast<double>(prompt->size() + static_cast<size_t>(g.max_tokens));
  if (absl::Status taken = TakeTokens(*stream, cost); !taken.ok()) {
    Fail(*stream, taken);
    return;
  }
  engine.generator->SetTenantKvQuota(stream->r.tenant_id,
                                     static_cast<int64_t>(std::min<uint64_t>(
                                         stream->r.kv_cache_tokens, uint64_t{1} << 40)));
  g.prompt_ids = *std::move(prompt);
  g.sampling = SamplingOf(request.sampling());
  g.stop.assign(request.stop().begin(), request.stop().end());
  g.ignore_eos = request.ignore_eos();
  g.tenant = stream->r.tenant_id;
  g.priority = stream->r.priority;
  g.weight = stream->r.weight;
  Bytes salt = ToBytes(kPrefixSaltLabel);
  AppendLengthPrefixed(salt, stream->r.session->identity_public_key());
  g.prefix_salt = crypto::Sha256(salt);
  absl::StatusOr<uint64_t> sequence = engine.generator->Add(std::move(g));
  if (!sequence.ok()) {
    ReturnTokens(*stream, stream->charged);
    Fail(*stream, sequence.status());
    return;
  }
  stream->sequence = *sequence;
  stream->added = true;
  engine.running[*sequence] = std::move(stream);
}

void GenerationService::Step(Engine& engine) {
  const absl::Time start = absl::Now();
  const int64_t interrupted_before = engine.generator->interrupted_steps();
  absl::StatusOr<std::vector<llm::TokenEvent>> events = engine.generator->Step();
  const double step_ns = absl::ToDoubleNanoseconds(absl::Now() - start);
  interrupted_steps_ += engine.generator->interrupted_steps() - interrupted_before;
  if (!events.ok()) {
    Log(LogLevel::kError, "generation_step_failed",
        {{"reason", std::string(events.status().message())}});
    for (auto& [sequence, stream] : engine.running) {
      Fail(*stream, absl::InternalError(
                        absl::StrCat("the engine failed: ", events.status().message())));
    }
    engines_.erase(engine.model->handle);  // a fresh generator for the next request
    return;
  }
  // The step's time, shared by the sequences that were in it in proportion to the tokens it
  // computed for each (a prefill chunk of 400 tokens costs about 400 decodes); one waiting for
  // a slot had no part in it.
  const std::vector<llm::Generator::StepPart>& parts = engine.generator->last_step();
  int64_t step_tokens = 0;
  for (const llm::Generator::StepPart& part : parts) step_tokens += part.tokens;
  for (const llm::Generator::StepPart& part : parts) {
    auto it = engine.running.find(part.sequence);
    if (it == engine.running.end()) continue;
    it->second->execution_ns +=
        step_ns * static_cast<double>(part.tokens) / static_cast<double>(step_tokens);
  }
  for (auto& [sequence, stream] : engine.running) {
    // Blocks held after the step (a finishing sequence's are already freed: it had them for
    // the steps before).
    stream->kv_block_ns += static_cast<double>(engine.generator->kv_blocks(sequence)) * step_ns;
  }
  for (const llm::TokenEvent& event : *events) {
    auto it = engine.running.find(event.sequence);
    if (it == engine.running.end()) continue;
    Stream& stream = *it->second;
    if (event.finish != llm::FinishReason::kCancelled) {
      api::v1::SampledTokenInfo* token = stream.pending.add_tokens();
      token->set_id(event.token.id);
      if (stream.r.request.sampling().logprobs()) {
        token->set_logprob(event.token.logprob);
        for (const llm::TokenLogprob& top : event.token.top) {
          api::v1::TokenLogprob* t = token->add_top();
          t->set_id(top.id);
          t->set_logprob(top.logprob);
        }
      }
      stream.pending.mutable_text()->append(event.text);
      ++stream.pending_tokens;
      ++stream.tokens;
    }
    if (event.finish != llm::FinishReason::kNone) {
      if (!Finish(stream, event)) finishing_.push_back(std::move(it->second));
      engine.running.erase(it);
    } else if (stream.interval == absl::ZeroDuration() &&
               stream.pending_tokens >= stream.tokens_per_chunk) {
      if (!Send(stream, stream.pending, /*final=*/false, nullptr)) {
        engine.generator->Cancel(stream.sequence);
      }
      stream.pending.Clear();
      stream.pending_tokens = 0;
    }
  }
}

absl::Status GenerationService::TakeTokens(const Stream& stream, double cost) {
  const double rate = stream.r.tokens_per_second;
  if (!(rate > 0)) return absl::OkStatus();
  const double burst = stream.r.token_burst > 0 ? stream.r.token_burst : 10 * rate;
  if (cost > burst) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "the request's ", cost, " tokens (prompt and max_tokens) exceed the tenant's token "
            "burst of ", burst)),
        api::v1::TOO_LARGE);
  }
  TokenBucket& bucket = buckets_[stream.r.tenant_id];
  const absl::Time now = clock_->Now();
  if (bucket.refilled == absl::InfinitePast()) {
    bucket.level = burst;
  } else {
    bucket.level = std::min(burst, bucket.level + rate * absl::ToDoubleSeconds(now - bucket.refilled));
  }
  bucket.refilled = now;
  if (bucket.level < cost) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrFormat(
            "token rate limit of %g tokens/s: the request needs %g tokens, %g are left; send "
            "again in %.1f s",
            rate, cost, bucket.level, (cost - bucket.level) / rate)),
        api::v1::OVERLOADED);
  }
  bucket.level -= cost;
  const_cast<Stream&>(stream).charged = cost;
  return absl::OkStatus();
}

void GenerationService::ReturnTokens(const Stream& stream, double tokens) {
  if (!(stream.r.tokens_per_second > 0) || tokens <= 0) return;
  auto it = buckets_.find(stream.r.tenant_id);
  if (it == buckets_.end()) return;
  const double burst =
      stream.r.token_burst > 0 ? stream.r.token_burst : 10 * stream.r.tokens_per_second;
  it->second.level = std::min(burst, it->second.level + tokens);
}

absl::Time GenerationService::Tick(absl::Time now, bool all_final) {
  absl::Time next = absl::InfiniteFuture();
  auto due = [&](Stream& stream) {
    if (stream.ended || stream.interval == absl::ZeroDuration()) return false;
    if (now < stream.next_tick) return false;
    // A tick missed (a long step) is not made up: the next one is an interval from now.
    stream.next_tick = std::max(stream.next_tick + stream.interval, now);
    return true;
  };
  for (auto& [handle, engine] : engines_) {
    for (auto& [sequence, stream] : engine->running) {
      if (due(*stream)) {
        if (!Send(*stream, stream->pending, /*final=*/false, nullptr)) {
          engine->generator->Cancel(sequence);
        }
        stream->pending.Clear();
        stream->pending_tokens = 0;
      }
      if (!stream->ended && stream->interval > absl::ZeroDuration()) {
        next = std::min(next, stream->next_tick);
      }
    }
  }
  for (auto it = finishing_.begin(); it != finishing_.end();) {
    Stream& stream = **it;
    if (all_final || due(stream)) {
      Send(stream, stream.pending, /*final=*/true,
           stream.held_receipt ? &*stream.held_receipt : nullptr);
      it = finishing_.erase(it);
    } else {
      next = std::min(next, stream.next_tick);
      ++it;
    }
  }
  return next;
}

bool GenerationService::Finish(Stream& stream, const llm::TokenEvent& event) {
  // What the request did not generate goes back to its tenant's bucket.
  ReturnTokens(stream, stream.charged - static_cast<double>(stream.prompt_tokens) -
                           static_cast<double>(event.completion_tokens));
  if (!stream.cut.ok()) {
    Fail(stream, stream.cut);
    return true;
  }
  GenerateChunk& last = stream.pending;
  last.set_finish_reason(std::string(llm::FinishReasonName(event.finish)));
  last.mutable_usage()->set_prompt_tokens(stream.prompt_tokens);
  last.mutable_usage()->set_cached_tokens(static_cast<uint64_t>(event.cached_tokens));
  last.mutable_usage()->set_completion_tokens(static_cast<uint64_t>(event.completion_tokens));
  std::optional<boundary::v1::SignedUsageReceipt> receipt =
      Receipt(stream, /*ran=*/event.finish != llm::FinishReason::kCancelled,
              static_cast<uint64_t>(event.cached_tokens),
              static_cast<uint64_t>(event.completion_tokens));
  if (receipt) {
    last.set_receipt(receipt->receipt());
    last.set_receipt_signature(receipt->signature());
  }
  if (stream.interval > absl::ZeroDuration() && !stream.ended) {
    stream.held_receipt = std::move(receipt);
    return false;
  }
  Send(stream, last, /*final=*/true, receipt ? &*receipt : nullptr);
  return true;
}

void GenerationService::Fail(Stream& stream, const absl::Status& status) {
  // Tokens already sampled but not yet sent are dropped: an error chunk carries no text.
  stream.pending.Clear();
  GenerateChunk chunk;
  chunk.set_code(static_cast<int>(status.code()));
  chunk.set_message(std::string(status.message()));
  chunk.set_reason(proto::ReasonOf(status));
  std::optional<boundary::v1::SignedUsageReceipt> receipt =
      Receipt(stream, /*ran=*/false, 0, stream.tokens);
  if (receipt) {
    chunk.set_receipt(receipt->receipt());
    chunk.set_receipt_signature(receipt->signature());
  }
  Send(stream, chunk, /*final=*/true, receipt ? &*receipt : nullptr);
}

std::optional<boundary::v1::SignedUsageReceipt> GenerationService::Receipt(
    const Stream& stream, bool ran, uint64_t cached, uint64_t completion) {
  boundary::v1::UsageCounters usage;
  usage.set_batches(1);
  usage.set_sequences(1);
  (ran ? usage.set_requests(1) : usage.set_failed_requests(1));
  usage.set_prompt_tokens(stream.added ? stream.prompt_tokens : 0);
  usage.set_cached_tokens(cached);
  usage.set_completion_tokens(completion);
  usage.set_execution_ns(static_cast<uint64_t>(stream.execution_ns));
  usage.set_kv_block_ms(static_cast<uint64_t>(stream.kv_block_ns / 1e6));
  if (stream.r.model == nullptr) return std::nullopt;  // refused before a model was found
  boundary::v1::UsageReceipt receipt =
      usage_->Record(stream.r.tenant_id, stream.r.model->handle, usage);
  receipt.set_model_digest(stream.r.model->info.digest());
  std::string serialized = receipt.SerializeAsString();
  absl::StatusOr<Bytes> signature =
      crypto::SignUsageReceipt(signing_seed_->span(), AsBytes(serialized));
  if (!signature.ok()) {
    Log(LogLevel::kError, "receipt_signing_failed",
        {{"reason", std::string(signature.status().message())}});
    return std::nullopt;
  }
  boundary::v1::SignedUsageReceipt signed_receipt;
  signed_receipt.set_receipt(std::move(serialized));
  signed_receipt.set_signature(ToString(*signature));
  return signed_receipt;
}

bool GenerationService::Send(Stream& stream, GenerateChunk& chunk, bool final,
                                     const boundary::v1::SignedUsageReceipt* receipt) {
  if (stream.ended) return false;
  EnclaveToHost frame;
  frame.set_call_id(stream.r.call_id);
  boundary::v1::GenerateResult& result = *frame.mutable_generate();
  result.set_request_id(stream.r.request_id);
  result.set_chunk(stream.next_chunk);
  result.set_final(final);
  PadChunk(chunk, stream.pad_to);
  const crypto::MessageHeader header{crypto::MessageKind::kGenerateChunk, stream.r.request_id,
                                     stream.r.model_handle, stream.next_chunk, final};
  std::string& buffer = *result.mutable_ciphertext();
  absl::StatusOr<std::span<uint8_t>> message = proto::SerializeForSealing(chunk, buffer);
  proto::WipeMessage(chunk);
  absl::StatusOr<uint64_t> sequence =
      message.ok() ? stream.r.session->SealInPlace(header, *message) : message.status();
  if (!sequence.ok()) {
    // No key to seal under any more (the session ran out of messages): the host ends the
    // stream with this status, which is the last frame; the sequence leaves at the next step.
    proto::WipeString(buffer);
    frame.clear_generate();
    proto::SetBoundaryStatus(sequence.status(), *frame.mutable_status());
    stream.ended = true;
    Forget(stream);
    stream.r.sink->Write(frame);
    return false;
  }
  result.set_sequence(*sequence);
  if (receipt != nullptr) *result.mutable_receipt() = *receipt;
  ++stream.next_chunk;
  if (final) {
    // Forgotten first, so that a cancel that follows the final frame finds nothing.
    stream.ended = true;
    Forget(stream);
  }
  stream.r.sink->Write(frame);
  return true;
}

void GenerationService::Forget(const Stream& stream) {
  absl::MutexLock lock(&mu_);
  calls_.erase(stream.r.call_id);
}

GenerationService::GenerationService(const SecretBytes* signing_seed, UsageLedger* usage,
                                     Clock* clock, GenerationOptions options)
    : signing_seed_(signing_seed),
      usage_(usage),
      clock_(clock),
      options_(options),
      counters_(std::make_shared<llm::TenantCounters>()),
      thread_([this] { Loop(); }) {}

GenerationService::~GenerationService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();  // it ends every open stream first
}

void GenerationService::Start(Request request) {
  auto stream = std::make_unique<Stream>();
  const api::v1::StreamShape& shape = request.request.shape();
  stream->pad_to = shape.pad_to() == 0 ? kDefaultChunkPadding : shape.pad_to();
  stream->tokens_per_chunk = std::max<uint32_t>(shape.tokens_per_chunk(), 1);
  const uint32_t interval_ms = shape.interval_ms();
  const bool bad_interval = interval_ms != 0 && (interval_ms < 10 || interval_ms > 10000);
  if (interval_ms != 0 && !bad_interval) {
    stream->interval = absl::Milliseconds(interval_ms);
    stream->next_tick = absl::Now() + stream->interval;
  }
  stream->r = std::move(request);
  if (bad_interval && stream->r.refusal.ok()) {
    stream->r.refusal = absl::InvalidArgumentError(
        absl::StrCat("shape.interval_ms ", interval_ms,
                     " is out of range: 0 (no cadence) or 10 to 10000"));
  }
  if (!stream->r.refusal.ok()) {
    // Opened, so sealed to the tenant; never reaches the engine.
    const absl::Status refusal = stream->r.refusal;
    Fail(*stream, refusal);
    return;
  }
  absl::MutexLock lock(&mu_);
  if (!calls_.insert(stream->r.call_id).second) {
    // Not this call's stream to answer: a duplicate id is the host's mistake.
    Log(LogLevel::kWarning, "generate_call_id_reused",
        {{"call_id", static_cast<int64_t>(stream->r.call_id)}});
    EnclaveToHost frame;
    frame.set_call_id(stream->r.call_id);
    proto::SetBoundaryStatus(
        absl::InvalidArgumentError("a generation with this call id is already running"),
        *frame.mutable_status());
    stream->r.sink->Write(frame);
    return;
  }
  // A realtime request need not wait for the rest of a best-effort step running now.
  const bool realtime = stream->r.priority == llm::Priority::kRealtime;
  incoming_.push_back(std::move(stream));
  if (realtime && options_.interrupt_for_realtime) interrupt_.store(true);
}

bool GenerationService::Cancel(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  if (calls_.count(call_id) == 0) return false;
  cancels_.push_back(call_id);
  return true;
}

size_t GenerationService::active() {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

}  // namespace cloister::enclave
