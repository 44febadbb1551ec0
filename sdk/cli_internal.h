// Internals of the `cloister` command line (cli.h) shared by its source files: cli.cc (help
// texts, the subcommand table, RunCli), cli_flags.cc (flags, settings, connection options),
// cli_output.cc (JSON and human-readable output), cli_commands.cc (keygen, attest, upload,
// models, delete, infer), cli_generate.cc (generate), cli_chat.cc (chat) and cli_status.cc
// (status, from the operator port). Not for use outside the CLI (and its tests).
// Threading: as RunCli (cli.h), except where ChatInput says otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cloister/api/v1/api.pb.h"
#include "google/protobuf/repeated_field.h"
#include "sdk/cli.h"
#include "sdk/client.h"

namespace cloister::sdk::cli_internal {

// ---- Errors carried to the exit status. ----

// `cloister chat` ended by Ctrl-C at its prompt (128 + SIGINT, as a shell reports it).
inline constexpr int kExitInterrupted = 130;

struct CliError {
  int exit_code;
  std::string message;
};

inline CliError Usage(std::string message) { return {kExitUsage, std::move(message)}; }
inline CliError Refused(std::string message) { return {kExitRefused, std::move(message)}; }
inline CliError Usage(const absl::Status& status) { return Usage(std::string(status.message())); }
inline CliError Refused(const absl::Status& status) {
  return Refused(std::string(status.message()));
}

// ---- Flags. ----

enum class FlagKind { kValue, kRepeated, kBool };

struct FlagSpec {
  absl::string_view name;
  FlagKind kind;
};

struct Flags {
  std::map<std::string, std::string> values;
  std::map<std::string, std::vector<std::string>> repeated;
  std::set<std::string> bools;
  bool help = false;

