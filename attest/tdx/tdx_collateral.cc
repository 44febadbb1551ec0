#include "attest/tdx/tdx_collateral.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/string_view.h"
#include "base/status.h"
#include "crypto/hash.h"

namespace cloister::attest {
namespace {

using Json = nlohmann::json;

// ---- DER ----

struct Tlv {
  uint8_t tag = 0;
  ByteSpan contents;
  ByteSpan whole;
};

// Reads one definite-length element from the front of `rest` and advances it.
absl::StatusOr<Tlv> ReadTlv(ByteSpan& rest, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("PCK SGX extension: ", what, ": ", why));
  };
  if (rest.size() < 2) return bad("truncated");
  Tlv tlv;
  tlv.tag = rest[0];
  size_t size = rest[1];
  size_t header = 2;
  if (size & 0x80) {
    size_t count = size & 0x7F;
    if (count == 0 || count > 3 || rest.size() < 2 + count) return bad("bad length");
    size = 0;
    for (size_t i = 0; i < count; ++i) size = size << 8 | rest[2 + i];
    header += count;
  }
  if (rest.size() - header < size) return bad("length overruns the extension");
  tlv.contents = rest.subspan(header, size);
  tlv.whole = rest.first(header + size);
  rest = rest.subspan(header + size);
  return tlv;
}

absl::StatusOr<Tlv> ReadTlvWithTag(ByteSpan& rest, uint8_t tag, absl::string_view what) {
  ASSIGN_OR_RETURN(Tlv tlv, ReadTlv(rest, what));
  if (tlv.tag != tag) {
    return absl::InvalidArgumentError(absl::StrCat("PCK SGX extension: ", what, ": tag 0x",
                                                   absl::Hex(tlv.tag), ", expected 0x",
                                                   absl::Hex(tag)));
  }
  return tlv;
}

constexpr std::string_view kSgxExtensionOid = "1.2.840.113741.1.13.1";

Bytes Oid(absl::string_view dotted) {
  auto oid = der::ObjectId(StdSv(dotted));
  CLOISTER_CHECK(oid.ok());
  return *oid;
}

