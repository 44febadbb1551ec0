// The Generator's step scheduler between tenants and classes, on the shared tiny model: the
// virtual token counters share steps by weight, a returning tenant gets no credit for its time
// away, a realtime decode keeps its step short while a batch tenant's long prompt is
// prefilled, and a batch sequence preempted for a realtime one gives exactly the ids it gives
// alone (its tokens are recomputed, not lost).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "enclave/llm/engine.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/model.h"
#include "enclave/llm/tiny_model_references.h"
#include "gtest/gtest.h"

namespace cloister::llm {
namespace {

const std::string kModelDir = std::string(CLOISTER_LLM_MODELS_DIR) + "/tiny-llama";

// Forwards to the CPU engine and records the tokens of each step.
class RecordingEngine : public ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  absl::Status Step(std::span<const StepSequence> parts, StepResult& result) override {
    std::vector<size_t> sizes;
    for (const StepSequence& part : parts) sizes.push_back(part.tokens.size());
    steps.push_back(std::move(sizes));
    return inner().Step(parts, result);
  }
  std::vector<std::vector<size_t>> steps;  // per step, each part's token count, in order
};

class GeneratorFairnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto files = ReadCheckpointDir(kModelDir, storage_);
    ASSERT_TRUE(files.ok()) << files.status();
    auto model = Model::Load(*files, LoadOptions{});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    refs_ = testing::LoadReferences(kModelDir);
  }

  // A generator on a recording CPU engine (kept in `engine_`).
  std::unique_ptr<Generator> Make(GeneratorOptions options) {
    auto blocks = KvBlocksFor(model_->config(), options);
    EXPECT_TRUE(blocks.ok());
    EngineOptions engine_options;
    engine_options.num_blocks = *blocks;
    engine_options.block_size = options.block_size;
    auto cpu = MakeCpuEngine(*model_, engine_options);
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    auto engine = std::make_unique<RecordingEngine>(*std::move(cpu));
    engine_ = engine.get();
    auto generator = Generator::Create(*model_, options, std::move(engine));
    EXPECT_TRUE(generator.ok()) << generator.status();
    return generator.ok() ? *std::move(generator) : nullptr;
  }

  GenerationRequest Long(const std::string& tenant, double weight = 1,
                         Priority priority = Priority::kStandard, int64_t max_tokens = 40) {
    GenerationRequest request;
    request.prompt_ids = refs_[3].prompt_ids;
    request.sampling.temperature = 0;
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    request.tenant = tenant;
    request.weight = weight;
    request.priority = priority;
    return request;
  }

  std::vector<std::string> storage_;
  std::unique_ptr<Model> model_;
  std::vector<testing::Reference> refs_;
  RecordingEngine* engine_ = nullptr;
};

// Two backlogged tenants with weights 1 and 3 contend for two sequence slots: admission goes
// to the lower counter, so while both have work waiting the heavier tenant gets three times the
// weighted token service of the other. With equal weights the service is equal, whatever the
// arrival order.
double ServiceRatio(Generator& generator, const std::string& a, double weight_a,
                    const std::string& b, double weight_b) {
  return generator.tenant_service(b) * weight_b / (generator.tenant_service(a) * weight_a);
}

TEST_F(GeneratorFairnessTest, BackloggedTenantsShareStepsByWeight) {
  GeneratorOptions options;
  options.max_sequences = 2;
  auto generator = Make(options);
  ASSERT_NE(generator, nullptr);
  // The light tenant's work arrives first; tokens are counted from the events, apart from the
  // counters.
  std::map<uint64_t, std::string> owner;
  for (int i = 0; i < 64; ++i) {
    auto id = generator->Add(Long("light", 1, Priority::kStandard, 16));
    ASSERT_TRUE(id.ok());
    owner[*id] = "light";
  }
  for (int i = 0; i < 64; ++i) {
    auto id = generator->Add(Long("heavy", 3, Priority::kStandard, 16));
    ASSERT_TRUE(id.ok());
    owner[*id] = "heavy";
  }
  // Both stay backlogged for all these steps (about 50 of the 128 sequences finish). The VTC
  // bound: the counters never differ by more than two sequences' cost (prompt and completion
  // tokens at their prices, over the smaller weight: both slots may hold the same tenant).
  const double bound = 2 * (23 * options.prompt_token_cost + 16 * options.completion_token_cost);
  double widest = 0;
  std::map<std::string, int> tokens;
  for (int step = 0; step < 400; ++step) {
    auto events = generator->Step();
    ASSERT_TRUE(events.ok());
    for (const TokenEvent& e : *events) ++tokens[owner[e.sequence]];
    widest = std::max(widest, std::abs(generator->tenant_service("light") -
                                       generator->tenant_service("heavy")));
  }
  EXPECT_LE(widest, bound);
  ASSERT_GT(tokens["light"], 0);  // its first sequences came first and ran: none starved
  EXPECT_NEAR(static_cast<double>(tokens["heavy"]) / tokens["light"], 3.0, 0.45)
      << tokens["heavy"] << " / " << tokens["light"];
}

