#include "sdk/cli.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/file.h"
#include "base/status.h"
#include "cloister/ops/v1/ops.grpc.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "sdk/model_dir.h"
#include "sdk/npy.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

namespace {

// ---- Help texts. ----

constexpr char kMainHelp[] = R"(usage: cloister SUBCOMMAND [flags]

The Cloister tenant tool: attest the enclave behind a cloisterd, upload an encrypted model,
run encrypted inference. Models and tensors are encrypted end to end to the attested enclave.

subcommands:
  keygen   create a tenant identity key (owns your models)
  attest   check the server's attestation evidence against your policy
  upload   encrypt and upload a model (ONNX file)
  models   list your models
  infer    run a model on .npy inputs
  delete   delete one of your models
  status   the appliance at a glance (operator port): workers, tenants, queues, evidence age

connection flags (each falls back to an environment variable):
  --server HOST:PORT   cloisterd address     CLOISTER_SERVER (default 127.0.0.1:7700)
                       several comma-separated (a:7700,b:7700): the first that attests
                       holds the session; the next takes over when it goes down (models
                       are per node: upload them to each)
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

// ---- Errors carried to the exit status. ----

struct CliError {
  int exit_code;
  std::string message;
};

CliError Usage(std::string message) { return {kExitUsage, std::move(message)}; }
CliError Refused(std::string message) { return {kExitRefused, std::move(message)}; }
CliError Usage(const absl::Status& status) { return Usage(std::string(status.message())); }
CliError Refused(const absl::Status& status) { return Refused(std::string(status.message())); }

// A refusal of a call that named a model: the enclave's "model not found" (it sees only the
// model's handle) gets the name the user typed and where to look.
CliError RefusedForModel(const absl::Status& status, const std::string& name) {
  if (absl::IsNotFound(status) && status.message() == "model not found") {
    return Refused(
        absl::StrCat("model not found: no model '", name,
                     "' uploaded with this identity key (`cloister models` lists yours)"));
  }
  return Refused(status);
}

// ---- Flags. ----

enum class FlagKind { kValue, kRepeated, kBool };

struct FlagSpec {
  absl::string_view name;
  FlagKind kind;
};

constexpr FlagSpec kConnectionFlags[] = {
    {"server", FlagKind::kValue},     {"policy", FlagKind::kValue}, {"tenant", FlagKind::kValue},
    {"token-file", FlagKind::kValue}, {"key", FlagKind::kValue},    {"timeout", FlagKind::kValue},
    {"ca", FlagKind::kValue},         {"client-cert", FlagKind::kValue},
    {"client-key", FlagKind::kValue}, {"tls-server-name", FlagKind::kValue},
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
      {"delete",
       kDeleteHelp,
       {{"model", FlagKind::kValue}, {"json", FlagKind::kBool}, {"fresh", FlagKind::kBool}}},
      {"status", kStatusHelp, {{"operator", FlagKind::kValue}, {"json", FlagKind::kBool}}},
  };
  return *subcommands;
}

const Subcommand* FindSubcommand(absl::string_view name) {
  for (const Subcommand& sub : Subcommands()) {
    if (sub.name == name) return &sub;
  }
  return nullptr;
}

std::optional<FlagSpec> FindFlag(const Subcommand& sub, absl::string_view name) {
  for (const FlagSpec& spec : kConnectionFlags) {
    if (spec.name == name) return spec;
  }
  for (const FlagSpec& spec : sub.flags) {
    if (spec.name == name) return spec;
  }
  return std::nullopt;
}

// Parses `--flag value`, `--flag=value`, boolean `--flag`, and `--help`/`-h`.
absl::StatusOr<Flags> ParseFlags(const Subcommand& sub, const std::vector<std::string>& args) {
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      continue;
    }
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' for `cloister ", sub.name, "`"));
    }
    absl::string_view body = arg.substr(2);
    std::optional<std::string> inline_value;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      inline_value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    std::optional<FlagSpec> spec = FindFlag(sub, body);
    if (!spec.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", body, " for `cloister ",
                                                     sub.name, "` (see cloister ", sub.name,
                                                     " --help)"));
    }
    std::string name(body);
    if (spec->kind == FlagKind::kBool) {
      if (inline_value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value"));
      }
      flags.bools.insert(name);
      continue;
    }
    std::string value;
    if (inline_value.has_value()) {
      value = *inline_value;
    } else {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    if (spec->kind == FlagKind::kRepeated) {
      flags.repeated[name].push_back(std::move(value));
    } else if (!flags.values.emplace(name, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given more than once"));
    }
  }
  return flags;
}

