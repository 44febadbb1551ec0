#include "attest/nvidia/rim.h"

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xmlerror.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
// xmlsec.h comes first: the other xmlsec headers rely on its definitions.
#include <xmlsec/xmlsec.h>
// The rest of xmlsec, after xmlsec.h:
#include <xmlsec/errors.h>
#include <xmlsec/io.h>
#include <xmlsec/keys.h>
#include <xmlsec/openssl/app.h>
#include <xmlsec/openssl/crypto.h>
#include <xmlsec/openssl/evp.h>
#include <xmlsec/templates.h>
#include <xmlsec/transforms.h>
#include <xmlsec/xmldsig.h>
#include <xmlsec/xmltree.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/nvidia/base64.h"
#include "attest/string_view.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr std::string_view kDsigNamespace = "http://www.w3.org/2000/09/xmldsig#";
constexpr size_t kMaxHashSize = 64;
constexpr size_t kMaxSignerChainCount = 8;
constexpr size_t kMaxCollectedErrors = 4;

struct DocDeleter {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
struct ParserCtxtDeleter {
  void operator()(xmlParserCtxt* ctxt) const { xmlFreeParserCtxt(ctxt); }
};
struct XmlCharDeleter {
  void operator()(xmlChar* text) const { xmlFree(text); }
};
struct DsigCtxDeleter {
  void operator()(xmlSecDSigCtx* ctx) const { xmlSecDSigCtxDestroy(ctx); }
};
using DocPtr = std::unique_ptr<xmlDoc, DocDeleter>;
using ParserCtxtPtr = std::unique_ptr<xmlParserCtxt, ParserCtxtDeleter>;
using XmlCharPtr = std::unique_ptr<xmlChar, XmlCharDeleter>;
using DsigCtxPtr = std::unique_ptr<xmlSecDSigCtx, DsigCtxDeleter>;

const xmlChar* X(const char* text) { return reinterpret_cast<const xmlChar*>(text); }
std::string FromXml(const xmlChar* text) {
  return text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text));
}

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("RIM: ", message));
}

// ---- one-time library setup and error collection ----

// xmlsec reports errors through one process-wide callback; each verification collects the
// messages of its own thread into this list while it runs (see ScopedXmlsecErrors).
thread_local std::vector<std::string>* t_xmlsec_errors = nullptr;

void CollectXmlsecError(const char* file, int line, const char* func, const char* error_object,
                        const char* error_subject, int reason, const char* message) {
  if (t_xmlsec_errors == nullptr || t_xmlsec_errors->size() >= kMaxCollectedErrors) return;
  std::string text = message != nullptr ? message : "";
  if (error_subject != nullptr && *error_subject != '\0') {
    text = absl::StrCat(error_subject, ": ", text);
  }
  t_xmlsec_errors->push_back(std::move(text));
}

class ScopedXmlsecErrors {
 public:
  ScopedXmlsecErrors() : previous_(t_xmlsec_errors) { t_xmlsec_errors = &errors_; }
  ~ScopedXmlsecErrors() { t_xmlsec_errors = previous_; }
  std::string Summary() const {
    return errors_.empty() ? std::string("no detail from xmlsec") : absl::StrJoin(errors_, "; ");
  }

 private:
  std::vector<std::string> errors_;
  std::vector<std::string>* previous_;
};

// libxml2 reports some problems (encoding conversion, for one) through its per-thread generic
// error handler rather than the parser context; this silences that handler while a RIM is
// processed on this thread, so nothing reaches stderr. Our errors come from the return values.
void IgnoreLibxmlMessage(void* context, const char* format, ...) {}

class ScopedLibxmlSilence {
 public:
  ScopedLibxmlSilence() : handler_(xmlGenericError), context_(xmlGenericErrorContext) {
    xmlSetGenericErrorFunc(nullptr, &IgnoreLibxmlMessage);
  }
  ~ScopedLibxmlSilence() { xmlSetGenericErrorFunc(context_, handler_); }

 private:
  xmlGenericErrorFunc handler_;
  void* context_;
};

// libxml2's loader for external entities and DTDs, replaced process-wide: nothing is loaded.
xmlParserInputPtr RefuseExternalEntity(const char* url, const char* id, xmlParserCtxtPtr context) {
  return nullptr;
}

