#include "host/config/daemon_config.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// Builds "FILE:LINE: FIELD: what" messages for one config file, collects the ones that do not
// stop the whole load, and resolves relative paths against the file's folder.
class ConfigErrors {
 public:
  explicit ConfigErrors(absl::string_view file_name) : file_name_(file_name) {
    std::filesystem::path folder = std::filesystem::path(file_name_).parent_path();
    base_dir_ = folder.string();
  }

  // Keeps the message of a failed status (OK is ignored).
  void Collect(const absl::Status& status) {
    if (!status.ok()) messages_.emplace_back(status.message());
  }
  bool empty() const { return messages_.empty(); }
  absl::Status Collected() const {
    return absl::InvalidArgumentError(absl::StrJoin(messages_, "\n"));
  }
  // `path` as seen from the process: relative paths are relative to the config's folder.
  std::string Resolve(const std::string& path) const {
    if (path.empty() || path[0] == '/' || base_dir_.empty()) return path;
    return (std::filesystem::path(base_dir_) / path).lexically_normal().string();
  }

  absl::Status At(const YAML::Node& node, absl::string_view field, absl::string_view what) const {
    return AtPosition(node.Mark(), field, what);
  }
  absl::Status AtPosition(const YAML::Mark& position, absl::string_view field,
                          absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name_, ":", position.line + 1, ": ", field, ": ", what));
  }
  absl::Status AtLine(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_name_, ":", line + 1, ": ", what));
  }
  const std::string& file_name() const { return file_name_; }

 private:
  std::string file_name_;
  std::string base_dir_;
  std::vector<std::string> messages_;
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
  } else if (key == "default_deadline_ms" || key == "max_deadline_ms") {
    ASSIGN_OR_RETURN(double ms, ReadNumber(errors, value, field, 0, 3.6e6));
    absl::Duration& deadline =
        key == "default_deadline_ms" ? limits.default_deadline : limits.max_deadline;
    deadline =
        ms == 0 ? absl::InfiniteDuration() : absl::Microseconds(static_cast<int64_t>(ms * 1000));
    if (deadline == absl::ZeroDuration()) {
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
absl::StatusOr<bool> ReadBool(const ConfigErrors& errors, const YAML::Node& node,
                              absl::string_view field) {
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    if (text == "true") return true;
    if (text == "false") return false;
  }
  return errors.At(node, field,
                   absl::StrCat("expected true or false, got ",
                                node.IsScalar() ? absl::StrCat("'", node.Scalar(), "'")
                                                : std::string(TypeName(node))));
}

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
    } else if (key == "adaptive_queue_delay") {
      ASSIGN_OR_RETURN(options.adaptive_queue_delay, ReadBool(errors, value, field));
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
    } else if (key == "realtime_arrival_guard_ms") {
      ASSIGN_OR_RETURN(options.realtime_arrival_guard,
                       ReadMilliseconds(errors, value, field, 0, 1000));
    } else if (key == "realtime_reserved_slots") {
      ASSIGN_OR_RETURN(int64_t count, ReadInteger(errors, value, field, 0, 63));
      options.realtime_reserved_slots = static_cast<int>(count);
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
  if (options.realtime_reserved_slots >= options.max_batches_in_flight &&
      options.realtime_reserved_slots > 0) {
    return errors.At(node, section,
                     absl::StrCat("realtime_reserved_slots (", options.realtime_reserved_slots,
                                  ") must be less than max_batches_in_flight (",
                                  options.max_batches_in_flight, ")"));
  }
  if (!options.preferred_batch_sizes.empty() &&
      options.preferred_batch_sizes.back() > options.max_batch_size) {
    return errors.At(node, section,
                     absl::StrCat("preferred batch size ", options.preferred_batch_sizes.back(),
                                  " is larger than max_batch_size (", options.max_batch_size, ")"));
  }
  return absl::OkStatus();
}

// A word from a fixed set.
absl::StatusOr<std::string> ReadChoice(const ConfigErrors& errors, const YAML::Node& node,
                                       absl::string_view field,
                                       std::initializer_list<absl::string_view> choices) {
  ASSIGN_OR_RETURN(std::string word, ReadString(errors, node, field));
  for (absl::string_view choice : choices) {
    if (word == choice) return word;
  }
  return errors.At(
      node, field,
      absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", not '", word, "'"));
}

