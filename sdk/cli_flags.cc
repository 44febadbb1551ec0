// The `cloister` command line (cli.h): parsing the flags of a subcommand, and the settings
// (flag, else environment variable) that make up the connection options.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attest/policy.h"
#include "base/file.h"
#include "base/flags.h"
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
    {"spread", FlagKind::kBool},
};

std::string UnknownFlag(const Subcommand& sub, absl::string_view flag) {
  return absl::StrCat("unknown flag ", flag, " for `cloister ", sub.name, "` (see cloister ",
                      sub.name, " --help)");
}

// The error for an argument that is no flag of `sub`: a stray argument unless it looks like a
// flag.
std::string UnknownArgument(const Subcommand& sub, absl::string_view arg) {
  if (arg.size() < 3 || !absl::StartsWith(arg, "--")) {
    return absl::StrCat("unexpected argument '", arg, "' for `cloister ", sub.name, "`");
  }
  return UnknownFlag(sub, arg);
}

// `spec` as base/flags has it, filling `flags`; a switch sets its entry of `switches`.
::cloister::FlagSpec BaseFlag(const FlagSpec& spec, Flags& flags,
                              std::map<std::string, bool>& switches) {
  std::string name(spec.name);
  if (spec.kind == FlagKind::kBool) return {"--" + name, SwitchFlag{&switches[name]}};
  if (spec.kind == FlagKind::kRepeated) {
    return {"--" + name, CustomFlag{[&flags, name](const std::string& value) {
              flags.repeated[name].push_back(value);
              return absl::OkStatus();
            }}};
  }
  return {
      "--" + name, CustomFlag{[&flags, name](const std::string& value) {
        if (!flags.values.emplace(name, value).second) {
          return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given more than once"));
        }
        return absl::OkStatus();
      }}};
}

}  // namespace

absl::StatusOr<Flags> ParseFlags(const Subcommand& sub, const std::vector<std::string>& args) {
  Flags flags;
  std::map<std::string, bool> switches;
  // "--" alone is a stray argument, but "--=x" an unknown flag "--" and "--help=x" an unknown
  // flag "--help": "--" is a switch that ends the parse, and neither switch takes a value.
  bool bare_dashes = false;
  std::vector<::cloister::FlagSpec> specs = {{"--help", SwitchFlag{&flags.help}},
                                             {"-h", SwitchFlag{&flags.help}},
                                             {"--", SwitchFlag{&bare_dashes, /*stop=*/true}}};
  for (const FlagSpec& spec : kConnectionFlags) specs.push_back(BaseFlag(spec, flags, switches));
  for (const FlagSpec& spec : sub.flags) specs.push_back(BaseFlag(spec, flags, switches));
  const FlagSyntax syntax{
      .unknown_flag = [&](const std::string& arg) { return UnknownArgument(sub, arg); },
      .needs_value = [](const std::string& flag) { return "flag " + flag + " needs a value"; },
      .takes_no_value =
          [&](const std::string& flag) {
            return flag == "--help" || flag == "--" ? UnknownFlag(sub, flag)
                                                    : "flag " + flag + " takes no value";
          }};
  RETURN_IF_ERROR(::cloister::ParseFlags(args, specs, syntax));
  if (bare_dashes) return absl::InvalidArgumentError(UnknownArgument(sub, "--"));
  for (const auto& [name, given] : switches) {
    if (given) flags.bools.insert(name);
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
  if (flags.Has("spread")) {
    options.spread_endpoints = true;
  } else if (auto it = io.env.find("CLOISTER_SPREAD"); it != io.env.end() && !it->second.empty()) {
    if (it->second == "1" || it->second == "true") {
      options.spread_endpoints = true;
    } else if (it->second != "0" && it->second != "false") {
      return absl::InvalidArgumentError(absl::StrCat(
          "CLOISTER_SPREAD must be 1, true, 0 or false, not '", it->second, "'"));
    }
  }
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