// Initialises libxml2 and xmlsec (OpenSSL backend) once per process; C++ guarantees the
// static is initialised exactly once even when several threads arrive together.
absl::Status EnsureXmlsecInitialized() {
  static const absl::Status* const status = []() -> absl::Status* {
    xmlInitParser();
    xmlSetExternalEntityLoader(&RefuseExternalEntity);
    if (xmlSecInit() < 0) return new absl::Status(absl::InternalError("xmlSecInit failed"));
    if (xmlSecCheckVersion() != 1) {
      return new absl::Status(
          absl::InternalError("the loaded libxmlsec1 is not the version we were built with"));
    }
    // No input callbacks at all: xmlsec can never open a file or URL, whatever a document
    // asks for (references are restricted to "" as well).
    xmlSecIOCleanupCallbacks();
    if (xmlSecOpenSSLAppInit(nullptr) < 0 || xmlSecOpenSSLInit() < 0) {
      return new absl::Status(absl::InternalError("xmlsec's OpenSSL backend failed to start"));
    }
    // Errors go to the verification that caused them, never to stderr.
    xmlSecErrorsSetCallback(&CollectXmlsecError);
    return new absl::Status(absl::OkStatus());
  }();
  return *status;
}

// ---- parsing ----

absl::StatusOr<DocPtr> ParseXml(std::string_view xml) {
  RETURN_IF_ERROR(EnsureXmlsecInitialized());
  if (xml.size() > kMaxRimXmlSize) {
    return Invalid(absl::StrCat("the document is ", xml.size(), " bytes; at most ", kMaxRimXmlSize,
                                " are accepted"));
  }
  if (xml.empty()) return Invalid("the document is empty");
  // A DTD could declare entities (external ones would be fetched); RIMs never carry one.
  if (absl::StrContains(Sv(xml), "<!DOCTYPE") || absl::StrContains(Sv(xml), "<!ENTITY")) {
    return Invalid("document type declarations are refused");
  }
  ParserCtxtPtr ctxt(xmlNewParserCtxt());
  if (ctxt == nullptr) return absl::ResourceExhaustedError("RIM: cannot allocate an XML parser");
  DocPtr doc(xmlCtxtReadMemory(ctxt.get(), xml.data(), static_cast<int>(xml.size()), "rim.xml",
                               nullptr, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
  if (doc == nullptr) {
    const xmlError* error = xmlCtxtGetLastError(ctxt.get());
    std::string reason = error != nullptr && error->message != nullptr
                             ? std::string(absl::StripAsciiWhitespace(error->message))
                             : std::string("unknown error");
    int line = error != nullptr ? error->line : 0;
    return Invalid(absl::StrCat("malformed XML at line ", line, ": ", reason));
  }
  if (doc->intSubset != nullptr || doc->extSubset != nullptr) {
    return Invalid("document type declarations are refused");
  }
  return doc;
}

bool IsElement(const xmlNode* node, const char* local_name, std::string_view ns) {
  return node != nullptr && node->type == XML_ELEMENT_NODE &&
         xmlStrEqual(node->name, X(local_name)) && node->ns != nullptr &&
         std::string_view(reinterpret_cast<const char*>(node->ns->href)) == ns;
}

std::string NamespaceOf(const xmlNode* node) {
  return node->ns != nullptr ? FromXml(node->ns->href) : std::string();
}

// An attribute without a namespace, or nullopt.
std::optional<std::string> Attribute(const xmlNode* node, const char* name) {
  XmlCharPtr value(xmlGetNoNsProp(node, X(name)));
  if (value == nullptr) return std::nullopt;
  return FromXml(value.get());
}

std::optional<std::string> NsAttribute(const xmlNode* node, const char* name, std::string_view ns) {
  std::string ns_text(ns);
  XmlCharPtr value(xmlGetNsProp(node, X(name), X(ns_text.c_str())));
  if (value == nullptr) return std::nullopt;
  return FromXml(value.get());
}

// A decimal number without sign, spaces or leading zeros, at most `max`.
std::optional<uint64_t> ParseDecimal(absl::string_view text, uint64_t max) {
  if (text.empty() || text.size() > 9 || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > max) return std::nullopt;
  return value;
}

absl::StatusOr<RimMeasurement> ParseResource(const xmlNode* node, size_t position) {
  const std::string where = absl::StrCat("Payload entry ", position);
  auto required = [&](const char* name) -> absl::StatusOr<std::string> {
    std::optional<std::string> value = Attribute(node, name);
    if (!value.has_value()) return Invalid(absl::StrCat(where, " has no '", name, "' attribute"));
    return *value;
  };
  ASSIGN_OR_RETURN(std::string type, required("type"));
  if (type != "Measurement") {
    return Invalid(absl::StrCat(where, " has type '", type, "'; only 'Measurement' is supported"));
  }
  RimMeasurement out;
  ASSIGN_OR_RETURN(std::string index_text, required("index"));
  std::optional<uint64_t> index = ParseDecimal(Sv(index_text), kMaxRimIndex);
  if (!index.has_value()) {
    return Invalid(
        absl::StrCat(where, " has index '", index_text, "'; expected 0 to ", kMaxRimIndex));
  }
  out.index = static_cast<uint32_t>(*index);
  const std::string named = absl::StrCat("index ", out.index);

  ASSIGN_OR_RETURN(std::string active, required("active"));
  if (absl::EqualsIgnoreCase(active, "true")) {
    out.active = true;
  } else if (absl::EqualsIgnoreCase(active, "false")) {
    out.active = false;
  } else {
    return Invalid(absl::StrCat(named, " has active='", active, "'; expected True or False"));
  }
  ASSIGN_OR_RETURN(std::string alternatives_text, required("alternatives"));
  std::optional<uint64_t> alternatives = ParseDecimal(Sv(alternatives_text), kMaxRimAlternatives);
  if (!alternatives.has_value() || *alternatives == 0) {
    return Invalid(absl::StrCat(named, " has alternatives='", alternatives_text,
                                "'; expected 1 to ", kMaxRimAlternatives));
  }
  ASSIGN_OR_RETURN(std::string size_text, required("size"));
  std::optional<uint64_t> size = ParseDecimal(Sv(size_text), kMaxHashSize);
  if (!size.has_value() || *size == 0) {
    return Invalid(
        absl::StrCat(named, " has size='", size_text, "'; expected 1 to ", kMaxHashSize));
  }
  out.size = static_cast<size_t>(*size);
  out.name = Attribute(node, "name").value_or("");

  // Exactly Hash0 .. Hash{alternatives-1} in the SHA-384 namespace, nothing else there.
  for (const xmlAttr* attr = node->properties; attr != nullptr; attr = attr->next) {
    if (attr->ns == nullptr || FromXml(attr->ns->href) != std::string(kSha384HashNamespace))
      continue;
    std::string name = FromXml(attr->name);
    std::optional<uint64_t> number = absl::StartsWith(name, "Hash")
                                         ? ParseDecimal(Sv(name).substr(4), kMaxRimAlternatives)
                                         : std::nullopt;
    if (!number.has_value() || *number >= *alternatives) {
      return Invalid(absl::StrCat(named, " has an unexpected hash attribute '", name, "' (",
                                  *alternatives, " alternatives declared)"));
    }
  }
  for (uint64_t k = 0; k < *alternatives; ++k) {
    std::string attr_name = absl::StrCat("Hash", k);
    std::optional<std::string> hex = NsAttribute(node, attr_name.c_str(), kSha384HashNamespace);
    if (!hex.has_value()) {
      return Invalid(
          absl::StrCat(named, " declares ", *alternatives, " alternatives but has no ", attr_name));
    }
    absl::StatusOr<Bytes> digest = HexDecode(*hex);
    if (!digest.ok() || digest->size() != out.size) {
      return Invalid(absl::StrCat(named, " ", attr_name, " is not ", out.size, " bytes of hex"));
    }
    out.alternatives.push_back(std::move(*digest));
  }
  return out;
}

absl::Status ParseMeta(const xmlNode* meta, Rim& rim) {
  std::optional<std::string> version = Attribute(meta, "colloquialVersion");
  if (!version.has_value() || version->empty()) {
    return Invalid("Meta has no colloquialVersion");
  }
  rim.colloquial_version = *version;
  rim.product = Attribute(meta, "product").value_or("");
  rim.edition = Attribute(meta, "edition").value_or("");
  rim.revision = Attribute(meta, "revision").value_or("");
  rim.binding_spec = NsAttribute(meta, "BindingSpec", kTcgRimNamespace).value_or("");
  rim.binding_spec_version = NsAttribute(meta, "BindingSpecVersion", kTcgRimNamespace).value_or("");
  rim.platform_manufacturer_id =
      NsAttribute(meta, "PlatformManufacturerId", kTcgRimNamespace).value_or("");
  rim.platform_model = NsAttribute(meta, "PlatformModel", kTcgRimNamespace).value_or("");
  rim.firmware_manufacturer_id =
      NsAttribute(meta, "FirmwareManufacturerId", kTcgRimNamespace).value_or("");
  return absl::OkStatus();
}

absl::Status ParsePayload(const xmlNode* payload, Rim& rim) {
  std::set<uint32_t> seen;
  size_t position = 0;
  for (const xmlNode* child = payload->children; child != nullptr; child = child->next) {
    if (child->type != XML_ELEMENT_NODE) continue;
    if (!IsElement(child, "Resource", kSwidNamespace)) {
      return Invalid(
          absl::StrCat("Payload holds an unsupported element '", FromXml(child->name), "'"));
    }
    if (rim.measurements.size() == kMaxRimMeasurementCount) {
      return Invalid(absl::StrCat("Payload has more than ", kMaxRimMeasurementCount, " entries"));
    }
    ASSIGN_OR_RETURN(RimMeasurement measurement, ParseResource(child, position++));
    if (!seen.insert(measurement.index).second) {
      return Invalid(absl::StrCat("index ", measurement.index, " appears twice in the Payload"));
    }
    rim.measurements.push_back(std::move(measurement));
  }
  return absl::OkStatus();
}

// The signature elements anywhere in the document.
void CollectSignatures(xmlNode* node, std::vector<xmlNode*>& out) {
  for (xmlNode* child = node; child != nullptr; child = child->next) {
    if (child->type != XML_ELEMENT_NODE) continue;
    if (IsElement(child, "Signature", kDsigNamespace)) out.push_back(child);
    CollectSignatures(child->children, out);
  }
}

xmlNode* FirstChildElement(xmlNode* parent, const char* name, std::string_view ns) {
  for (xmlNode* child = parent->children; child != nullptr; child = child->next) {
    if (IsElement(child, name, ns)) return child;
  }
  return nullptr;
}

// The one ds:Signature, which must be a child of the root.
absl::StatusOr<xmlNode*> FindSignature(xmlDoc* doc) {
  xmlNode* root = xmlDocGetRootElement(doc);
  std::vector<xmlNode*> signatures;
  CollectSignatures(root, signatures);
  if (signatures.empty()) return Invalid("the document has no ds:Signature");
  if (signatures.size() > 1) {
    return Invalid(absl::StrCat("the document has ", signatures.size(),
                                " ds:Signature elements; exactly one is accepted"));
  }
  if (signatures[0]->parent != root) {
    return Invalid("the ds:Signature is not a child of the root element (not enveloped)");
  }
  return signatures[0];
}

// The certificates of KeyInfo/X509Data, in document order.
absl::StatusOr<std::vector<Certificate>> SignerChain(xmlNode* signature) {
  std::vector<Certificate> chain;
  xmlNode* key_info = FirstChildElement(signature, "KeyInfo", kDsigNamespace);
  if (key_info == nullptr) return chain;
  for (xmlNode* data = key_info->children; data != nullptr; data = data->next) {
    if (!IsElement(data, "X509Data", kDsigNamespace)) continue;
    for (xmlNode* cert = data->children; cert != nullptr; cert = cert->next) {
      if (!IsElement(cert, "X509Certificate", kDsigNamespace)) continue;
      if (chain.size() == kMaxSignerChainCount) {
        return Invalid(
            absl::StrCat("KeyInfo carries more than ", kMaxSignerChainCount, " certificates"));
      }
      XmlCharPtr text(xmlNodeGetContent(cert));
      absl::StatusOr<Bytes> der = Base64Decode(FromXml(text.get()), /*skip_whitespace=*/true);
      if (!der.ok()) {
        return Invalid(absl::StrCat("KeyInfo certificate ", chain.size(),
                                    " is not base64: ", der.status().message()));
      }
      absl::StatusOr<Certificate> parsed = Certificate::FromDer(*der);
      if (!parsed.ok()) {
        return Invalid(absl::StrCat("KeyInfo certificate ", chain.size(),
                                    " does not parse: ", parsed.status().message()));
      }
      chain.push_back(std::move(*parsed));
    }
  }
  return chain;
}

absl::StatusOr<Rim> ParseRimDocument(xmlDoc* doc) {
  xmlNode* root = xmlDocGetRootElement(doc);
  if (root == nullptr) return Invalid("the document has no root element");
  if (!IsElement(root, "SoftwareIdentity", kSwidNamespace)) {
    return Invalid(absl::StrCat("the root element is '", FromXml(root->name), "' in namespace '",
                                NamespaceOf(root), "', not a SWID SoftwareIdentity"));
  }
  Rim rim;
  rim.name = Attribute(root, "name").value_or("");
  rim.tag_id = Attribute(root, "tagId").value_or("");
  rim.version = Attribute(root, "version").value_or("");
  rim.tag_version = Attribute(root, "tagVersion").value_or("");
  const xmlNode* meta = nullptr;
  const xmlNode* payload = nullptr;
  for (xmlNode* child = root->children; child != nullptr; child = child->next) {
    if (child->type != XML_ELEMENT_NODE) continue;
    if (IsElement(child, "Meta", kSwidNamespace)) {
      if (meta != nullptr) return Invalid("more than one Meta element");
      meta = child;
    } else if (IsElement(child, "Payload", kSwidNamespace)) {
      if (payload != nullptr) return Invalid("more than one Payload element");
      payload = child;
    } else if (IsElement(child, "Entity", kSwidNamespace)) {
      if (rim.creator.empty()) rim.creator = Attribute(child, "name").value_or("");
    }
    // Other SWID elements (Link, Evidence, ...) and the signature carry nothing we use.
  }
  if (meta == nullptr) return Invalid("no Meta element");
  if (payload == nullptr) return Invalid("no Payload element");
  RETURN_IF_ERROR(ParseMeta(meta, rim));
  RETURN_IF_ERROR(ParsePayload(payload, rim));

  std::vector<xmlNode*> signatures;
  CollectSignatures(root, signatures);
  if (signatures.size() == 1) {
    ASSIGN_OR_RETURN(rim.signer_chain, SignerChain(signatures[0]));
  }
  return rim;
}

// ---- signature checks ----

std::string Rfc3339(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}

bool IsSelfSigned(const Certificate& cert) {
  X509* x509 = static_cast<X509*>(cert.native());
  return X509_check_issued(x509, x509) == X509_V_OK;
}

// Verifies `chain` to `root` at `at`; with `allow_expired`, a chain that fails only because a
// certificate has expired is accepted when it verifies at a moment every certificate was
// valid.
absl::Status VerifySignerChain(const std::vector<Certificate>& chain, const Certificate& root,
                               absl::Time at, bool allow_expired, RimSignatureInfo& info) {
  std::vector<const Certificate*> involved = {&root};
  for (const Certificate& cert : chain) {
    if (!IsSelfSigned(cert)) involved.push_back(&cert);
  }
  info.earliest_expiry = absl::InfiniteFuture();
  std::vector<std::string> expired;
  absl::Time latest_start = absl::InfinitePast();
  for (const Certificate* cert : involved) {
    info.earliest_expiry = std::min(info.earliest_expiry, cert->NotAfter());
    latest_start = std::max(latest_start, cert->NotBefore());
    if (cert->NotAfter() < at) {
      expired.push_back(
          absl::StrCat("'", cert->SubjectCommonName(), "' expired on ", Rfc3339(cert->NotAfter())));
    }
  }
  absl::Status status = VerifyChain(chain, root, at);
  if (status.ok()) return status;
  if (expired.empty()) {
    return absl::PermissionDeniedError(absl::StrCat("RIM signer chain: ", status.message()));
  }
  const std::string expiry = absl::StrCat("RIM signer certificate ", absl::StrJoin(expired, ", "),
                                          " (verification time ", Rfc3339(at), ")");
  if (!allow_expired) return absl::PermissionDeniedError(expiry);
  if (latest_start > info.earliest_expiry) {
    return absl::PermissionDeniedError(
        absl::StrCat(expiry, "; the certificates were never valid at the same time"));
  }
  absl::Status at_start = VerifyChain(chain, root, latest_start);
  if (!at_start.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        expiry, "; and the chain does not verify either while it was valid: ", at_start.message()));
  }
  info.expired_but_allowed = true;
  return absl::OkStatus();
}

