#include "attest/policy.h"

#include "attest/snp/snp_verifier.h"
#include "attest/tdx/tdx_verifier.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "attest/sim/sim_tee.h"
#include "attest/spdm.h"
#include "attest/string_view.h"
#include "attest/x509.h"
#include "base/file.h"
#include "base/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "proto/yaml_message.h"

namespace cloister::attest {
namespace {

namespace pb = ::google::protobuf;

constexpr uint64_t kMaxPolicyFileSize = 1 << 20;

using ::cloister::proto::EnumYamlName;
using ::cloister::proto::YamlMessageReader;

// Checks that the schema cannot express, with errors at the line of the field they name;
// normalizes hex and version spellings.
class PolicyChecker {
 public:
  explicit PolicyChecker(const YamlMessageReader& reader) : reader_(reader) {}

  absl::Status Check(Policy& policy) const {
    if (policy.name().empty()) return Error("name", "missing (every policy needs a name)");
    if (policy.tee() == v1::TEE_TYPE_UNSPECIFIED) {
      return Error("tee", "missing (one of sim, sev-snp, tdx)");
    }
    if (policy.gpu() == v1::GPU_TYPE_UNSPECIFIED) {
      return Error("gpu", "missing (one of none, sim, nvidia-cc)");
    }
    const bool sim_tee = policy.tee() == v1::TEE_TYPE_SIM;
    const bool sim_gpu = policy.gpu() == v1::GPU_TYPE_SIM;
    if (sim_gpu && !sim_tee) {
      return Error("gpu", "a simulated GPU is only accepted together with tee: sim");
    }
    if (sim_tee && policy.gpu() == v1::GPU_TYPE_NVIDIA_CC) {
      return Error("gpu", "a simulated CVM cannot vouch for a real GPU; use gpu: sim or none");
    }
    if (policy.has_snp()) {
      absl::Status st = ValidateSnpPolicy(policy.snp());
      if (!st.ok()) return Error("snp", std::string(st.message()));
    }
    if (policy.has_tdx()) {
      absl::Status st = ValidateTdxPolicy(policy.tdx());
      if (!st.ok()) return Error("tdx", std::string(st.message()));
    }

    if (policy.enclave_measurements().empty()) {
      return Error("enclave_measurements", "missing (list at least one accepted measurement)");
    }
    std::set<std::string> measurements;
    for (int i = 0; i < policy.enclave_measurements_size(); ++i) {
      std::string path = absl::StrCat("enclave_measurements[", i, "]");
      std::string hex = absl::AsciiStrToLower(policy.enclave_measurements(i));
      auto bytes = HexDecode(hex);
      if (!bytes.ok() || bytes->size() != kMeasurementSize) {
        return Error(path, absl::StrCat("expected ", 2 * kMeasurementSize,
                                        " hex digits (a SHA-384 measurement), got '",
                                        policy.enclave_measurements(i), "'"));
      }
      if (!measurements.insert(hex).second) return Error(path, "listed twice");
      policy.set_enclave_measurements(i, hex);
    }
    std::set<std::string> pinned;
    for (int i = 0; i < policy.published_models_size(); ++i) {
      std::string path = absl::StrCat("published_models[", i, "]");
      v1::PublishedModelPin* pin = policy.mutable_published_models(i);
      if (pin->name().empty()) return Error(path + ".name", "missing");
      if (!pinned.insert(pin->name()).second) return Error(path + ".name", "listed twice");
      std::string hex = absl::AsciiStrToLower(pin->digest());
      auto bytes = HexDecode(hex);
      if (!bytes.ok() || bytes->size() != 32) {
        return Error(path + ".digest", absl::StrCat("expected 64 hex digits (a SHA-256), got '",
                                                    pin->digest(), "'"));
      }
      pin->set_digest(hex);
    }
    if (policy.max_evidence_age_seconds() < 0) {
      return Error("max_evidence_age_seconds", "must not be negative (0 means no limit)");
    }

    if (policy.has_gpu_versions()) {
      if (policy.gpu() == v1::GPU_TYPE_NONE) {
        return Error("gpu_versions", "GPU versions are only allowed when a GPU is expected");
      }
      auto* versions = policy.mutable_gpu_versions();
      for (int i = 0; i < versions->driver_versions_size(); ++i) {
        const std::string& v = versions->driver_versions(i);
        bool ok = !v.empty() && absl::ascii_isdigit(v.front()) && absl::ascii_isdigit(v.back());
        for (char c : v) ok = ok && (absl::ascii_isdigit(c) || c == '.');
        if (!ok) {
          return Error(absl::StrCat("gpu_versions.driver_versions[", i, "]"),
                       absl::StrCat("'", v, "' is not a driver version like 550.90.07"));
        }
      }
      for (int i = 0; i < versions->vbios_versions_size(); ++i) {
        const std::string& v = versions->vbios_versions(i);
        if (!EncodeVbiosVersion(v).ok()) {
          return Error(absl::StrCat("gpu_versions.vbios_versions[", i, "]"),
                       absl::StrCat("'", v, "' is not a VBIOS version like 96.00.9F.00.01"));
        }
        versions->set_vbios_versions(i, absl::AsciiStrToUpper(v));
      }
    }
    if (policy.has_nvidia()) {
      if (policy.gpu() != v1::GPU_TYPE_NVIDIA_CC) {
        return Error("nvidia", "NVIDIA settings are only allowed when gpu is nvidia-cc");
      }
      for (const auto& [path, pem] :
           {std::pair<std::string, std::string>{"nvidia.device_root_pem",
                                                policy.nvidia().device_root_pem()},
            {"nvidia.corim_root_pem", policy.nvidia().corim_root_pem()}}) {
        if (!pem.empty()) RETURN_IF_ERROR(CheckRoot(path, pem));
      }
    }
    if (policy.has_sim() && !sim_tee && !sim_gpu) {
      return Error("sim", "simulated roots are only allowed when tee or gpu is sim");
    }
    if (sim_tee) RETURN_IF_ERROR(CheckRoot("sim.cvm_root_pem", policy.sim().cvm_root_pem()));
    if (sim_gpu) RETURN_IF_ERROR(CheckRoot("sim.gpu_root_pem", policy.sim().gpu_root_pem()));
    if (!sim_gpu && !policy.sim().gpu_root_pem().empty()) {
      return Error("sim.gpu_root_pem", "set, but gpu is not sim");
    }

    return absl::OkStatus();
  }