// [a-z0-9_-]{1,max_length}
absl::StatusOr<std::string> ReadName(const ConfigErrors& errors, const YAML::Node& node,
                                     absl::string_view field, size_t max_length) {
  ASSIGN_OR_RETURN(std::string name, ReadString(errors, node, field));
  bool valid = name.size() <= max_length;
  for (char c : name) {
    valid = valid && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
  }
  if (!valid) {
    return errors.At(node, field,
                     absl::StrCat("'", name, "' is not a name: use a-z, 0-9, _ and -, at most ",
                                  max_length, " characters"));
  }
  return name;
}

absl::Status ExpectMap(const ConfigErrors& errors, const YAML::Node& node,
                       absl::string_view field) {
  if (node.IsMap()) return absl::OkStatus();
  return errors.At(node, field, absl::StrCat("expected a map, got ", TypeName(node)));
}

absl::Status ExpectList(const ConfigErrors& errors, const YAML::Node& node,
                        absl::string_view field) {
  if (node.IsSequence()) return absl::OkStatus();
  return errors.At(node, field, absl::StrCat("expected a list, got ", TypeName(node)));
}

absl::Status UnknownField(const ConfigErrors& errors, const YAML::Node& key_node,
                          absl::string_view section) {
  return errors.At(key_node, section, absl::StrCat("unknown field '", key_node.Scalar(), "'"));
}

// Where each reference to another part of the file was written, for errors found once the
// whole file is read. Positions, not YAML::Node handles: assigning to a yaml-cpp Node rewrites
// the node it refers to (inside the document being read), so nodes are never reassigned here.
struct Mark {
  YAML::Mark position;
  std::string field;
};

absl::Status ParseOneTenant(const ConfigErrors& errors, const YAML::Node& item,
                            const std::string& where, const TenantLimits& defaults,
                            TenantConfig& tenant, std::optional<Mark>& policy_mark,
                            std::optional<Mark>& identities_mark) {
  RETURN_IF_ERROR(ExpectMap(errors, item, where));
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
      ASSIGN_OR_RETURN(std::string hex, ReadString(errors, entry.second, where + ".token_sha256"));
      absl::StatusOr<Bytes> hash = HexDecode(hex);
      if (!hash.ok() || hash->size() != 32) {
        return errors.At(entry.second, where + ".token_sha256",
                         "expected 64 hex digits (the SHA-256 of the tenant's API token)");
      }
      tenant.token_sha256 = *std::move(hash);
      has_hash = true;
    } else if (key == "mtls_identities") {
      std::string field = where + ".mtls_identities";
      RETURN_IF_ERROR(ExpectList(errors, entry.second, field));
      for (size_t i = 0; i < entry.second.size(); ++i) {
        std::string item_field = absl::StrCat(field, "[", i, "]");
        ASSIGN_OR_RETURN(std::string identity, ReadString(errors, entry.second[i], item_field));
        if (identity.size() > 512 || identity.find_first_of(" \t\r\n") != std::string::npos) {
          return errors.At(entry.second[i], item_field,
                           "an identity is a certificate name or SAN without spaces, at most 512 "
                           "characters");
        }
        tenant.mtls_identities.push_back(std::move(identity));
      }
      if (!tenant.mtls_identities.empty()) identities_mark = Mark{entry.second.Mark(), field};
    } else if (key == "attestation_policy") {
      std::string field = where + ".attestation_policy";
      ASSIGN_OR_RETURN(tenant.attestation_policy, ReadName(errors, entry.second, field, 64));
      policy_mark = Mark{entry.second.Mark(), field};
    } else {
      ASSIGN_OR_RETURN(bool known, ParseLimit(errors, key, entry.second, where, tenant.limits));
      if (!known) return UnknownField(errors, entry.first, where);
    }
  }
  if (!has_id) return errors.At(item, where, "missing field 'id'");
  // A tenant bound to client certificates may go without a token (admitted by mutual TLS alone).
  if (!has_hash && tenant.mtls_identities.empty()) {
    return errors.At(item, where, "missing field 'token_sha256' (or mtls_identities)");
  }
  return absl::OkStatus();
}

