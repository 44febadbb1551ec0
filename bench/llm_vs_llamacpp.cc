#include "base/flags.h"
#include "bench/llm_vs_llamacpp.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/model.h"
#include "nlohmann/json.hpp"
#include "tests/support/process.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kTinyModel[] = "tiny";
constexpr char kSyntheticModel[] = "synthetic";
// The smallest context of the benchmark's models (tiny-llama's max_position_embeddings).
constexpr int kSmallestContext = 512;
// The peer's exit status when node-llama-cpp or its binary does not load.
constexpr int kPeerMissingExit = 2;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

// Resets the kernel's peak-RSS mark of this process ("5" to /proc/self/clear_refs, Linux 4.0+).
void ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) {
      int64_t kib = 0;
      std::istringstream(line.substr(6)) >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// Where each side finds a model at a precision.
struct ModelFiles {
  std::string checkpoint_dir;  // Hugging Face folder, ours
  std::string gguf;            // llama.cpp's
};

ModelFiles FilesFor(const LlmVsLlamaCppOptions& options, const std::string& model,
                    const std::string& precision) {
  if (model == kTinyModel) {
    const std::string dir = (fs::path(options.models_dir) / "llm" / "tiny-llama").string();
    return {dir, precision == "f32"
                     ? (fs::path(dir) / "model.gguf").string()
                     : (fs::path(options.cache_dir) / "tiny-llama" / "model-bf16.gguf").string()};
  }
  const fs::path dir = fs::path(options.cache_dir) / "synthetic-110m";
  return {dir.string(),
          (dir / (precision == "f32" ? "model-f32.gguf" : "model-bf16.gguf")).string()};
}

// `program` itself when it names a path, else the first executable of that name on PATH (the
// child-process helper does not search PATH); `program` unchanged when there is none, so that
// the spawn fails and the caller reports it.
std::string FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return program;
}

// The last non-empty line of a child's stderr, for error messages.
std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  return lines.empty() ? std::string("(no message)") : lines.back();
}

// Writes the synthetic model and the BF16 GGUFs unless their stamps match.
absl::Status GenerateModels(const LlmVsLlamaCppOptions& options, std::FILE* log) {
  return RunLlmModelGenerator(options.python, options.generator_script, options.models_dir,
                              options.cache_dir, options.seed, {}, log);
}

absl::StatusOr<std::string> ResolveLlamaModulesDir(const std::string& dir) {
  std::error_code error;
  if (fs::exists(fs::path(dir) / "node-llama-cpp", error)) return dir;
  const fs::path nested = fs::path(dir) / "node_modules";
  if (fs::exists(nested / "node-llama-cpp", error)) return nested.string();
  return absl::FailedPreconditionError(
      absl::StrCat("node-llama-cpp not found in ", dir,
                   " (install it with scripts/install-bench-deps.sh, or pass --llama-dir)"));
}

// Runs the peer once over every sequence count; one LlmSideFigures per count.
absl::StatusOr<std::vector<LlmSideFigures>> RunPeer(const LlmVsLlamaCppOptions& options,
                                                    const std::string& modules_dir,
                                                    const std::string& gguf,
                                                    const std::string& prompts_file, int threads,
                                                    LlamaPeerInfo* info, int64_t* file_bytes) {
  std::vector<std::string> argv = {FindProgram(options.node),
                                   options.peer_script,
                                   "--modules",
                                   modules_dir,
                                   "--model",
                                   gguf,
                                   "--prompts",
                                   prompts_file,
                                   "--threads",
                                   std::to_string(threads),
                                   "--sequences",
                                   absl::StrJoin(options.sequences, ","),
                                   "--decode-tokens",
                                   std::to_string(options.decode_tokens),
                                   "--warmup",
                                   std::to_string(options.warmup),
                                   "--repeats",
                                   std::to_string(options.repeats),
                                   "--step-tokens",
                                   std::to_string(options.step_tokens),
                                   "--flash-attention",
                                   options.flash_attention,
                                   "--kv-type",
                                   "F32"};
  testing::RunResult result = testing::Run(argv, {}, absl::Hours(2));
  if (result.exit_code == kPeerMissingExit) {
    return absl::FailedPreconditionError(absl::StrCat("llama.cpp peer: ", LastLine(result.err)));
  }
  if (result.exit_code != 0) {
    return absl::InternalError(absl::StrCat("llama.cpp peer (", gguf, ", exit ", result.exit_code,
                                            "): ", LastLine(result.err)));
  }
  return ParseLlamaPeerDocument(result.out, options.sequences, options.decode_tokens, info,
                                file_bytes);
}

