// Internals of the `cloister` command line (cli.h) shared by its source files: cli.cc (help
// texts, the subcommand table, RunCli), cli_flags.cc (flags, settings, connection options),
// cli_output.cc (JSON and human-readable output), cli_commands.cc (keygen, attest, upload,
// models, delete, infer), cli_generate.cc (generate) and cli_status.cc (status, from the
// operator port). Not for use outside the CLI (and its tests).
// Threading: as RunCli (cli.h).
#pragma once

#include <cstdint>
#include <map>
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

}  // namespace cloister::sdk::cli_internal
