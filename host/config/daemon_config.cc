#include "host/config/daemon_config.h"

#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/status.h"
#include "host/common/ids.h"
#include "yaml-cpp/yaml.h"

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

// Builds "FILE:LINE: FIELD: what" messages for one config file.
class ConfigErrors {
 public:
  explicit ConfigErrors(absl::string_view file_name) : file_name_(file_name) {}

  absl::Status At(const YAML::Node& node, absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name_, ":", node.Mark().line + 1, ": ", field, ": ", what));
  }
  absl::Status AtLine(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_name_, ":", line + 1, ": ", what));
  }
  const std::string& file_name() const { return file_name_; }

 private:
  std::string file_name_;
};

absl::string_view TypeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Undefined:
      return "nothing";
  }
  return "something else";
}

absl::StatusOr<std::string> ReadString(const ConfigErrors& errors, const YAML::Node& node,
                                       absl::string_view field) {
  if (!node.IsScalar()) {
    return errors.At(node, field, absl::StrCat("expected a string, got ", TypeName(node)));
  }
  if (node.Scalar().empty()) return errors.At(node, field, "must not be empty");
  return node.Scalar();
}

absl::StatusOr<int64_t> ReadInteger(const ConfigErrors& errors, const YAML::Node& node,
                                    absl::string_view field, int64_t min, int64_t max) {
  int64_t value;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value)) {
    return errors.At(node, field,
                     absl::StrCat("expected an integer, got ",
                                  node.IsScalar() ? absl::StrCat("'", node.Scalar(), "'")
                                                  : std::string(TypeName(node))));
  }
  if (value < min || value > max) {
    return errors.At(node, field, absl::StrCat(value, " is outside ", min, "..", max));
  }
  return value;
}

absl::StatusOr<double> ReadNumber(const ConfigErrors& errors, const YAML::Node& node,
                                  absl::string_view field, double min, double max) {
  double value;
  if (!node.IsScalar() || !absl::SimpleAtod(node.Scalar(), &value)) {
    return errors.At(node, field,
                     absl::StrCat("expected a number, got ",
                                  node.IsScalar() ? absl::StrCat("'", node.Scalar(), "'")
                                                  : std::string(TypeName(node))));
  }
  if (!(value >= min && value <= max)) {
    return errors.At(node, field, absl::StrCat(node.Scalar(), " is outside ", min, "..", max));
  }
  return value;
}

// A size in bytes: an integer, optionally with a binary suffix (KiB, MiB, GiB, TiB).
absl::StatusOr<uint64_t> ReadSize(const ConfigErrors& errors, const YAML::Node& node,
                                  absl::string_view field) {
  if (!node.IsScalar()) {
    return errors.At(node, field, absl::StrCat("expected a size, got ", TypeName(node)));
  }
  absl::string_view text = node.Scalar();
  uint64_t unit = 1;
  for (const auto& [suffix, shift] :
       {std::pair<absl::string_view, int>{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}}) {
    if (absl::EndsWith(text, suffix)) {
      text.remove_suffix(suffix.size());
      unit = uint64_t{1} << shift;
      break;
    }
  }
  uint64_t count;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &count) || text.empty() ||
      text[0] == '-' || count > (uint64_t{1} << 50) / unit) {
    return errors.At(node, field,
                     absl::StrCat("expected a size in bytes (like 1048576 or 64MiB), got '",
                                  node.Scalar(), "'"));
  }
  if (count == 0) return errors.At(node, field, "must be at least 1 byte");
  return count * unit;
}

absl::StatusOr<absl::Duration> ReadMilliseconds(const ConfigErrors& errors, const YAML::Node& node,
                                                absl::string_view field, double min, double max) {
  ASSIGN_OR_RETURN(double value, ReadNumber(errors, node, field, min, max));
  return absl::Microseconds(static_cast<int64_t>(value * 1000));
}

