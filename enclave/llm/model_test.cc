// The engine against the shared tiny model's independent references (made by a float32 torch
// model from the BF16 weights and confirmed token for token by llama.cpp): last-position logits,
// greedy ids alone and all prompts in one batch, with the KV cache paged across blocks and
// prompts prefilled in chunks; and the load-time refusals.
#include "enclave/llm/model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "base/status.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/tiny_model_references.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {
namespace {

using ::testing::HasSubstr;

const std::string kModelDir = std::string(CLOISTER_LLM_MODELS_DIR) + "/tiny-llama";

using testing::LoadReferences;
using testing::ReadNpy;
using testing::ReadText;
using testing::Reference;

std::vector<Reference> LoadReferences() { return testing::LoadReferences(kModelDir); }

class TinyModelTest : public ::testing::Test {
 protected:
  static std::unique_ptr<Model> LoadModel(WeightFormat format, const std::string& dir = kModelDir) {
    std::vector<std::string> storage;
    auto files = ReadCheckpointDir(dir, storage);
    EXPECT_TRUE(files.ok()) << files.status();
    LoadOptions options;
    options.weights = format;
    auto model = Model::Load(*files, options);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  // Greedy ids for every reference prompt, run together through one generator.
  static std::vector<std::vector<int32_t>> GenerateAll(const Model& model,
                                                       const std::vector<Reference>& refs,
                                                       GeneratorOptions options,
                                                       std::vector<std::string>* texts = nullptr) {
    auto generator = Generator::Create(model, options);
    EXPECT_TRUE(generator.ok()) << generator.status();
    if (!generator.ok()) return {};
    return testing::RunAll(
        **generator, testing::GreedyRequests(refs, model.config().max_position_embeddings), texts);
  }
};

TEST_F(TinyModelTest, LastPositionLogitsMatchTheReference) {
  for (WeightFormat format : {WeightFormat::kAsStored, WeightFormat::kF32}) {
    auto model = LoadModel(format);
    ASSERT_NE(model, nullptr);
    std::vector<float> expected = ReadNpy(kModelDir + "/reference_logits.npy");
    std::vector<Reference> refs = LoadReferences();
    ASSERT_EQ(static_cast<int64_t>(expected.size()), model->config().vocab_size);
    KvCache cache(model->config(), 8, 16);
    ThreadPool pool(2);
    std::vector<int32_t> table = {3, 0, 5};  // out of order, so paging is exercised
    StepSequence part{refs[0].prompt_ids, 0, table, true};
    std::vector<float> logits;
    ASSERT_TRUE(model->Forward({&part, 1}, cache, pool, logits).ok());
    ASSERT_EQ(logits.size(), expected.size());
    const double worst = testing::WorstRelativeError(logits, expected);
    EXPECT_LT(worst, 1e-3);
    RecordProperty("worst_relative_error", std::to_string(worst));
  }
}

// A step given up part-way (the interrupt flag set from another thread while it runs) leaves
// only keys and values at the part's own new positions, which the step done again rewrites:
// the logits are the reference's. Whether the flag lands before the first layer or between two,
// the redone step must match; a step that finished before the flag came is as good.
TEST_F(TinyModelTest, AnInterruptedStepDoneAgainGivesTheReferenceLogits) {
  auto model = LoadModel(WeightFormat::kAsStored);
  ASSERT_NE(model, nullptr);
  std::vector<float> expected = ReadNpy(kModelDir + "/reference_logits.npy");
  std::vector<Reference> refs = LoadReferences();
  KvCache cache(model->config(), 8, 16);
  ThreadPool pool(1);
  std::vector<int32_t> table = {3, 0, 5};
  StepSequence part{refs[0].prompt_ids, 0, table, true};
  std::vector<float> logits;
  std::atomic<bool> already(true);
  absl::Status refused = model->Forward({&part, 1}, cache, pool, logits, &already);
  EXPECT_TRUE(absl::IsCancelled(refused)) << refused;
  int interrupted = 0;
  for (int delay_us = 0; delay_us <= 2000; delay_us += 50) {
    std::atomic<bool> flag(false);
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      flag.store(true);
    });
    absl::Status status = model->Forward({&part, 1}, cache, pool, logits, &flag);
    setter.join();
    if (absl::IsCancelled(status)) ++interrupted;
    else ASSERT_TRUE(status.ok()) << status;
    std::atomic<bool> clear(false);
    ASSERT_TRUE(model->Forward({&part, 1}, cache, pool, logits, &clear).ok());
    ASSERT_EQ(logits.size(), expected.size());
    EXPECT_LT(testing::WorstRelativeError(logits, expected), 1e-3)
        << "after a flag at " << delay_us << " us";
  }
  EXPECT_GT(interrupted, 0);
}

