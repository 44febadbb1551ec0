// The `cloister` command line (cli.h): the help texts, the table of subcommands and RunCli,
// which dispatches to them. The flags are parsed in cli_flags.cc, the subcommands run in
// cli_commands.cc and cli_status.cc, and their output is formatted in cli_output.cc.
#include "sdk/cli.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/status.h"
#include "sdk/cli_internal.h"
#include "sdk/proxy/proxy_command.h"

namespace cloister::sdk {
namespace cli_internal {
namespace {

// ---- Help texts. ----

constexpr char kMainHelp[] = R"(usage: cloister SUBCOMMAND [flags]

The Cloister tenant tool: attest the enclave behind a cloisterd, upload an encrypted model,
run encrypted inference and text generation. Models, tensors, prompts and text are encrypted
end to end to the attested enclave.

subcommands:
  keygen   create a tenant identity key (owns your models)
  attest   check the server's attestation evidence against your policy
  upload   encrypt and upload a model (ONNX file or LLM checkpoint folder)
  models   list your models
  infer    run a model on .npy inputs
  generate generate text with an LLM, streamed as it comes
  chat     a conversation with an LLM on the terminal (or through a pipe)
  proxy    serve the OpenAI API on this machine, backed by your attested models
  delete   delete one of your models
  status   the appliance at a glance (operator port): workers, tenants, queues, evidence age

connection flags (each falls back to an environment variable):
  --server HOST:PORT   cloisterd address     CLOISTER_SERVER (default 127.0.0.1:7700)
                       several comma-separated (a:7700,b:7700): the first that attests
                       holds the session; the next takes over when it goes down (models
                       are per node: upload them to each)
  --spread             with several servers, start from the one your identity key picks
                       (the same list spreads tenants over the nodes)   CLOISTER_SPREAD=1
  --policy FILE        attestation policy    CLOISTER_POLICY
  --tenant ID          tenant id             CLOISTER_TENANT
  --token-file FILE    file with API token   CLOISTER_TOKEN_FILE
  --key FILE           identity key          CLOISTER_KEY
  --timeout SECONDS    per-call deadline (default 60)
  --ca FILE            TLS: server's CA      CLOISTER_CA (unset: plaintext)
  --client-cert FILE   mutual TLS cert       CLOISTER_CLIENT_CERT
  --client-key FILE    mutual TLS key        CLOISTER_CLIENT_KEY
  --tls-server-name N  name the server certificate carries (default: the --server host)

output: human-readable text, or one JSON document on stdout with --json.
exit status: 0 success, 1 attestation failed or operation refused, 2 bad usage or
unreadable input. Errors are one line on stderr: "cloister: <reason>".

Run `cloister SUBCOMMAND --help` for the flags of one subcommand.
)";

constexpr char kKeygenHelp[] = R"(usage: cloister keygen --key FILE [--json]

Creates a new Ed25519 tenant identity key in FILE (mode 0600) and prints its public key.
The key owns every model you upload with it: keep it safe, and keep a backup, because
without it your models cannot be used or deleted. An existing file is never overwritten.

flags:
  --key FILE   where to write the key (or CLOISTER_KEY)
  --json       print {"key": FILE, "public_key": HEX}
)";

constexpr char kAttestHelp[] = R"(usage: cloister attest [--fresh] [--json] [connection flags]

Fetches attestation evidence from cloisterd with a random nonce and verifies it against your
policy: the CVM report and its certificate chain, the enclave measurement, the GPU reports,
and the binding of the enclave's keys and your nonce. Prints the verdict and every check.

flags:
  --fresh      ask for hardware evidence collected over your nonce (slower) instead of the
               enclave's cached evidence countersigned over your nonce
  --json       print {"verdict": "pass"|"fail", "checks": [{"name", "result", "detail"}],
               "claims": {...}}
needs: --server, --policy, --tenant, --token-file (see `cloister --help`)
exit status: 0 when the verdict is pass, 1 when it is fail or no evidence could be had.
)";

constexpr char kUploadHelp[] =
    R"(usage: cloister upload --model FILE|DIR --name NAME [--json] [connection flags]

