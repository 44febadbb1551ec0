// The CUDA LLM engine against the shared tiny model's references and the CPU engine (label gpu;
// every test but the selection ones skips without a device): last-position logits, greedy ids
// alone and batched across paged blocks and prefill chunks, seeded sampling through the logits
// download, the BF16 path's differences explained by the references' margins, and refusals.
#include "enclave/gpu/llm/cuda_llm_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "enclave/llm/engine.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/model.h"
#include "enclave/llm/tiny_model_references.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::gpu::llm {
namespace {

namespace core = cloister::llm;
using ::testing::HasSubstr;

const std::string kModelDir = std::string(CLOISTER_LLM_MODELS_DIR) + "/tiny-llama";

TEST(CudaLlmSelection, CudaAndAutoFollowTheDevice) {
  const absl::Status available = CudaLlmAvailable();
  absl::StatusOr<std::string> cuda = core::ResolveExecutor("cuda");
  absl::StatusOr<std::string> chosen = core::ResolveExecutor("auto");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  if (available.ok()) {
    EXPECT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ(*chosen, "cuda");
  } else {
    ASSERT_FALSE(cuda.ok());
    EXPECT_THAT(cuda.status().message(), HasSubstr("no CUDA device"));
    EXPECT_EQ(cuda.status().message().find('\n'), std::string::npos);
    EXPECT_EQ(*chosen, "cpu");
  }
}

class CudaLlmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status available = CudaLlmAvailable(); !available.ok()) {
      GTEST_SKIP() << available.message();
    }
    auto files = core::ReadCheckpointDir(kModelDir, storage_);
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *files;
    core::LoadOptions options;
    auto model = core::Model::Load(files_, options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    refs_ = core::testing::LoadReferences(kModelDir);
  }

  std::unique_ptr<core::StepEngine> Engine(core::Precision precision, int32_t blocks,
                                           int32_t block_size = 16) {
    core::EngineOptions options;
    options.executor = "cuda";
    options.num_blocks = blocks;
    options.block_size = block_size;
    options.precision = precision;
    auto engine = core::CreateEngine(*model_, files_, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  std::unique_ptr<core::Generator> MakeGenerator(core::Precision precision,
                                                 core::GeneratorOptions options) {
    auto blocks = core::KvBlocksFor(model_->config(), options);
    EXPECT_TRUE(blocks.ok());
    auto generator = core::Generator::Create(
        *model_, options, Engine(precision, *blocks, options.block_size));
    EXPECT_TRUE(generator.ok()) << generator.status();
    return generator.ok() ? std::move(*generator) : nullptr;
  }

  // The last prompt position's logits of reference prompt `index` on `engine`.
  std::vector<float> PromptLogits(core::StepEngine& engine, size_t index) {
    std::vector<int32_t> table = {3, 0, 5, 7, 1, 2, 4, 6};  // out of order: paging is exercised
    core::StepSequence part{refs_[index].prompt_ids, 0, table, true, false};
    core::StepResult result;
    absl::Status status = engine.Step({&part, 1}, result);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(result.ids, std::vector<int32_t>{-1});
    return result.logits;
  }

  std::vector<std::string> storage_;
  core::CheckpointFiles files_;
  std::unique_ptr<core::Model> model_;
  std::vector<core::testing::Reference> refs_;
};

TEST_F(CudaLlmTest, LastPositionLogitsMatchTheReferenceAndTheCpuEngine) {
  std::vector<float> expected = core::testing::ReadNpy(kModelDir + "/reference_logits.npy");
  auto engine = Engine(core::Precision::kF32, 8);
  ASSERT_NE(engine, nullptr);
  std::vector<float> logits = PromptLogits(*engine, 0);
  ASSERT_EQ(logits.size(), expected.size());
  const double worst = core::testing::WorstRelativeError(logits, expected);
  EXPECT_LT(worst, 1e-3);

  core::EngineOptions cpu_options;
  cpu_options.num_blocks = 8;
  auto cpu = core::MakeCpuEngine(*model_, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<float> cpu_logits = PromptLogits(**cpu, 0);
  const double against_cpu = core::testing::WorstRelativeError(logits, cpu_logits);
  EXPECT_LT(against_cpu, 1e-4);
  std::printf("cuda f32: worst relative logit error %.3g against the reference, %.3g against cpu\n",
              worst, against_cpu);
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST_F(CudaLlmTest, GreedyIdsMatchTheReferencesAloneAndTogether) {
  const int64_t context = model_->config().max_position_embeddings;
  for (size_t i = 0; i < refs_.size(); ++i) {
    core::GeneratorOptions options;
    options.max_sequences = 1;
    auto generator = MakeGenerator(core::Precision::kF32, options);
    ASSERT_NE(generator, nullptr);
    auto ids = core::testing::RunAll(*generator, core::testing::GreedyRequests({refs_[i]}, context));
    EXPECT_EQ(ids[0], refs_[i].generated_ids) << "prompt " << i;
  }
  // All together: 5-token blocks, 13-token steps, so prompts are prefilled in chunks beside
  // other sequences' decode tokens.
  core::GeneratorOptions options;
  options.block_size = 5;
  options.max_step_tokens = 13;
  auto generator = MakeGenerator(core::Precision::kF32, options);
  ASSERT_NE(generator, nullptr);
  std::vector<std::string> texts;
  auto ids = core::testing::RunAll(*generator, core::testing::GreedyRequests(refs_, context), &texts);
  for (size_t i = 0; i < refs_.size(); ++i) {
    EXPECT_EQ(ids[i], refs_[i].generated_ids) << "prompt " << i;
    EXPECT_EQ(texts[i], refs_[i].generated_text) << "prompt " << i;
  }
}

TEST_F(CudaLlmTest, SeededSamplingMatchesTheCpuEngine) {
  const int64_t context = model_->config().max_position_embeddings;
  std::vector<core::GenerationRequest> requests = core::testing::GreedyRequests(refs_, context);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.temperature = 0.8f;
    requests[i].sampling.top_p = 0.95f;
    requests[i].sampling.seed = 77 + i;
    requests[i].max_tokens = std::min<int64_t>(requests[i].max_tokens, 24);
  }
  core::GeneratorOptions options;
  auto cpu = core::Generator::Create(*model_, options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto expected = core::testing::RunAll(**cpu, requests);
  auto generator = MakeGenerator(core::Precision::kF32, options);
  ASSERT_NE(generator, nullptr);
  auto ids = core::testing::RunAll(*generator, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(ids[i], expected[i]) << "request " << i;
}

// The BF16 path may differ from the float32 references only where a reference step's margin
// (top-1 minus top-2 logit) is within twice its measured logit error.
TEST_F(CudaLlmTest, Bf16DiffersOnlyWhereTheMarginIsBelowItsError) {
  auto f32 = Engine(core::Precision::kF32, 8);
  auto bf16 = Engine(core::Precision::kBf16, 8);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(bf16, nullptr);
  double error = 0;
  for (size_t i = 0; i < refs_.size(); ++i) {
    std::vector<float> a = PromptLogits(*f32, i);
    std::vector<float> b = PromptLogits(*bf16, i);
    for (size_t k = 0; k < a.size(); ++k) error = std::max(error, std::abs(double{a[k]} - b[k]));
  }
  std::printf("cuda bf16: largest absolute logit error against f32 %.4g\n", error);
  RecordProperty("bf16_max_abs_logit_error", std::to_string(error));

  core::GeneratorOptions options;
  auto generator = MakeGenerator(core::Precision::kBf16, options);
  ASSERT_NE(generator, nullptr);
  auto ids = core::testing::RunAll(
      *generator, core::testing::GreedyRequests(refs_, model_->config().max_position_embeddings));
  int identical = 0;
  for (size_t i = 0; i < refs_.size(); ++i) {
    const std::vector<int32_t>& want = refs_[i].generated_ids;
    size_t step = 0;
    while (step < want.size() && step < ids[i].size() && ids[i][step] == want[step]) ++step;
    if (step == want.size() && ids[i].size() == want.size()) {
      ++identical;
      continue;
    }
    ASSERT_LT(step, refs_[i].margins.size());
    const double margin = refs_[i].margins[step];
    std::printf("cuda bf16: prompt %zu departs at step %zu, reference margin %.4g\n", i, step, margin);
    EXPECT_LE(margin, 2 * error) << "prompt " << i << " departs at step " << step;
  }
  std::printf("cuda bf16: %d of %zu prompts identical to the reference\n", identical, refs_.size());
}

TEST_F(CudaLlmTest, BadStepsAreRefusedInOneLine) {
  auto engine = Engine(core::Precision::kF32, 4);
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<int32_t> outside = {9};
  core::StepSequence part{tokens, 0, outside, true, true};
  core::StepResult result;
  absl::Status status = engine->Step({&part, 1}, result);
  EXPECT_THAT(status.message(), HasSubstr("block 9 is not in the cache"));
  std::vector<int32_t> table = {0};
  std::vector<int32_t> bad_token = {static_cast<int32_t>(model_->config().vocab_size)};
  core::StepSequence bad{bad_token, 0, table, true, true};
  status = engine->Step({&bad, 1}, result);
  EXPECT_THAT(status.message(), HasSubstr("is not below vocab_size"));
  // The engine still works afterwards.
  core::StepSequence good{tokens, 0, table, true, true};
  ASSERT_TRUE(engine->Step({&good, 1}, result).ok());
  ASSERT_EQ(result.ids.size(), 1u);
  EXPECT_GE(result.ids[0], 0);
}

}  // namespace
}  // namespace cloister::gpu::llm
