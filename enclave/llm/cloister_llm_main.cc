// cloister-llm: the enclave's LLM engine offline, for conformance checks and benchmarks.
//
//   cloister-llm run --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | --chat FILE.json)
//       [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed S]
//       [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
//       [--stop TEXT]... [--top-logprobs N] [--ignore-eos] [--threads N]
//       [--weights as-stored|f32] [--executor auto|cpu|cuda] [--precision f32|bf16] [--json]
//   cloister-llm tokenize --model DIR (--text TEXT | --chat FILE.json) [--json]
//
// Conventions as Hugging Face has them: --prompt and --text add the special tokens that
// tokenizer.json's post-processor adds (a BOS for Llama-family models) and read special-token
// text as special tokens; --chat renders the model's chat template (with the generation prompt)
// and tokenizes the result without adding special tokens, since the template writes its own.
// Generation stops at every eos id of generation_config.json (else config.json). Sampling
// defaults come from generation_config.json (greedy unless it sets do_sample).
//
// Executors: cpu (the CPU engine, --threads, --weights), cuda (the CUDA engine, --precision:
// f32 is the references' float32, bf16 runs 16-bit GEMMs), auto (cuda where a device is
// present, else cpu).
//
// Output: the generated text as it is made (a summary line with the rates on stderr), or one
// JSON document with --json. Errors go to stderr as one
// line; exit 0 on success, 1 when the engine refuses the request, 2 on bad usage or a model or
// file it cannot read.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/flags.h"
#include "base/mutex_tuning.h"
#include "base/status.h"
#include "enclave/llm/chat_template.h"
#include "enclave/llm/engine.h"
#include "enclave/llm/generator.h"
#include "enclave/llm/model.h"
#include "nlohmann/json.hpp"

namespace cloister::llm {
namespace {

constexpr char kUsage[] =
    "usage: cloister-llm run --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | --chat FILE.json)"
    " [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed S]"
    " [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F] [--stop TEXT]"
    " [--top-logprobs N] [--ignore-eos] [--threads N] [--weights as-stored|f32]"
    " [--executor auto|cpu|cuda] [--precision f32|bf16] [--json]\n"
    "       cloister-llm tokenize --model DIR (--text TEXT | --chat FILE.json) [--json]\n";

struct Options {
  std::string command;
  std::string model;
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  std::optional<std::string> chat;
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature, top_p, min_p, repetition_penalty, presence_penalty,
      frequency_penalty;
  std::optional<int64_t> top_k;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  int64_t top_logprobs = 0;
  bool ignore_eos = false;
  int64_t threads = 1;
  std::string weights = "as-stored";
  std::string executor = "auto";
  Precision precision = Precision::kF32;
  bool json = false;
};

int UsageError(const std::string& message) {
  std::cerr << "cloister-llm: " << message << "\n" << kUsage;
  return 2;
}

// A line on stderr; returns `exit_code`.
int Fail(int exit_code, absl::string_view message) {
  std::cerr << "cloister-llm: " << message << "\n";
  return exit_code;
}

absl::Status ParseNumber(const std::string& flag, const std::string& text, double& out) {
  if (!absl::SimpleAtod(text, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be a number, got \"", text, "\""));
  }
  return absl::OkStatus();
}

absl::Status ParseNumber(const std::string& flag, const std::string& text, uint64_t& out) {
  if (!absl::SimpleAtoi(text, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be a non-negative integer, got \"", text, "\""));
  }
  return absl::OkStatus();
}