// Our side of one case: N sequences through one Generator, passes as the peer runs them.
absl::StatusOr<LlmSideFigures> RunOurs(const LlmVsLlamaCppOptions& options, const llm::Model& model,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       int threads) {
  const int count = static_cast<int>(prompts.size());
  llm::GeneratorOptions generator_options;
  generator_options.threads = threads;
  generator_options.max_sequences = count;
  generator_options.max_step_tokens = options.step_tokens;
  const int64_t positions = options.prompt_tokens + options.decode_tokens;
  const int32_t blocks_per_sequence = static_cast<int32_t>(
      (positions + generator_options.block_size - 1) / generator_options.block_size);
  generator_options.kv_blocks = count * (blocks_per_sequence + 1);

  ResetPeakRss();
  ASSIGN_OR_RETURN(std::unique_ptr<llm::Generator> generator,
                   llm::Generator::Create(model, generator_options));
  return MeasureGenerator(*generator, prompts, options.decode_tokens, options.warmup,
                          options.repeats);
}

}  // namespace

absl::StatusOr<LlmSideFigures> MeasureGenerator(llm::Generator& generator,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                int decode_tokens, int warmup, int repeats) {
  const int count = static_cast<int>(prompts.size());
  LlmSideFigures figures;
  figures.kv_bytes_per_token = static_cast<int64_t>(generator.engine().kv_bytes_per_token());
  std::vector<double> prefill_rates;
  std::vector<double> decode_rates;
  std::optional<std::vector<std::vector<int32_t>>> first_ids;
  int64_t prompt_total = 0;
  for (const auto& prompt : prompts) prompt_total += static_cast<int64_t>(prompt.size());

  for (int pass = 0; pass < warmup + repeats; ++pass) {
    std::vector<std::vector<int32_t>> ids(count);
    std::map<uint64_t, int> index_of;
    const auto start = Clock::now();
    for (int i = 0; i < count; ++i) {
      llm::GenerationRequest request;
      request.prompt_ids = prompts[i];
      request.sampling.temperature = 0;
      request.max_tokens = decode_tokens;
      request.ignore_eos = true;
      ASSIGN_OR_RETURN(uint64_t id, generator.Add(std::move(request)));
      index_of[id] = i;
    }
    int with_first_token = 0;
    int64_t produced = 0;
    int64_t produced_at_prefill_end = 0;
    Clock::time_point prefill_end;
    while (!generator.idle()) {
      ASSIGN_OR_RETURN(std::vector<llm::TokenEvent> events, generator.Step());
      for (const llm::TokenEvent& event : events) {
        auto found = index_of.find(event.sequence);
        if (found == index_of.end()) {
          return absl::InternalError("the generator reported an unknown sequence");
        }
        std::vector<int32_t>& sequence_ids = ids[found->second];
        if (event.finish == llm::FinishReason::kCancelled) {
          return absl::InternalError(
              absl::StrCat("sequence ", found->second, " was cancelled by the generator"));
        }
        sequence_ids.push_back(event.token.id);
        ++produced;
        if (sequence_ids.size() == 1) ++with_first_token;
        if (event.finish != llm::FinishReason::kNone &&
            static_cast<int>(sequence_ids.size()) != decode_tokens) {
          return absl::InternalError(absl::StrCat("sequence ", found->second, " finished (",
                                                  std::string(llm::FinishReasonName(event.finish)),
                                                  ") after ", sequence_ids.size(), " of ",
                                                  decode_tokens, " tokens"));
        }
      }
      if (with_first_token == count && produced_at_prefill_end == 0) {
        prefill_end = Clock::now();
        produced_at_prefill_end = produced;
      }
    }
    const auto end = Clock::now();
    for (int i = 0; i < count; ++i) {
      if (static_cast<int>(ids[i].size()) != decode_tokens) {
        return absl::InternalError(absl::StrCat("sequence ", i, " produced ", ids[i].size(), " of ",
                                                decode_tokens, " tokens"));
      }
    }
    if (!first_ids) {
      first_ids = ids;
    } else if (ids != *first_ids) {
      figures.ids_stable = false;
    }
    if (pass < warmup) continue;
    if (pass == warmup) figures.generated_ids = ids;
    prefill_rates.push_back(static_cast<double>(prompt_total) / Seconds(start, prefill_end));
    const int64_t decoded = produced - produced_at_prefill_end;
    const double decode_seconds = Seconds(prefill_end, end);
    decode_rates.push_back(decoded > 0 && decode_seconds > 0 ? decoded / decode_seconds : 0);
  }
  figures.prefill_tokens_per_s = Median(prefill_rates);
  figures.decode_tokens_per_s = Median(decode_rates);
  figures.peak_rss_bytes = PeakRssBytes();
  return figures;
}