TEST_F(TinyModelTest, GreedyIdsMatchAloneAndTogether) {
  auto model = LoadModel(WeightFormat::kAsStored);
  ASSERT_NE(model, nullptr);
  std::vector<Reference> refs = LoadReferences();
  // Alone, one thread, 16-token blocks.
  for (const Reference& r : refs) {
    GeneratorOptions options;
    options.max_sequences = 1;
    auto ids = GenerateAll(*model, {r}, options);
    EXPECT_EQ(ids[0], r.generated_ids);
  }
  // All six in one batch, two threads, 5-token blocks and 7-token prefill chunks.
  GeneratorOptions options;
  options.threads = 2;
  options.block_size = 5;
  options.max_step_tokens = 7 + 6;
  std::vector<std::string> texts;
  auto ids = GenerateAll(*model, refs, options, &texts);
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(ids[i], refs[i].generated_ids) << "prompt " << i;
    EXPECT_EQ(texts[i], refs[i].generated_text) << "prompt " << i;
  }
}

// Forwards to the CPU engine and counts the rows it picked itself, checking that only the other
// rows' logits came back.
class PickCountingEngine : public ForwardingEngine {
 public:
  PickCountingEngine(std::unique_ptr<StepEngine> inner, int32_t vocab)
      : ForwardingEngine(std::move(inner)), vocab_(vocab) {}
  std::string_view name() const override { return "pick-counting"; }
  absl::Status Step(std::span<const StepSequence> parts, StepResult& result) override {
    RETURN_IF_ERROR(inner().Step(parts, result));
    size_t host_rows = 0, i = 0;
    for (const StepSequence& part : parts) {
      if (!part.want_logits) continue;
      const bool picked = result.ids.at(i++) >= 0;
      EXPECT_EQ(picked, part.argmax);
      picked ? ++picked_rows : ++host_rows;
    }
    EXPECT_EQ(i, result.ids.size());
    EXPECT_EQ(result.logits.size(), host_rows * static_cast<size_t>(vocab_));
    return absl::OkStatus();
  }
  int64_t picked_rows = 0;

 private:
  int32_t vocab_;
};

// The CPU engine picks the argmax of plain greedy rows itself and sends back only their ids,
// beside sampled rows whose logits it returns: the ids are those the host's Sampler picks from
// the logits (greedy with log-probabilities asked for, so the host picks), and the references.
TEST_F(TinyModelTest, EnginePickedIdsAndSampledRowsMixInOneStep) {
  auto model = LoadModel(WeightFormat::kAsStored);
  ASSERT_NE(model, nullptr);
  std::vector<Reference> refs = LoadReferences();
  std::vector<GenerationRequest> requests =
      testing::GreedyRequests(refs, model->config().max_position_embeddings);
  // Every other request samples (seeded), so both kinds of row share steps.
  for (size_t i = 1; i < requests.size(); i += 2) {
    requests[i].sampling.temperature = 0.8f;
    requests[i].sampling.seed = 1234 + i;
  }
  GeneratorOptions options;
  options.threads = 2;
  std::vector<GenerationRequest> on_host = requests;
  for (size_t i = 0; i < on_host.size(); i += 2) on_host[i].sampling.logprobs = true;
  auto plain = Generator::Create(*model, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::vector<std::vector<int32_t>> expected = testing::RunAll(**plain, on_host);

  EngineOptions engine_options;
  engine_options.threads = 2;
  engine_options.num_blocks = *KvBlocksFor(model->config(), options);
  auto cpu = MakeCpuEngine(*model, engine_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto engine = std::make_unique<PickCountingEngine>(std::move(*cpu), model->config().vocab_size);
  PickCountingEngine* counting = engine.get();
  auto generator = Generator::Create(*model, options, std::move(engine));
  ASSERT_TRUE(generator.ok()) << generator.status();
  std::vector<std::vector<int32_t>> got = testing::RunAll(**generator, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i], expected[i]) << "request " << i;
    if (i % 2 == 0) {
      EXPECT_EQ(got[i], refs[i].generated_ids) << "request " << i;
    }
  }
  EXPECT_GT(counting->picked_rows, 0);
}