Attests, then encrypts the model with a fresh key, streams the ciphertext through cloisterd
and hands the key to the enclave inside the session. The enclave checks, loads and keeps the
model for your identity key; the host only ever stores ciphertext. The model is an ONNX FILE,
or a Hugging Face checkpoint folder DIR (config.json, tokenizer.json, tokenizer_config.json,
generation_config.json, model.safetensors or its shards with model.safetensors.index.json),
which is packed into one deterministic tar archive first (other files in DIR are left out;
links are refused). The description printed gives the model's kind and digest (SHA-256 of the
ONNX file or of the archive) and, for ONNX, ends with its batching: whether your requests
batched together share one model run (the enclave proved that each output row depends on its
own input row only) or run one by one, and then why (which node mixes rows); results are the
same either way.

flags:
  --model FILE   the model file (ONNX) or checkpoint folder (LLM)
  --name NAME    the name to run it under (re-uploading a name replaces that model)
  --fresh        attest with fresh hardware evidence
  --json         print the model description as JSON
needs: --server, --policy, --tenant, --token-file, --key
)";

constexpr char kModelsHelp[] = R"(usage: cloister models [--json] [connection flags]

Lists the models that your identity key owns, with their inputs, outputs and batching (see
cloister upload --help).

flags:
  --fresh   attest with fresh hardware evidence
  --json    print {"models": [{"name", "handle", "size", "kind" ("onnx" or "llm"), "digest",
            "inputs", "outputs", "rows_coalesce", "rows_shared_reason" (when rows_coalesce is
            false)}]}
needs: --server, --policy, --tenant, --token-file, --key
)";

constexpr char kInferHelp[] =
    R"(usage: cloister infer --model NAME --input NAME=FILE.npy [--input ...]
                      [--output NAME ...] [--output-dir DIR | --json] [connection flags]

Runs one inference. Inputs are NumPy .npy files (little-endian, C order; float16/32/64,
int8/16/32/64, uint8/16/32/64, bool). Each output is written as DIR/NAME.npy (characters
of NAME that are unsafe in file names become '_'), or printed with --json as
{"outputs": [{"name", "datatype", "shape", "data": [...]}]} (non-finite floats as null).

flags:
  --model NAME            the model to run
  --input NAME=FILE.npy   an input tensor; repeat for each input
  --output NAME           an output to return; repeat; default: all outputs
  --output-dir DIR        where to write the .npy files (default: the current directory)
  --json                  print the outputs instead of writing files
  --fresh                 attest with fresh hardware evidence
needs: --server, --policy, --tenant, --token-file, --key
)";

constexpr char kGenerateHelp[] =
    R"(usage: cloister generate --model NAME (--prompt TEXT | --chat FILE.json | --prompt-ids IDS)
                         [--max-tokens N] [--temperature T] [--top-p P] [--top-k K]
                         [--seed S] [--stop TEXT ...] [--json] [connection flags]