absl::Status RunLlmModelGenerator(const std::string& python, const std::string& script,
                                  const std::string& models_dir, const std::string& cache_dir,
                                  uint64_t seed, const std::vector<std::string>& models,
                                  std::FILE* log) {
  if (!FileExists(script)) {
    return absl::FailedPreconditionError(absl::StrCat("model generator ", script, " not found"));
  }
  const std::string tiny_dir = (fs::path(models_dir) / "llm" / "tiny-llama").string();
  std::vector<std::string> argv = {FindProgram(python), script,   cache_dir, "--tiny-dir",
                                   tiny_dir,            "--seed", std::to_string(seed)};
  if (!models.empty()) {
    argv.push_back("--models");
    argv.push_back(absl::StrJoin(models, ","));
  }
  testing::RunResult result = testing::Run(argv, {}, absl::Minutes(20));
  if (result.exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("writing the benchmark models into ", cache_dir, " failed (", python, " ",
                     script, ", exit ", result.exit_code, "): ", LastLine(result.err)));
  }
  absl::FPrintF(log, "%s", result.out);
  return absl::OkStatus();
}

IdComparison CompareGeneratedIds(const std::vector<std::vector<int32_t>>& ours,
                                 const std::vector<std::vector<int32_t>>& theirs) {
  IdComparison comparison;
  comparison.match = ours.size() == theirs.size();
  const size_t sequences = std::max(ours.size(), theirs.size());
  for (size_t s = 0; s < sequences; ++s) {
    static const std::vector<int32_t> kNone;
    const std::vector<int32_t>& a = s < ours.size() ? ours[s] : kNone;
    const std::vector<int32_t>& b = s < theirs.size() ? theirs[s] : kNone;
    size_t common = 0;
    while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
    comparison.matching_tokens += static_cast<int64_t>(common);
    comparison.compared_tokens += static_cast<int64_t>(std::max(a.size(), b.size()));
    if (common != a.size() || common != b.size()) {
      comparison.match = false;
      if (comparison.first_mismatch_sequence < 0) {
        comparison.first_mismatch_sequence = static_cast<int>(s);
        comparison.first_mismatch_step = static_cast<int>(common);
      }
    }
  }
  return comparison;
}

double LlmVsLlamaCppLine::bandwidth_fraction() const {
  if (bandwidth_bytes_per_s <= 0 || sequences <= 0) return 0;
  return static_cast<double>(weight_bytes) * (ours.decode_tokens_per_s / sequences) /
         bandwidth_bytes_per_s;
}