bool SameBytes(ByteSpan a, ByteSpan b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// ---- JSON ----

absl::Status JsonError(absl::string_view where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
}

// Scans a JSON string starting at text[i] == '"'; returns the index after its closing quote.
absl::StatusOr<size_t> SkipJsonString(std::string_view text, size_t i) {
  for (++i; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  return absl::InvalidArgumentError("unterminated JSON string");
}

size_t SkipWhitespace(std::string_view text, size_t i) {
  while (i < text.size() &&
         (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) {
    ++i;
  }
  return i;
}

constexpr int kMaxJsonDepth = 32;

// Scans one JSON value starting at text[i]; returns the index after it. Nesting is limited.
absl::StatusOr<size_t> SkipJsonValue(std::string_view text, size_t i) {
  int depth = 0;
  do {
    if (i >= text.size()) return absl::InvalidArgumentError("truncated JSON");
    char c = text[i];
    if (c == '"') {
      ASSIGN_OR_RETURN(i, SkipJsonString(text, i));
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return absl::InvalidArgumentError("JSON nested too deeply");
      ++i;
    } else if (c == '}' || c == ']') {
      if (--depth < 0) return absl::InvalidArgumentError("unbalanced JSON");
      ++i;
    } else {
      ++i;
    }
  } while (depth > 0);
  // A bare number or literal runs until a delimiter.
  while (i < text.size() &&
         std::string_view(",}] \n\r\t").find(text[i]) == std::string_view::npos) {
    ++i;
  }
  return i;
}

absl::StatusOr<Json> ParseJson(std::string_view text, absl::string_view where) {
  // The scanner bounds the nesting before nlohmann's recursive parser sees the text.
  ASSIGN_OR_RETURN(size_t end, SkipJsonValue(text, SkipWhitespace(text, 0)));
  if (SkipWhitespace(text, end) != text.size()) {
    return JsonError(where, "trailing text after the JSON value");
  }
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return JsonError(where, "not valid JSON");
  return json;
}

absl::StatusOr<const Json*> Member(const Json& object, absl::string_view key,
                                   absl::string_view where) {
  if (!object.is_object()) return JsonError(where, "expected a JSON object");
  auto it = object.find(std::string(key));
  if (it == object.end()) return JsonError(where, absl::StrCat("missing field '", key, "'"));
  return &*it;
}

absl::StatusOr<std::string> StringMember(const Json& object, absl::string_view key,
                                         absl::string_view where) {
  ASSIGN_OR_RETURN(const Json* value, Member(object, key, where));
  if (!value->is_string()) {
    return JsonError(where, absl::StrCat("field '", key, "' is not a string"));
  }
  return value->get<std::string>();
}

absl::StatusOr<int64_t> IntMember(const Json& object, absl::string_view key,
                                  absl::string_view where, int64_t max) {
  ASSIGN_OR_RETURN(const Json* value, Member(object, key, where));
  if (!value->is_number_integer() || value->get<int64_t>() < 0 || value->get<int64_t>() > max) {
    return JsonError(where,
                     absl::StrCat("field '", key, "' is not a whole number from 0 to ", max));
  }
  return value->get<int64_t>();
}

absl::StatusOr<Bytes> HexMember(const Json& object, absl::string_view key, size_t size,
                                absl::string_view where) {
  ASSIGN_OR_RETURN(std::string text, StringMember(object, key, where));
  auto bytes = HexDecode(text);
  if (!bytes.ok() || bytes->size() != size) {
    return JsonError(where, absl::StrCat("field '", key, "' is not ", 2 * size, " hex digits"));
  }
  return *std::move(bytes);
}

absl::StatusOr<absl::Time> TimeMember(const Json& object, absl::string_view key,
                                      absl::string_view where) {
  ASSIGN_OR_RETURN(std::string text, StringMember(object, key, where));
  absl::Time time;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, text, &time, &error)) {
    return JsonError(where, absl::StrCat("field '", key, "' is not an RFC 3339 time: ", text));
  }
  return time;
}

absl::StatusOr<const Json*> ArrayMember(const Json& object, absl::string_view key,
                                        absl::string_view where) {
  ASSIGN_OR_RETURN(const Json* value, Member(object, key, where));
  if (!value->is_array()) return JsonError(where, absl::StrCat("field '", key, "' is not a list"));
  return value;
}

// A list of 16 {"svn": N} components.
absl::StatusOr<std::array<uint8_t, 16>> Components(const Json& tcb, absl::string_view key,
                                                   absl::string_view where) {
  ASSIGN_OR_RETURN(const Json* list, ArrayMember(tcb, key, where));
  if (list->size() != 16) {
    return JsonError(
        where, absl::StrCat("field '", key, "' has ", list->size(), " components, expected 16"));
  }
  std::array<uint8_t, 16> out{};
  for (size_t i = 0; i < 16; ++i) {
    ASSIGN_OR_RETURN(int64_t svn, IntMember((*list)[i], "svn", absl::StrCat(where, ".", key), 255));
    out[i] = static_cast<uint8_t>(svn);
  }
  return out;
}

absl::StatusOr<std::vector<TdxModuleLevel>> IsvSvnLevels(const Json& object,
                                                         absl::string_view where) {
  ASSIGN_OR_RETURN(const Json* list, ArrayMember(object, "tcbLevels", where));
  std::vector<TdxModuleLevel> levels;
  for (size_t i = 0; i < list->size(); ++i) {
    std::string here = absl::StrCat(where, ".tcbLevels[", i, "]");
    ASSIGN_OR_RETURN(const Json* tcb, Member((*list)[i], "tcb", here));
    TdxModuleLevel level;
    ASSIGN_OR_RETURN(int64_t svn, IntMember(*tcb, "isvsvn", here, 255));
    level.isv_svn = static_cast<uint8_t>(svn);
    ASSIGN_OR_RETURN(level.status, StringMember((*list)[i], "tcbStatus", here));
    levels.push_back(std::move(level));
  }
  if (levels.empty()) return JsonError(where, "no TCB levels");
  return levels;
}

absl::StatusOr<TdxModuleIdentity> ModuleIdentity(const Json& object, absl::string_view where,
                                                 bool with_levels) {
  TdxModuleIdentity identity;
  if (with_levels) {
    ASSIGN_OR_RETURN(identity.id, StringMember(object, "id", where));
  }
  ASSIGN_OR_RETURN(identity.mr_signer, HexMember(object, "mrsigner", 48, where));
  ASSIGN_OR_RETURN(identity.attributes, HexMember(object, "attributes", 8, where));
  ASSIGN_OR_RETURN(identity.attributes_mask, HexMember(object, "attributesMask", 8, where));
  if (with_levels) {
    ASSIGN_OR_RETURN(identity.levels, IsvSvnLevels(object, where));
  }
  return identity;
}

bool MaskedEquals(ByteSpan value, ByteSpan mask, ByteSpan expected) {
  if (value.size() != mask.size() || value.size() != expected.size()) return false;
  for (size_t i = 0; i < value.size(); ++i) {
    if ((value[i] & mask[i]) != expected[i]) return false;
  }
  return true;
}

// ---- OpenSSL ----

X509_CRL* NativeCrl(void* crl) { return static_cast<X509_CRL*>(crl); }

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

X509Ptr ToNative(const Certificate& cert) {
  Bytes der = cert.ToDer();
  const unsigned char* cursor = der.data();
  X509Ptr x509(d2i_X509(nullptr, &cursor, static_cast<long>(der.size())));
  CLOISTER_CHECK(x509 != nullptr);  // it parsed once already
  return x509;
}

absl::Time FromAsn1Time(const ASN1_TIME* time) {
  struct tm parts = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &parts) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&parts));
}