absl::Status ParseNumber(const std::string& flag, const std::string& text, int64_t& out) {
  if (!absl::SimpleAtoi(text, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be an integer, got \"", text, "\""));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ParseNumber(const std::string& flag, const std::string& text, std::optional<T>& out) {
  T number;
  RETURN_IF_ERROR(ParseNumber(flag, text, number));
  out = number;
  return absl::OkStatus();
}

// A flag holding a number of `out`'s type (an optional one stays unset until given); `out` is
// left as it was when the value is not such a number.
template <typename T>
FlagSpec NumberFlag(const std::string& name, T* out) {
  return {name, CustomFlag{[name, out](const std::string& text) {
            T number = *out;
            RETURN_IF_ERROR(ParseNumber(name, text, number));
            *out = number;
            return absl::OkStatus();
          }}};
}

// The flags of `o.command`, filling `o`.
std::vector<FlagSpec> CommandFlags(Options& o) {
  std::vector<FlagSpec> flags = {{"--model", StringFlag{&o.model}},
                                 {"--chat", OptionalStringFlag{&o.chat}},
                                 {"--json", SwitchFlag{&o.json}}};
  if (o.command == "tokenize") {
    flags.push_back({"--text", OptionalStringFlag{&o.prompt}});
    return flags;
  }
  flags.insert(flags.end(),
               {{"--prompt", OptionalStringFlag{&o.prompt}},
                {"--prompt-ids", OptionalStringFlag{&o.prompt_ids}},
                NumberFlag("--max-tokens", &o.max_tokens),
                NumberFlag("--temperature", &o.temperature),
                NumberFlag("--top-p", &o.top_p),
                NumberFlag("--top-k", &o.top_k),
                NumberFlag("--min-p", &o.min_p),
                NumberFlag("--repetition-penalty", &o.repetition_penalty),
                NumberFlag("--presence-penalty", &o.presence_penalty),
                NumberFlag("--frequency-penalty", &o.frequency_penalty),
                NumberFlag("--seed", &o.seed),
                {"--stop", StringListFlag{&o.stop}},
                NumberFlag("--top-logprobs", &o.top_logprobs),
                {"--ignore-eos", SwitchFlag{&o.ignore_eos}},
                {"--threads", CustomFlag{[&o](const std::string& text) {
                   RETURN_IF_ERROR(ParseNumber("--threads", text, o.threads));
                   if (o.threads < 1 || o.threads > 1024) {
                     return absl::InvalidArgumentError("--threads must be in [1, 1024]");
                   }
                   return absl::OkStatus();
                 }}},
                {"--weights", CustomFlag{[&o](const std::string& text) {
                   if (text != "as-stored" && text != "f32") {
                     return absl::InvalidArgumentError("--weights must be as-stored or f32");
                   }
                   o.weights = text;
                   return absl::OkStatus();
                 }}},
                {"--executor", CustomFlag{[&o](const std::string& text) {
                   if (text != "auto" && text != "cpu" && text != "cuda") {
                     return absl::InvalidArgumentError("--executor must be auto, cpu or cuda");
                   }
                   o.executor = text;
                   return absl::OkStatus();
                 }}},
                {"--precision", CustomFlag{[&o](const std::string& text) {
                   absl::StatusOr<Precision> precision = ParsePrecision(text);
                   if (!precision.ok()) {
                     return absl::InvalidArgumentError("--precision must be f32 or bf16");
                   }
                   o.precision = *precision;
                   return absl::OkStatus();
                 }}}});
  return flags;
}

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options o;
  if (argc < 2) return absl::InvalidArgumentError("missing command (run or tokenize)");
  o.command = argv[1];
  if (o.command != "run" && o.command != "tokenize") {
    return absl::InvalidArgumentError(absl::StrCat("unknown command \"", o.command, "\""));
  }
  // The other command's prompt flag is named as such; the rest are unknown options.
  const bool run = o.command == "run";
  const FlagSyntax syntax{.inline_values = false, .unknown_flag = [run](const std::string& arg) {
                            if (arg == (run ? "--text" : "--prompt")) {
                              return absl::StrCat(arg, " is not an option of ",
                                                  run ? "run" : "tokenize");
                            }
                            return absl::StrCat("unknown option ", arg, run ? "" : " for tokenize");
                          }};
  RETURN_IF_ERROR(
      ParseFlags(std::vector<std::string>(argv + 2, argv + argc), CommandFlags(o), syntax));
  if (o.model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  int inputs = o.prompt.has_value() + o.prompt_ids.has_value() + o.chat.has_value();
  if (inputs != 1) {
    return absl::InvalidArgumentError(run ? "give exactly one of --prompt, --prompt-ids, --chat"
                                          : "give exactly one of --text, --chat");
  }
  return o;
}

// The prompt's ids, by the conventions in the file comment. Errors are bad input (exit 2).
absl::StatusOr<std::vector<int32_t>> PromptIds(const Options& o, const Model& model) {
  if (o.prompt_ids) {
    std::vector<int32_t> ids;
    for (absl::string_view piece : absl::StrSplit(*o.prompt_ids, ',', absl::SkipWhitespace())) {
      int32_t id;
      if (!absl::SimpleAtoi(piece, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompt-ids: \"", std::string(piece), "\" is not a token id"));
      }
      ids.push_back(id);
    }
    return ids;
  }
  if (o.prompt) return model.tokenizer().Encode(*o.prompt, /*add_special_tokens=*/true);
  ASSIGN_OR_RETURN(std::string text, ReadFile(*o.chat, 64 << 20));
  nlohmann::json messages = nlohmann::json::parse(text, nullptr, false);
  if (messages.is_discarded() || !messages.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(*o.chat, ": not a JSON list of messages"));
  }
  for (const auto& message : messages) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(*o.chat, ": every message needs a \"role\" string"));
    }
  }
  if (model.chat_template() == nullptr) {
    return absl::InvalidArgumentError("the model's tokenizer_config.json has no chat_template");
  }
  nlohmann::json context = {{"messages", messages},
                            {"add_generation_prompt", true},
                            {"bos_token", model.tokenizer().bos_token()},
                            {"eos_token", model.tokenizer().eos_token()}};
  ASSIGN_OR_RETURN(std::string rendered, model.chat_template()->Render(context));
  return model.tokenizer().Encode(rendered, /*add_special_tokens=*/false);
}