double LlmVsLlamaCppLine::llama_bandwidth_fraction() const {
  if (bandwidth_bytes_per_s <= 0 || sequences <= 0) return 0;
  return static_cast<double>(llama_model_file_bytes) * (llama.decode_tokens_per_s / sequences) /
         bandwidth_bytes_per_s;
}

std::vector<std::vector<int32_t>> MakeBenchPrompts(int count, int tokens, int64_t vocab_size,
                                                   std::optional<int32_t> bos_id,
                                                   const std::vector<int32_t>& excluded,
                                                   uint64_t seed) {
  std::set<int32_t> skip(excluded.begin(), excluded.end());
  if (bos_id) skip.insert(*bos_id);
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (!skip.count(id)) allowed.push_back(id);
  }
  std::vector<std::vector<int32_t>> prompts(count);
  for (int i = 0; i < count; ++i) {
    // One stream per prompt. mt19937_64's output is fixed by the standard, and the index is
    // drawn by modulo (not std::uniform_int_distribution, whose algorithm is not), so the
    // prompts are the same with every standard library.
    std::mt19937_64 random(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
    std::vector<int32_t>& prompt = prompts[i];
    if (bos_id && tokens > 0) prompt.push_back(*bos_id);
    while (static_cast<int>(prompt.size()) < tokens && !allowed.empty()) {
      prompt.push_back(allowed[random() % allowed.size()]);
    }
  }
  return prompts;
}

absl::StatusOr<std::vector<LlmSideFigures>> ParseLlamaPeerDocument(
    std::string_view document, const std::vector<int>& sequences, int decode_tokens,
    LlamaPeerInfo* info, int64_t* model_file_bytes) {
  const json root = json::parse(document, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) {
    return absl::InternalError(absl::StrCat("llama.cpp peer printed no JSON document: ",
                                            std::string(document.substr(0, 200))));
  }
  auto string_field = [&](const char* key) {
    return root.contains(key) && root[key].is_string() ? root[key].get<std::string>() : "";
  };
  if (info != nullptr) {
    info->version = string_field("version");
    info->llama_cpp_release = string_field("llama_cpp_release");
    info->system_info = string_field("system_info");
  }
  if (model_file_bytes != nullptr) {
    *model_file_bytes = root.contains("model_file_bytes") && root["model_file_bytes"].is_number()
                            ? root["model_file_bytes"].get<int64_t>()
                            : 0;
  }
  const int64_t kv_bytes =
      root.contains("kv_bytes_per_token") && root["kv_bytes_per_token"].is_number_integer()
          ? root["kv_bytes_per_token"].get<int64_t>()
          : 0;
  if (!root.contains("runs") || !root["runs"].is_array() ||
      root["runs"].size() != sequences.size()) {
    return absl::InternalError(
        absl::StrCat("llama.cpp peer's document does not hold ", sequences.size(), " runs"));
  }
  std::vector<LlmSideFigures> figures;
  for (size_t r = 0; r < sequences.size(); ++r) {
    const json& run = root["runs"][r];
    const bool well_formed =
        run.is_object() && run.contains("sequences") && run["sequences"] == sequences[r] &&
        run.contains("prefill_tokens_per_s") && run["prefill_tokens_per_s"].is_number() &&
        run.contains("decode_tokens_per_s") && run["decode_tokens_per_s"].is_number() &&
        run.contains("generated_ids") && run["generated_ids"].is_array() &&
        run["generated_ids"].size() == static_cast<size_t>(sequences[r]);
    if (!well_formed) {
      return absl::InternalError(absl::StrCat(
          "llama.cpp peer's run ", r, " is malformed or is not for ", sequences[r], " sequences"));
    }
    LlmSideFigures side;
    side.prefill_tokens_per_s = run["prefill_tokens_per_s"].get<double>();
    side.decode_tokens_per_s = run["decode_tokens_per_s"].get<double>();
    side.ids_stable = run.contains("ids_stable") && run["ids_stable"] == true;
    side.kv_bytes_per_token = kv_bytes;
    side.peak_rss_bytes = run.contains("peak_rss_bytes") && run["peak_rss_bytes"].is_number()
                              ? run["peak_rss_bytes"].get<int64_t>()
                              : 0;
    for (const json& ids : run["generated_ids"]) {
      if (!ids.is_array() || ids.size() != static_cast<size_t>(decode_tokens) ||
          !std::all_of(ids.begin(), ids.end(),
                       [](const json& id) { return id.is_number_integer(); })) {
        return absl::InternalError(absl::StrCat("llama.cpp peer's run ", r, " does not hold ",
                                                decode_tokens, " ids per sequence"));
      }
      side.generated_ids.push_back(ids.get<std::vector<int32_t>>());
    }
    figures.push_back(std::move(side));
  }
  return figures;
}