std::string TimeText(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}

}  // namespace

// ---- PCK extensions ----

absl::StatusOr<PckExtensions> ReadPckExtensions(const Certificate& pck_leaf) {
  ASSIGN_OR_RETURN(Bytes extension, pck_leaf.ExtensionValue(kSgxExtensionOid));
  const std::string base = std::string(kSgxExtensionOid) + ".";
  ByteSpan rest(extension);
  ASSIGN_OR_RETURN(Tlv outer, ReadTlvWithTag(rest, 0x30, "outer SEQUENCE"));
  if (!rest.empty()) {
    return absl::InvalidArgumentError("PCK SGX extension: bytes after the outer SEQUENCE");
  }
  PckExtensions out;
  bool have_ppid = false, have_tcb = false, have_pce_id = false, have_fmspc = false;
  ByteSpan entries = outer.contents;
  while (!entries.empty()) {
    ASSIGN_OR_RETURN(Tlv entry, ReadTlvWithTag(entries, 0x30, "entry"));
    ByteSpan fields = entry.contents;
    ASSIGN_OR_RETURN(Tlv oid, ReadTlvWithTag(fields, 0x06, "entry OID"));
    ASSIGN_OR_RETURN(Tlv value, ReadTlv(fields, "entry value"));
    if (SameBytes(oid.whole, Oid(base + "1"))) {
      if (value.tag != 0x04 || value.contents.size() != 16) {
        return absl::InvalidArgumentError("PCK SGX extension: PPID is not 16 bytes");
      }
      out.ppid.assign(value.contents.begin(), value.contents.end());
      have_ppid = true;
    } else if (SameBytes(oid.whole, Oid(base + "2"))) {
      if (value.tag != 0x30) {
        return absl::InvalidArgumentError("PCK SGX extension: TCB is not a SEQUENCE");
      }
      std::array<bool, 18> seen{};
      ByteSpan components = value.contents;
      while (!components.empty()) {
        ASSIGN_OR_RETURN(Tlv component, ReadTlvWithTag(components, 0x30, "TCB component"));
        ByteSpan parts = component.contents;
        ASSIGN_OR_RETURN(Tlv component_oid, ReadTlvWithTag(parts, 0x06, "TCB component OID"));
        ASSIGN_OR_RETURN(Tlv component_value, ReadTlv(parts, "TCB component value"));
        for (int index = 1; index <= 18; ++index) {
          if (!SameBytes(component_oid.whole, Oid(absl::StrCat(base, "2.", index)))) continue;
          if (index == 18) {
            if (component_value.tag != 0x04 || component_value.contents.size() != 16) {
              return absl::InvalidArgumentError("PCK SGX extension: CPUSVN is not 16 bytes");
            }
            out.cpu_svn.assign(component_value.contents.begin(), component_value.contents.end());
          } else {
            auto number = der::ParseInteger(component_value.whole);
            const uint64_t max = index == 17 ? 0xFFFF : 0xFF;
            if (!number.ok() || *number > max) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "PCK SGX extension: TCB component ", index, " is not an INTEGER up to ", max));
            }
            if (index == 17) {
              out.pce_svn = static_cast<uint16_t>(*number);
            } else {
              out.sgx_tcb_components[index - 1] = static_cast<uint8_t>(*number);
            }
          }
          seen[index - 1] = true;
        }
      }
      for (int index = 1; index <= 18; ++index) {
        if (!seen[index - 1]) {
          return absl::InvalidArgumentError(
              absl::StrCat("PCK SGX extension: TCB component ", index, " is missing"));
        }
      }
      have_tcb = true;
    } else if (SameBytes(oid.whole, Oid(base + "3"))) {
      if (value.tag != 0x04 || value.contents.size() != 2) {
        return absl::InvalidArgumentError("PCK SGX extension: PCE-ID is not 2 bytes");
      }
      out.pce_id.assign(value.contents.begin(), value.contents.end());
      have_pce_id = true;
    } else if (SameBytes(oid.whole, Oid(base + "4"))) {
      if (value.tag != 0x04 || value.contents.size() != 6) {
        return absl::InvalidArgumentError("PCK SGX extension: FMSPC is not 6 bytes");
      }
      out.fmspc.assign(value.contents.begin(), value.contents.end());
      have_fmspc = true;
    }
  }
  if (!have_ppid || !have_tcb || !have_pce_id || !have_fmspc) {
    return absl::InvalidArgumentError("PCK SGX extension: PPID, TCB, PCE-ID or FMSPC is missing");
  }
  return out;
}