absl::Status EnableTransforms(xmlSecDSigCtx* ctx) {
  // Canonicalization for SignedInfo and the one signature algorithm NVIDIA uses.
  for (xmlSecTransformId id : {xmlSecTransformInclC14NId, xmlSecTransformInclC14N11Id,
                               xmlSecTransformExclC14NId, xmlSecOpenSSLTransformEcdsaSha384Id}) {
    if (xmlSecDSigCtxEnableSignatureTransform(ctx, id) < 0) {
      return absl::InternalError("xmlsec: enabling a signature transform failed");
    }
  }
  for (xmlSecTransformId id :
       {xmlSecTransformEnvelopedId, xmlSecTransformInclC14NId, xmlSecTransformInclC14N11Id,
        xmlSecTransformExclC14NId, xmlSecOpenSSLTransformSha384Id}) {
    if (xmlSecDSigCtxEnableReferenceTransform(ctx, id) < 0) {
      return absl::InternalError("xmlsec: enabling a reference transform failed");
    }
  }
  ctx->enabledReferenceUris = xmlSecTransformUriTypeEmpty;
  ctx->flags |= XMLSEC_DSIG_FLAGS_IGNORE_MANIFESTS;
  return absl::OkStatus();
}

// Wraps an OpenSSL key (public or private) as the context's signing key; the context owns it.
absl::Status SetSignKey(xmlSecDSigCtx* ctx, EVP_PKEY* pkey) {
  EVP_PKEY_up_ref(pkey);
  xmlSecKeyDataPtr data = xmlSecOpenSSLEvpKeyAdopt(pkey);
  if (data == nullptr) {
    EVP_PKEY_free(pkey);
    return absl::InvalidArgumentError("RIM: xmlsec does not accept the signer's key");
  }
  xmlSecKeyPtr key = xmlSecKeyCreate();
  if (key == nullptr || xmlSecKeySetValue(key, data) < 0) {
    xmlSecKeyDataDestroy(data);
    if (key != nullptr) xmlSecKeyDestroy(key);
    return absl::InternalError("RIM: xmlsec could not wrap the signer's key");
  }
  ctx->signKey = key;
  return absl::OkStatus();
}