std::string LlmVsLlamaCppUsage() {
  return "[--json] [--models tiny,synthetic] [--precisions f32,bf16] [--threads 1,2]\n"
         "      [--sequences 1,16] [--prompt-tokens 128] [--decode-tokens 64] [--warmup 1]\n"
         "      [--repeats 3] [--step-tokens 512] [--flash-attention off|on|auto]\n"
         "      [--llama-dir DIR] [--cache-dir DIR] [--models-dir DIR] [--node PROGRAM]\n"
         "      [--python PROGRAM] [--bandwidth-mib 1024] [--bandwidth-passes 5] [--seed N]\n";
}

absl::StatusOr<LlmVsLlamaCppOptions> ParseLlmVsLlamaCppFlags(const std::vector<std::string>& args,
                                                             LlmVsLlamaCppOptions defaults) {
  LlmVsLlamaCppOptions options = std::move(defaults);
  std::string models = absl::StrJoin(options.models, ",");
  std::string precisions = absl::StrJoin(options.precisions, ",");
  std::string seed = std::to_string(options.seed);
  RETURN_IF_ERROR(ParseFlags(
      args, {
                {"--json", SwitchFlag{&options.json}},
                {"--models", StringFlag{&models, {}}},
                {"--precisions", StringFlag{&precisions, {}}},
                {"--threads", IntListFlag{&options.threads, 1}},
                {"--sequences", IntListFlag{&options.sequences, 1}},
                {"--prompt-tokens", IntFlag{&options.prompt_tokens, 1}},
                {"--decode-tokens", IntFlag{&options.decode_tokens, 2}},
                {"--warmup", IntFlag{&options.warmup, 0}},
                {"--repeats", IntFlag{&options.repeats, 1}},
                {"--step-tokens", IntFlag{&options.step_tokens, 1}},
                {"--flash-attention", StringFlag{&options.flash_attention, {"off", "on", "auto"}}},
                {"--llama-dir", StringFlag{&options.llama_dir, {}}},
                {"--cache-dir", StringFlag{&options.cache_dir, {}}},
                {"--models-dir", StringFlag{&options.models_dir, {}}},
                {"--node", StringFlag{&options.node, {}}},
                {"--python", StringFlag{&options.python, {}}},
                {"--bandwidth-mib", IntFlag{&options.bandwidth_mib, 1}},
                {"--bandwidth-passes", IntFlag{&options.bandwidth_passes, 1}},
                {"--seed", StringFlag{&seed, {}}},
            }));
  options.models = absl::StrSplit(models, ',', absl::SkipEmpty());
  options.precisions = absl::StrSplit(precisions, ',', absl::SkipEmpty());
  if (options.models.empty()) return absl::InvalidArgumentError("--models names no model");
  for (const std::string& model : options.models) {
    if (model != kTinyModel && model != kSyntheticModel) {
      return absl::InvalidArgumentError(
          absl::StrCat("--models: unknown model ", model, " (tiny, synthetic)"));
    }
  }
  if (options.precisions.empty()) {
    return absl::InvalidArgumentError("--precisions names no precision");
  }
  for (const std::string& precision : options.precisions) {
    if (precision != "f32" && precision != "bf16") {
      return absl::InvalidArgumentError(
          absl::StrCat("--precisions: unknown precision ", precision, " (f32, bf16)"));
    }
  }
  if (!absl::SimpleAtoi(seed, &options.seed)) {
    return absl::InvalidArgumentError(absl::StrCat("--seed: not an unsigned integer: ", seed));
  }
  if (options.prompt_tokens + options.decode_tokens > kSmallestContext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-tokens + --decode-tokens is ", options.prompt_tokens + options.decode_tokens,
        ", more than the tiny model's context of ", kSmallestContext));
  }
  return options;
}