// ---- signed JSON ----

absl::StatusOr<SignedJson> SplitSignedJson(std::string_view body, std::string_view member_text) {
  absl::string_view member = Sv(member_text);
  const std::string where = absl::StrCat("collateral with '", member, "'");
  auto scan_error = [&](const absl::Status& status) { return JsonError(where, status.message()); };
  auto parsed = ParseJson(body, where);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) return JsonError(where, "expected a JSON object");

  // Find the member's raw text: the scanner walks the top-level object exactly as written.
  std::optional<std::string_view> raw;
  size_t i = SkipWhitespace(body, 0);
  if (i >= body.size() || body[i] != '{') return JsonError(where, "expected a JSON object");
  i = SkipWhitespace(body, i + 1);
  while (i < body.size() && body[i] != '}') {
    if (body[i] != '"') return JsonError(where, "expected a field name");
    auto key_end = SkipJsonString(body, i);
    if (!key_end.ok()) return scan_error(key_end.status());
    std::string_view key = body.substr(i + 1, *key_end - i - 2);
    i = SkipWhitespace(body, *key_end);
    if (i >= body.size() || body[i] != ':') return JsonError(where, "expected ':'");
    i = SkipWhitespace(body, i + 1);
    auto value_end = SkipJsonValue(body, i);
    if (!value_end.ok()) return scan_error(value_end.status());
    if (key == member_text) {
      if (raw.has_value()) return JsonError(where, absl::StrCat("'", member, "' appears twice"));
      raw = body.substr(i, *value_end - i);
    }
    i = SkipWhitespace(body, *value_end);
    if (i < body.size() && body[i] == ',') i = SkipWhitespace(body, i + 1);
  }
  if (!raw.has_value()) return JsonError(where, absl::StrCat("missing field '", member, "'"));
  if (parsed->count(std::string(member)) != 1 || !(*parsed)[std::string(member)].is_object()) {
    return JsonError(where, absl::StrCat("'", member, "' is not an object"));
  }
  SignedJson out;
  out.signed_text = std::string(*raw);
  ASSIGN_OR_RETURN(out.signature, HexMember(*parsed, "signature", 64, where));
  return out;
}

