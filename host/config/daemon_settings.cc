// The checks of single settings that the config file and the command line share (addresses,
// evidence sources, PEM files) and the command line itself; declared in daemon_config.h.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/flags.h"
#include "base/status.h"
#include "host/config/daemon_config.h"

namespace cloister::host {
namespace {

absl::Status CheckTeeWord(absl::string_view tee) {
  if (tee == "sim" || tee == "sev-snp" || tee == "tdx") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tee must be sim, sev-snp or tdx, not '", tee, "'"));
}

absl::Status CheckGpuWord(absl::string_view gpu) {
  if (gpu == "sim" || gpu == "nvidia-cc" || gpu == "none") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("gpu must be sim, nvidia-cc or none, not '", gpu, "'"));
}

}  // namespace

absl::Status CheckListenAddress(absl::string_view listen) {
  size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' is not HOST:PORT"));
  }
  absl::string_view host = listen.substr(0, colon);
  absl::string_view port_text = listen.substr(colon + 1);
  if (absl::StrContains(host, ':') && !(absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "': put an IPv6 host in brackets, [::1]:7700"));
  }
  int port;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' has no port in 0..65535"));
  }
  return absl::OkStatus();
}

std::string ListenHost(absl::string_view listen) {
  size_t colon = listen.rfind(':');
  return std::string(colon == absl::string_view::npos ? listen : listen.substr(0, colon));
}

absl::Status CheckPemFile(const std::string& path, absl::string_view kind) {
  absl::StatusOr<std::string> text = ReadFile(path, 1 << 20);
  if (!text.ok()) return text.status();
  for (size_t at = text->find("-----BEGIN "); at != std::string::npos;
       at = text->find("-----BEGIN ", at + 1)) {
    size_t close = text->find("-----", at + 11);
    if (close == std::string::npos) break;
    absl::string_view label = absl::string_view(*text).substr(at + 11, close - at - 11);
    if (label == kind || (kind == "PRIVATE KEY" && absl::EndsWith(label, " PRIVATE KEY"))) {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, " holds no PEM ", kind, " (-----BEGIN ", kind, "-----)"));
}

absl::Status CheckOperatorAddress(absl::string_view listen, bool allow_remote) {
  if (absl::StartsWith(listen, "unix:")) {
    if (listen.size() == 5) {
      return absl::InvalidArgumentError(
          "'unix:' needs a socket path, like unix:/run/cloister/op.sock");
    }
    return absl::OkStatus();
  }
  absl::Status valid = CheckListenAddress(listen);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(valid.message(), " (or use unix:/path/to/socket)"));
  }
  std::string host = ListenHost(listen);
  bool loopback = host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.");
  if (!loopback && !allow_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", listen,
        "' is not loopback; the operator port has no authentication of its own: use a unix "
        "socket or 127.0.0.1, or set operator.allow_remote: true behind your own access control"));
  }
  return absl::OkStatus();
}

absl::Status CheckEvidenceSources(absl::string_view tee, absl::string_view gpu) {
  RETURN_IF_ERROR(CheckTeeWord(tee));
  if (!gpu.empty()) RETURN_IF_ERROR(CheckGpuWord(gpu));
  if (gpu == "sim" && tee != "sim") {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu sim needs tee sim (a simulated GPU cannot sit in a ", tee, " CVM)"));
  }
  if (gpu == "nvidia-cc" && tee == "sim") {
    return absl::InvalidArgumentError(
        "gpu nvidia-cc needs tee sev-snp or tdx (a simulated CVM cannot vouch for a real GPU)");
  }
  return absl::OkStatus();
}

absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv) {
  CommandLine command_line;
  auto value_of = [](std::optional<std::string>* target) {
    return OptionalStringFlag{target, /*non_empty=*/true};
  };
  RETURN_IF_ERROR(ParseFlags(
      std::vector<std::string>(argv + 1, argv + argc),
      {{"--help", SwitchFlag{&command_line.help}},
       {"-h", SwitchFlag{&command_line.help}},
       {"--skip-file-checks", SwitchFlag{&command_line.skip_file_checks}},
       {"--config", value_of(&command_line.config_path)},
       {"--listen", value_of(&command_line.listen)},
       {"--data-dir", value_of(&command_line.data_dir)},
       {"--enclave-binary", value_of(&command_line.enclave_binary)},
       {"--tee", value_of(&command_line.tee)},
       {"--gpu", value_of(&command_line.gpu)},
       {"--check-config", value_of(&command_line.check_config)},
       {"--model-digest", value_of(&command_line.model_digest)}},
      {.unknown_flag =
           [](const std::string& arg) {
             return absl::StartsWith(arg, "--") ? absl::StrCat("unknown flag ", arg)
                                                : absl::StrCat("unexpected argument '", arg, "'");
           },
       .needs_value = [](const std::string& flag) { return "flag " + flag + " needs a value"; }}));
  if (command_line.skip_file_checks && !command_line.check_config.has_value()) {
    return absl::InvalidArgumentError("--skip-file-checks only goes with --check-config FILE");
  }
  return command_line;
}

absl::StatusOr<DaemonConfig> ResolveDaemonConfig(const CommandLine& command_line) {
  DaemonConfig config;
  if (command_line.config_path.has_value()) {
    ASSIGN_OR_RETURN(config, LoadDaemonConfig(*command_line.config_path));
  }
  if (command_line.listen.has_value()) {
    absl::Status valid = CheckListenAddress(*command_line.listen);
    if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("--listen: ", valid.message()));
    config.listen = *command_line.listen;
    config.flag_overrides.push_back("listen");
  }
  if (command_line.data_dir.has_value()) {
    config.data_dir = *command_line.data_dir;
    config.flag_overrides.push_back("data_dir");
  }
  if (command_line.enclave_binary.has_value()) {
    config.enclave_binary = *command_line.enclave_binary;
    config.flag_overrides.push_back("enclave_binary");
  }
  if (command_line.tee.has_value()) {
    config.tee = *command_line.tee;
    config.flag_overrides.push_back("tee");
  }
  if (command_line.gpu.has_value()) {
    config.gpu = *command_line.gpu;
    config.flag_overrides.push_back("gpu");
  }
  if (absl::Status valid = CheckEvidenceSources(config.tee, config.gpu); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        command_line.tee.has_value() || command_line.gpu.has_value() ? "--tee/--gpu: " : "",
        valid.message()));
  }
  return config;
}

}  // namespace cloister::host