// Parsed after everything else: tenants take tenant_defaults, and their references are checked
// against attestation_policies and tls. Each broken tenant is one collected error.
void ParseTenants(ConfigErrors& errors, const YAML::Node& node, DaemonConfig& config) {
  if (node.IsNull()) return;
  if (absl::Status list = ExpectList(errors, node, "tenants"); !list.ok()) {
    errors.Collect(list);
    return;
  }
  std::set<std::string> policy_names;
  for (const AttestationPolicyConfig& policy : config.attestation_policies) {
    policy_names.insert(policy.name);
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    std::string where = absl::StrCat("tenants[", i, "]");
    TenantConfig tenant;
    std::optional<Mark> policy_mark;
    std::optional<Mark> identities_mark;
    absl::Status status = ParseOneTenant(errors, item, where, config.scheduler.default_limits,
                                         tenant, policy_mark, identities_mark);
    if (status.ok()) {
      for (const TenantConfig& other : config.tenants) {
        if (other.tenant_id == tenant.tenant_id) {
          status = errors.At(item, where + ".id",
                             absl::StrCat("tenant '", tenant.tenant_id, "' is listed twice"));
        }
      }
    }
    if (status.ok() && policy_mark.has_value() &&
        !policy_names.contains(tenant.attestation_policy)) {
      status =
          errors.AtPosition(policy_mark->position, policy_mark->field,
                            absl::StrCat("no attestation policy named '", tenant.attestation_policy,
                                         "' in attestation_policies"));
    }
    if (status.ok() && identities_mark.has_value() && config.tls.client_ca_file.empty()) {
      status = errors.AtPosition(identities_mark->position, identities_mark->field,
                                 "client identities need tls.client_ca_file (mutual TLS)");
    }
    if (!status.ok()) {
      errors.Collect(status);
      continue;
    }
    if (tenant.attestation_policy.empty()) tenant.attestation_policy = config.attestation_policy;
    config.scheduler.tenant_limits[tenant.tenant_id] = tenant.limits;
    config.tenants.push_back(std::move(tenant));
  }
}

absl::Status ParseTls(const ConfigErrors& errors, const YAML::Node& node, TlsConfig& tls) {
  RETURN_IF_ERROR(ExpectMap(errors, node, "tls"));
  for (const auto& entry : node) {
    std::string key = entry.first.Scalar();
    std::string field = "tls." + key;
    if (key == "cert_file" || key == "key_file" || key == "client_ca_file") {
      ASSIGN_OR_RETURN(std::string path, ReadString(errors, entry.second, field));
      std::string& target = key == "cert_file"  ? tls.cert_file
                            : key == "key_file" ? tls.key_file
                                                : tls.client_ca_file;
      target = errors.Resolve(path);
    } else if (key == "require_client_cert") {
      ASSIGN_OR_RETURN(tls.require_client_cert, ReadBool(errors, entry.second, field));
    } else {
      return UnknownField(errors, entry.first, "tls");
    }
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return errors.At(node, tls.cert_file.empty() ? "tls.cert_file" : "tls.key_file",
                     "missing: cert_file and key_file go together");
  }
  if (tls.cert_file.empty()) {
    return errors.At(node, "tls.cert_file", "missing: a tls section needs cert_file and key_file");
  }
  if (tls.require_client_cert && tls.client_ca_file.empty()) {
    return errors.At(node, "tls.require_client_cert",
                     "needs tls.client_ca_file (the CA that issues client certificates)");
  }
  return absl::OkStatus();
}

