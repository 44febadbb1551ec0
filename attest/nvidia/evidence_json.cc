#include "attest/nvidia/evidence_json.h"

#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/nvidia/base64.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

using Json = nlohmann::json;

constexpr size_t kNonceSize = 32;

absl::Status Invalid(absl::string_view where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("NVIDIA evidence JSON: ", where, ": ", message));
}

absl::Status CheckMembers(const Json& object, const std::set<std::string>& allowed,
                          absl::string_view where) {
  for (const auto& [key, value] : object.items()) {
    if (!allowed.contains(key)) {
      return Invalid(where, absl::StrCat("unknown member '", key, "' (expected ",
                                         absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> StringMember(const Json& object, const char* name,
                                         absl::string_view where) {
  auto it = object.find(name);
  if (it == object.end()) return Invalid(where, absl::StrCat("missing member '", name, "'"));
  if (!it->is_string()) return Invalid(where, absl::StrCat("'", name, "' is not a string"));
  return it->get<std::string>();
}

absl::StatusOr<Bytes> NonceMember(const Json& object, absl::string_view where) {
  ASSIGN_OR_RETURN(std::string hex, StringMember(object, "nonce", where));
  absl::StatusOr<Bytes> nonce = HexDecode(hex);
  if (!nonce.ok() || nonce->size() != kNonceSize) {
    return Invalid(where, "'nonce' is not 64 hex digits");
  }
  return *nonce;
}

absl::StatusOr<std::string> ArchMember(const Json& object, absl::string_view where) {
  ASSIGN_OR_RETURN(std::string arch, StringMember(object, "arch", where));
  if (arch.empty()) return Invalid(where, "'arch' is empty");
  return arch;
}

absl::Status ReadReportAndChain(const Json& object, absl::string_view where,
                                NvidiaEvidenceItem& item) {
  ASSIGN_OR_RETURN(std::string evidence, StringMember(object, "evidence", where));
  absl::StatusOr<Bytes> report = Base64Decode(evidence);
  if (!report.ok()) {
    return Invalid(where, absl::StrCat("'evidence': ", report.status().message()));
  }
  if (report->empty()) return Invalid(where, "'evidence' is empty");
  item.report = std::move(*report);
  ASSIGN_OR_RETURN(std::string certificate, StringMember(object, "certificate", where));
  absl::StatusOr<Bytes> pem = Base64Decode(certificate);
  if (!pem.ok()) {
    return Invalid(where, absl::StrCat("'certificate': ", pem.status().message()));
  }
  item.cert_chain_pem = ToString(*pem);
  if (item.cert_chain_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return Invalid(where, "'certificate' does not decode to PEM certificates");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<NvidiaEvidenceItem>> ParseNvidiaEvidenceJson(std::string_view text) {
  if (text.size() > kMaxEvidenceJsonSize) {
    return Invalid("document", absl::StrCat(text.size(), " bytes; at most ", kMaxEvidenceJsonSize,
                                            " are accepted"));
  }
  Json json = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Invalid("document", "not valid JSON");

  std::vector<NvidiaEvidenceItem> items;
  if (json.is_array()) {
    if (json.empty()) return Invalid("document", "the evidence list is empty");
    if (json.size() > kMaxEvidenceItems) {
      return Invalid("document", absl::StrCat(json.size(), " items; at most ", kMaxEvidenceItems));
    }
    for (size_t i = 0; i < json.size(); ++i) {
      const std::string where = absl::StrCat("item ", i);
      const Json& entry = json[i];
      if (!entry.is_object()) return Invalid(where, "not an object");
      RETURN_IF_ERROR(CheckMembers(entry, {"arch", "nonce", "evidence", "certificate"}, where));
      NvidiaEvidenceItem item;
      ASSIGN_OR_RETURN(item.arch, ArchMember(entry, where));
      ASSIGN_OR_RETURN(item.nonce, NonceMember(entry, where));
      RETURN_IF_ERROR(ReadReportAndChain(entry, where, item));
      items.push_back(std::move(item));
    }
    return items;
  }
  if (json.is_object()) {
    RETURN_IF_ERROR(
        CheckMembers(json, {"arch", "nonce", "evidence_list", "claims_version"}, "request"));
    ASSIGN_OR_RETURN(std::string arch, ArchMember(json, "request"));
    ASSIGN_OR_RETURN(Bytes nonce, NonceMember(json, "request"));
    auto list = json.find("evidence_list");
    if (list == json.end() || !list->is_array() || list->empty()) {
      return Invalid("request", "'evidence_list' is missing, not a list, or empty");
    }
    if (list->size() > kMaxEvidenceItems) {
      return Invalid("request", absl::StrCat(list->size(), " items; at most ", kMaxEvidenceItems));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string where = absl::StrCat("evidence_list item ", i);
      const Json& entry = (*list)[i];
      if (!entry.is_object()) return Invalid(where, "not an object");
      RETURN_IF_ERROR(CheckMembers(entry, {"arch", "evidence", "certificate"}, where));
      NvidiaEvidenceItem item;
      item.arch = arch;
      if (entry.contains("arch")) {
        ASSIGN_OR_RETURN(item.arch, ArchMember(entry, where));
      }
      item.nonce = nonce;
      RETURN_IF_ERROR(ReadReportAndChain(entry, where, item));
      items.push_back(std::move(item));
    }
    return items;
  }
  return Invalid("document", "expected a list of evidence items or an NRAS request object");
}

std::string NvidiaEvidenceToJson(const std::vector<NvidiaEvidenceItem>& items) {
  Json list = Json::array();
  for (const NvidiaEvidenceItem& item : items) {
    list.push_back(Json{{"arch", item.arch},
                        {"nonce", HexEncode(item.nonce)},
                        {"evidence", Base64Encode(item.report)},
                        {"certificate", Base64Encode(AsBytes(item.cert_chain_pem))}});
  }
  return list.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace cloister::attest