TEST_F(GeneratorFairnessTest, EqualWeightsGiveEqualService) {
  GeneratorOptions options;
  options.max_sequences = 2;
  auto generator = Make(options);
  ASSERT_NE(generator, nullptr);
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(generator->Add(Long("first", 1, Priority::kStandard, 16)).ok());
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(generator->Add(Long("second", 1, Priority::kStandard, 16)).ok());
  for (int step = 0; step < 400; ++step) ASSERT_TRUE(generator->Step().ok());
  EXPECT_NEAR(ServiceRatio(*generator, "first", 1, "second", 1), 1.0, 0.15);
}

// A tenant that arrives after another has been served alone starts at that tenant's counter,
// not at zero, so it does not get the slots to itself to catch up; one that comes back with a
// higher counter keeps it.
TEST_F(GeneratorFairnessTest, AReturningTenantIsLiftedToTheOthers) {
  GeneratorOptions options;
  options.max_sequences = 2;
  auto generator = Make(options);
  ASSERT_NE(generator, nullptr);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(generator->Add(Long("early", 1, Priority::kStandard, 16)).ok());
  for (int step = 0; step < 40; ++step) ASSERT_TRUE(generator->Step().ok());
  const double early = generator->tenant_service("early");
  ASSERT_GT(early, 0);
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(generator->Add(Long("early", 1, Priority::kStandard, 16)).ok());
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(generator->Add(Long("late", 1, Priority::kStandard, 16)).ok());
  EXPECT_DOUBLE_EQ(generator->tenant_service("late"), early);
  // From there on they share the slots about equally.
  for (int step = 0; step < 400; ++step) ASSERT_TRUE(generator->Step().ok());
  const double early_gain = generator->tenant_service("early") - early;
  const double late_gain = generator->tenant_service("late") - early;
  EXPECT_NEAR(late_gain / (early_gain + late_gain), 0.5, 0.1) << early_gain << " " << late_gain;
}

// A realtime sequence decoding beside a batch tenant's long prompt: every step with the
// realtime decode in it carries at most realtime_step_tokens; the prompt is chunked to fit.
TEST_F(GeneratorFairnessTest, ARealtimeDecodeKeepsItsStepShort) {
  GeneratorOptions options;
  options.max_step_tokens = 512;
  options.realtime_step_tokens = 16;
  auto generator = Make(options);
  ASSERT_NE(generator, nullptr);
  auto realtime = generator->Add(Long("rt", 1, Priority::kRealtime, 60));
  ASSERT_TRUE(realtime.ok());
  ASSERT_TRUE(generator->Step().ok());  // its prefill
  GenerationRequest big = Long("bulk", 1, Priority::kBatch, 8);
  big.prompt_ids = refs_[5].prompt_ids;  // the long prompt (153 tokens)
  ASSERT_TRUE(generator->Add(big).ok());
  const size_t before = engine_->steps.size();
  for (int step = 0; step < 30; ++step) ASSERT_TRUE(generator->Step().ok());
  size_t chunked = 0;
  for (size_t i = before; i < engine_->steps.size(); ++i) {
    size_t total = 0;
    for (size_t n : engine_->steps[i]) total += n;
    EXPECT_LE(total, 16u) << "step " << i;
    chunked += engine_->steps[i].size() > 1 ? 1 : 0;
  }
  EXPECT_GT(chunked, 5u);  // the prompt went in beside the realtime decodes, in pieces
}