absl::StatusOr<TdxTcbInfo> ParseTdxTcbInfo(std::string_view text) {
  const std::string where = "TCB info";
  ASSIGN_OR_RETURN(Json json, ParseJson(text, where));
  TdxTcbInfo info;
  ASSIGN_OR_RETURN(info.id, StringMember(json, "id", where));
  if (info.id != "TDX") {
    return JsonError(where, absl::StrCat("id is '", info.id, "', expected TDX"));
  }
  ASSIGN_OR_RETURN(int64_t version, IntMember(json, "version", where, 1000));
  info.version = static_cast<int>(version);
  if (info.version != 3) {
    return JsonError(where, absl::StrCat("version ", version, " is not supported (3)"));
  }
  ASSIGN_OR_RETURN(info.issue_date, TimeMember(json, "issueDate", where));
  ASSIGN_OR_RETURN(info.next_update, TimeMember(json, "nextUpdate", where));
  ASSIGN_OR_RETURN(info.fmspc, HexMember(json, "fmspc", 6, where));
  ASSIGN_OR_RETURN(info.pce_id, HexMember(json, "pceId", 2, where));
  ASSIGN_OR_RETURN(int64_t tcb_type, IntMember(json, "tcbType", where, 1000));
  if (tcb_type != 0) {
    return JsonError(where, absl::StrCat("tcbType ", tcb_type, " is not supported (0)"));
  }
  ASSIGN_OR_RETURN(int64_t number, IntMember(json, "tcbEvaluationDataNumber", where, 1 << 30));
  info.tcb_evaluation_data_number = static_cast<int>(number);
  ASSIGN_OR_RETURN(const Json* module, Member(json, "tdxModule", where));
  ASSIGN_OR_RETURN(info.tdx_module, ModuleIdentity(*module, where + ".tdxModule", false));
  if (json.contains("tdxModuleIdentities")) {
    ASSIGN_OR_RETURN(const Json* identities, ArrayMember(json, "tdxModuleIdentities", where));
    for (size_t i = 0; i < identities->size(); ++i) {
      ASSIGN_OR_RETURN(TdxModuleIdentity identity,
                       ModuleIdentity((*identities)[i],
                                      absl::StrCat(where, ".tdxModuleIdentities[", i, "]"), true));
      info.module_identities.push_back(std::move(identity));
    }
  }
  ASSIGN_OR_RETURN(const Json* levels, ArrayMember(json, "tcbLevels", where));
  for (size_t i = 0; i < levels->size(); ++i) {
    const std::string here = absl::StrCat(where, ".tcbLevels[", i, "]");
    const Json& entry = (*levels)[i];
    ASSIGN_OR_RETURN(const Json* tcb, Member(entry, "tcb", here));
    TdxTcbLevel level;
    ASSIGN_OR_RETURN(level.sgx_components, Components(*tcb, "sgxtcbcomponents", here));
    ASSIGN_OR_RETURN(int64_t pce_svn, IntMember(*tcb, "pcesvn", here, 0xFFFF));
    level.pce_svn = static_cast<uint16_t>(pce_svn);
    ASSIGN_OR_RETURN(level.tdx_components, Components(*tcb, "tdxtcbcomponents", here));
    ASSIGN_OR_RETURN(level.status, StringMember(entry, "tcbStatus", here));
    ASSIGN_OR_RETURN(level.tcb_date, StringMember(entry, "tcbDate", here));
    if (entry.contains("advisoryIDs")) {
      ASSIGN_OR_RETURN(const Json* advisories, ArrayMember(entry, "advisoryIDs", here));
      for (const Json& id : *advisories) {
        if (!id.is_string()) return JsonError(here, "advisoryIDs holds a non-string");
        level.advisory_ids.push_back(id.get<std::string>());
      }
    }
    info.levels.push_back(std::move(level));
  }
  if (info.levels.empty()) return JsonError(where, "no TCB levels");
  return info;
}