  std::optional<std::string> Get(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
  bool Has(const std::string& name) const { return bools.count(name) > 0; }
  std::vector<std::string> All(const std::string& name) const {
    auto it = repeated.find(name);
    return it == repeated.end() ? std::vector<std::string>{} : it->second;
  }
};

struct Subcommand {
  absl::string_view name;
  const char* help;
  std::vector<FlagSpec> flags;  // besides the connection flags and --help
};

// The subcommand called `name` (cli.cc's table), or nullptr.
const Subcommand* FindSubcommand(absl::string_view name);

// Parses `--flag value`, `--flag=value`, boolean `--flag`, and `--help`/`-h` (with base/flags).
// InvalidArgument for an unknown flag or a stray argument, a missing value, a value given to a
// boolean flag, or a single-valued flag given twice.
absl::StatusOr<Flags> ParseFlags(const Subcommand& sub, const std::vector<std::string>& args);

// A flag, else its environment variable, else `fallback`.
std::optional<std::string> Setting(const Flags& flags, const CliIo& io, const std::string& flag,
                                   const std::string& env_name,
                                   std::optional<std::string> fallback = std::nullopt);

// A flag or its environment variable; InvalidArgument naming both when neither is set.
absl::StatusOr<std::string> RequiredSetting(const Flags& flags, const CliIo& io,
                                            const std::string& flag, const std::string& env_name,
                                            absl::string_view what);

// A flag that `subcommand` needs; InvalidArgument when it is missing or empty.
absl::StatusOr<std::string> RequiredFlag(const Flags& flags, const std::string& flag,
                                         absl::string_view subcommand);

// Reads the connection settings and every local file they name. `need_key`: the identity key
// is loaded too (attest does not need it).
absl::StatusOr<ClientOptions> LoadConnection(const Flags& flags, const CliIo& io, bool need_key);

// ---- Output. ----

// `text` as a quoted JSON string.
std::string JsonString(absl::string_view text);
std::string ShapeJson(const google::protobuf::RepeatedField<int64_t>& shape);
// A shape as "[?, 3]": unknown dimensions as '?'.
std::string ShapeHuman(const google::protobuf::RepeatedField<int64_t>& shape);
std::string ModelJson(const cloister::api::v1::ModelInfo& model);
void PrintModelHuman(std::ostream& out, const cloister::api::v1::ModelInfo& model);

// A refusal of a call that named a model: the enclave's "model not found" (it sees only the
// model's handle) gets the name the user typed and where to look.
CliError RefusedForModel(const absl::Status& status, const std::string& name);

// The GenerateRequest that generate's flags describe (--prompt, --chat FILE.json read here,
// --prompt-ids, --max-tokens, --temperature, --top-p, --top-k, --seed, --stop), checked
// locally: InvalidArgument naming the flag for a missing or second prompt, a malformed value
// or one out of range, or a chat file that cannot be read or is not a list of messages.
absl::StatusOr<cloister::api::v1::GenerateRequest> GenerateRequestFromFlags(const Flags& flags);
// {"ids", "text", "finish_reason", "usage": {"prompt_tokens", "cached_tokens",
// "completion_tokens"}, "receipt", "receipt_signature"} (the receipt's bytes in base64).
std::string GenerateResultJson(const GenerateResult& result);

// ---- Subcommands. ----

using Result = std::optional<CliError>;  // nullopt: success

Result RunKeygen(const Flags& flags, CliIo& io);
Result RunAttest(const Flags& flags, CliIo& io);
Result RunUpload(const Flags& flags, CliIo& io);
Result RunModels(const Flags& flags, CliIo& io);
Result RunDelete(const Flags& flags, CliIo& io);
Result RunInfer(const Flags& flags, CliIo& io);
Result RunGenerate(const Flags& flags, CliIo& io);
// The operator port's status (cli_status.cc).
Result RunStatus(const Flags& flags, CliIo& io);
// A conversation with an LLM (cli_chat.cc): PrepareChat, then RunChatLoop over the standard
// input (OpenChatInput(STDIN_FILENO)).
Result RunChat(const Flags& flags, CliIo& io);

// ---- chat (cli_chat.cc). ----

// Where `cloister chat` reads the user's lines and learns of Ctrl-C: the program's standard
// input and SIGINT (OpenChatInput), or a script in tests. ReadLine and ClearInterrupt are called
// from one thread; Interrupted may be called from any.
class ChatInput {
 public:
  enum class Line {
    kRead,         // `line` holds the next line, without its line ending
    kEnd,          // the input ended (Ctrl-D on a terminal)
    kInterrupted,  // Ctrl-C came while waiting for the line (or before, and was not cleared)
    kTooLong,      // the line is longer than kMaxChatLineSize; it was read past and dropped
  };
  virtual ~ChatInput() = default;
  virtual Line ReadLine(std::string& line) = 0;
  // Whether Ctrl-C came since the last ClearInterrupt.
  virtual bool Interrupted() = 0;
  // Forgets a Ctrl-C that has been acted on.
  virtual void ClearInterrupt() = 0;
};

// The longest user line `cloister chat` sends.
inline constexpr size_t kMaxChatLineSize = size_t{1} << 20;

// Lines from file descriptor `fd` (not owned; it stays open) and Ctrl-C from SIGINT, whose
// handler is installed for the life of the returned object (the previous one comes back when it
// is destroyed); one at a time per process. Internal if the wake-up pipe or the handler cannot
// be set up.
absl::StatusOr<std::unique_ptr<ChatInput>> OpenChatInput(int fd);

// Everything a conversation needs once its flags are checked and its session is open.
struct ChatSetup {
  std::unique_ptr<Client> client;
  std::string model;
  // The sampling, max_tokens and stop strings of every reply; no prompt (each turn adds the chat).
  cloister::api::v1::GenerateRequest request;
  std::string system;    // the system message; empty: none
  bool usage = false;    // --usage
  bool prompts = false;  // ask with "> " and greet (standard input is a terminal)
  bool dim = false;      // the usage line in dim text (standard output is a terminal)
};

// Checks chat's flags (Usage naming the flag for a missing --model, an empty --system or a bad
// sampling flag, as generate's), loads the connection, connects and checks that `--model` names
// one of the caller's LLMs or a published one (Refused otherwise). Fills `setup` on success.
Result PrepareChat(const Flags& flags, CliIo& io, ChatSetup& setup);
// The conversation: reads lines from `input` until /exit, /quit or the end (nullopt) or Ctrl-C
// at the prompt (kExitInterrupted, no message). A turn that fails is one line
// "cloister chat: <reason>" on io.err and leaves the conversation as it was.
Result RunChatLoop(ChatSetup& setup, ChatInput& input, CliIo& io);

}  // namespace cloister::sdk::cli_internal