std::string LlmVsLlamaCppJsonDocument(const LlmVsLlamaCppOptions& options,
                                      const LlmVsLlamaCppReport& report) {
  json lines = json::array();
  for (const LlmVsLlamaCppLine& line : report.lines) {
    json first_mismatch = nullptr;
    if (line.outputs.first_mismatch_sequence >= 0) {
      first_mismatch = {{"sequence", line.outputs.first_mismatch_sequence},
                        {"step", line.outputs.first_mismatch_step}};
    }
    lines.push_back({
        {"model", line.model},
        {"precision", line.precision},
        {"threads", line.threads},
        {"sequences", line.sequences},
        {"prompt_tokens", line.prompt_tokens},
        {"decode_tokens", line.decode_tokens},
        {"ours_prefill_tokens_per_s", line.ours.prefill_tokens_per_s},
        {"llama_prefill_tokens_per_s", line.llama.prefill_tokens_per_s},
        {"ours_decode_tokens_per_s", line.ours.decode_tokens_per_s},
        {"llama_decode_tokens_per_s", line.llama.decode_tokens_per_s},
        {"prefill_ratio", line.prefill_ratio()},
        {"decode_ratio", line.decode_ratio()},
        {"outputs_match", line.outputs.match},
        {"matching_tokens", line.outputs.matching_tokens},
        {"compared_tokens", line.outputs.compared_tokens},
        {"first_mismatch", first_mismatch},
        {"ours_ids_stable", line.ours.ids_stable},
        {"llama_ids_stable", line.llama.ids_stable},
        {"bandwidth_fraction", line.bandwidth_fraction()},
        {"llama_bandwidth_fraction", line.llama_bandwidth_fraction()},
        {"weight_bytes", line.weight_bytes},
        {"llama_model_file_bytes", line.llama_model_file_bytes},
        {"kv_bytes_per_token", line.ours.kv_bytes_per_token},
        {"llama_kv_bytes_per_token", line.llama.kv_bytes_per_token},
        {"ours_peak_rss_bytes", line.ours.peak_rss_bytes},
        {"llama_peak_rss_bytes", line.llama.peak_rss_bytes},
    });
  }
  json bandwidth_by_threads = json::object();
  for (const auto& [threads, bytes_per_s] : report.bandwidth_by_threads) {
    bandwidth_by_threads[std::to_string(threads)] = bytes_per_s;
  }
  json document = {
      {"benchmark", "llm-vs-llamacpp"},
      {"peer",
       {{"name", "node-llama-cpp"},
        {"version", report.peer.version},
        {"llama_cpp_release", report.peer.llama_cpp_release},
        {"system_info", report.peer.system_info}}},
      {"settings",
       {{"prompt_tokens", options.prompt_tokens},
        {"decode_tokens", options.decode_tokens},
        {"warmup", options.warmup},
        {"repeats", options.repeats},
        {"step_tokens", options.step_tokens},
        {"flash_attention", options.flash_attention},
        {"kv_type", "F32"},
        {"sampling", "greedy, eos ignored"},
        {"seed", options.seed}}},
      {"bandwidth",
       {{"bytes_per_s", report.bandwidth_bytes_per_s},
        {"threads", report.bandwidth_threads},
        {"by_threads", bandwidth_by_threads},
        {"buffer_bytes", static_cast<int64_t>(options.bandwidth_mib) << 20}}},
      {"lines", lines},
  };
  return document.dump();
}