TEST(EngineSelection, UnknownAndMissingExecutorsAreRefusedInOneLine) {
  EXPECT_EQ(*ResolveExecutor("cpu"), "cpu");
  absl::StatusOr<std::string> unknown = ResolveExecutor("tpu");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("executor \"tpu\" is not in this build"));
  // "auto" always resolves: to cuda where it is linked and a device is present, else cpu.
  absl::StatusOr<std::string> chosen = ResolveExecutor("auto");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_TRUE(*chosen == "cpu" || *chosen == "cuda") << *chosen;
  EXPECT_FALSE(ParsePrecision("f8").ok());
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16);
}

TEST_F(TinyModelTest, Float32WeightsGiveTheSameIds) {
  auto model = LoadModel(WeightFormat::kF32);
  ASSERT_NE(model, nullptr);
  std::vector<Reference> refs = LoadReferences();
  GeneratorOptions options;
  options.threads = 2;
  auto ids = GenerateAll(*model, refs, options);
  for (size_t i = 0; i < refs.size(); ++i) EXPECT_EQ(ids[i], refs[i].generated_ids);
}

TEST_F(TinyModelTest, PrefixCacheReusesBlocksOfOneTenantOnly) {
  auto model = LoadModel(WeightFormat::kAsStored);
  ASSERT_NE(model, nullptr);
  std::vector<Reference> refs = LoadReferences();
  const Reference& r = refs[5];  // 153 prompt tokens
  GeneratorOptions options;
  options.block_size = 16;
  auto generator = Generator::Create(*model, options);
  ASSERT_TRUE(generator.ok());
  auto run = [&](const std::string& tenant, std::vector<uint8_t> salt) {
    GenerationRequest request;
    request.prompt_ids = r.prompt_ids;
    request.sampling.temperature = 0;
    request.max_tokens = 48;
    request.tenant = tenant;
    request.prefix_salt = salt;
    auto id = (*generator)->Add(request);
    EXPECT_TRUE(id.ok());
    std::vector<int32_t> ids;
    int64_t cached = -1;
    while (!(*generator)->idle()) {
      auto events = (*generator)->Step();
      EXPECT_TRUE(events.ok());
      for (const TokenEvent& e : *events) {
        ids.push_back(e.token.id);
        if (e.finish != FinishReason::kNone) cached = e.cached_tokens;
      }
    }
    return std::make_pair(ids, cached);
  };
  std::vector<uint8_t> salt_a(32, 0xa1), salt_b(32, 0xb2);
  auto first = run("a", salt_a);
  EXPECT_EQ(first.first, r.generated_ids);
  EXPECT_EQ(first.second, 0);
  auto second = run("a", salt_a);
  EXPECT_EQ(second.first, r.generated_ids);
  EXPECT_EQ(second.second, 144);  // 9 full blocks of the 153-token prompt
  auto other = run("b", salt_b);
  EXPECT_EQ(other.first, r.generated_ids);
  EXPECT_EQ(other.second, 0);
}