absl::StatusOr<QeIdentity> ParseQeIdentity(std::string_view text) {
  const std::string where = "QE identity";
  ASSIGN_OR_RETURN(Json json, ParseJson(text, where));
  QeIdentity identity;
  ASSIGN_OR_RETURN(identity.id, StringMember(json, "id", where));
  if (identity.id != "TD_QE") {
    return JsonError(where, absl::StrCat("id is '", identity.id, "', expected TD_QE"));
  }
  ASSIGN_OR_RETURN(int64_t version, IntMember(json, "version", where, 1000));
  identity.version = static_cast<int>(version);
  if (identity.version != 2) {
    return JsonError(where, absl::StrCat("version ", version, " is not supported (2)"));
  }
  ASSIGN_OR_RETURN(identity.issue_date, TimeMember(json, "issueDate", where));
  ASSIGN_OR_RETURN(identity.next_update, TimeMember(json, "nextUpdate", where));
  ASSIGN_OR_RETURN(identity.misc_select, HexMember(json, "miscselect", 4, where));
  ASSIGN_OR_RETURN(identity.misc_select_mask, HexMember(json, "miscselectMask", 4, where));
  ASSIGN_OR_RETURN(identity.attributes, HexMember(json, "attributes", 16, where));
  ASSIGN_OR_RETURN(identity.attributes_mask, HexMember(json, "attributesMask", 16, where));
  ASSIGN_OR_RETURN(identity.mr_signer, HexMember(json, "mrsigner", 32, where));
  ASSIGN_OR_RETURN(int64_t prod_id, IntMember(json, "isvprodid", where, 0xFFFF));
  identity.isv_prod_id = static_cast<uint16_t>(prod_id);
  ASSIGN_OR_RETURN(identity.levels, IsvSvnLevels(json, where));
  return identity;
}

absl::StatusOr<Certificate> VerifyCollateralSignature(const SignedJson& signed_json,
                                                      std::string_view signer_chain_pem,
                                                      const Certificate& root, absl::Time at) {
  if (signer_chain_pem.empty()) {
    return absl::PermissionDeniedError(
        "the collateral's signing chain (Intel SGX TCB Signing certificate) was not given, so "
        "the collateral cannot be authenticated");
  }
  auto chain = ParsePemChain(signer_chain_pem, 4);
  if (!chain.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the collateral's signing chain: ", chain.status().message()));
  }
  const Certificate& signer = (*chain)[0];
  if (signer.SubjectCommonName() != "Intel SGX TCB Signing") {
    return absl::PermissionDeniedError(absl::StrCat("the collateral signer is '",
                                                    signer.SubjectCommonName(),
                                                    "', not 'Intel SGX TCB Signing'"));
  }
  if (auto status = VerifyChain(*chain, root, at); !status.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("the collateral signer: ", status.message()));
  }
  absl::Status signature = VerifyP1363WithCertificate(
      signer, crypto::HashAlg::kSha256, AsBytes(signed_json.signed_text), signed_json.signature);
  if (!signature.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the collateral's signature does not verify with the Intel SGX TCB Signing "
                     "key: ",
                     signature.message()));
  }
  return signer;
}