// A checkpoint folder's files and the model loaded from them; `files` views `storage`.
struct LoadedModel {
  std::vector<std::string> storage;
  CheckpointFiles files;
  std::unique_ptr<Model> model;
};

// Reads `o.model` into `loaded`, with host weights only where the CPU engine runs them. Errors
// are bad input (exit 2).
absl::Status LoadModel(const Options& o, const std::string& executor, LoadedModel& loaded) {
  ASSIGN_OR_RETURN(loaded.files, ReadCheckpointDir(o.model, loaded.storage));
  LoadOptions load;
  load.weights = o.weights == "f32" ? WeightFormat::kF32 : WeightFormat::kAsStored;
  // A device engine holds the weights itself, read from the files when it is made.
  if (executor != "cpu" || o.command == "tokenize") load.weights = WeightFormat::kNone;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(loaded.files, load);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(o.model, ": ", model.status().message()));
  }
  loaded.model = *std::move(model);
  return absl::OkStatus();
}

void PrintIds(const std::vector<int32_t>& ids, bool json) {
  if (json) {
    std::cout << nlohmann::json({{"ids", ids}}).dump() << "\n";
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
}

// The request for `ids`: sampling from the flags, else the model's generation defaults (greedy
// unless they sample), and a token budget that fits the context.
GenerationRequest MakeRequest(const Options& o, const ModelConfig& config,
                              const std::vector<int32_t>& ids) {
  GenerationRequest request;
  request.prompt_ids = ids;
  SamplingParams& s = request.sampling;
  s.temperature = static_cast<float>(
      o.temperature.value_or(config.default_do_sample ? config.default_temperature : 0.0));
  s.top_p =
      static_cast<float>(o.top_p.value_or(config.default_do_sample ? config.default_top_p : 1.0));
  s.top_k =
      static_cast<int32_t>(o.top_k.value_or(config.default_do_sample ? config.default_top_k : 0));
  s.min_p = static_cast<float>(o.min_p.value_or(0.0));
  s.repetition_penalty =
      static_cast<float>(o.repetition_penalty.value_or(config.default_repetition_penalty));
  s.presence_penalty = static_cast<float>(o.presence_penalty.value_or(0.0));
  s.frequency_penalty = static_cast<float>(o.frequency_penalty.value_or(0.0));
  s.seed = o.seed;
  s.logprobs = o.top_logprobs > 0;
  s.top_logprobs = static_cast<int32_t>(o.top_logprobs);
  const int64_t room = config.max_position_embeddings - static_cast<int64_t>(ids.size());
  request.max_tokens = o.max_tokens.value_or(
      std::min<int64_t>(config.default_max_new_tokens.value_or(256), std::max<int64_t>(room, 1)));
  request.stop = o.stop;
  request.ignore_eos = o.ignore_eos;
  return request;
}

// A generator for the one `request`, with a KV cache that holds it, on `executor`. Frees the
// checkpoint's bytes once the engine holds the weights. Errors are refusals (exit 1).
absl::StatusOr<std::unique_ptr<Generator>> MakeGenerator(const Options& o,
                                                         const std::string& executor,
                                                         const GenerationRequest& request,
                                                         LoadedModel& loaded) {
  const ModelConfig& config = loaded.model->config();
  GeneratorOptions options;
  options.threads = static_cast<int32_t>(o.threads);
  options.max_sequences = 1;
  options.max_step_tokens = 2048;
  const int64_t tokens_needed =
      static_cast<int64_t>(request.prompt_ids.size()) + std::max<int64_t>(request.max_tokens, 1);
  options.kv_blocks =
      static_cast<int32_t>((std::min(tokens_needed, config.max_position_embeddings) + 15) / 16);
  ASSIGN_OR_RETURN(int32_t blocks, KvBlocksFor(config, options));
  EngineOptions engine_options;
  engine_options.executor = executor;
  engine_options.threads = options.threads;
  engine_options.num_blocks = blocks;
  engine_options.block_size = options.block_size;
  engine_options.precision = o.precision;
  ASSIGN_OR_RETURN(std::unique_ptr<StepEngine> engine,
                   CreateEngine(*loaded.model, loaded.files, engine_options));
  loaded.storage.clear();  // the weights were copied; the file bytes are no longer needed
  return Generator::Create(*loaded.model, options, std::move(engine));
}

// What a generation made, and how long its first step (the prefill) and the rest took.
struct Generation {
  std::vector<int32_t> ids;
  std::string text;
  nlohmann::json logprobs = nlohmann::json::array();
  FinishReason finish = FinishReason::kNone;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Steps `generator` until it is idle, writing the text to stdout as it comes unless --json.
absl::StatusOr<Generation> Generate(Generator& generator, const Options& o, bool logprobs) {
  using Clock = std::chrono::steady_clock;
  Generation out;
  bool first = true;
  while (!generator.idle()) {
    auto start = Clock::now();
    absl::StatusOr<std::vector<TokenEvent>> events = generator.Step();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!events.ok()) return events.status();
    if (events->empty()) continue;
    (first ? out.prefill_seconds : out.decode_seconds) += seconds;
    first = false;
    for (const TokenEvent& event : *events) {
      out.ids.push_back(event.token.id);
      out.text += event.text;
      if (!o.json && !event.text.empty()) std::cout << event.text << std::flush;  // as it comes
      if (logprobs) {
        nlohmann::json top = nlohmann::json::array();
        for (const TokenLogprob& t : event.token.top)
          top.push_back({{"id", t.id}, {"logprob", t.logprob}});
        out.logprobs.push_back(
            {{"id", event.token.id}, {"logprob", event.token.logprob}, {"top", top}});
      }
      if (event.finish != FinishReason::kNone) out.finish = event.finish;
    }
  }
  return out;
}

// The JSON document, or the end of the streamed text and a summary line on stderr.
void PrintGeneration(const Options& o, const std::vector<int32_t>& prompt_ids, const Generation& g,
                     const std::string& executor, bool logprobs) {
  const double prefill_rate =
      g.prefill_seconds > 0 ? static_cast<double>(prompt_ids.size()) / g.prefill_seconds : 0;
  const double decode_rate = g.decode_seconds > 0 && g.ids.size() > 1
                                 ? static_cast<double>(g.ids.size() - 1) / g.decode_seconds
                                 : 0;
  if (o.json) {
    nlohmann::ordered_json doc = {{"prompt_ids", prompt_ids},
                                  {"ids", g.ids},
                                  {"text", g.text},
                                  {"finish_reason", std::string(FinishReasonName(g.finish))},
                                  {"prefill_tokens_per_s", prefill_rate},
                                  {"decode_tokens_per_s", decode_rate},
                                  {"executor", executor}};
    if (logprobs) doc["logprobs"] = g.logprobs;
    std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\n";
    std::fprintf(stderr,
                 "[%zu prompt tokens, %zu generated, finish %s; prefill %.1f tokens/s, decode "
                 "%.1f tokens/s]\n",
                 prompt_ids.size(), g.ids.size(), std::string(FinishReasonName(g.finish)).c_str(),
                 prefill_rate, decode_rate);
  }
}

int Main(int argc, char** argv) {
  absl::StatusOr<Options> parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  const Options& o = *parsed;
  absl::StatusOr<std::string> executor = ResolveExecutor(o.executor);
  if (!executor.ok()) return Fail(1, executor.status().message());
  LoadedModel loaded;
  if (absl::Status status = LoadModel(o, *executor, loaded); !status.ok()) {
    return Fail(2, status.message());
  }
  absl::StatusOr<std::vector<int32_t>> ids = PromptIds(o, *loaded.model);
  if (!ids.ok()) return Fail(2, ids.status().message());
  if (o.command == "tokenize") {
    PrintIds(*ids, o.json);
    return 0;
  }

  const GenerationRequest request = MakeRequest(o, loaded.model->config(), *ids);
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      MakeGenerator(o, *executor, request, loaded);
  if (!generator.ok()) return Fail(1, generator.status().message());
  absl::StatusOr<uint64_t> sequence = (*generator)->Add(request);
  if (!sequence.ok()) return Fail(1, sequence.status().message());
  absl::StatusOr<Generation> generation = Generate(**generator, o, request.sampling.logprobs);
  if (!generation.ok()) return Fail(1, generation.status().message());
  PrintGeneration(o, *ids, *generation, *executor, request.sampling.logprobs);
  return 0;
}

}  // namespace
}  // namespace cloister::llm

int main(int argc, char** argv) {
  cloister::SkipRunTimeDeadlockDetection();
  return cloister::llm::Main(argc, argv);
}