// What a step's time is shared by (the receipts' execution time): the sequences the step ran,
// each with the tokens computed for it, as the engine saw them; a sequence waiting for a slot
// has no part, and a step that runs nothing leaves the list empty.
TEST_F(GeneratorFairnessTest, TheLastStepNamesEachSequenceWithTheTokensItComputed) {
  GeneratorOptions options;
  options.max_sequences = 2;
  options.max_step_tokens = 64;
  auto generator = Make(options);
  ASSERT_NE(generator, nullptr);
  EXPECT_TRUE(generator->last_step().empty());
  GenerationRequest big = Long("a", 1, Priority::kStandard, 4);
  big.prompt_ids = refs_[5].prompt_ids;  // 153 tokens: three chunks of at most 64
  auto first = generator->Add(big);
  auto second = generator->Add(Long("b", 1, Priority::kStandard, 4));
  auto third = generator->Add(Long("c", 1, Priority::kStandard, 4));  // no slot yet
  ASSERT_TRUE(first.ok() && second.ok() && third.ok());
  bool saw_third = false, one_finished = false;
  int64_t first_tokens = 0;
  for (int step = 0; step < 40 && generator->active() > 0; ++step) {
    auto events = generator->Step();
    ASSERT_TRUE(events.ok()) << events.status();
    const auto& parts = generator->last_step();
    ASSERT_EQ(parts.size(), engine_->steps.back().size()) << "step " << step;
    int64_t total = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_EQ(parts[i].tokens, static_cast<int64_t>(engine_->steps.back()[i])) << step;
      total += parts[i].tokens;
      if (parts[i].sequence == *first) first_tokens += parts[i].tokens;
      if (parts[i].sequence == *third) {
        // The third waits for a slot: it runs only after one of the first two has finished.
        EXPECT_TRUE(one_finished) << "step " << step;
        saw_third = true;
      }
    }
    EXPECT_LE(total, 64) << "step " << step;
    for (const TokenEvent& event : *events) {
      one_finished |= event.finish != FinishReason::kNone;
    }
  }
  EXPECT_EQ(generator->active(), 0u);
  EXPECT_TRUE(saw_third);
  // The first sequence's prompt, then its three decodes after the token its prefill sampled.
  EXPECT_EQ(first_tokens, static_cast<int64_t>(refs_[5].prompt_ids.size()) + 3);
  ASSERT_TRUE(generator->Step().ok());
  EXPECT_TRUE(generator->last_step().empty());
}

// The interrupt flag gives up a step with no realtime sequence in it: no tokens, no service,
// nothing in last_step, and the sequence then gives exactly its ids. A step with a realtime
// sequence in it runs to the end whatever the flag says.
TEST_F(GeneratorFairnessTest, TheInterruptFlagGivesUpOnlyStepsWithoutRealtimeWork) {
  auto generator = Make(GeneratorOptions{});
  ASSERT_NE(generator, nullptr);
  std::atomic<bool> flag(true);
  generator->set_interrupt(&flag);
  GenerationRequest bulk = Long("bulk", 1, Priority::kBatch, 8);
  auto b = generator->Add(bulk);
  ASSERT_TRUE(b.ok());
  for (int i = 0; i < 3; ++i) {
    auto events = generator->Step();
    ASSERT_TRUE(events.ok()) << events.status();
    EXPECT_TRUE(events->empty());
    EXPECT_TRUE(generator->last_step().empty());
  }
  EXPECT_EQ(generator->interrupted_steps(), 3);
  EXPECT_EQ(generator->tenant_service("bulk"), 0);
  // A realtime sequence joins: its steps are not given up, and the batch one runs in them.
  auto r = generator->Add(Long("rt", 1, Priority::kRealtime, 8));
  ASSERT_TRUE(r.ok());
  std::map<uint64_t, std::vector<int32_t>> ids;
  auto events = generator->Step();
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(generator->interrupted_steps(), 3);
  EXPECT_FALSE(generator->last_step().empty());
  for (const TokenEvent& e : *events) ids[e.sequence].push_back(e.token.id);
  flag.store(false);
  for (int step = 0; step < 100 && !generator->idle(); ++step) {
    auto more = generator->Step();
    ASSERT_TRUE(more.ok());
    for (const TokenEvent& e : *more) ids[e.sequence].push_back(e.token.id);
  }
  std::vector<int32_t> expected(refs_[3].generated_ids.begin(), refs_[3].generated_ids.begin() + 8);
  EXPECT_EQ(ids[*b], expected);
  EXPECT_EQ(ids[*r], expected);
}