Generates text with one of your LLMs (uploaded as a checkpoint folder). The prompt and the
text are encrypted end to end; every chunk of the stream is checked (in order, none missing,
replayed or altered, and the stream complete) before it is used. The text is printed as it
arrives, then a newline; with --json one document at the end instead:
{"ids": [...], "text", "finish_reason" ("stop", "length" or "cancelled"), "usage":
{"prompt_tokens", "cached_tokens", "completion_tokens"}, "receipt", "receipt_signature"}
(the enclave's signed usage receipt for the request, base64).

flags:
  --model NAME         the LLM to run
  --prompt TEXT        the prompt as text (tokenized with the model's special tokens)
  --chat FILE.json     a chat: a JSON list of {"role": ..., "content": ...} messages, rendered
                       by the model's chat template
  --prompt-ids IDS     the prompt as token ids, comma-separated (1,2,3)
  --max-tokens N       at most N new tokens (default: up to the model's context)
  --temperature T      0 to 2 (default 1; 0: greedy)
  --top-p P            above 0, at most 1 (default 1: off)
  --top-k K            sample among the K most likely tokens (default 0: off)
  --seed S             fix the sampler's seed (a seeded generation is retried when the worker
                       restarts before it starts; an unseeded one never is)
  --stop TEXT          stop when TEXT is generated (not included); repeat for more
  --json               print the result as one JSON document
  --fresh              attest with fresh hardware evidence
  --timeout SECONDS    a limit on the whole generation (default 60)
needs: --server, --policy, --tenant, --token-file, --key
)";

constexpr char kChatHelp[] =
    R"(usage: cloister chat --model NAME [--system TEXT] [--max-tokens N] [--temperature T]
                     [--top-p P] [--top-k K] [--seed S] [--stop TEXT ...] [--usage]
                     [connection flags]

A conversation with one of your LLMs (or one the operator publishes). Each line you type is
sent with the conversation so far as chat messages (system, user, assistant), rendered by the
model's chat template inside the enclave, and the reply is printed as it streams and joins the
conversation. On a terminal each line is asked for with "> "; from a pipe every line is one
message and only the replies are printed. Empty lines are skipped.

commands (a line of one word beginning with '/'):
  /reset   forget the conversation (the --system message stays)
  /exit    end the conversation (also /quit, or the end of input: Ctrl-D); exit status 0
  /help    list the commands
Ctrl-C while a reply streams stops it: the enclave cancels the generation, "[cancelled]" is
printed and the partial reply is left out of the conversation. Ctrl-C at the prompt ends the
chat with exit status 130. A reply that fails is one line "cloister chat: <reason>" on stderr
and the conversation goes on without that turn; once the conversation outgrows the model's
context the enclave refuses it, and /reset starts over.

flags:
  --model NAME         the LLM to talk to
  --system TEXT        a system message that opens the conversation
  --max-tokens N       at most N new tokens per reply (default: up to the model's context)
  --temperature T      0 to 2 (default 1; 0: greedy)
  --top-p P            above 0, at most 1 (default 1: off)
  --top-k K            sample among the K most likely tokens (default 0: off)
  --seed S             fix the sampler's seed (the same seed for every reply)
  --stop TEXT          end a reply when TEXT is generated (not included); repeat for more
  --usage              after each reply, a line with its prompt and completion token counts
  --fresh              attest with fresh hardware evidence
  --timeout SECONDS    a limit on each reply (default 60)
needs: --server, --policy, --tenant, --token-file, --key
)";

constexpr char kDeleteHelp[] = R"(usage: cloister delete --model NAME [--json] [connection flags]

Deletes one of your models from the enclave and its ciphertext and wrapped key from the
host (crypto-shredding).

flags:
  --model NAME   the model to delete
  --json         print {"deleted": NAME}
needs: --server, --policy, --tenant, --token-file, --key
)";

constexpr char kStatusHelp[] = R"(usage: cloister status [--operator ADDRESS] [--json] [--timeout SECONDS]

For operators: asks cloisterd's operator port (not the tenant port) for its status and prints
the enclave workers (devices) with their batches in flight and evidence age, the tenants with
their priority class, queue depth, counters, sessions and models, and the audit log's state.
No tenant credentials are needed; the operator port listens on loopback or a unix socket.

flags:
  --operator ADDRESS   HOST:PORT or unix:PATH   CLOISTER_OPERATOR (default 127.0.0.1:7701)
  --json               print the StatusResponse (proto/cloister/ops/v1/ops.proto) as JSON
)";

const std::vector<Subcommand>& Subcommands() {
  static const auto* subcommands = new std::vector<Subcommand>{
      {"keygen", kKeygenHelp, {{"json", FlagKind::kBool}}},
      {"attest", kAttestHelp, {{"json", FlagKind::kBool}, {"fresh", FlagKind::kBool}}},
      {"upload",
       kUploadHelp,
       {{"model", FlagKind::kValue},
        {"name", FlagKind::kValue},
        {"json", FlagKind::kBool},
        {"fresh", FlagKind::kBool}}},
      {"models", kModelsHelp, {{"json", FlagKind::kBool}, {"fresh", FlagKind::kBool}}},
      {"infer",
       kInferHelp,
       {{"model", FlagKind::kValue},
        {"input", FlagKind::kRepeated},
        {"output", FlagKind::kRepeated},
        {"output-dir", FlagKind::kValue},
        {"json", FlagKind::kBool},
        {"fresh", FlagKind::kBool}}},
      {"generate",
       kGenerateHelp,
       {{"model", FlagKind::kValue},
        {"prompt", FlagKind::kValue},
        {"chat", FlagKind::kValue},
        {"prompt-ids", FlagKind::kValue},
        {"max-tokens", FlagKind::kValue},
        {"temperature", FlagKind::kValue},
        {"top-p", FlagKind::kValue},
        {"top-k", FlagKind::kValue},
        {"seed", FlagKind::kValue},
        {"stop", FlagKind::kRepeated},
        {"json", FlagKind::kBool},
        {"fresh", FlagKind::kBool}}},
      {"chat",
       kChatHelp,
       {{"model", FlagKind::kValue},
        {"system", FlagKind::kValue},
        {"max-tokens", FlagKind::kValue},
        {"temperature", FlagKind::kValue},
        {"top-p", FlagKind::kValue},
        {"top-k", FlagKind::kValue},
        {"seed", FlagKind::kValue},
        {"stop", FlagKind::kRepeated},
        {"usage", FlagKind::kBool},
        {"fresh", FlagKind::kBool}}},
      {"proxy",
       kProxyHelp,
       {{"listen", FlagKind::kValue},
        {"api-key-file", FlagKind::kValue},
        {"fresh", FlagKind::kBool}}},
      {"delete",
       kDeleteHelp,
       {{"model", FlagKind::kValue}, {"json", FlagKind::kBool}, {"fresh", FlagKind::kBool}}},
      {"status", kStatusHelp, {{"operator", FlagKind::kValue}, {"json", FlagKind::kBool}}},
  };
  return *subcommands;
}

}  // namespace