absl::Status VerifyXmlSignature(xmlNode* signature, const Certificate& signer) {
  ScopedXmlsecErrors errors;
  DsigCtxPtr ctx(xmlSecDSigCtxCreate(nullptr));
  if (ctx == nullptr) return absl::InternalError("RIM: cannot create an xmlsec context");
  RETURN_IF_ERROR(EnableTransforms(ctx.get()));
  // The key is the validated signer's, set before verification so that xmlsec never takes a
  // key from KeyInfo (it reads KeyInfo only when no key is set and a key manager exists).
  RETURN_IF_ERROR(SetSignKey(ctx.get(), X509_get0_pubkey(static_cast<X509*>(signer.native()))));
  if (xmlSecDSigCtxVerify(ctx.get(), signature) < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("RIM XML signature could not be processed: ", errors.Summary()));
  }
  if (xmlSecPtrListGetSize(&ctx->signedInfoReferences) != 1) {
    return absl::PermissionDeniedError(
        "RIM XML signature must have exactly one Reference (to the whole document)");
  }
  auto* reference =
      static_cast<xmlSecDSigReferenceCtx*>(xmlSecPtrListGetItem(&ctx->signedInfoReferences, 0));
  if (reference == nullptr || reference->uri == nullptr || reference->uri[0] != '\0') {
    return absl::PermissionDeniedError("RIM XML signature's Reference is not URI=\"\"");
  }
  if (ctx->status == xmlSecDSigStatusSucceeded) return absl::OkStatus();
  if (reference->status != xmlSecDSigStatusSucceeded) {
    return absl::PermissionDeniedError(
        "RIM XML signature: the digest of the document does not match (it was changed after "
        "signing)");
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "RIM XML signature does not verify with the key of '", signer.SubjectCommonName(), "'"));
}