TEST_F(TinyModelTest, RefusesPromptsAndMaxTokensPastTheContext) {
  auto model = LoadModel(WeightFormat::kAsStored);
  ASSERT_NE(model, nullptr);
  auto generator = Generator::Create(*model, GeneratorOptions{});
  ASSERT_TRUE(generator.ok());
  GenerationRequest request;
  request.prompt_ids.assign(512, 72);
  auto added = (*generator)->Add(request);
  ASSERT_FALSE(added.ok());
  EXPECT_THAT(added.status().message(), HasSubstr("the prompt has 512 tokens"));
  request.prompt_ids.assign(500, 72);
  request.max_tokens = 13;
  added = (*generator)->Add(request);
  ASSERT_FALSE(added.ok());
  EXPECT_THAT(added.status().message(), HasSubstr("max_tokens 13 with a prompt of 500"));
  request.max_tokens = 12;
  EXPECT_TRUE((*generator)->Add(request).ok());
  request.prompt_ids = {5000};
  added = (*generator)->Add(request);
  ASSERT_FALSE(added.ok());
  EXPECT_THAT(added.status().message(), HasSubstr("not below the vocabulary size"));
}

TEST_F(TinyModelTest, CancelFreesTheSequenceAtOnce) {
  auto model = LoadModel(WeightFormat::kAsStored);
  ASSERT_NE(model, nullptr);
  GeneratorOptions options;
  options.max_sequences = 1;
  options.kv_blocks = 4;  // room for one 64-token sequence only
  auto generator = Generator::Create(*model, options);
  ASSERT_TRUE(generator.ok());
  GenerationRequest request;
  request.prompt_ids = LoadReferences()[3].prompt_ids;
  request.max_tokens = 40;
  request.ignore_eos = true;
  auto first = (*generator)->Add(request);
  auto second = (*generator)->Add(request);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*generator)->Step().ok());
  (*generator)->Cancel(*first);
  auto events = (*generator)->Step();
  ASSERT_TRUE(events.ok());
  bool cancelled = false, second_ran = false;
  for (const TokenEvent& e : *events) {
    if (e.sequence == *first) cancelled = e.finish == FinishReason::kCancelled;
    if (e.sequence == *second) second_ran = true;
  }
  EXPECT_TRUE(cancelled);
  EXPECT_TRUE(second_ran);  // admitted in the same step, into the freed blocks
}

// Checkpoints of the other architecture variants, made by the shared generator (its torch model
// is the reference) when CLOISTER_LLM_VARIANTS_DIR names a folder of them: see
// scripts/llm-variants.sh (ctest label slow).
TEST_F(TinyModelTest, ArchitectureVariantsMatchTheirReferences) {
  const char* root = std::getenv("CLOISTER_LLM_VARIANTS_DIR");
  if (root == nullptr) GTEST_SKIP() << "CLOISTER_LLM_VARIANTS_DIR is not set";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    if (!std::filesystem::exists(dir + "/reference.json")) continue;
    SCOPED_TRACE(dir);
    auto model = LoadModel(WeightFormat::kAsStored, dir);
    ASSERT_NE(model, nullptr);
    std::vector<Reference> refs = LoadReferences(dir);
    nlohmann::json root_json = nlohmann::json::parse(ReadText(dir + "/reference.json"));
    for (const auto& check : root_json["tokenizer_checks"]) {
      auto ids = model->tokenizer().Encode(check["text"].get<std::string>(), false);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, check["ids"].get<std::vector<int32_t>>()) << check["text"];
    }
    std::vector<float> expected = ReadNpy(dir + "/reference_logits.npy");
    KvCache cache(model->config(), 64, 16);
    ThreadPool pool(1);
    std::vector<int32_t> table(64);
    for (int i = 0; i < 64; ++i) table[i] = i;
    StepSequence part{refs[0].prompt_ids, 0, table, true};
    std::vector<float> logits;
    ASSERT_TRUE(model->Forward({&part, 1}, cache, pool, logits).ok());
    ASSERT_EQ(logits.size(), expected.size());
    EXPECT_LT(testing::WorstRelativeError(logits, expected), 1e-3);
    GeneratorOptions options;
    options.threads = 2;
    options.block_size = 8;
    auto ids = GenerateAll(*model, refs, options);
    for (size_t i = 0; i < refs.size(); ++i) EXPECT_EQ(ids[i], refs[i].generated_ids) << "prompt " << i;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// ---- refusals at load ------------------------------------------------------------------------

class LoadRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto files = ReadCheckpointDir(kModelDir, storage_);
    ASSERT_TRUE(files.ok());
    files_ = *files;
  }
  absl::Status LoadWith(const std::string& name, const std::string& bytes) {
    replaced_.push_back(std::vector<uint8_t>(bytes.begin(), bytes.end()));
    CheckpointFiles files = files_;
    files[name] = replaced_.back();
    return Model::Load(files, LoadOptions{}).status();
  }
  std::string Text(const std::string& name) {
    auto span = files_.at(name);
    return std::string(reinterpret_cast<const char*>(span.data()), span.size());
  }
  std::vector<std::string> storage_;
  std::list<std::vector<uint8_t>> replaced_;
  CheckpointFiles files_;
};

TEST_F(LoadRefusalTest, UnsupportedArchitectureIsNamed) {
  std::string config = Text("config.json");
  config.replace(config.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel");
  absl::Status status = LoadWith("config.json", config);
  EXPECT_THAT(status.message(), HasSubstr("architectures[0] \"GPT2LMHeadModel\" is not supported"));
}

TEST_F(LoadRefusalTest, UnsupportedRopeScalingIsNamed) {
  std::string config = Text("config.json");
  config.replace(config.find("\"rope_scaling\": null"), 20,
                 "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}");
  EXPECT_THAT(LoadWith("config.json", config).message(),
              HasSubstr("rope_scaling type \"yarn\" is not supported"));
}

TEST_F(LoadRefusalTest, ConfigThatDisagreesWithTheTensorsIsRefused) {
  std::string config = Text("config.json");
  config.replace(config.find("\"intermediate_size\": 768"), 24, "\"intermediate_size\": 512");
  EXPECT_THAT(LoadWith("config.json", config).message(),
              HasSubstr("has shape [768, 256], config.json implies [512, 256]"));
}

TEST_F(LoadRefusalTest, TruncatedSafetensorsIsRefused) {
  std::string weights = Text("model.safetensors");
  EXPECT_THAT(LoadWith("model.safetensors", weights.substr(0, weights.size() / 2)).message(),
              HasSubstr("lie outside the"));
  EXPECT_THAT(LoadWith("model.safetensors", weights.substr(0, 5)).message(),
              HasSubstr("shorter than the 8-byte header length"));
}

TEST_F(LoadRefusalTest, LyingHeaderIsRefused) {
  std::string weights = Text("model.safetensors");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(weights[i]);
  std::string header = weights.substr(8, header_size);
  // The header claims a bigger shape for the first layer's q_proj than its byte range holds.
  size_t at = header.find("\"model.layers.0.self_attn.q_proj.weight\"");
  ASSERT_NE(at, std::string::npos);
  size_t shape = header.find("[256,256]", at);
  if (shape == std::string::npos) shape = header.find("[256, 256]", at);
  ASSERT_NE(shape, std::string::npos) << header.substr(at, 200);
  std::string lying = header;
  lying.replace(shape + 1, 3, "999");
  std::string file = weights.substr(0, 8) + lying + weights.substr(8 + header_size);
  EXPECT_THAT(LoadWith("model.safetensors", file).message(),
              HasSubstr("data_offsets span 131072 bytes but the shape needs"));
  // A length field that points past the end.
  std::string huge = weights;
  huge[5] = 1;
  EXPECT_THAT(LoadWith("model.safetensors", huge).message(), HasSubstr("header length"));
}

TEST_F(LoadRefusalTest, WeightLimitIsCheckedBeforeAllocation) {
  LoadOptions options;
  options.max_weight_bytes = 1 << 20;
  auto model = Model::Load(files_, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(model.status().message(), HasSubstr("over the limit of 1048576"));
}

}  // namespace
}  // namespace cloister::llm