absl::StatusOr<TdxTcbResult> EvaluateTdxTcb(const TdxTcbInfo& info, const PckExtensions& pck,
                                            const TdReportBody& body) {
  if (info.fmspc != pck.fmspc) {
    return absl::PermissionDeniedError(absl::StrCat("the TCB info is for FMSPC ",
                                                    HexEncode(info.fmspc), ", the PCK's is ",
                                                    HexEncode(pck.fmspc)));
  }
  if (info.pce_id != pck.pce_id) {
    return absl::PermissionDeniedError(absl::StrCat("the TCB info is for PCE ID ",
                                                    HexEncode(info.pce_id), ", the PCK's is ",
                                                    HexEncode(pck.pce_id)));
  }
  CLOISTER_CHECK(body.tee_tcb_svn.size() == 16);
  TdxTcbResult result;
  const uint8_t module_major = body.tee_tcb_svn[1];
  const TdxModuleIdentity* module = &info.tdx_module;
  if (module_major > 0 && !info.module_identities.empty()) {
    result.module_id = absl::StrCat("TDX_", absl::Hex(module_major, absl::kZeroPad2));
    module = nullptr;
    for (const TdxModuleIdentity& candidate : info.module_identities) {
      if (absl::EqualsIgnoreCase(candidate.id, result.module_id)) module = &candidate;
    }
    if (module == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("the TCB info has no module identity ", result.module_id));
    }
  }
  if (!ConstantTimeEquals(module->mr_signer, body.mr_signer_seam)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "MRSIGNERSEAM ", HexEncode(body.mr_signer_seam), " is not the TDX module signer ",
        HexEncode(module->mr_signer), " of the TCB info"));
  }
  if (!MaskedEquals(body.seam_attributes, module->attributes_mask, module->attributes)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "SEAMATTRIBUTES ", HexEncode(body.seam_attributes), " do not match the TCB info's module"));
  }
  if (!module->levels.empty()) {
    for (const TdxModuleLevel& level : module->levels) {
      if (level.isv_svn <= body.tee_tcb_svn[0]) {
        result.module_status = level.status;
        break;
      }
    }
    if (result.module_status.empty()) {
      return absl::PermissionDeniedError(absl::StrCat("the TDX module SVN ", body.tee_tcb_svn[0],
                                                      " is below every "
                                                      "level of ",
                                                      result.module_id));
    }
  }
  const size_t first_tdx_component = module_major > 0 ? 2 : 0;
  for (const TdxTcbLevel& level : info.levels) {
    bool match = pck.pce_svn >= level.pce_svn;
    for (size_t i = 0; i < 16 && match; ++i) {
      match = pck.sgx_tcb_components[i] >= level.sgx_components[i];
    }
    for (size_t i = first_tdx_component; i < 16 && match; ++i) {
      match = body.tee_tcb_svn[i] >= level.tdx_components[i];
    }
    if (match) {
      result.status = level.status;
      result.tcb_date = level.tcb_date;
      result.advisory_ids = level.advisory_ids;
      return result;
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "no TCB level of the TCB info matches: the platform (PCK SVNs ",
      absl::StrJoin(pck.sgx_tcb_components, ","), ", PCESVN ", pck.pce_svn, ", TEE_TCB_SVN ",
      HexEncode(body.tee_tcb_svn), ") is below every level, so its TCB is not supported"));
}

absl::StatusOr<std::string> EvaluateQeIdentity(const QeIdentity& identity,
                                               const SgxReportBody& qe_report) {
  if (!MaskedEquals(qe_report.misc_select_raw, identity.misc_select_mask, identity.misc_select)) {
    return absl::PermissionDeniedError("the QE report's MISCSELECT does not match the QE identity");
  }
  if (!MaskedEquals(qe_report.attributes, identity.attributes_mask, identity.attributes)) {
    return absl::PermissionDeniedError(absl::StrCat("the QE report's ATTRIBUTES ",
                                                    HexEncode(qe_report.attributes),
                                                    " do not match the QE identity"));
  }
  if (!ConstantTimeEquals(qe_report.mr_signer, identity.mr_signer)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the QE's MRSIGNER ", HexEncode(qe_report.mr_signer), " is not Intel's ",
                     HexEncode(identity.mr_signer)));
  }
  if (qe_report.isv_prod_id != identity.isv_prod_id) {
    return absl::PermissionDeniedError(absl::StrCat("the QE's ISVPRODID ", qe_report.isv_prod_id,
                                                    " is not ", identity.isv_prod_id));
  }
  for (const TdxModuleLevel& level : identity.levels) {
    if (level.isv_svn <= qe_report.isv_svn) return level.status;
  }
  return absl::PermissionDeniedError(
      absl::StrCat("the QE's ISVSVN ", qe_report.isv_svn, " is below every QE identity level"));
}