// ---- writing ----

std::string EscapeAttribute(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      // Literal whitespace in an attribute would be normalized to a space when read back.
      case '\t':
        out += "&#9;";
        break;
      case '\n':
        out += "&#10;";
        break;
      case '\r':
        out += "&#13;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace

const RimMeasurement* Rim::Find(uint32_t index) const {
  for (const RimMeasurement& measurement : measurements) {
    if (measurement.index == index) return &measurement;
  }
  return nullptr;
}

std::vector<const RimMeasurement*> Rim::ActiveMeasurements() const {
  std::vector<const RimMeasurement*> out;
  for (const RimMeasurement& measurement : measurements) {
    if (measurement.active) out.push_back(&measurement);
  }
  return out;
}

absl::StatusOr<Rim> ParseRim(std::string_view xml) {
  RETURN_IF_ERROR(EnsureXmlsecInitialized());
  ScopedLibxmlSilence silence;
  ASSIGN_OR_RETURN(DocPtr doc, ParseXml(xml));
  return ParseRimDocument(doc.get());
}

absl::StatusOr<RimSignatureInfo> VerifyRimSignature(std::string_view xml,
                                                    const Certificate& corim_root, absl::Time at,
                                                    bool allow_expired) {
  RETURN_IF_ERROR(EnsureXmlsecInitialized());
  ScopedLibxmlSilence silence;
  ASSIGN_OR_RETURN(DocPtr doc, ParseXml(xml));
  xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr || !IsElement(root, "SoftwareIdentity", kSwidNamespace)) {
    return Invalid("the root element is not a SWID SoftwareIdentity");
  }
  ASSIGN_OR_RETURN(xmlNode * signature, FindSignature(doc.get()));
  RimSignatureInfo info;
  ASSIGN_OR_RETURN(info.chain, SignerChain(signature));
  if (info.chain.empty()) {
    return Invalid("the signature's KeyInfo carries no X509Certificate");
  }
  const Certificate& signer = info.chain[0];
  info.signer = signer.SubjectCommonName();
  absl::StatusOr<crypto::EcCurve> curve = signer.KeyCurve();
  if (!curve.ok() || *curve != crypto::EcCurve::kP384) {
    return absl::PermissionDeniedError(
        absl::StrCat("RIM signer '", info.signer, "' does not hold a P-384 key"));
  }
  RETURN_IF_ERROR(VerifySignerChain(info.chain, corim_root, at, allow_expired, info));
  RETURN_IF_ERROR(VerifyXmlSignature(signature, signer));
  return info;
}