std::string LlmVsLlamaCppTable(const LlmVsLlamaCppReport& report) {
  std::string table =
      absl::StrFormat("%-9s %-4s %3s %4s %10s %10s %7s %9s %9s %7s %6s %6s %7s\n", "model", "prec",
                      "thr", "seqs", "ours pf/s", "llama pf/s", "pf x", "ours tg/s", "llama tg/s",
                      "tg x", "bw", "llm bw", "match");
  for (const LlmVsLlamaCppLine& line : report.lines) {
    absl::StrAppendFormat(
        &table, "%-9s %-4s %3d %4d %10.1f %10.1f %7.2f %9.1f %9.1f %7.2f %6.3f %6.3f %7s\n",
        line.model, line.precision, line.threads, line.sequences, line.ours.prefill_tokens_per_s,
        line.llama.prefill_tokens_per_s, line.prefill_ratio(), line.ours.decode_tokens_per_s,
        line.llama.decode_tokens_per_s, line.decode_ratio(), line.bandwidth_fraction(),
        line.llama_bandwidth_fraction(),
        line.outputs.match
            ? "yes"
            : absl::StrFormat("%lld/%lld", static_cast<long long>(line.outputs.matching_tokens),
                              static_cast<long long>(line.outputs.compared_tokens)));
  }
  absl::StrAppendFormat(&table,
                        "pf: prefill tokens/s, tg: decode tokens/s, x: ours / llama.cpp; bw: "
                        "weight bytes per step x steps/s / %.1f GB/s read bandwidth (%d threads)\n",
                        report.bandwidth_bytes_per_s / 1e9, report.bandwidth_threads);
  return table;
}