// ---- CRL ----

absl::StatusOr<Crl> Crl::Parse(ByteSpan der_or_pem) {
  ERR_clear_error();
  absl::string_view text(reinterpret_cast<const char*>(der_or_pem.data()), der_or_pem.size());
  X509_CRL* crl = nullptr;
  if (absl::StrContains(text, "-----BEGIN X509 CRL-----")) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(
        BIO_new_mem_buf(der_or_pem.data(), static_cast<int>(der_or_pem.size())), &BIO_free);
    if (bio != nullptr) crl = PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr);
  } else {
    const unsigned char* cursor = der_or_pem.data();
    crl = d2i_X509_CRL(nullptr, &cursor, static_cast<long>(der_or_pem.size()));
    if (crl != nullptr && cursor != der_or_pem.data() + der_or_pem.size()) {
      X509_CRL_free(crl);
      ERR_clear_error();
      return absl::InvalidArgumentError("the CRL has trailing bytes");
    }
  }
  ERR_clear_error();
  if (crl == nullptr) return absl::InvalidArgumentError("not a CRL (DER or PEM)");
  return Crl(crl);
}

Crl::Crl(Crl&& other) noexcept : crl_(other.crl_) { other.crl_ = nullptr; }
Crl& Crl::operator=(Crl&& other) noexcept {
  if (this != &other) {
    X509_CRL_free(NativeCrl(crl_));
    crl_ = other.crl_;
    other.crl_ = nullptr;
  }
  return *this;
}
Crl::~Crl() { X509_CRL_free(NativeCrl(crl_)); }

std::string Crl::IssuerCommonName() const {
  const X509_NAME* name = X509_CRL_get_issuer(NativeCrl(crl_));
  int index = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (index < 0) return "";
  const ASN1_STRING* value = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(value)),
                     static_cast<size_t>(ASN1_STRING_length(value)));
}

absl::Time Crl::ThisUpdate() const {
  return FromAsn1Time(X509_CRL_get0_lastUpdate(NativeCrl(crl_)));
}

absl::Time Crl::NextUpdate() const {
  const ASN1_TIME* next = X509_CRL_get0_nextUpdate(NativeCrl(crl_));
  return next == nullptr ? absl::InfiniteFuture() : FromAsn1Time(next);
}

size_t Crl::revoked_count() const {
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(NativeCrl(crl_));
  return revoked == nullptr ? 0 : static_cast<size_t>(sk_X509_REVOKED_num(revoked));
}

absl::Status Crl::VerifyIssuedBy(const Certificate& issuer, absl::Time at) const {
  X509Ptr native = ToNative(issuer);
  if (X509_NAME_cmp(X509_CRL_get_issuer(NativeCrl(crl_)), X509_get_subject_name(native.get())) !=
      0) {
    return absl::PermissionDeniedError(absl::StrCat("the CRL is issued by '", IssuerCommonName(),
                                                    "', not by '", issuer.SubjectCommonName(),
                                                    "'"));
  }
  EVP_PKEY* key = X509_get0_pubkey(native.get());
  int verified = key == nullptr ? -1 : X509_CRL_verify(NativeCrl(crl_), key);
  ERR_clear_error();
  if (verified != 1) {
    return absl::PermissionDeniedError(
        absl::StrCat("the CRL of '", IssuerCommonName(), "' is not signed by its issuer's key"));
  }
  if (at < ThisUpdate() || at > NextUpdate()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the CRL of '", IssuerCommonName(), "' is valid from ", TimeText(ThisUpdate()),
                     " to ", TimeText(NextUpdate()), ", not at ", TimeText(at)));
  }
  return absl::OkStatus();
}

bool Crl::Revokes(const Certificate& cert) const {
  X509Ptr native = ToNative(cert);
  X509_REVOKED* entry = nullptr;
  return X509_CRL_get0_by_serial(NativeCrl(crl_), &entry, X509_get0_serialNumber(native.get())) ==
         1;
}

}  // namespace cloister::attest