// A flag, else its environment variable, else `fallback`.
std::optional<std::string> Setting(const Flags& flags, const CliIo& io, const std::string& flag,
                                   const std::string& env_name,
                                   std::optional<std::string> fallback = std::nullopt) {
  if (auto value = flags.Get(flag); value.has_value()) return value;
  auto it = io.env.find(env_name);
  if (it != io.env.end() && !it->second.empty()) return it->second;
  return fallback;
}

absl::StatusOr<std::string> RequiredSetting(const Flags& flags, const CliIo& io,
                                            const std::string& flag, const std::string& env_name,
                                            absl::string_view what) {
  std::optional<std::string> value = Setting(flags, io, flag, env_name);
  if (!value.has_value() || value->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no ", what, " given: pass --", flag, " or set ", env_name));
  }
  return *value;
}

absl::StatusOr<std::string> RequiredFlag(const Flags& flags, const std::string& flag,
                                         absl::string_view subcommand) {
  std::optional<std::string> value = flags.Get(flag);
  if (!value.has_value() || value->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("`cloister ", subcommand, "` needs --", flag));
  }
  return *value;
}

// Reads the connection settings and every local file they name. `need_key`: the identity key
// is loaded too (attest does not need it).
absl::StatusOr<ClientOptions> LoadConnection(const Flags& flags, const CliIo& io, bool need_key) {
  ClientOptions options;
  options.server = *Setting(flags, io, "server", "CLOISTER_SERVER", kDefaultServer);
  RETURN_IF_ERROR(ParseServerList(options.server).status());
  ASSIGN_OR_RETURN(options.tenant_id,
                   RequiredSetting(flags, io, "tenant", "CLOISTER_TENANT", "tenant id"));
  // A tenant bound to client certificates may connect with its certificate alone.
  const bool client_certificate =
      Setting(flags, io, "client-cert", "CLOISTER_CLIENT_CERT").has_value();
  std::string token_file = Setting(flags, io, "token-file", "CLOISTER_TOKEN_FILE").value_or("");
  if (token_file.empty() && !client_certificate) {
    ASSIGN_OR_RETURN(token_file, RequiredSetting(flags, io, "token-file", "CLOISTER_TOKEN_FILE",
                                                 "token file"));
  }
  ASSIGN_OR_RETURN(std::string policy_path,
                   RequiredSetting(flags, io, "policy", "CLOISTER_POLICY", "attestation policy"));
  if (std::optional<std::string> timeout = flags.Get("timeout"); timeout.has_value()) {
    double seconds = 0;
    if (!absl::SimpleAtod(*timeout, &seconds) || !(seconds > 0) || seconds > 86400) {
      return absl::InvalidArgumentError(
          absl::StrCat("--timeout must be a number of seconds above 0, not '", *timeout, "'"));
    }
    options.call_timeout = absl::Seconds(seconds);
  }
  options.fresh_evidence = flags.Has("fresh");
  // TLS: the files are read (and their errors reported) when the connection is made.
  options.tls_ca_file = Setting(flags, io, "ca", "CLOISTER_CA").value_or("");
  options.tls_client_cert_file =
      Setting(flags, io, "client-cert", "CLOISTER_CLIENT_CERT").value_or("");
  options.tls_client_key_file =
      Setting(flags, io, "client-key", "CLOISTER_CLIENT_KEY").value_or("");
  options.tls_server_name = flags.Get("tls-server-name").value_or("");

  if (!token_file.empty()) {
    auto token = ReadFile(token_file, /*max_size=*/4096);
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read token file: ", token.status().message()));
    }
    options.token = std::string(absl::StripAsciiWhitespace(*token));
    if (options.token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", token_file, " is empty"));
    }
  }
  ASSIGN_OR_RETURN(options.policy, attest::LoadPolicyFile(policy_path));
  options.policy_path = policy_path;
  if (need_key) {
    ASSIGN_OR_RETURN(std::string key_path,
                     RequiredSetting(flags, io, "key", "CLOISTER_KEY", "identity key"));
    ASSIGN_OR_RETURN(TenantIdentity identity, TenantIdentity::Load(key_path));
    options.identity = std::make_shared<const TenantIdentity>(std::move(identity));
    options.identity_key_path = key_path;
  }
  return options;
}

// ---- JSON output. ----

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