const Subcommand* FindSubcommand(absl::string_view name) {
  for (const Subcommand& sub : Subcommands()) {
    if (sub.name == name) return &sub;
  }
  return nullptr;
}

}  // namespace cli_internal

using cli_internal::FindSubcommand;
using cli_internal::kMainHelp;
using cli_internal::ParseFlags;
using cli_internal::Result;
using cli_internal::RunAttest;
using cli_internal::RunChat;
using cli_internal::RunDelete;
using cli_internal::RunGenerate;
using cli_internal::RunInfer;
using cli_internal::RunKeygen;
using cli_internal::RunModels;
using cli_internal::RunProxy;
using cli_internal::RunStatus;
using cli_internal::RunUpload;
using cli_internal::Subcommand;

int RunCli(const std::vector<std::string>& args, CliIo& io) {
  if (args.empty()) {
    io.err << kMainHelp;
    return kExitUsage;
  }
  const std::string& first = args[0];
  if (first == "--help" || first == "-h" || first == "help") {
    if (first == "help" && args.size() > 1) {
      if (const Subcommand* sub = FindSubcommand(args[1]); sub != nullptr) {
        io.out << sub->help;
        return kExitOk;
      }
    }
    io.out << kMainHelp;
    return kExitOk;
  }
  const Subcommand* sub = FindSubcommand(first);
  if (sub == nullptr) {
    io.err
        << "cloister: unknown subcommand '" << first
        << "' (subcommands: keygen, attest, upload, models, infer, generate, chat, proxy, "
           "delete, status; see cloister --help)\n";
    return kExitUsage;
  }
  auto flags = ParseFlags(*sub, std::vector<std::string>(args.begin() + 1, args.end()));
  if (!flags.ok()) {
    io.err << "cloister: " << flags.status().message() << "\n";
    return kExitUsage;
  }
  if (flags->help) {
    io.out << sub->help;
    return kExitOk;
  }
  Result result;
  if (sub->name == "keygen") {
    result = RunKeygen(*flags, io);
  } else if (sub->name == "attest") {
    result = RunAttest(*flags, io);
  } else if (sub->name == "upload") {
    result = RunUpload(*flags, io);
  } else if (sub->name == "models") {
    result = RunModels(*flags, io);
  } else if (sub->name == "infer") {
    result = RunInfer(*flags, io);
  } else if (sub->name == "generate") {
    result = RunGenerate(*flags, io);
  } else if (sub->name == "chat") {
    result = RunChat(*flags, io);
  } else if (sub->name == "proxy") {
    result = RunProxy(*flags, io);
  } else if (sub->name == "status") {
    result = RunStatus(*flags, io);
  } else {
    CLOISTER_CHECK(sub->name == "delete");
    result = RunDelete(*flags, io);
  }
  io.out.flush();
  if (!result.has_value()) return kExitOk;
  if (!result->message.empty()) {
    std::string line = result->message;
    for (char& c : line) {
      if (c == '\n' || c == '\r') c = ' ';  // always one line
    }
    io.err << "cloister: " << line << "\n";
  }
  return result->exit_code;
}

}  // namespace cloister::sdk
