#include "base/flags.h"
#include "bench/llm_cuda.h"

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "bench/llm_vs_llamacpp.h"
#include "enclave/llm/engine.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/model.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;

std::string CheckpointDirFor(const LlmCudaOptions& options, const std::string& model) {
  if (model == "tiny") return (fs::path(options.models_dir) / "llm" / "tiny-llama").string();
  return (fs::path(options.cache_dir) / (model == "synthetic" ? "synthetic-110m" : model)).string();
}

absl::Status GenerateModels(const LlmCudaOptions& options, std::FILE* log) {
  std::vector<std::string> wanted;
  for (const std::string& model : options.models) {
    if (model != "tiny") wanted.push_back(model);
  }
  if (wanted.empty()) return absl::OkStatus();
  return RunLlmModelGenerator(options.python, options.generator_script, options.models_dir,
                              options.cache_dir, options.seed, wanted, log);
}

}  // namespace

std::string LlmCudaUsage() {
  return "[--json] [--models synthetic-1b,synthetic,tiny] [--precisions bf16,f32]\n"
         "      [--sequences 1,32] [--prompt-tokens 128] [--decode-tokens 64] [--warmup 1]\n"
         "      [--repeats 3] [--step-tokens 2048] [--executor cuda] [--cache-dir DIR]\n"
         "      [--models-dir DIR] [--python PROGRAM]\n";
}

absl::StatusOr<LlmCudaOptions> ParseLlmCudaFlags(const std::vector<std::string>& args,
                                                 LlmCudaOptions defaults) {
  LlmCudaOptions options = std::move(defaults);
  std::string models = absl::StrJoin(options.models, ",");
  std::string precisions = absl::StrJoin(options.precisions, ",");
  RETURN_IF_ERROR(ParseFlags(
      args, {
                {"--json", SwitchFlag{&options.json}},
                {"--models", StringFlag{&models, {}}},
                {"--precisions", StringFlag{&precisions, {}}},
                {"--sequences", IntListFlag{&options.sequences, 1}},
                {"--prompt-tokens", IntFlag{&options.prompt_tokens, 1}},
                {"--decode-tokens", IntFlag{&options.decode_tokens, 2}},
                {"--warmup", IntFlag{&options.warmup, 0}},
                {"--repeats", IntFlag{&options.repeats, 1}},
                {"--step-tokens", IntFlag{&options.step_tokens, 1}},
                {"--executor", StringFlag{&options.executor, {}}},
                {"--cache-dir", StringFlag{&options.cache_dir, {}}},
                {"--models-dir", StringFlag{&options.models_dir, {}}},
                {"--python", StringFlag{&options.python, {}}},
            }));
  options.models = absl::StrSplit(models, ',', absl::SkipEmpty());
  options.precisions = absl::StrSplit(precisions, ',', absl::SkipEmpty());
  if (options.models.empty()) return absl::InvalidArgumentError("--models names no model");
  for (const std::string& model : options.models) {
    if (model != "synthetic-1b" && model != "synthetic" && model != "tiny") {
      return absl::InvalidArgumentError(
          absl::StrCat("--models: unknown model ", model, " (synthetic-1b, synthetic, tiny)"));
    }
  }
  for (const std::string& precision : options.precisions) {
    if (!llm::ParsePrecision(precision).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precisions: unknown precision ", precision, " (bf16, f32)"));
    }
  }
  if (options.precisions.empty()) return absl::InvalidArgumentError("--precisions names none");
  return options;
}

std::string LlmCudaJsonLine(const LlmCudaLine& line) {
  nlohmann::ordered_json doc = {{"case", "llm-cuda"},
                                {"model", line.model},
                                {"precision", line.precision},
                                {"sequences", line.sequences},
                                {"prefill_tokens_per_s", line.prefill_tokens_per_s},
                                {"decode_tokens_per_s", line.decode_tokens_per_s},
                                {"bandwidth_fraction", line.bandwidth_fraction()},
                                {"read_bandwidth_bytes_per_s", line.read_bandwidth_bytes_per_s},
                                {"weight_bytes", line.weight_bytes},
                                {"kv_bytes_per_token", line.kv_bytes_per_token},
                                {"ids_stable", line.ids_stable}};
  return doc.dump();
}