std::string RimToXml(const Rim& rim) {
  auto attr = [](absl::string_view name, absl::string_view value) {
    return absl::StrCat(" ", name, "=\"", EscapeAttribute(value), "\"");
  };
  std::string out = absl::StrCat(
      "<SoftwareIdentity xmlns=\"", Sv(kSwidNamespace), "\" xmlns:ns0=\"", Sv(kSwidNamespace),
      "\" xmlns:ns2=\"", Sv(kSha384HashNamespace), "\" corpus=\"false\"", attr("name", rim.name),
      " patch=\"false\" supplemental=\"false\"", attr("tagId", rim.tag_id),
      attr("version", rim.version), attr("tagVersion", rim.tag_version), ">\n");
  absl::StrAppend(&out, "    <ns0:Entity", attr("name", rim.creator),
                  " role=\"softwareCreator tagCreator\"/>\n");
  absl::StrAppend(&out, "    <ns0:Meta xmlns:ns1=\"", Sv(kTcgRimNamespace), "\"",
                  attr("colloquialVersion", rim.colloquial_version), attr("edition", rim.edition),
                  attr("product", rim.product), attr("revision", rim.revision),
                  " PayloadType=\"direct\"", attr("ns1:BindingSpec", rim.binding_spec),
                  attr("ns1:BindingSpecVersion", rim.binding_spec_version),
                  attr("ns1:PlatformManufacturerId", rim.platform_manufacturer_id),
                  attr("ns1:PlatformModel", rim.platform_model),
                  attr("ns1:FirmwareManufacturerId", rim.firmware_manufacturer_id), "/>\n");
  absl::StrAppend(&out, "    <ns0:Payload>\n");
  for (const RimMeasurement& m : rim.measurements) {
    absl::StrAppend(&out, "        <ns0:Resource type=\"Measurement\"",
                    attr("index", absl::StrCat(m.index)),
                    attr("active", m.active ? "True" : "False"),
                    attr("alternatives", absl::StrCat(m.alternatives.size())));
    for (size_t k = 0; k < m.alternatives.size(); ++k) {
      absl::StrAppend(&out, attr(absl::StrCat("ns2:Hash", k), HexEncode(m.alternatives[k])));
    }
    absl::StrAppend(&out, attr("name", m.name), attr("size", absl::StrCat(m.size)), "/>\n");
  }
  absl::StrAppend(&out, "    </ns0:Payload>\n</SoftwareIdentity>\n");
  return out;
}

