#include "attest/policy.h"

#include "attest/snp/snp_verifier.h"
#include "attest/tdx/tdx_verifier.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "attest/sim/sim_tee.h"
#include "attest/spdm.h"
#include "attest/string_view.h"
#include "attest/x509.h"
#include "base/file.h"
#include "base/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace cloister::attest {
namespace {

namespace pb = ::google::protobuf;

constexpr uint64_t kMaxPolicyFileSize = 1 << 20;

// Enum values are written in YAML without the enum's prefix, in lower case with dashes:
// TEE_TYPE_SEV_SNP -> "sev-snp".
std::string EnumPrefix(const pb::EnumDescriptor* type) {
  std::string prefix;
  for (char c : type->name()) {
    if (absl::ascii_isupper(c) && !prefix.empty()) prefix.push_back('_');
    prefix.push_back(absl::ascii_toupper(c));
  }
  return prefix + "_";
}

std::string EnumYamlName(const pb::EnumValueDescriptor* value) {
  std::string name = value->name();
  std::string prefix = EnumPrefix(value->type());
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return absl::StrReplaceAll(absl::AsciiStrToLower(name), {{"_", "-"}});
}

std::string NodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Scalar:
      return node.Tag() == "?" ? absl::StrCat("'", node.Scalar(), "'")
                               : absl::StrCat("the string '", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

// Maps a YAML tree onto a protobuf message by reflection, remembering where each field was
// written so that later checks can point at the line.
class YamlPolicyReader {
 public:
  explicit YamlPolicyReader(absl::string_view source) : source_(source) {}

  absl::Status Read(const YAML::Node& root, Policy& policy) {
    root_mark_ = root.Mark();
    if (!root.IsMap()) {
      return ErrorAt(root.Mark(), "",
                     absl::StrCat("the policy must be a mapping of fields, not ", NodeKind(root)));
    }
    RETURN_IF_ERROR(ReadMessage(root, policy, ""));
    return CheckSemantics(policy);
  }

 private:
  absl::Status ErrorAt(const YAML::Mark& mark, absl::string_view path, absl::string_view message) {
    int line = mark.is_null() ? 1 : mark.line + 1;
    if (path.empty())
      return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", message));
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", line, ": field '", path, "': ", message));
  }
  // The mark of a field that was written, or of the closest enclosing mapping.
  YAML::Mark MarkOf(const std::string& path) const {
    std::string probe = path;
    while (true) {
      auto it = marks_.find(probe);
      if (it != marks_.end()) return it->second;
      size_t dot = probe.find_last_of(".[");
      if (dot == std::string::npos) return root_mark_;
      probe = probe.substr(0, dot);
    }
  }
  absl::Status Error(const std::string& path, absl::string_view message) {
    return ErrorAt(MarkOf(path), path, message);
  }

  absl::Status ReadMessage(const YAML::Node& map, pb::Message& message, const std::string& prefix) {
    const pb::Descriptor* descriptor = message.GetDescriptor();
    std::map<std::string, int> seen_lines;
    for (const auto& entry : map) {
      // Copies: yaml-cpp's iterator hands out temporaries (nodes are shared handles).
      const YAML::Node key = entry.first;
      const YAML::Node value = entry.second;
      if (!key.IsScalar()) {
        return ErrorAt(key.Mark(), prefix, "field names must be plain words");
      }
      const std::string& name = key.Scalar();
      std::string path = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
      auto [seen, inserted] = seen_lines.emplace(name, key.Mark().line + 1);
      if (!inserted) {
        return ErrorAt(key.Mark(), path,
                       absl::StrCat("appears twice (first on line ", seen->second, ")"));
      }
      const pb::FieldDescriptor* field = descriptor->FindFieldByName(name);
      if (field == nullptr) {
        std::vector<std::string> known;
        for (int i = 0; i < descriptor->field_count(); ++i)
          known.push_back(descriptor->field(i)->name());
        return ErrorAt(
            key.Mark(), path,
            absl::StrCat("unknown field; expected one of: ", absl::StrJoin(known, ", ")));
      }
      marks_[path] = key.Mark();
      RETURN_IF_ERROR(ReadField(key.Mark(), value, message, field, path));
    }
    return absl::OkStatus();
  }

  absl::Status ReadField(const YAML::Mark& key_mark, const YAML::Node& value, pb::Message& message,
                         const pb::FieldDescriptor* field, const std::string& path) {
    const pb::Reflection* reflection = message.GetReflection();
    if (field->is_repeated()) {
      if (!value.IsSequence()) {
        return ErrorAt(key_mark, path, absl::StrCat("expected a list, got ", NodeKind(value)));
      }
      for (size_t i = 0; i < value.size(); ++i) {
        const YAML::Node element = value[i];
        std::string element_path = absl::StrCat(path, "[", i, "]");
        YAML::Mark mark = element.Mark().is_null() ? key_mark : element.Mark();
        marks_[element_path] = mark;
        RETURN_IF_ERROR(ReadScalarInto(mark, element, message, field, element_path, true));
      }
      return absl::OkStatus();
    }
    if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      if (!value.IsMap()) {
        return ErrorAt(key_mark, path, absl::StrCat("expected a mapping, got ", NodeKind(value)));
      }
      return ReadMessage(value, *reflection->MutableMessage(&message, field), path);
    }
    return ReadScalarInto(key_mark, value, message, field, path, false);
  }

  absl::Status ReadScalarInto(const YAML::Mark& mark, const YAML::Node& value, pb::Message& message,
                              const pb::FieldDescriptor* field, const std::string& path,
                              bool repeated) {
    const pb::Reflection* reflection = message.GetReflection();
    const bool plain = value.IsScalar() && value.Tag() == "?";
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING: {
        if (field->type() != pb::FieldDescriptor::TYPE_STRING || !value.IsScalar()) {
          return ErrorAt(mark, path, absl::StrCat("expected text, got ", NodeKind(value)));
        }
        if (repeated) {
          reflection->AddString(&message, field, value.Scalar());
        } else {
          reflection->SetString(&message, field, value.Scalar());
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        static const std::set<std::string> kTrue = {"true", "True", "TRUE"};
        static const std::set<std::string> kFalse = {"false", "False", "FALSE"};
        if (!plain || (!kTrue.count(value.Scalar()) && !kFalse.count(value.Scalar()))) {
          return ErrorAt(mark, path, absl::StrCat("expected true or false, got ", NodeKind(value)));
        }
        bool b = kTrue.count(value.Scalar()) > 0;
        if (repeated) {
          reflection->AddBool(&message, field, b);
        } else {
          reflection->SetBool(&message, field, b);
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_INT64:
      case pb::FieldDescriptor::CPPTYPE_INT32:
      case pb::FieldDescriptor::CPPTYPE_UINT64:
      case pb::FieldDescriptor::CPPTYPE_UINT32: {
        int64_t number = 0;
        if (!plain || !absl::SimpleAtoi(value.Scalar(), &number)) {
          return ErrorAt(mark, path,
                         absl::StrCat("expected a whole number, got ", NodeKind(value)));
        }
        return SetInteger(mark, message, field, path, number, repeated);
      }
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumDescriptor* type = field->enum_type();
        std::vector<std::string> names;
        for (int i = 0; i < type->value_count(); ++i) {
          const pb::EnumValueDescriptor* candidate = type->value(i);
          if (candidate->number() == 0) continue;  // "unspecified" is not a choice
          names.push_back(EnumYamlName(candidate));
          if (value.IsScalar() && names.back() == value.Scalar()) {
            if (repeated) {
              reflection->AddEnum(&message, field, candidate);
            } else {
              reflection->SetEnum(&message, field, candidate);
            }
            return absl::OkStatus();
          }
        }
        return ErrorAt(mark, path,
                       absl::StrCat("expected one of ", absl::StrJoin(names, ", "), "; got ",
                                    NodeKind(value)));
      }
      default:
        return ErrorAt(mark, path, "this field type cannot be written in YAML");
    }
  }

  absl::Status SetInteger(const YAML::Mark& mark, pb::Message& message,
                          const pb::FieldDescriptor* field, const std::string& path, int64_t number,
                          bool repeated) {
    const pb::Reflection* reflection = message.GetReflection();
    auto out_of_range = [&] {
      return ErrorAt(mark, path, absl::StrCat(number, " is out of range"));
    };
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT64:
        repeated ? reflection->AddInt64(&message, field, number)
                 : reflection->SetInt64(&message, field, number);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT32:
        if (number < INT32_MIN || number > INT32_MAX) return out_of_range();
        repeated ? reflection->AddInt32(&message, field, static_cast<int32_t>(number))
                 : reflection->SetInt32(&message, field, static_cast<int32_t>(number));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        if (number < 0) return out_of_range();
        repeated ? reflection->AddUInt64(&message, field, static_cast<uint64_t>(number))
                 : reflection->SetUInt64(&message, field, static_cast<uint64_t>(number));
        break;
      default:
        if (number < 0 || number > UINT32_MAX) return out_of_range();
        repeated ? reflection->AddUInt32(&message, field, static_cast<uint32_t>(number))
                 : reflection->SetUInt32(&message, field, static_cast<uint32_t>(number));
        break;
    }
    return absl::OkStatus();
  }

  // Checks that the schema cannot express; normalizes hex and version spellings.
  absl::Status CheckSemantics(Policy& policy) {
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

  absl::Status CheckRoot(const std::string& path, const std::string& pem) {
    if (pem.empty()) return Error(path, "missing (PEM of the simulated root certificate)");
    auto cert = Certificate::FromPem(pem);
    if (!cert.ok()) return Error(path, cert.status().message());
    if (!cert->IsCa()) return Error(path, "the certificate is not a CA certificate");
    return absl::OkStatus();
  }

  std::string source_;
  YAML::Mark root_mark_;
  std::map<std::string, YAML::Mark> marks_;
};

void EmitMessage(YAML::Emitter& out, const pb::Message& message) {
  const pb::Descriptor* descriptor = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  out << YAML::BeginMap;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const pb::FieldDescriptor* field = descriptor->field(i);
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
            out << EnumYamlName(reflection->GetRepeatedEnum(message, field, j));
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
        out << (value->number() == 0 ? std::string("unspecified") : EnumYamlName(value));
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
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": expected exactly one YAML document, found ", document_count));
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
    YamlPolicyReader reader(source_name);
    RETURN_IF_ERROR(reader.Read(documents[0], policy));
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