std::string ShapeJson(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string ShapeHuman(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(d < 0 ? "?" : absl::StrCat(d));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string TensorInfosJson(const google::protobuf::RepeatedPtrField<api::TensorInfo>& infos) {
  std::vector<std::string> items;
  for (const api::TensorInfo& info : infos) {
    items.push_back(absl::StrCat("{\"name\":", JsonString(info.name()),
                                 ",\"datatype\":", JsonString(info.datatype()),
                                 ",\"shape\":", ShapeJson(info.shape()), "}"));
  }
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

absl::string_view KindName(api::ModelKind kind) {
  switch (kind) {
    case api::MODEL_KIND_ONNX: return "onnx";
    case api::MODEL_KIND_LLM: return "llm";
    default: return "unknown";
  }
}

std::string ModelJson(const api::ModelInfo& model) {
  return absl::StrCat(
      "{\"name\":", JsonString(model.name()), ",\"handle\":", JsonString(model.handle()),
      ",\"size\":", model.size(), ",\"kind\":", JsonString(KindName(model.kind())),
      ",\"digest\":", JsonString(model.digest()), ",\"inputs\":", TensorInfosJson(model.inputs()),
      ",\"outputs\":", TensorInfosJson(model.outputs()),
      ",\"rows_coalesce\":", model.rows_coalesce() ? "true" : "false",
      model.rows_coalesce()
          ? ""
          : absl::StrCat(",\"rows_shared_reason\":", JsonString(model.rows_shared_reason())),
      "}");
}

void PrintModelHuman(std::ostream& out, const api::ModelInfo& model) {
  out << model.name() << "  (" << KindName(model.kind()) << ", handle " << model.handle() << ", "
      << model.size() << " bytes)\n";
  out << "  digest  sha256:" << model.digest() << "\n";
  if (model.kind() == api::MODEL_KIND_LLM) {
    out << "  generative model: run it with Generate (Infer refuses it)\n";
    return;
  }
  for (const api::TensorInfo& info : model.inputs()) {
    out << "  input   " << info.name() << "  " << info.datatype() << " " << ShapeHuman(info.shape())
        << "\n";
  }
  for (const api::TensorInfo& info : model.outputs()) {
    out << "  output  " << info.name() << "  " << info.datatype() << " " << ShapeHuman(info.shape())
        << "\n";
  }
  if (model.rows_coalesce()) {
    out << "  batching: requests coalesce (each output row depends on its own input row only)\n";
  } else {
    out << "  batching: requests run one by one (" << model.rows_shared_reason() << ")\n";
  }
}

float HalfToFloat(uint16_t half) {
  uint32_t sign = static_cast<uint32_t>(half >> 15) << 31;
  uint32_t exponent = (half >> 10) & 0x1f;
  uint32_t mantissa = half & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: normalize.
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ff;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

template <typename T>
T LoadLittleEndian(const char* data) {
  T value;
  std::memcpy(&value, data, sizeof(T));  // little-endian host (checked in npy.cc)
  return value;
}

std::string FloatJson(double value, int precision) {
  if (!std::isfinite(value)) return "null";
  return absl::StrFormat("%.*g", precision, value);
}

std::string PrintElement(const std::string& datatype, const char* p) {
  if (datatype == "FP32") return FloatJson(LoadLittleEndian<float>(p), 9);
  if (datatype == "FP64") return FloatJson(LoadLittleEndian<double>(p), 17);
  if (datatype == "FP16") return FloatJson(HalfToFloat(LoadLittleEndian<uint16_t>(p)), 5);
  if (datatype == "INT8") return absl::StrCat(LoadLittleEndian<int8_t>(p));
  if (datatype == "INT16") return absl::StrCat(LoadLittleEndian<int16_t>(p));
  if (datatype == "INT32") return absl::StrCat(LoadLittleEndian<int32_t>(p));
  if (datatype == "INT64") return absl::StrCat(LoadLittleEndian<int64_t>(p));
  if (datatype == "UINT8") return absl::StrCat(LoadLittleEndian<uint8_t>(p));
  if (datatype == "UINT16") return absl::StrCat(LoadLittleEndian<uint16_t>(p));
  if (datatype == "UINT32") return absl::StrCat(LoadLittleEndian<uint32_t>(p));
  if (datatype == "UINT64") return absl::StrCat(LoadLittleEndian<uint64_t>(p));
  if (datatype == "BOOL") return *p != 0 ? "true" : "false";
  CLOISTER_CHECK(false && "datatype was validated");
  return "";
}

// ---- Subcommands. ----

using Result = std::optional<CliError>;  // nullopt: success

Result RunKeygen(const Flags& flags, CliIo& io) {
  auto path = RequiredSetting(flags, io, "key", "CLOISTER_KEY", "key file");
  if (!path.ok()) return Usage(path.status());
  TenantIdentity identity = TenantIdentity::Generate();
  absl::Status saved = identity.Save(*path);
  if (!saved.ok()) return Refused(saved);
  if (flags.Has("json")) {
    io.out << "{\"key\":" << JsonString(*path)
           << ",\"public_key\":" << JsonString(identity.public_key_hex()) << "}\n";
  } else {
    io.out << "wrote identity key " << *path << "\npublic key: " << identity.public_key_hex()
           << "\nkeep this file safe: it owns every model you upload with it\n";
  }
  return std::nullopt;
}

void PrintVerdict(const attest::Verdict& verdict, bool json, std::ostream& out) {
  if (json) {
    std::vector<std::string> checks;
    for (const attest::Check& check : verdict.checks) {
      checks.push_back(absl::StrCat("{\"name\":", JsonString(check.name), ",\"result\":",
                                    JsonString(std::string(attest::CheckResultName(check.result))),
                                    ",\"detail\":", JsonString(check.detail), "}"));
    }
    std::vector<std::string> claims;
    for (const auto& [key, value] : verdict.claims) {
      claims.push_back(absl::StrCat(JsonString(key), ":", JsonString(value)));
    }
    out << "{\"verdict\":" << JsonString(verdict.pass ? "pass" : "fail") << ",\"checks\":["
        << absl::StrJoin(checks, ",") << "],\"claims\":{" << absl::StrJoin(claims, ",") << "}}\n";
    return;
  }
  out << "attestation: " << (verdict.pass ? "PASS" : "FAIL") << "\n";
  for (const attest::Check& check : verdict.checks) {
    absl::string_view mark = check.result == attest::Check::kPass   ? "pass"
                             : check.result == attest::Check::kFail ? "FAIL"
                                                                    : "skip";
    out << "  [" << mark << "] " << check.name;
    if (!check.detail.empty()) out << ": " << check.detail;
    out << "\n";
  }
  if (!verdict.claims.empty()) {
    out << "claims:\n";
    for (const auto& [key, value] : verdict.claims) out << "  " << key << ": " << value << "\n";
  }
}

Result RunAttest(const Flags& flags, CliIo& io) {
  auto options = LoadConnection(flags, io, /*need_key=*/false);
  if (!options.ok()) return Usage(options.status());
  auto verdict = Attest(*options);
  if (!verdict.ok()) return Refused(verdict.status());
  PrintVerdict(*verdict, flags.Has("json"), io.out);
  if (!verdict->pass) {
    io.err << "cloister: attestation failed: " << verdict->FailedSummary() << "\n";
    return CliError{kExitRefused, ""};  // already reported
  }
  return std::nullopt;
}

// OK when `path` is a regular file this process can open for reading.
absl::Status CheckReadableFile(const std::string& path, absl::string_view what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", what, " ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular)
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not a regular file"));
  return absl::OkStatus();
}

Result RunUpload(const Flags& flags, CliIo& io) {
  auto model_path = RequiredFlag(flags, "model", "upload");
  if (!model_path.ok()) return Usage(model_path.status());
  auto name = RequiredFlag(flags, "name", "upload");
  if (!name.ok()) return Usage(name.status());
  // Check the model file is readable, or the folder a checkpoint, before connecting.
  struct stat model_st;
  if (::stat(model_path->c_str(), &model_st) == 0 && S_ISDIR(model_st.st_mode)) {
    if (auto listed = ListModelDir(*model_path); !listed.ok()) return Usage(listed.status());
  } else if (absl::Status readable = CheckReadableFile(*model_path, "model file");
             !readable.ok()) {
    return Usage(readable);
  }
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());

  bool show = io.show_progress && !flags.Has("json");
  UploadProgress progress;
  if (show) {
    progress = [&io, &name](uint64_t sent, uint64_t total) {
      double percent = total == 0 ? 100.0 : 100.0 * static_cast<double>(sent) / total;
      io.err << absl::StrFormat("\ruploading %s: %3.0f%% (%.1f of %.1f MiB)", *name, percent,
                                sent / 1048576.0, total / 1048576.0)
             << std::flush;
    };
  }
  auto model = (*client)->UploadModel(*model_path, *name, progress);
  if (show) io.err << "\n";
  if (!model.ok()) return Refused(model.status());
  if (flags.Has("json")) {
    io.out << ModelJson(*model) << "\n";
  } else {
    io.out << "uploaded ";
    PrintModelHuman(io.out, *model);
  }
  return std::nullopt;
}

Result RunModels(const Flags& flags, CliIo& io) {
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  auto models = (*client)->ListModels();
  if (!models.ok()) return Refused(models.status());
  if (flags.Has("json")) {
    std::vector<std::string> items;
    for (const api::ModelInfo& model : *models) items.push_back(ModelJson(model));
    io.out << "{\"models\":[" << absl::StrJoin(items, ",") << "]}\n";
  } else if (models->empty()) {
    io.out << "no models\n";
  } else {
    for (const api::ModelInfo& model : *models) PrintModelHuman(io.out, model);
  }
  return std::nullopt;
}

Result RunDelete(const Flags& flags, CliIo& io) {
  auto name = RequiredFlag(flags, "model", "delete");
  if (!name.ok()) return Usage(name.status());
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  absl::Status deleted = (*client)->DeleteModel(*name);
  if (!deleted.ok()) return RefusedForModel(deleted, *name);
  if (flags.Has("json")) {
    io.out << "{\"deleted\":" << JsonString(*name) << "}\n";
  } else {
    io.out << "deleted model " << *name << "\n";
  }
  return std::nullopt;
}

Result RunInfer(const Flags& flags, CliIo& io) {
  auto name = RequiredFlag(flags, "model", "infer");
  if (!name.ok()) return Usage(name.status());
  bool json = flags.Has("json");
  std::optional<std::string> output_dir = flags.Get("output-dir");
  if (json && output_dir.has_value()) {
    return Usage("--json and --output-dir exclude each other: print or write files, not both");
  }
  std::vector<std::string> input_specs = flags.All("input");
  if (input_specs.empty()) {
    return Usage("`cloister infer` needs at least one --input NAME=FILE.npy");
  }
  // Read every input before connecting: a typo should not cost an attestation round trip.
  std::vector<api::Tensor> inputs;
  std::set<std::string> input_names;
  for (const std::string& spec : input_specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return Usage(absl::StrCat("--input wants NAME=FILE.npy, not '", spec, "'"));
    }
    std::string input_name = spec.substr(0, eq);
    if (!input_names.insert(input_name).second) {
      return Usage(absl::StrCat("input '", input_name, "' given more than once"));
    }
    auto array = ReadNpyFile(spec.substr(eq + 1));
    if (!array.ok()) return Usage(array.status());
    inputs.push_back(ToTensor(input_name, *std::move(array)));
  }
  std::string dir = output_dir.value_or(".");
  if (!json) {
    absl::Status made = MakeDirs(dir, 0755);
    if (!made.ok()) return Usage(made);
  }
  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  auto outputs = (*client)->Infer(*name, std::move(inputs), flags.All("output"));
  if (!outputs.ok()) return RefusedForModel(outputs.status(), *name);

  if (json) {
    std::vector<std::string> items;
    for (const api::Tensor& tensor : *outputs) {
      auto item = TensorToJson(tensor);
      if (!item.ok()) return Refused(item.status());
      items.push_back(*std::move(item));
    }
    io.out << "{\"outputs\":[" << absl::StrJoin(items, ",") << "]}\n";
    return std::nullopt;
  }
  std::set<std::string> used_files;
  for (const api::Tensor& tensor : *outputs) {
    auto array = FromTensor(tensor);
    if (!array.ok()) return Refused(array.status());
    std::string base = SanitizeOutputName(tensor.name());
    std::string file = base;
    for (int n = 2; !used_files.insert(file).second; ++n) file = absl::StrCat(base, "_", n);
    std::string path = absl::StrCat(dir, "/", file, ".npy");
    absl::Status written = WriteNpyFile(path, *array);
    if (!written.ok()) return Refused(written);
    io.out << "wrote " << path << "  (" << tensor.name() << ", " << tensor.datatype() << " "
           << ShapeHuman(tensor.shape()) << ")\n";
  }
  return std::nullopt;
}

}  // namespace