absl::StatusOr<std::vector<LlmCudaLine>> RunLlmCuda(const LlmCudaOptions& options,
                                                    std::FILE* out, std::FILE* log) {
  ASSIGN_OR_RETURN(std::string executor, llm::ResolveExecutor(options.executor));
  if (executor == "cpu") {
    return absl::FailedPreconditionError("llm-cuda runs on a device engine, not the CPU");
  }
  ASSIGN_OR_RETURN(double bandwidth, llm::EngineReadBandwidth(executor));
  absl::FPrintF(log, "llm-cuda: %s read bandwidth %.1f GB/s\n", executor, bandwidth / 1e9);
  RETURN_IF_ERROR(GenerateModels(options, log));
  std::vector<LlmCudaLine> lines;
  for (const std::string& model_name : options.models) {
    std::vector<std::string> storage;
    ASSIGN_OR_RETURN(llm::CheckpointFiles files,
                     llm::ReadCheckpointDir(CheckpointDirFor(options, model_name), storage));
    llm::LoadOptions load;
    load.weights = llm::WeightFormat::kNone;
    ASSIGN_OR_RETURN(std::unique_ptr<llm::Model> model, llm::Model::Load(files, load));
    const llm::ModelConfig& config = model->config();
    if (options.prompt_tokens + options.decode_tokens > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_name, ": prompt and decode tokens exceed the context of ",
          config.max_position_embeddings));
    }
    for (const std::string& precision : options.precisions) {
      for (int sequences : options.sequences) {
        llm::GeneratorOptions generator_options;
        generator_options.max_sequences = sequences;
        generator_options.max_step_tokens = options.step_tokens;
        const int64_t positions = options.prompt_tokens + options.decode_tokens;
        generator_options.kv_blocks = static_cast<int32_t>(
            sequences * ((positions + generator_options.block_size - 1) /
                             generator_options.block_size + 1));
        llm::EngineOptions engine_options;
        engine_options.executor = executor;
        engine_options.num_blocks = generator_options.kv_blocks;
        engine_options.block_size = generator_options.block_size;
        engine_options.precision = *llm::ParsePrecision(precision);
        ASSIGN_OR_RETURN(std::unique_ptr<llm::StepEngine> engine,
                         llm::CreateEngine(*model, files, engine_options));
        LlmCudaLine line;
        line.model = model_name;
        line.precision = precision;
        line.sequences = sequences;
        line.weight_bytes = static_cast<int64_t>(engine->weight_bytes());
        line.read_bandwidth_bytes_per_s = bandwidth;
        ASSIGN_OR_RETURN(std::unique_ptr<llm::Generator> generator,
                         llm::Generator::Create(*model, generator_options, std::move(engine)));
        std::vector<int32_t> excluded = config.eos_token_ids;
        std::vector<std::vector<int32_t>> prompts =
            MakeBenchPrompts(sequences, options.prompt_tokens, config.vocab_size,
                             config.bos_token_id, excluded, options.seed);
        ASSIGN_OR_RETURN(LlmSideFigures figures,
                         MeasureGenerator(*generator, prompts, options.decode_tokens,
                                          options.warmup, options.repeats));
        line.prefill_tokens_per_s = figures.prefill_tokens_per_s;
        line.decode_tokens_per_s = figures.decode_tokens_per_s;
        line.kv_bytes_per_token = figures.kv_bytes_per_token;
        line.ids_stable = figures.ids_stable;
        if (options.json) {
          absl::FPrintF(out, "%s\n", LlmCudaJsonLine(line));
        } else {
          absl::FPrintF(out,
                        "%-13s %-5s seq %3d  prefill %10.1f tok/s  decode %9.1f tok/s  "
                        "bandwidth_fraction %.3f  weights %.2f GB  kv %lld B/token\n",
                        line.model, line.precision, line.sequences, line.prefill_tokens_per_s,
                        line.decode_tokens_per_s, line.bandwidth_fraction(),
                        line.weight_bytes / 1e9, static_cast<long long>(line.kv_bytes_per_token));
        }
        std::fflush(out);
        lines.push_back(std::move(line));
      }
    }
  }
  return lines;
}

}  // namespace cloister::bench
