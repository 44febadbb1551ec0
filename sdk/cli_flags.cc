// The `cloister` command line (cli.h): parsing the flags of a subcommand, and the settings
// (flag, else environment variable) that make up the connection options.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attest/policy.h"
#include "base/file.h"
#include "base/status.h"
#include "sdk/cli_internal.h"
#include "sdk/client.h"
#include "sdk/identity.h"

namespace cloister::sdk::cli_internal {

namespace {

constexpr FlagSpec kConnectionFlags[] = {
    {"server", FlagKind::kValue},     {"policy", FlagKind::kValue}, {"tenant", FlagKind::kValue},
    {"token-file", FlagKind::kValue}, {"key", FlagKind::kValue},    {"timeout", FlagKind::kValue},
    {"ca", FlagKind::kValue},         {"client-cert", FlagKind::kValue},
    {"client-key", FlagKind::kValue}, {"tls-server-name", FlagKind::kValue},
};

std::optional<FlagSpec> FindFlag(const Subcommand& sub, absl::string_view name) {
  for (const FlagSpec& spec : kConnectionFlags) {
    if (spec.name == name) return spec;
  }
  for (const FlagSpec& spec : sub.flags) {
    if (spec.name == name) return spec;
  }
  return std::nullopt;
}

}  // namespace

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

std::optional<std::string> Setting(const Flags& flags, const CliIo& io, const std::string& flag,
                                   const std::string& env_name,
                                   std::optional<std::string> fallback) {
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

}  // namespace cloister::sdk::cli_internal