std::string SanitizeOutputName(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool safe =
        absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    out.push_back(safe ? c : '_');
  }
  for (char& c : out) {
    if (c != '.') break;
    c = '_';
  }
  if (out.empty()) out = "output";
  return out;
}

absl::StatusOr<std::string> TensorToJson(const api::Tensor& tensor) {
  RETURN_IF_ERROR(ValidateTensor(tensor));
  size_t element_size = *DatatypeElementSize(tensor.datatype());
  std::string data;
  const std::string& raw = tensor.raw();
  for (size_t offset = 0; offset < raw.size(); offset += element_size) {
    if (offset > 0) data.push_back(',');
    data += PrintElement(tensor.datatype(), raw.data() + offset);
  }
  return absl::StrCat("{\"name\":", JsonString(tensor.name()),
                      ",\"datatype\":", JsonString(tensor.datatype()),
                      ",\"shape\":", ShapeJson(tensor.shape()), ",\"data\":[", data, "]}");
}

namespace {

// ---- status (operator port) ----

std::string AgeText(double seconds) {
  if (seconds < 0) return "-";
  int64_t whole = static_cast<int64_t>(seconds);
  if (whole < 120) return absl::StrCat(whole, "s");
  if (whole < 7200) return absl::StrCat(whole / 60, "m", whole % 60, "s");
  return absl::StrCat(whole / 3600, "h", (whole % 3600) / 60, "m");
}

// Columns padded to their widest cell, two spaces apart.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

Result RunStatus(const Flags& flags, CliIo& io) {
  std::string address =
      Setting(flags, io, "operator", "CLOISTER_OPERATOR", "127.0.0.1:7701").value_or("");
  absl::Duration timeout = absl::Seconds(10);
  if (auto text = flags.Get("timeout"); text.has_value()) {
    double seconds = 0;
    if (!absl::SimpleAtod(*text, &seconds) || !(seconds > 0)) {
      return Usage(absl::StrCat("--timeout must be a number of seconds above 0, not '", *text, "'"));
    }
    timeout = absl::Seconds(seconds);
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = ops::v1::Operator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ops::v1::StatusResponse status;
  grpc::Status rpc = stub->Status(&context, ops::v1::StatusRequest(), &status);
  if (!rpc.ok()) {
    return Refused(absl::StrCat("cannot get status from the operator port at ", address, ": ",
                                rpc.error_message()));
  }
  if (flags.Has("json")) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(status, &json, options);
    io.out << json << "\n";
    return std::nullopt;
  }
  io.out << "cloisterd (operator port " << address << "): up " << AgeText(status.uptime_seconds())
         << ", " << status.workers_size() << " workers, " << status.queued_requests()
         << " queued, " << status.batches_in_flight() << " batches in flight, "
         << status.sessions() << " sessions, " << status.models() << " models\n";
  if (!status.audit_log_path().empty()) {
    io.out << "audit log " << status.audit_log_path() << ": " << status.audit_entries()
           << " entries, signed through entry " << status.audit_signed_entries() << "\n";
  }
  io.out << "\n";
  std::vector<std::vector<std::string>> workers = {
      {"WORKER", "TEE", "GPU", "IN FLIGHT", "EVIDENCE AGE", "SIGNING KEY"}};
  for (const auto& worker : status.workers()) {
    std::string key = worker.signing_public_key_hex();
    workers.push_back({absl::StrCat(worker.index()), worker.tee(),
                       worker.gpu().empty() ? "-" : worker.gpu(),
                       absl::StrCat(worker.batches_in_flight()),
                       AgeText(worker.evidence_age_seconds()),
                       key.empty() ? "-" : key.substr(0, 16) + "..."});
  }
  PrintTable(io.out, workers);
  io.out << "\n";
  std::vector<std::vector<std::string>> tenants = {{"TENANT", "PRIORITY", "WEIGHT", "QUEUED",
                                                    "ADMITTED", "REFUSED", "EXPIRED", "BATCHES",
                                                    "SESSIONS", "MODELS"}};
  for (const auto& tenant : status.tenants()) {
    tenants.push_back({tenant.id(), tenant.priority(), absl::StrCat(tenant.weight()),
                       absl::StrCat(tenant.queued_requests()), absl::StrCat(tenant.admitted()),
                       absl::StrCat(tenant.refused()), absl::StrCat(tenant.expired()),
                       absl::StrCat(tenant.batches()), absl::StrCat(tenant.sessions()),
                       absl::StrCat(tenant.models())});
  }
  PrintTable(io.out, tenants);
  return std::nullopt;
}

}  // namespace

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
        << "' (subcommands: keygen, attest, upload, models, infer, delete, status; see cloister "
           "--help)\n";
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