absl::Status ParseOperator(const ConfigErrors& errors, const YAML::Node& node,
                           OperatorConfig& operator_api) {
  RETURN_IF_ERROR(ExpectMap(errors, node, "operator"));
  std::optional<YAML::Mark> listen_position;
  std::optional<YAML::Mark> metrics_position;
  for (const auto& entry : node) {
    std::string key = entry.first.Scalar();
    if (key == "listen") {
      ASSIGN_OR_RETURN(operator_api.listen, ReadString(errors, entry.second, "operator.listen"));
      listen_position = entry.second.Mark();
    } else if (key == "metrics_listen") {
      ASSIGN_OR_RETURN(operator_api.metrics_listen,
                       ReadString(errors, entry.second, "operator.metrics_listen"));
      metrics_position = entry.second.Mark();
    } else if (key == "allow_remote") {
      ASSIGN_OR_RETURN(operator_api.allow_remote,
                       ReadBool(errors, entry.second, "operator.allow_remote"));
    } else {
      return UnknownField(errors, entry.first, "operator");
    }
  }
  absl::Status valid = CheckOperatorAddress(operator_api.listen, operator_api.allow_remote);
  if (!valid.ok()) {
    return errors.AtPosition(listen_position.value_or(node.Mark()), "operator.listen",
                             valid.message());
  }
  if (metrics_position.has_value()) {
    absl::Status metrics_valid =
        absl::StartsWith(operator_api.metrics_listen, "unix:")
            ? absl::InvalidArgumentError(
                  "the metrics endpoint is HTTP on HOST:PORT, not a unix "
                  "socket")
            : CheckOperatorAddress(operator_api.metrics_listen, operator_api.allow_remote);
    if (!metrics_valid.ok()) {
      return errors.AtPosition(*metrics_position, "operator.metrics_listen",
                               metrics_valid.message());
    }
  }
  return absl::OkStatus();
}

absl::Status ParseDevice(const ConfigErrors& errors, const YAML::Node& item,
                         const std::string& where, DeviceConfig& device) {
  RETURN_IF_ERROR(ExpectMap(errors, item, where));
  bool has_name = false;
  YAML::Mark pcie_position = item.Mark();  // where pcie_mode and executor were written
  YAML::Mark executor_position = item.Mark();
  YAML::Mark run_threads_position = item.Mark();
  for (const auto& entry : item) {
    std::string key = entry.first.Scalar();
    std::string field = absl::StrCat(where, ".", key);
    const YAML::Node& value = entry.second;
    if (key == "name") {
      ASSIGN_OR_RETURN(device.name, ReadName(errors, value, field, 32));
      has_name = true;
    } else if (key == "gpu") {
      ASSIGN_OR_RETURN(device.gpu, ReadChoice(errors, value, field, {"sim", "nvidia-cc", "none"}));
    } else if (key == "executor") {
      ASSIGN_OR_RETURN(device.executor, ReadChoice(errors, value, field, {"auto", "cpu", "cuda"}));
      executor_position = value.Mark();
    } else if (key == "pcie_mode") {
      ASSIGN_OR_RETURN(device.pcie_mode,
                       ReadChoice(errors, value, field, {"driver", "emulated", "off"}));
      pcie_position = value.Mark();
    } else if (key == "run_threads") {
      ASSIGN_OR_RETURN(int64_t threads, ReadInteger(errors, value, field, 1, 64));
      device.run_threads = static_cast<int>(threads);
      run_threads_position = value.Mark();
    } else if (key == "pci_address") {
      ASSIGN_OR_RETURN(device.pci_address, ReadString(errors, value, field));
      // DDDD:BB:DD.F in hex.
      const std::string& address = device.pci_address;
      bool valid =
          address.size() == 12 && address[4] == ':' && address[7] == ':' && address[10] == '.';
      for (size_t i = 0; valid && i < address.size(); ++i) {
        if (i == 4 || i == 7 || i == 10) continue;
        valid = absl::ascii_isxdigit(static_cast<unsigned char>(address[i]));
      }
      if (!valid) {
        return errors.At(value, field,
                         absl::StrCat("'", address, "' is not a PCI address like 0000:c1:00.0"));
      }
    } else {
      return UnknownField(errors, entry.first, where);
    }
  }
  if (!has_name) return errors.At(item, where, "missing field 'name'");
  if (device.gpu == "nvidia-cc" && device.pcie_mode == "off") {
    return errors.AtPosition(pcie_position, where + ".pcie_mode",
                             "off (plaintext on the bus) cannot be used with gpu nvidia-cc");
  }
  if (device.executor == "cuda" && (device.gpu == "sim" || device.gpu == "none")) {
    return errors.AtPosition(executor_position, where + ".executor",
                             absl::StrCat("cuda needs a GPU; this device has gpu ", device.gpu));
  }
  if (device.executor == "cuda" && device.run_threads > 0) {
    return errors.AtPosition(run_threads_position, where + ".run_threads",
                             "applies to the CPU executor only; this device has executor cuda");
  }
  return absl::OkStatus();
}