// Sets one tenant limit named `key`; false (and OK) when `key` is not a limit.
absl::StatusOr<bool> ParseLimit(const ConfigErrors& errors, const std::string& key,
                                const YAML::Node& value, const std::string& where,
                                TenantLimits& limits) {
  std::string field = absl::StrCat(where, ".", key);
  if (key == "priority") {
    ASSIGN_OR_RETURN(std::string word, ReadString(errors, value, field));
    absl::StatusOr<PriorityClass> priority = ParsePriorityClass(word);
    if (!priority.ok()) return errors.At(value, field, priority.status().message());
    limits.priority = *priority;
  } else if (key == "weight") {
    ASSIGN_OR_RETURN(int64_t weight, ReadInteger(errors, value, field, 1, 10000));
    limits.weight = static_cast<int>(weight);
  } else if (key == "rate_per_second") {
    ASSIGN_OR_RETURN(limits.rate_per_second, ReadNumber(errors, value, field, 0, 1e9));
  } else if (key == "burst") {
    ASSIGN_OR_RETURN(limits.burst, ReadNumber(errors, value, field, 0, 1e9));
  } else if (key == "max_queued_requests") {
    ASSIGN_OR_RETURN(int64_t count, ReadInteger(errors, value, field, 1, 1 << 24));
    limits.max_queued_requests = static_cast<int>(count);
  } else if (key == "max_queued_bytes") {
    ASSIGN_OR_RETURN(limits.max_queued_size, ReadSize(errors, value, field));
  } else if (key == "max_payload_bytes") {
    ASSIGN_OR_RETURN(limits.max_payload_size, ReadSize(errors, value, field));
  } else if (key == "model_memory_quota_bytes") {
    ASSIGN_OR_RETURN(limits.model_memory_quota, ReadSize(errors, value, field));
  } else if (key == "default_deadline_ms") {
    ASSIGN_OR_RETURN(double ms, ReadNumber(errors, value, field, 0, 3.6e6));
    limits.default_deadline =
        ms == 0 ? absl::InfiniteDuration() : absl::Microseconds(static_cast<int64_t>(ms * 1000));
    if (limits.default_deadline == absl::ZeroDuration()) {
      return errors.At(value, field, "must be 0 (none) or at least 0.001");
    }
  } else {
    return false;
  }
  return true;
}

absl::Status ParseTenantDefaults(const ConfigErrors& errors, const YAML::Node& node,
                                 TenantLimits& limits) {
  if (!node.IsMap()) {
    return errors.At(node, "tenant_defaults", absl::StrCat("expected a map, got ", TypeName(node)));
  }
  for (const auto& entry : node) {
    std::string key = entry.first.Scalar();
    ASSIGN_OR_RETURN(bool known, ParseLimit(errors, key, entry.second, "tenant_defaults", limits));
    if (!known) {
      return errors.At(entry.first, "tenant_defaults", absl::StrCat("unknown field '", key, "'"));
    }
  }
  return absl::OkStatus();
}