// A step that carries a realtime prompt carries no other prefill (a batch prompt waiting beside
// it goes in the steps after), so the realtime first token is not held up by it.
TEST_F(GeneratorFairnessTest, ARealtimePromptsStepCarriesNoOtherPrefill) {
  auto generator = Make(GeneratorOptions{});
  ASSERT_NE(generator, nullptr);
  GenerationRequest bulk = Long("bulk", 1, Priority::kBatch, 4);
  bulk.prompt_ids = refs_[5].prompt_ids;
  ASSERT_TRUE(generator->Add(bulk).ok());
  auto r = generator->Add(Long("rt", 1, Priority::kRealtime, 4));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(generator->Step().ok());
  ASSERT_EQ(generator->last_step().size(), 1u);
  EXPECT_EQ(generator->last_step()[0].sequence, *r);
  ASSERT_TRUE(generator->Step().ok());  // the realtime decode, and the batch prompt beside it
  EXPECT_EQ(generator->last_step().size(), 2u);
}

// KV memory for two sequences: two batch sequences hold it when a realtime one arrives; the
// newest batch sequence is preempted, the realtime one runs at once, and every sequence still
// gives exactly the ids it gives alone.
TEST_F(GeneratorFairnessTest, ABatchSequencePreemptedForRealtimeGivesItsIdsAlone) {
  GeneratorOptions options;
  options.max_sequences = 4;
  options.block_size = 16;
  const auto alone = [&](const GenerationRequest& request) {
    auto generator = Make(GeneratorOptions{});
    return testing::RunAll(*generator, {request})[0];
  };
  GenerationRequest batch_a = Long("bulk", 1, Priority::kBatch, 30);
  GenerationRequest batch_b = Long("bulk", 1, Priority::kBatch, 30);
  batch_b.prompt_ids = refs_[4].prompt_ids;
  GenerationRequest rt = Long("rt", 1, Priority::kRealtime, 30);
  rt.prompt_ids = refs_[0].prompt_ids;
  const auto expect_a = alone(batch_a), expect_b = alone(batch_b), expect_rt = alone(rt);

  // Blocks for the two batch sequences and no more (each needs 4 blocks of 16).
  options.kv_blocks = 8;
  auto generator = Make(options);
  ASSERT_NE(generator, nullptr);
  auto a = generator->Add(batch_a);
  auto b = generator->Add(batch_b);
  ASSERT_TRUE(a.ok() && b.ok());
  std::map<uint64_t, std::vector<int32_t>> ids;
  for (int step = 0; step < 5; ++step) {
    auto events = generator->Step();
    ASSERT_TRUE(events.ok());
    for (const TokenEvent& e : *events) ids[e.sequence].push_back(e.token.id);
  }
  auto r = generator->Add(rt);
  ASSERT_TRUE(r.ok());
  auto events = generator->Step();
  ASSERT_TRUE(events.ok());
  bool rt_ran = false;
  for (const TokenEvent& e : *events) {
    ids[e.sequence].push_back(e.token.id);
    rt_ran |= e.sequence == *r;
  }
  EXPECT_TRUE(rt_ran);  // admitted in the step it arrived
  EXPECT_EQ(generator->preemptions(), 1);
  for (int step = 0; step < 500 && !generator->idle(); ++step) {
    auto more = generator->Step();
    ASSERT_TRUE(more.ok());
    for (const TokenEvent& e : *more) ids[e.sequence].push_back(e.token.id);
  }
  EXPECT_EQ(ids[*a], expect_a);
  EXPECT_EQ(ids[*b], expect_b);
  EXPECT_EQ(ids[*r], expect_rt);
}

TEST_F(GeneratorFairnessTest, ABadWeightIsRefused) {
  auto generator = Make(GeneratorOptions{});
  ASSERT_NE(generator, nullptr);
  GenerationRequest request = Long("t", 0);
  auto added = generator->Add(request);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(added.status().message(), "the tenant's weight must be a positive number, got 0");
  EXPECT_TRUE(generator->idle());
}

}  // namespace
}  // namespace cloister::llm