absl::Status ParseDevices(const ConfigErrors& errors, const YAML::Node& node,
                          std::vector<DeviceConfig>& devices) {
  RETURN_IF_ERROR(ExpectList(errors, node, "devices"));
  if (node.size() == 0) return errors.At(node, "devices", "must list at least one device");
  if (node.size() > 64) return errors.At(node, "devices", "at most 64 devices");
  for (size_t i = 0; i < node.size(); ++i) {
    std::string where = absl::StrCat("devices[", i, "]");
    DeviceConfig device;
    RETURN_IF_ERROR(ParseDevice(errors, node[i], where, device));
    for (const DeviceConfig& other : devices) {
      if (other.name == device.name) {
        return errors.At(node[i], where + ".name",
                         absl::StrCat("device '", device.name, "' is listed twice"));
      }
      if (!device.pci_address.empty() && other.pci_address == device.pci_address) {
        return errors.At(node[i], where + ".pci_address",
                         absl::StrCat(device.pci_address, " is already device '", other.name, "'"));
      }
    }
    devices.push_back(std::move(device));
  }
  return absl::OkStatus();
}

absl::Status ParseApiLimits(const ConfigErrors& errors, const YAML::Node& node, ApiLimits& limits) {
  RETURN_IF_ERROR(ExpectMap(errors, node, "limits"));
  for (const auto& entry : node) {
    std::string key = entry.first.Scalar();
    std::string field = "limits." + key;
    if (key == "max_model_bytes") {
      ASSIGN_OR_RETURN(limits.max_model_size, ReadSize(errors, entry.second, field));
    } else if (key == "max_sealed_message_bytes") {
      ASSIGN_OR_RETURN(limits.max_sealed_message_size, ReadSize(errors, entry.second, field));
      if (limits.max_sealed_message_size > (uint64_t{1} << 30)) {
        return errors.At(entry.second, field, "must be at most 1GiB (one gRPC message)");
      }
    } else if (key == "session_ttl_seconds") {
      ASSIGN_OR_RETURN(double seconds, ReadNumber(errors, entry.second, field, 60, 86400));
      limits.session_ttl = absl::Milliseconds(static_cast<int64_t>(seconds * 1000));
    } else if (key == "max_sessions_per_tenant") {
      ASSIGN_OR_RETURN(int64_t count, ReadInteger(errors, entry.second, field, 1, 1000000));
      limits.max_sessions_per_tenant = static_cast<int>(count);
    } else if (key == "upload_idle_timeout_seconds") {
      ASSIGN_OR_RETURN(double seconds, ReadNumber(errors, entry.second, field, 1, 3600));
      limits.upload_idle_timeout = absl::Milliseconds(static_cast<int64_t>(seconds * 1000));
    } else if (key == "upload_timeout_seconds") {
      ASSIGN_OR_RETURN(double seconds, ReadNumber(errors, entry.second, field, 1, 86400));
      limits.upload_timeout = absl::Milliseconds(static_cast<int64_t>(seconds * 1000));
    } else {
      return UnknownField(errors, entry.first, "limits");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAttestationPolicies(const ConfigErrors& errors, const YAML::Node& node,
                                      std::vector<AttestationPolicyConfig>& policies,
                                      std::vector<Mark>& file_marks) {
  RETURN_IF_ERROR(ExpectList(errors, node, "attestation_policies"));
  for (size_t i = 0; i < node.size(); ++i) {
    std::string where = absl::StrCat("attestation_policies[", i, "]");
    const YAML::Node& item = node[i];
    RETURN_IF_ERROR(ExpectMap(errors, item, where));
    AttestationPolicyConfig policy;
    std::optional<YAML::Mark> file_position;
    for (const auto& entry : item) {
      std::string key = entry.first.Scalar();
      if (key == "name") {
        ASSIGN_OR_RETURN(policy.name, ReadName(errors, entry.second, where + ".name", 64));
      } else if (key == "file") {
        ASSIGN_OR_RETURN(std::string path, ReadString(errors, entry.second, where + ".file"));
        policy.file = errors.Resolve(path);
        file_position = entry.second.Mark();
      } else {
        return UnknownField(errors, entry.first, where);
      }
    }
    if (policy.name.empty()) return errors.At(item, where, "missing field 'name'");
    if (policy.file.empty()) return errors.At(item, where, "missing field 'file'");
    for (const AttestationPolicyConfig& other : policies) {
      if (other.name == policy.name) {
        return errors.At(item, where + ".name",
                         absl::StrCat("policy '", policy.name, "' is listed twice"));
      }
    }
    file_marks.push_back(Mark{*file_position, where + ".file"});
    policies.push_back(std::move(policy));
  }
  return absl::OkStatus();
}

// The GPU evidence a worker reports when its gpu is left to the default.
std::string EffectiveGpu(absl::string_view tee, absl::string_view gpu) {
  if (!gpu.empty()) return std::string(gpu);
  return tee == "sim" ? "sim" : "none";
}

// Reads a file named by the config, with the error at the field that names it.
absl::StatusOr<std::string> ReadNamedFile(const ConfigErrors& errors, const Mark& mark,
                                          const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, 1 << 20);
  if (!text.ok()) return errors.AtPosition(mark.position, mark.field, text.status().message());
  return text;
}

absl::Status CheckPemAt(const ConfigErrors& errors, const Mark& mark, const std::string& path,
                        absl::string_view kind) {
  absl::Status status = CheckPemFile(path, kind);
  if (!status.ok()) return errors.AtPosition(mark.position, mark.field, status.message());
  return absl::OkStatus();
}

// The files the config names: TLS material and attestation policies (whose tee and gpu must
// match every worker's). Each problem is one collected error.
void CheckNamedFiles(ConfigErrors& errors, const DaemonConfig& config,
                     const std::vector<Mark>& tls_marks, const std::vector<Mark>& policy_marks) {
  if (config.tls.enabled()) {
    // tls_marks: cert_file, key_file, client_ca_file (when set), in that order.
    errors.Collect(CheckPemAt(errors, tls_marks[0], config.tls.cert_file, "CERTIFICATE"));
    errors.Collect(CheckPemAt(errors, tls_marks[1], config.tls.key_file, "PRIVATE KEY"));
    struct stat key_stat;
    if (::stat(config.tls.key_file.c_str(), &key_stat) == 0 && (key_stat.st_mode & 007) != 0) {
      errors.Collect(errors.AtPosition(
          tls_marks[1].position, tls_marks[1].field,
          absl::StrCat(config.tls.key_file, " is readable by every user; chmod o-rwx it")));
    }
    if (!config.tls.client_ca_file.empty()) {
      errors.Collect(CheckPemAt(errors, tls_marks[2], config.tls.client_ca_file, "CERTIFICATE"));
    }
  }
  std::set<std::string> worker_gpus;
  for (const DeviceConfig& device : config.Workers()) {
    worker_gpus.insert(EffectiveGpu(config.tee, device.gpu));
  }
  for (size_t i = 0; i < config.attestation_policies.size(); ++i) {
    const AttestationPolicyConfig& policy = config.attestation_policies[i];
    const Mark& mark = policy_marks[i];
    absl::StatusOr<std::string> text = ReadNamedFile(errors, mark, policy.file);
    if (!text.ok()) {
      errors.Collect(text.status());
      continue;
    }
    YAML::Node root;
    try {
      root = YAML::Load(*text);
    } catch (const YAML::Exception& e) {
      errors.Collect(errors.AtPosition(
          mark.position, mark.field,
          absl::StrCat(policy.file, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg)));
      continue;
    }
    if (!root.IsMap()) {
      errors.Collect(
          errors.AtPosition(mark.position, mark.field,
                            absl::StrCat(policy.file, " is not an attestation policy (a map)")));
      continue;
    }
    const YAML::Node& policy_root = root;  // const: reading must not add keys
    for (absl::string_view key : {"tee", "gpu"}) {
      const YAML::Node value = policy_root[std::string(key)];
      if (!value.IsDefined() || !value.IsScalar()) continue;
      bool matches = key == "tee" ? value.Scalar() == config.tee
                                  : worker_gpus.size() == 1 && worker_gpus.contains(value.Scalar());
      if (!matches) {
        errors.Collect(errors.AtPosition(
            mark.position, mark.field,
            absl::StrCat(policy.file, " is for ", key, " ", value.Scalar(), " but this daemon's ",
                         key == "tee" ? absl::StrCat("tee is ", config.tee)
                                      : absl::StrCat("workers report gpu ",
                                                     absl::StrJoin(worker_gpus, "/")))));
      }
    }
  }
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

absl::StatusOr<DaemonConfig> ParseDaemonConfig(absl::string_view yaml_text,
                                               absl::string_view file_name,
                                               FileChecks file_checks) {
  ConfigErrors errors(file_name);
  DaemonConfig config;
  config.source_file = std::string(file_name);
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
  YAML::Mark evidence_position = root.Mark();  // the later of tee and gpu, for the pair
  std::string evidence_key = "tee";
  bool evidence_words_ok = true;
  bool evidence_word_refused = false;
  std::string scheduler_key;  // which of scheduler and batching was given, if any
  std::optional<YAML::Node> tenants_node;
  std::optional<YAML::Mark> workers_position;
  std::vector<YAML::Mark> device_positions;  // of each entry of devices
  std::optional<Mark> default_policy_mark;
  std::vector<Mark> tls_marks;
  std::vector<Mark> policy_marks;
  try {
    // Each top-level field on its own: a mistake in one is collected and the others still get
    // checked, so one run of --check-config names every broken section.
    for (const auto& entry : root) {
      if (!entry.first.IsScalar()) {
        errors.Collect(errors.At(entry.first, "(key)", "expected a field name"));
        continue;
      }
      std::string key = entry.first.Scalar();
      const YAML::Node& value = entry.second;
      auto parse_field = [&]() -> absl::Status {
        if (key == "listen") {
          ASSIGN_OR_RETURN(config.listen, ReadString(errors, value, "listen"));
          absl::Status valid = CheckListenAddress(config.listen);
          if (!valid.ok()) return errors.At(value, "listen", valid.message());
        } else if (key == "data_dir") {
          // data_dir and enclave_binary stay relative to the working directory, as on the
          // command line; only the files the config itself reads follow the config's folder.
          ASSIGN_OR_RETURN(config.data_dir, ReadString(errors, value, "data_dir"));
        } else if (key == "enclave_binary") {
          ASSIGN_OR_RETURN(config.enclave_binary, ReadString(errors, value, "enclave_binary"));
        } else if (key == "tee" || key == "gpu") {
          std::string& field = key == "tee" ? config.tee : config.gpu;
          // Each word on its own first; the pair is checked once both are known (and only when
          // neither word was refused, which would name the same mistake twice).
          evidence_words_ok = false;
          ASSIGN_OR_RETURN(field, ReadString(errors, value, key));
          absl::Status valid = key == "tee" ? CheckTeeWord(field) : CheckGpuWord(field);
          if (!valid.ok()) return errors.At(value, key, valid.message());
          evidence_words_ok = !evidence_word_refused;
          evidence_position = value.Mark();
          evidence_key = key;
        } else if (key == "workers") {
          ASSIGN_OR_RETURN(int64_t workers, ReadInteger(errors, value, "workers", 1, 64));
          config.workers = static_cast<int>(workers);
          workers_position = value.Mark();
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
        } else if (key == "tls") {
          RETURN_IF_ERROR(ParseTls(errors, value, config.tls));
          for (absl::string_view name : {"cert_file", "key_file", "client_ca_file"}) {
            const YAML::Node field = value[std::string(name)];
            tls_marks.push_back(
                Mark{field.IsDefined() ? field.Mark() : value.Mark(), absl::StrCat("tls.", name)});
          }
        } else if (key == "operator") {
          RETURN_IF_ERROR(ParseOperator(errors, value, config.operator_api));
        } else if (key == "devices") {
          RETURN_IF_ERROR(ParseDevices(errors, value, config.devices));
          for (size_t i = 0; i < value.size(); ++i) device_positions.push_back(value[i].Mark());
        } else if (key == "limits") {
          RETURN_IF_ERROR(ParseApiLimits(errors, value, config.limits));
        } else if (key == "attestation_policies") {
          RETURN_IF_ERROR(
              ParseAttestationPolicies(errors, value, config.attestation_policies, policy_marks));
        } else if (key == "attestation_policy") {
          ASSIGN_OR_RETURN(config.attestation_policy,
                           ReadName(errors, value, "attestation_policy", 64));
          default_policy_mark = Mark{value.Mark(), "attestation_policy"};
        } else {
          return errors.AtLine(entry.first.Mark().line, absl::StrCat("unknown field '", key, "'"));
        }
        return absl::OkStatus();
      };
      absl::Status field_status = parse_field();
      if (!field_status.ok() && (key == "tee" || key == "gpu")) evidence_word_refused = true;
      errors.Collect(field_status);
    }
    // References between sections, now that all of them are read.
    if (default_policy_mark.has_value()) {
      bool known = false;
      for (const AttestationPolicyConfig& policy : config.attestation_policies) {
        known = known || policy.name == config.attestation_policy;
      }
      if (!known) {
        errors.Collect(errors.AtPosition(
            default_policy_mark->position, default_policy_mark->field,
            absl::StrCat("no attestation policy named '", config.attestation_policy,
                         "' in attestation_policies")));
      }
    }
    if (tenants_node.has_value()) ParseTenants(errors, *tenants_node, config);
  } catch (const YAML::Exception& e) {
    errors.Collect(errors.AtLine(e.mark.line, e.msg));
  }
  if (absl::Status valid = CheckEvidenceSources(config.tee, config.gpu);
      !valid.ok() && evidence_words_ok) {
    errors.Collect(errors.AtPosition(evidence_position, evidence_key, valid.message()));
  }
  if (!config.devices.empty()) {
    if (workers_position.has_value() && config.workers != static_cast<int>(config.devices.size())) {
      errors.Collect(
          errors.AtPosition(*workers_position, "workers",
                            absl::StrCat(config.workers, " workers but ", config.devices.size(),
                                         " devices: drop workers, devices decide")));
    }
    config.workers = static_cast<int>(config.devices.size());
    for (size_t i = 0; i < config.devices.size(); ++i) {
      const DeviceConfig& device = config.devices[i];
      if (device.gpu.empty()) continue;
      if (absl::Status valid = CheckEvidenceSources(config.tee, device.gpu); !valid.ok()) {
        errors.Collect(errors.AtPosition(device_positions[i], absl::StrCat("devices[", i, "].gpu"),
                                         valid.message()));
      }
    }
  }
  if (errors.empty() && file_checks == FileChecks::kRead) {
    CheckNamedFiles(errors, config, tls_marks, policy_marks);
  }
  if (!errors.empty()) return errors.Collected();
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

std::vector<DeviceConfig> DaemonConfig::Workers() const {
  if (!devices.empty()) {
    std::vector<DeviceConfig> workers_out = devices;
    for (DeviceConfig& device : workers_out) {
      if (device.gpu.empty()) device.gpu = gpu;
    }
    return workers_out;
  }
  std::vector<DeviceConfig> workers_out(workers);
  for (int index = 0; index < workers; ++index) {
    workers_out[index].name = absl::StrCat("worker", index);
    workers_out[index].gpu = gpu;
  }
  return workers_out;
}

std::string DescribeDaemonConfig(const DaemonConfig& config) {
  return absl::StrCat(
      config.tenants.empty()
          ? std::string("development tenant")
          : absl::StrCat(config.tenants.size(), " tenant", config.tenants.size() == 1 ? "" : "s"),
      ", ", config.Workers().size(), " worker", config.Workers().size() == 1 ? "" : "s", ", tee ",
      config.tee, ", listen ", config.listen,
      config.tls.enabled()
          ? (config.tls.client_ca_file.empty()
                 ? " with TLS"
                 : (config.tls.require_client_cert ? " with mutual TLS (required)"
                                                   : " with TLS, client certificates optional"))
          : " plaintext",
      ", operator ", config.operator_api.listen, ", ", config.attestation_policies.size(),
      " attestation polic", config.attestation_policies.size() == 1 ? "y" : "ies");
}

std::vector<TenantCredential> DaemonConfig::Credentials() const {
  std::vector<TenantCredential> credentials;
  for (const TenantConfig& tenant : tenants) {
    credentials.push_back({tenant.tenant_id, tenant.token_sha256});
  }
  return credentials;
}

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path, FileChecks file_checks) {
  absl::StatusOr<std::string> text = ReadFile(path, 1 << 20);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read config: ", text.status().message()));
  }
  return ParseDaemonConfig(*text, path, file_checks);
}

absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv) {
  CommandLine command_line;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      command_line.help = true;
      continue;
    }
    if (arg == "--skip-file-checks") {
      command_line.skip_file_checks = true;
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
    } else if (name == "--check-config") {
      target = &command_line.check_config;
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