// `section` is the key the map was found under: scheduler, or its older name batching.
absl::Status ParseScheduler(const ConfigErrors& errors, const YAML::Node& node,
                            const std::string& section, SchedulerOptions& options) {
  if (!node.IsMap()) {
    return errors.At(node, section, absl::StrCat("expected a map, got ", TypeName(node)));
  }
  bool best_effort_set = false;
  for (const auto& entry : node) {
    std::string key = entry.first.Scalar();
    std::string field = absl::StrCat(section, ".", key);
    const YAML::Node& value = entry.second;
    if (key == "max_batch_size") {
      ASSIGN_OR_RETURN(int64_t count, ReadInteger(errors, value, field, 1, 1024));
      options.max_batch_size = static_cast<int>(count);
    } else if (key == "preferred_batch_sizes") {
      if (!value.IsSequence()) {
        return errors.At(value, field, absl::StrCat("expected a list, got ", TypeName(value)));
      }
      options.preferred_batch_sizes.clear();
      for (size_t i = 0; i < value.size(); ++i) {
        ASSIGN_OR_RETURN(int64_t count,
                         ReadInteger(errors, value[i], absl::StrCat(field, "[", i, "]"), 1, 1024));
        if (!options.preferred_batch_sizes.empty() &&
            count <= options.preferred_batch_sizes.back()) {
          return errors.At(value[i], absl::StrCat(field, "[", i, "]"),
                           "sizes must be in ascending order");
        }
        options.preferred_batch_sizes.push_back(static_cast<int>(count));
      }
    } else if (key == "max_queue_delay_ms") {
      ASSIGN_OR_RETURN(options.max_queue_delay, ReadMilliseconds(errors, value, field, 0, 10000));
    } else if (key == "max_batches_in_flight") {
      ASSIGN_OR_RETURN(int64_t count, ReadInteger(errors, value, field, 1, 64));
      options.max_batches_in_flight = static_cast<int>(count);
    } else if (key == "best_effort_max_batch_size") {
      ASSIGN_OR_RETURN(int64_t count, ReadInteger(errors, value, field, 1, 1024));
      options.best_effort_max_batch_size = static_cast<int>(count);
      best_effort_set = true;
    } else if (key == "best_effort_max_batch_time_ms") {
      ASSIGN_OR_RETURN(options.best_effort_max_batch_time,
                       ReadMilliseconds(errors, value, field, 0.001, 60000));
    } else if (key == "realtime_activity_window_ms") {
      ASSIGN_OR_RETURN(options.realtime_activity_window,
                       ReadMilliseconds(errors, value, field, 0, 60000));
    } else if (key == "fairness_quantum_ms") {
      ASSIGN_OR_RETURN(options.fairness_quantum,
                       ReadMilliseconds(errors, value, field, 0.001, 60000));
    } else {
      return errors.At(entry.first, section, absl::StrCat("unknown field '", key, "'"));
    }
  }
  if (best_effort_set && options.best_effort_max_batch_size > options.max_batch_size) {
    return errors.At(
        node, section,
        absl::StrCat("best_effort_max_batch_size (", options.best_effort_max_batch_size,
                     ") is larger than max_batch_size (", options.max_batch_size, ")"));
  }
  if (!options.preferred_batch_sizes.empty() &&
      options.preferred_batch_sizes.back() > options.max_batch_size) {
    return errors.At(node, section,
                     absl::StrCat("preferred batch size ", options.preferred_batch_sizes.back(),
                                  " is larger than max_batch_size (", options.max_batch_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseTenants(const ConfigErrors& errors, const YAML::Node& node,
                          const TenantLimits& defaults, DaemonConfig& config) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsSequence()) {
    return errors.At(node, "tenants", absl::StrCat("expected a list, got ", TypeName(node)));
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    std::string where = absl::StrCat("tenants[", i, "]");
    if (!item.IsMap()) {
      return errors.At(item, where, absl::StrCat("expected a map, got ", TypeName(item)));
    }
    TenantConfig tenant;
    tenant.limits = defaults;
    bool has_id = false;
    bool has_hash = false;
    for (const auto& entry : item) {
      std::string key = entry.first.Scalar();
      if (key == "id") {
        ASSIGN_OR_RETURN(tenant.tenant_id, ReadString(errors, entry.second, where + ".id"));
        if (!IsValidTenantId(tenant.tenant_id)) {
          return errors.At(entry.second, where + ".id", CheckTenantId(tenant.tenant_id).message());
        }
        has_id = true;
      } else if (key == "token_sha256") {
        ASSIGN_OR_RETURN(std::string hex,
                         ReadString(errors, entry.second, where + ".token_sha256"));
        absl::StatusOr<Bytes> hash = HexDecode(hex);
        if (!hash.ok() || hash->size() != 32) {
          return errors.At(entry.second, where + ".token_sha256",
                           "expected 64 hex digits (the SHA-256 of the tenant's API token)");
        }
        tenant.token_sha256 = *std::move(hash);
        has_hash = true;
      } else {
        ASSIGN_OR_RETURN(bool known, ParseLimit(errors, key, entry.second, where, tenant.limits));
        if (!known) return errors.At(entry.first, where, absl::StrCat("unknown field '", key, "'"));
      }
    }
    if (!has_id) return errors.At(item, where, "missing field 'id'");
    if (!has_hash) return errors.At(item, where, "missing field 'token_sha256'");
    for (const TenantConfig& other : config.tenants) {
      if (other.tenant_id == tenant.tenant_id) {
        return errors.At(item, where + ".id",
                         absl::StrCat("tenant '", tenant.tenant_id, "' is listed twice"));
      }
    }
    config.scheduler.tenant_limits[tenant.tenant_id] = tenant.limits;
    config.tenants.push_back(std::move(tenant));
  }
  return absl::OkStatus();
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

absl::StatusOr<DaemonConfig> ParseDaemonConfig(absl::string_view yaml_text,
                                               absl::string_view file_name) {
  ConfigErrors errors(file_name);
  DaemonConfig config;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::ParserException& e) {
    return errors.AtLine(e.mark.line, absl::StrCat("YAML syntax error: ", e.msg));
  }
  if (root.IsNull() || !root.IsDefined()) return config;
  if (!root.IsMap()) {
    return errors.AtLine(root.Mark().line,
                         absl::StrCat("expected a map of settings, got ", TypeName(root)));
  }
  YAML::Node evidence_node = root;  // the later of tee and gpu, for errors about the pair
  std::string evidence_key = "tee";
  std::string scheduler_key;  // which of scheduler and batching was given, if any
  std::optional<YAML::Node> tenants_node;
  try {
    for (const auto& entry : root) {
      if (!entry.first.IsScalar()) return errors.At(entry.first, "(key)", "expected a field name");
      std::string key = entry.first.Scalar();
      const YAML::Node& value = entry.second;
      if (key == "listen") {
        ASSIGN_OR_RETURN(config.listen, ReadString(errors, value, "listen"));
        absl::Status valid = CheckListenAddress(config.listen);
        if (!valid.ok()) return errors.At(value, "listen", valid.message());
      } else if (key == "data_dir") {
        ASSIGN_OR_RETURN(config.data_dir, ReadString(errors, value, "data_dir"));
      } else if (key == "enclave_binary") {
        ASSIGN_OR_RETURN(config.enclave_binary, ReadString(errors, value, "enclave_binary"));
      } else if (key == "tee" || key == "gpu") {
        std::string& field = key == "tee" ? config.tee : config.gpu;
        ASSIGN_OR_RETURN(field, ReadString(errors, value, key));
        // Each word on its own first; the pair is checked once both are known.
        absl::Status valid = key == "tee" ? CheckTeeWord(field) : CheckGpuWord(field);
        if (!valid.ok()) return errors.At(value, key, valid.message());
        evidence_node = value;
        evidence_key = key;
      } else if (key == "workers") {
        ASSIGN_OR_RETURN(int64_t workers, ReadInteger(errors, value, "workers", 1, 64));
        config.workers = static_cast<int>(workers);
      } else if (key == "scheduler" || key == "batching") {
        if (!scheduler_key.empty()) {
          return errors.At(
              entry.first, key,
              absl::StrCat("the scheduler settings are already given as '", scheduler_key, "'"));
        }
        scheduler_key = key;
        RETURN_IF_ERROR(ParseScheduler(errors, value, key, config.scheduler));
      } else if (key == "tenant_defaults") {
        RETURN_IF_ERROR(ParseTenantDefaults(errors, value, config.scheduler.default_limits));
      } else if (key == "tenants") {
        tenants_node.emplace(value);  // parsed last, over tenant_defaults wherever those are
      } else {
        return errors.AtLine(entry.first.Mark().line, absl::StrCat("unknown field '", key, "'"));
      }
    }
    if (tenants_node.has_value()) {
      RETURN_IF_ERROR(ParseTenants(errors, *tenants_node, config.scheduler.default_limits, config));
    }
  } catch (const YAML::Exception& e) {
    return errors.AtLine(e.mark.line, e.msg);
  }
  if (absl::Status valid = CheckEvidenceSources(config.tee, config.gpu); !valid.ok()) {
    return errors.At(evidence_node, evidence_key, valid.message());
  }
  return config;
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

std::vector<TenantCredential> DaemonConfig::Credentials() const {
  std::vector<TenantCredential> credentials;
  for (const TenantConfig& tenant : tenants) {
    credentials.push_back({tenant.tenant_id, tenant.token_sha256});
  }
  return credentials;
}

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, 1 << 20);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read config: ", text.status().message()));
  }
  return ParseDaemonConfig(*text, path);
}

absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv) {
  CommandLine command_line;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      command_line.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    absl::string_view name = arg;
    std::optional<std::string> value;
    size_t equals = arg.find('=');
    if (equals != absl::string_view::npos) {
      name = arg.substr(0, equals);
      value = std::string(arg.substr(equals + 1));
    }
    std::optional<std::string>* target = nullptr;
    if (name == "--config") {
      target = &command_line.config_path;
    } else if (name == "--listen") {
      target = &command_line.listen;
    } else if (name == "--data-dir") {
      target = &command_line.data_dir;
    } else if (name == "--enclave-binary") {
      target = &command_line.enclave_binary;
    } else if (name == "--tee") {
      target = &command_line.tee;
    } else if (name == "--gpu") {
      target = &command_line.gpu;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
    if (!value.has_value()) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", name, " needs a value"));
      }
      value = argv[++i];
    }
    if (value->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("flag ", name, " needs a value"));
    }
    *target = std::move(value);
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
  }
  if (command_line.data_dir.has_value()) config.data_dir = *command_line.data_dir;
  if (command_line.enclave_binary.has_value()) {
    config.enclave_binary = *command_line.enclave_binary;
  }
  if (command_line.tee.has_value()) config.tee = *command_line.tee;
  if (command_line.gpu.has_value()) config.gpu = *command_line.gpu;
  if (absl::Status valid = CheckEvidenceSources(config.tee, config.gpu); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        command_line.tee.has_value() || command_line.gpu.has_value() ? "--tee/--gpu: " : "",
        valid.message()));
  }
  return config;
}

}  // namespace cloister::host