 private:
  absl::Status CheckRoot(const std::string& path, const std::string& pem) const {
    if (pem.empty()) return Error(path, "missing (PEM of the simulated root certificate)");
    auto cert = Certificate::FromPem(pem);
    if (!cert.ok()) return Error(path, cert.status().message());
    if (!cert->IsCa()) return Error(path, "the certificate is not a CA certificate");
    return absl::OkStatus();
  }

  absl::Status Error(const std::string& path, absl::string_view message) const {
    return reader_.Error(path, message);
  }

  const YamlMessageReader& reader_;
};

void EmitMessage(YAML::Emitter& out, const pb::Message& message) {
  const pb::Descriptor* descriptor = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  out << YAML::BeginMap;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const pb::FieldDescriptor* field = descriptor->field(i);
    if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE && field->is_repeated()) {
      const int count = reflection->FieldSize(message, field);
      if (count == 0) continue;
      out << YAML::Key << field->name() << YAML::Value << YAML::BeginSeq;
      for (int j = 0; j < count; ++j) {
        EmitMessage(out, reflection->GetRepeatedMessage(message, field, j));
      }
      out << YAML::EndSeq;
      continue;
    }
    if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      if (!reflection->HasField(message, field)) continue;
      out << YAML::Key << field->name() << YAML::Value;
      EmitMessage(out, reflection->GetMessage(message, field));
      continue;
    }
    out << YAML::Key << field->name() << YAML::Value;
    auto emit_string = [&](const std::string& s) {
      if (absl::StrContains(s, '\n')) {
        out << YAML::Literal << s;
      } else {
        out << YAML::DoubleQuoted << s;
      }
    };
    if (field->is_repeated()) {
      int count = reflection->FieldSize(message, field);
      if (count == 0) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        continue;
      }
      out << YAML::BeginSeq;
      for (int j = 0; j < count; ++j) {
        switch (field->cpp_type()) {
          case pb::FieldDescriptor::CPPTYPE_STRING:
            emit_string(reflection->GetRepeatedString(message, field, j));
            break;
          case pb::FieldDescriptor::CPPTYPE_ENUM:
            out << EnumYamlName(*reflection->GetRepeatedEnum(message, field, j));
            break;
          default:
            CLOISTER_CHECK(false && "policy schema has an unsupported repeated field type");
        }
      }
      out << YAML::EndSeq;
      continue;
    }
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING:
        emit_string(reflection->GetString(message, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        out << (reflection->GetBool(message, field) ? "true" : "false");
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        out << reflection->GetInt64(message, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT32:
        out << reflection->GetInt32(message, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        out << reflection->GetUInt64(message, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        out << reflection->GetUInt32(message, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumValueDescriptor* value = reflection->GetEnum(message, field);
        out << (value->number() == 0 ? std::string("unspecified") : EnumYamlName(*value));
        break;
      }
      default:
        CLOISTER_CHECK(false && "policy schema has an unsupported field type");
    }
  }
  out << YAML::EndMap;
}

// How many YAML documents `text` holds, from its `---` markers and content lines. YAML::LoadAll
// would say, but yaml-cpp 0.7's LoadAll never returns on some inputs (`!r,`: it keeps making
// empty documents until memory runs out), so only the first document is parsed, with Load.
int CountYamlDocuments(std::string_view text) {
  int documents = 0;
  bool in_document = false;
  for (absl::string_view line : absl::StrSplit(Sv(text), '\n')) {
    const bool marker = line == "---" || line == "---\r" || absl::StartsWith(line, "--- ") ||
                        absl::StartsWith(line, "---\t");
    const absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    const bool content = !trimmed.empty() && trimmed[0] != '#';
    if (marker) {
      ++documents;
      in_document = true;
    } else if (content && !in_document) {
      ++documents;
      in_document = true;
    }
  }
  return documents;
}

}  // namespace

absl::StatusOr<Policy> ParsePolicyYaml(std::string_view text, std::string_view source_text) {
  absl::string_view source_name = Sv(source_text);
  const int document_count = CountYamlDocuments(text);
  if (document_count != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": expected exactly one YAML document, found ", document_count));
  }
  std::vector<YAML::Node> documents;
  try {
    documents.push_back(YAML::Load(std::string(text)));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
  Policy policy;
  try {
    const YAML::Node& root = documents[0];
    YamlMessageReader reader(source_name);
    if (!root.IsMap()) {
      return reader.ErrorAt(
          root.Mark(), "",
          absl::StrCat("the policy must be a mapping of fields, not ", reader.Describe(root)));
    }
    RETURN_IF_ERROR(reader.ReadMessage(root, policy));
    RETURN_IF_ERROR(PolicyChecker(reader).Check(policy));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", e.mark.line + 1, ": ", e.msg));
  }
  return policy;
}