absl::StatusOr<std::string> SignRimXml(std::string_view xml, const crypto::EcPrivateKey& signer_key,
                                       const std::vector<Certificate>& chain) {
  if (chain.empty()) return absl::InvalidArgumentError("RIM signing: no certificate chain");
  if (chain[0].PublicKeyDer() != signer_key.PublicKeyDer()) {
    return absl::InvalidArgumentError(
        "RIM signing: the first certificate does not hold the signing key");
  }
  RETURN_IF_ERROR(EnsureXmlsecInitialized());
  ScopedLibxmlSilence silence;
  ASSIGN_OR_RETURN(DocPtr doc, ParseXml(xml));
  xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr) return Invalid("the document has no root element");
  std::vector<xmlNode*> existing;
  CollectSignatures(root, existing);
  if (!existing.empty()) return Invalid("the document is already signed");

  xmlNode* signature =
      xmlSecTmplSignatureCreateNsPref(doc.get(), xmlSecTransformInclC14N11Id,
                                      xmlSecOpenSSLTransformEcdsaSha384Id, nullptr, X("ds"));
  if (signature == nullptr) return absl::InternalError("RIM signing: template failed");
  xmlAddChild(root, signature);
  xmlNode* reference = xmlSecTmplSignatureAddReference(signature, xmlSecOpenSSLTransformSha384Id,
                                                       nullptr, X(""), nullptr);
  if (reference == nullptr ||
      xmlSecTmplReferenceAddTransform(reference, xmlSecTransformEnvelopedId) == nullptr ||
      xmlSecTmplReferenceAddTransform(reference, xmlSecTransformInclC14N11Id) == nullptr) {
    return absl::InternalError("RIM signing: reference template failed");
  }

  ScopedXmlsecErrors errors;
  DsigCtxPtr ctx(xmlSecDSigCtxCreate(nullptr));
  if (ctx == nullptr) return absl::InternalError("RIM signing: cannot create an xmlsec context");
  RETURN_IF_ERROR(SetSignKey(ctx.get(), static_cast<EVP_PKEY*>(signer_key.evp_pkey())));
  if (xmlSecDSigCtxSign(ctx.get(), signature) < 0) {
    return absl::InternalError(absl::StrCat("RIM signing failed: ", errors.Summary()));
  }
  // KeyInfo is outside SignedInfo, so it can be added after signing.
  xmlNode* key_info = xmlSecTmplSignatureEnsureKeyInfo(signature, nullptr);
  xmlNode* x509_data = key_info != nullptr ? xmlSecTmplKeyInfoAddX509Data(key_info) : nullptr;
  if (x509_data == nullptr) return absl::InternalError("RIM signing: KeyInfo template failed");
  for (const Certificate& cert : chain) {
    xmlNode* node = xmlSecAddChild(x509_data, xmlSecNodeX509Certificate, xmlSecDSigNs);
    if (node == nullptr) return absl::InternalError("RIM signing: X509Certificate failed");
    std::string encoded = Base64Encode(cert.ToDer());
    xmlNodeSetContent(node, X(encoded.c_str()));
  }
  xmlChar* text = nullptr;
  int size = 0;
  xmlDocDumpMemory(doc.get(), &text, &size);
  if (text == nullptr) return absl::InternalError("RIM signing: serializing failed");
  XmlCharPtr owned(text);
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(size));
}

}  // namespace cloister::attest