absl::StatusOr<LlmVsLlamaCppReport> RunLlmVsLlamaCpp(const LlmVsLlamaCppOptions& options,
                                                     std::FILE* out, std::FILE* log) {
  LlmVsLlamaCppReport report;
  ASSIGN_OR_RETURN(std::string modules_dir, ResolveLlamaModulesDir(options.llama_dir));
  if (!FileExists(options.peer_script)) {
    return absl::FailedPreconditionError(
        absl::StrCat("llama.cpp peer script ", options.peer_script, " not found"));
  }
  if (testing::Run({FindProgram(options.node), "--version"}, {}, absl::Seconds(30)).exit_code !=
      0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", options.node, " (install Node.js, or pass --node)"));
  }
  const bool wants_generated =
      std::count(options.models.begin(), options.models.end(), kSyntheticModel) > 0 ||
      std::count(options.precisions.begin(), options.precisions.end(), "bf16") > 0;
  if (wants_generated) {
    RETURN_IF_ERROR(MakeDirs(options.cache_dir, 0755));
    RETURN_IF_ERROR(GenerateModels(options, log));
  }

  // The machine's read bandwidth, with all hardware threads and at each case's thread count.
  const size_t probe_size = static_cast<size_t>(options.bandwidth_mib) << 20;
  report.bandwidth_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::set<int> probe_threads(options.threads.begin(), options.threads.end());
  probe_threads.insert(report.bandwidth_threads);
  for (int threads : probe_threads) {
    ASSIGN_OR_RETURN(double bytes_per_s,
                     MeasureReadBandwidth(probe_size, threads, options.bandwidth_passes));
    report.bandwidth_by_threads[threads] = bytes_per_s;
    absl::FPrintF(log, "memory read bandwidth, %d threads: %.2f GB/s\n", threads,
                  bytes_per_s / 1e9);
  }
  report.bandwidth_bytes_per_s = report.bandwidth_by_threads[report.bandwidth_threads];
  const int most_sequences = *std::max_element(options.sequences.begin(), options.sequences.end());

  for (const std::string& model_name : options.models) {
    for (const std::string& precision : options.precisions) {
      const ModelFiles files = FilesFor(options, model_name, precision);
      const std::string label = absl::StrCat(model_name, " ", precision);
      std::vector<std::string> storage;
      auto checkpoint = llm::ReadCheckpointDir(files.checkpoint_dir, storage);
      if (!checkpoint.ok()) {
        return absl::Status(checkpoint.status().code(),
                            absl::StrCat(label, ": ", checkpoint.status().message()));
      }
      llm::LoadOptions load_options;
      load_options.weights =
          precision == "f32" ? llm::WeightFormat::kF32 : llm::WeightFormat::kAsStored;
      auto loaded = llm::Model::Load(*checkpoint, load_options);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            absl::StrCat(label, ": ", loaded.status().message()));
      }
      std::unique_ptr<llm::Model> model = std::move(*loaded);
      // The model holds its own copy of the weights; the file bytes would only inflate our peak.
      checkpoint->clear();
      storage.clear();
      storage.shrink_to_fit();

      const llm::ModelConfig& config = model->config();
      std::vector<std::vector<int32_t>> prompts =
          MakeBenchPrompts(most_sequences, options.prompt_tokens, config.vocab_size,
                           config.bos_token_id, config.eos_token_ids, options.seed);
      const std::string prompts_file =
          (fs::path(options.cache_dir) / absl::StrCat("prompts-", model_name, ".json")).string();
      RETURN_IF_ERROR(MakeDirs(options.cache_dir, 0755));
      RETURN_IF_ERROR(WriteFileAtomic(prompts_file, json(prompts).dump(), 0644));

      for (int threads : options.threads) {
        absl::FPrintF(log, "%s, %d threads: llama.cpp (%s)\n", label, threads, files.gguf);
        int64_t file_bytes = 0;
        auto theirs = RunPeer(options, modules_dir, files.gguf, prompts_file, threads, &report.peer,
                              &file_bytes);
        if (!theirs.ok()) {
          return absl::Status(
              theirs.status().code(),
              absl::StrCat(label, ", ", threads, " threads: ", theirs.status().message()));
        }
        for (size_t r = 0; r < options.sequences.size(); ++r) {
          const int count = options.sequences[r];
          absl::FPrintF(log, "%s, %d threads, %d sequences: ours\n", label, threads, count);
          const std::vector<std::vector<int32_t>> case_prompts(prompts.begin(),
                                                               prompts.begin() + count);
          auto ours = RunOurs(options, *model, case_prompts, threads);
          if (!ours.ok()) {
            return absl::Status(ours.status().code(),
                                absl::StrCat(label, ", ", threads, " threads, ", count,
                                             " sequences: ", ours.status().message()));
          }
          LlmVsLlamaCppLine line;
          line.model = model_name;
          line.precision = precision;
          line.threads = threads;
          line.sequences = count;
          line.prompt_tokens = options.prompt_tokens;
          line.decode_tokens = options.decode_tokens;
          line.ours = std::move(*ours);
          line.llama = std::move((*theirs)[r]);
          line.outputs = CompareGeneratedIds(line.ours.generated_ids, line.llama.generated_ids);
          line.weight_bytes = static_cast<int64_t>(model->weight_bytes());
          line.llama_model_file_bytes = file_bytes;
          line.bandwidth_bytes_per_s = report.bandwidth_bytes_per_s;
          if (!options.json) {
            absl::FPrintF(log, "  prefill %.1f vs %.1f tokens/s, decode %.1f vs %.1f, ids %s\n",
                          line.ours.prefill_tokens_per_s, line.llama.prefill_tokens_per_s,
                          line.ours.decode_tokens_per_s, line.llama.decode_tokens_per_s,
                          line.outputs.match ? "equal" : "differ");
          }
          report.lines.push_back(std::move(line));
        }
      }
    }
  }
  if (options.json) {
    absl::FPrintF(out, "%s\n", LlmVsLlamaCppJsonDocument(options, report));
  } else {
    absl::FPrintF(out, "%s", LlmVsLlamaCppTable(report));
  }
  return report;
}

}  // namespace cloister::bench