absl::StatusOr<Policy> LoadPolicyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxPolicyFileSize));
  ASSIGN_OR_RETURN(Policy policy, ParsePolicyYaml(text, path));
  // Directories named in the policy are relative to the policy file.
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  auto resolve = [&](const std::string& dir) {
    if (dir.empty() || std::filesystem::path(dir).is_absolute()) return dir;
    return (base / dir).lexically_normal().string();
  };
  if (policy.has_nvidia()) {
    v1::NvidiaGpuPolicy* nvidia = policy.mutable_nvidia();
    nvidia->set_rim_dir(resolve(nvidia->rim_dir()));
    nvidia->set_ocsp_dir(resolve(nvidia->ocsp_dir()));
  }
  return policy;
}

std::string PolicyToYaml(const Policy& policy) {
  YAML::Emitter out;
  EmitMessage(out, policy);
  return std::string(out.c_str()) + "\n";
}

absl::StatusOr<Policy> MakeDevPolicy(const std::string& sim_dir, ByteSpan measurement) {
  if (measurement.size() != kMeasurementSize) {
    return absl::InvalidArgumentError(absl::StrCat("enclave measurement is ", measurement.size(),
                                                   " bytes, expected ", kMeasurementSize));
  }
  ASSIGN_OR_RETURN(SimRootCertificates roots, LoadSimRootCertificates(sim_dir));
  Policy policy;
  policy.set_name("development");
  policy.set_tee(v1::TEE_TYPE_SIM);
  policy.set_gpu(v1::GPU_TYPE_SIM);
  policy.add_enclave_measurements(HexEncode(measurement));
  policy.set_allow_debug(false);
  policy.set_max_evidence_age_seconds(kDevPolicyMaxEvidenceAgeSeconds);
  policy.set_require_fresh_evidence(false);
  policy.mutable_sim()->set_cvm_root_pem(roots.cvm_root.ToPem());
  policy.mutable_sim()->set_gpu_root_pem(roots.gpu_root.ToPem());
  return policy;
}

absl::Status WriteDevPolicy(const std::string& path, const std::string& sim_dir,
                            ByteSpan measurement) {
  ASSIGN_OR_RETURN(Policy policy, MakeDevPolicy(sim_dir, measurement));
  std::string text = absl::StrCat(
      "# Cloister development attestation policy.\n"
      "# Trusts only the simulated TEE roots in ",
      sim_dir, "\n",
      "# and exactly one enclave measurement. Never use it for real tenants' data.\n",
      PolicyToYaml(policy));
  return WriteFileAtomic(path, text, 0644);
}

absl::StatusOr<std::vector<Bytes>> DecodeHexAllowList(
    const google::protobuf::RepeatedPtrField<std::string>& list, size_t size,
    std::string_view field) {
  std::vector<Bytes> out;
  for (int i = 0; i < list.size(); ++i) {
    auto bytes = HexDecode(list.Get(i));
    if (!bytes.ok() || bytes->size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("policy field '", std::string(field), "[", i,
                                                     "]': expected ", 2 * size,
                                                     " hex digits, got '", list.Get(i), "'"));
    }
    out.push_back(*std::move(bytes));
  }
  return out;
}

bool AllowListContains(const std::vector<Bytes>& list, ByteSpan value) {
  for (const Bytes& item : list) {
    if (ConstantTimeEquals(item, value)) return true;
  }
  return false;
}

}  // namespace cloister::attest
