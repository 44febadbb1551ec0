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
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
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

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options o;
  if (argc < 2) return absl::InvalidArgumentError("missing command (run or tokenize)");
  o.command = argv[1];
  if (o.command != "run" && o.command != "tokenize") {
    return absl::InvalidArgumentError(absl::StrCat("unknown command \"", o.command, "\""));
  }
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
      return std::string(argv[++i]);
    };
    auto number = [&](auto& out) -> absl::Status {
      ASSIGN_OR_RETURN(std::string text, value());
      using T = std::remove_reference_t<decltype(out)>;
      if constexpr (std::is_same_v<T, std::optional<double>> || std::is_same_v<T, double>) {
        double d;
        if (!absl::SimpleAtod(text, &d)) {
          return absl::InvalidArgumentError(absl::StrCat(flag, " must be a number, got \"", text, "\""));
        }
        out = d;
      } else if constexpr (std::is_same_v<T, uint64_t>) {
        uint64_t u;
        if (!absl::SimpleAtoi(text, &u)) {
          return absl::InvalidArgumentError(absl::StrCat(flag, " must be a non-negative integer, got \"", text, "\""));
        }
        out = u;
      } else {
        int64_t n;
        if (!absl::SimpleAtoi(text, &n)) {
          return absl::InvalidArgumentError(absl::StrCat(flag, " must be an integer, got \"", text, "\""));
        }
        out = n;
      }
      return absl::OkStatus();
    };
    if (flag == "--model") {
      ASSIGN_OR_RETURN(o.model, value());
    } else if (flag == "--prompt" || flag == "--text") {
      if ((flag == "--prompt") != (o.command == "run")) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " is not an option of ", o.command));
      }
      ASSIGN_OR_RETURN(o.prompt, value());
    } else if (flag == "--prompt-ids" && o.command == "run") {
      ASSIGN_OR_RETURN(o.prompt_ids, value());
    } else if (flag == "--chat") {
      ASSIGN_OR_RETURN(o.chat, value());
    } else if (flag == "--json") {
      o.json = true;
    } else if (o.command == "tokenize") {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", flag, " for tokenize"));
    } else if (flag == "--max-tokens") {
      RETURN_IF_ERROR(number(o.max_tokens));
    } else if (flag == "--temperature") {
      RETURN_IF_ERROR(number(o.temperature));
    } else if (flag == "--top-p") {
      RETURN_IF_ERROR(number(o.top_p));
    } else if (flag == "--top-k") {
      RETURN_IF_ERROR(number(o.top_k));
    } else if (flag == "--min-p") {
      RETURN_IF_ERROR(number(o.min_p));
    } else if (flag == "--repetition-penalty") {
      RETURN_IF_ERROR(number(o.repetition_penalty));
    } else if (flag == "--presence-penalty") {
      RETURN_IF_ERROR(number(o.presence_penalty));
    } else if (flag == "--frequency-penalty") {
      RETURN_IF_ERROR(number(o.frequency_penalty));
    } else if (flag == "--seed") {
      RETURN_IF_ERROR(number(o.seed));
    } else if (flag == "--stop") {
      ASSIGN_OR_RETURN(std::string stop, value());
      o.stop.push_back(stop);
    } else if (flag == "--top-logprobs") {
      RETURN_IF_ERROR(number(o.top_logprobs));
    } else if (flag == "--ignore-eos") {
      o.ignore_eos = true;
    } else if (flag == "--threads") {
      RETURN_IF_ERROR(number(o.threads));
      if (o.threads < 1 || o.threads > 1024) {
        return absl::InvalidArgumentError("--threads must be in [1, 1024]");
      }
    } else if (flag == "--weights") {
      ASSIGN_OR_RETURN(o.weights, value());
      if (o.weights != "as-stored" && o.weights != "f32") {
        return absl::InvalidArgumentError("--weights must be as-stored or f32");
      }
    } else if (flag == "--executor") {
      ASSIGN_OR_RETURN(o.executor, value());
      if (o.executor != "auto" && o.executor != "cpu" && o.executor != "cuda") {
        return absl::InvalidArgumentError("--executor must be auto, cpu or cuda");
      }
    } else if (flag == "--precision") {
      ASSIGN_OR_RETURN(std::string name, value());
      absl::StatusOr<Precision> precision = ParsePrecision(name);
      if (!precision.ok()) return absl::InvalidArgumentError("--precision must be f32 or bf16");
      o.precision = *precision;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", flag));
    }
  }
  if (o.model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  int inputs = o.prompt.has_value() + o.prompt_ids.has_value() + o.chat.has_value();
  if (inputs != 1) {
    return absl::InvalidArgumentError(o.command == "run"
                                          ? "give exactly one of --prompt, --prompt-ids, --chat"
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
        return absl::InvalidArgumentError(absl::StrCat("--prompt-ids: \"", std::string(piece),
                                                       "\" is not a token id"));
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

int Main(int argc, char** argv) {
  absl::StatusOr<Options> parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  const Options& o = *parsed;
  absl::StatusOr<std::string> executor = ResolveExecutor(o.executor);
  if (!executor.ok()) {
    std::cerr << "cloister-llm: " << executor.status().message() << "\n";
    return 1;
  }

  std::vector<std::string> storage;
  absl::StatusOr<CheckpointFiles> files = ReadCheckpointDir(o.model, storage);
  if (!files.ok()) {
    std::cerr << "cloister-llm: " << files.status().message() << "\n";
    return 2;
  }
  LoadOptions load;
  load.weights = o.weights == "f32" ? WeightFormat::kF32 : WeightFormat::kAsStored;
  // A device engine holds the weights itself, read from the files when it is made.
  if (*executor != "cpu" || o.command == "tokenize") load.weights = WeightFormat::kNone;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*files, load);
  if (!model.ok()) {
    std::cerr << "cloister-llm: " << o.model << ": " << model.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<int32_t>> ids = PromptIds(o, **model);
  if (!ids.ok()) {
    std::cerr << "cloister-llm: " << ids.status().message() << "\n";
    return 2;
  }

  if (o.command == "tokenize") {
    if (o.json) {
      std::cout << nlohmann::json({{"ids", *ids}}).dump() << "\n";
    } else {
      for (size_t i = 0; i < ids->size(); ++i) std::cout << (i ? " " : "") << (*ids)[i];
      std::cout << "\n";
    }
    return 0;
  }

  const ModelConfig& config = (*model)->config();
  GenerationRequest request;
  request.prompt_ids = *ids;
  SamplingParams& s = request.sampling;
  s.temperature = static_cast<float>(
      o.temperature.value_or(config.default_do_sample ? config.default_temperature : 0.0));
  s.top_p = static_cast<float>(o.top_p.value_or(config.default_do_sample ? config.default_top_p : 1.0));
  s.top_k = static_cast<int32_t>(o.top_k.value_or(config.default_do_sample ? config.default_top_k : 0));
  s.min_p = static_cast<float>(o.min_p.value_or(0.0));
  s.repetition_penalty =
      static_cast<float>(o.repetition_penalty.value_or(config.default_repetition_penalty));
  s.presence_penalty = static_cast<float>(o.presence_penalty.value_or(0.0));
  s.frequency_penalty = static_cast<float>(o.frequency_penalty.value_or(0.0));
  s.seed = o.seed;
  s.logprobs = o.top_logprobs > 0;
  s.top_logprobs = static_cast<int32_t>(o.top_logprobs);
  const int64_t room = config.max_position_embeddings - static_cast<int64_t>(ids->size());
  request.max_tokens =
      o.max_tokens.value_or(std::min<int64_t>(config.default_max_new_tokens.value_or(256), std::max<int64_t>(room, 1)));
  request.stop = o.stop;
  request.ignore_eos = o.ignore_eos;

  GeneratorOptions options;
  options.threads = static_cast<int32_t>(o.threads);
  options.max_sequences = 1;
  options.max_step_tokens = 2048;
  const int64_t tokens_needed = static_cast<int64_t>(ids->size()) + std::max<int64_t>(request.max_tokens, 1);
  options.kv_blocks = static_cast<int32_t>((std::min(tokens_needed, config.max_position_embeddings) + 15) / 16);
  absl::StatusOr<int32_t> blocks = KvBlocksFor(config, options);
  if (!blocks.ok()) {
    std::cerr << "cloister-llm: " << blocks.status().message() << "\n";
    return 1;
  }
  EngineOptions engine_options;
  engine_options.executor = *executor;
  engine_options.threads = options.threads;
  engine_options.num_blocks = *blocks;
  engine_options.block_size = options.block_size;
  engine_options.precision = o.precision;
  absl::StatusOr<std::unique_ptr<StepEngine>> engine = CreateEngine(**model, *files, engine_options);
  if (!engine.ok()) {
    std::cerr << "cloister-llm: " << engine.status().message() << "\n";
    return 1;
  }
  storage.clear();  // the weights were copied; the file bytes are no longer needed
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      Generator::Create(**model, options, std::move(*engine));
  if (!generator.ok()) {
    std::cerr << "cloister-llm: " << generator.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<uint64_t> sequence = (*generator)->Add(request);
  if (!sequence.ok()) {
    std::cerr << "cloister-llm: " << sequence.status().message() << "\n";
    return 1;
  }

  using Clock = std::chrono::steady_clock;
  std::vector<int32_t> out_ids;
  std::string text;
  nlohmann::json logprobs = nlohmann::json::array();
  FinishReason finish = FinishReason::kNone;
  double prefill_seconds = 0, decode_seconds = 0;
  bool first = true;
  while (!(*generator)->idle()) {
    auto start = Clock::now();
    absl::StatusOr<std::vector<TokenEvent>> events = (*generator)->Step();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!events.ok()) {
      std::cerr << "cloister-llm: " << events.status().message() << "\n";
      return 1;
    }
    if (events->empty()) continue;
    (first ? prefill_seconds : decode_seconds) += seconds;
    first = false;
    for (const TokenEvent& event : *events) {
      out_ids.push_back(event.token.id);
      text += event.text;
      if (!o.json && !event.text.empty()) std::cout << event.text << std::flush;  // as it comes
      if (s.logprobs) {
        nlohmann::json top = nlohmann::json::array();
        for (const TokenLogprob& t : event.token.top) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
        logprobs.push_back({{"id", event.token.id}, {"logprob", event.token.logprob}, {"top", top}});
      }
      if (event.finish != FinishReason::kNone) finish = event.finish;
    }
  }
  const double prefill_rate = prefill_seconds > 0 ? static_cast<double>(ids->size()) / prefill_seconds : 0;
  const double decode_rate =
      decode_seconds > 0 && out_ids.size() > 1 ? static_cast<double>(out_ids.size() - 1) / decode_seconds : 0;
  if (o.json) {
    nlohmann::ordered_json doc = {{"prompt_ids", *ids},
                          {"ids", out_ids},
                          {"text", text},
                          {"finish_reason", std::string(FinishReasonName(finish))},
                          {"prefill_tokens_per_s", prefill_rate},
                          {"decode_tokens_per_s", decode_rate},
                          {"executor", *executor}};
    if (s.logprobs) doc["logprobs"] = logprobs;
    std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\n";
    std::fprintf(stderr,
                 "[%zu prompt tokens, %zu generated, finish %s; prefill %.1f tokens/s, decode "
                 "%.1f tokens/s]\n",
                 ids->size(), out_ids.size(), std::string(FinishReasonName(finish)).c_str(),
                 prefill_rate, decode_rate);
  }
  return 0;
}

}  // namespace
}  // namespace cloister::llm

int main(int argc, char** argv) { return cloister::llm::Main(argc, argv); }
