#include "attest/x509.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "attest/string_view.h"
#include "base/status.h"
#include "crypto/random.h"

namespace cloister::attest {
namespace {

struct BioDeleter {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct X509Deleter {
  void operator()(X509* p) const { X509_free(p); }
};
struct StoreDeleter {
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
};
struct StoreCtxDeleter {
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
};
struct StackDeleter {
  void operator()(STACK_OF(X509) * p) const { sk_X509_free(p); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct ObjectDeleter {
  void operator()(ASN1_OBJECT* p) const { ASN1_OBJECT_free(p); }
};
struct OctetDeleter {
  void operator()(ASN1_OCTET_STRING* p) const { ASN1_OCTET_STRING_free(p); }
};
struct ExtensionDeleter {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
struct BnDeleter {
  void operator()(BIGNUM* p) const { BN_free(p); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using StorePtr = std::unique_ptr<X509_STORE, StoreDeleter>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, StoreCtxDeleter>;
using StackPtr = std::unique_ptr<STACK_OF(X509), StackDeleter>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using ObjectPtr = std::unique_ptr<ASN1_OBJECT, ObjectDeleter>;
using OctetPtr = std::unique_ptr<ASN1_OCTET_STRING, OctetDeleter>;
using ExtensionPtr = std::unique_ptr<X509_EXTENSION, ExtensionDeleter>;
using BnPtr = std::unique_ptr<BIGNUM, BnDeleter>;

constexpr absl::string_view kPemBegin = "-----BEGIN CERTIFICATE-----";
constexpr absl::string_view kPemEnd = "-----END CERTIFICATE-----";

X509* Native(const Certificate& cert) { return static_cast<X509*>(cert.native()); }

// Drains OpenSSL's error queue for this thread into one status.
absl::Status OpenSslError(absl::StatusCode code, absl::string_view operation) {
  std::string reasons;
  unsigned long err;
  while ((err = ERR_get_error()) != 0) {
    char buffer[256];
    ERR_error_string_n(err, buffer, sizeof(buffer));
    absl::StrAppend(&reasons, reasons.empty() ? "" : "; ", buffer);
  }
  return absl::Status(code,
                      absl::StrCat(operation, " failed", reasons.empty() ? "" : ": ", reasons));
}

std::string BioToString(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return size > 0 ? std::string(data, static_cast<size_t>(size)) : std::string();
}

std::string NameEntry(const X509_NAME* name, int nid) {
  int index = X509_NAME_get_index_by_NID(name, nid, -1);
  if (index < 0) return "";
  const ASN1_STRING* value = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  int size = ASN1_STRING_to_UTF8(&utf8, value);
  if (size < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(size));
  OPENSSL_free(utf8);
  return out;
}

absl::Time FromAsn1Time(const ASN1_TIME* time) {
  struct tm parts = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &parts) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&parts));
}

absl::Status SetTime(ASN1_TIME* field, absl::Time time) {
  if (ASN1_TIME_set(field, absl::ToTimeT(time)) == nullptr) {
    return OpenSslError(absl::StatusCode::kInvalidArgument, "ASN1_TIME_set");
  }
  return absl::OkStatus();
}

absl::Status AddConfExtension(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
  ExtensionPtr ext(X509V3_EXT_conf_nid(nullptr, ctx, nid, value));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, absl::StrCat("adding extension ", value));
  }
  return absl::OkStatus();
}

// DER length octets.
void AppendDerLength(Bytes& out, size_t size) {
  if (size < 0x80) {
    out.push_back(static_cast<uint8_t>(size));
    return;
  }
  Bytes digits;
  for (size_t v = size; v > 0; v >>= 8) digits.insert(digits.begin(), static_cast<uint8_t>(v));
  out.push_back(static_cast<uint8_t>(0x80 | digits.size()));
  Append(out, digits);
}

Bytes DerElement(uint8_t tag, ByteSpan contents) {
  Bytes out = {tag};
  AppendDerLength(out, contents.size());
  Append(out, contents);
  return out;
}

// Parses one whole DER element with the given tag (definite, minimal length) and returns its
// contents.
absl::StatusOr<ByteSpan> ParseDerElement(ByteSpan der, uint8_t tag, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("DER ", what, ": ", why));
  };
  if (der.size() < 2) return bad("too short");
  if (der[0] != tag)
    return bad(absl::StrCat("tag 0x", absl::Hex(der[0]), ", expected 0x", absl::Hex(tag)));
  size_t size = der[1];
  size_t header = 2;
  if (size & 0x80) {
    size_t count = size & 0x7F;
    if (count == 0 || count > 4 || der.size() < 2 + count) return bad("bad length");
    size = 0;
    for (size_t i = 0; i < count; ++i) size = size << 8 | der[2 + i];
    if (size < 0x80 || der[2] == 0) return bad("non-minimal length");
    header += count;
  }
  if (der.size() != header + size) return bad("length does not match the data");
  return der.subspan(header);
}

}  // namespace

// ---- Certificate ----

absl::StatusOr<Certificate> Certificate::FromPem(std::string_view pem) {
  ASSIGN_OR_RETURN(std::vector<Certificate> chain, ParsePemChain(pem, 1));
  return std::move(chain[0]);
}

absl::StatusOr<Certificate> Certificate::FromDer(ByteSpan der) {
  ERR_clear_error();
  const unsigned char* cursor = der.data();
  X509Ptr x509(d2i_X509(nullptr, &cursor, static_cast<long>(der.size())));
  if (x509 == nullptr)
    return OpenSslError(absl::StatusCode::kInvalidArgument, "parsing DER certificate");
  if (cursor != der.data() + der.size()) {
    return absl::InvalidArgumentError("DER certificate has trailing bytes");
  }
  return Certificate(x509.release());
}

Certificate::Certificate(const Certificate& other) : x509_(other.x509_) {
  X509_up_ref(static_cast<X509*>(x509_));
}
Certificate& Certificate::operator=(const Certificate& other) {
  if (this != &other) {
    X509_up_ref(static_cast<X509*>(other.x509_));
    X509_free(static_cast<X509*>(x509_));
    x509_ = other.x509_;
  }
  return *this;
}
Certificate::Certificate(Certificate&& other) noexcept : x509_(other.x509_) {
  // A moved-from certificate keeps a reference so that it stays valid (never null).
  X509_up_ref(static_cast<X509*>(x509_));
}
Certificate& Certificate::operator=(Certificate&& other) noexcept {
  return *this = static_cast<const Certificate&>(other);
}
Certificate::~Certificate() { X509_free(static_cast<X509*>(x509_)); }

std::string Certificate::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  CLOISTER_CHECK(bio != nullptr && PEM_write_bio_X509(bio.get(), Native(*this)) == 1);
  return BioToString(bio.get());
}

Bytes Certificate::ToDer() const {
  unsigned char* der = nullptr;
  int size = i2d_X509(Native(*this), &der);
  CLOISTER_CHECK(size > 0);
  Bytes out(der, der + size);
  OPENSSL_free(der);
  return out;
}

std::string Certificate::SubjectCommonName() const {
  return NameEntry(X509_get_subject_name(Native(*this)), NID_commonName);
}
std::string Certificate::IssuerCommonName() const {
  return NameEntry(X509_get_issuer_name(Native(*this)), NID_commonName);
}

std::string Certificate::SubjectName() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  CLOISTER_CHECK(bio != nullptr);
  X509_NAME_print_ex(bio.get(), X509_get_subject_name(Native(*this)), 0, XN_FLAG_RFC2253);
  return BioToString(bio.get());
}

Bytes Certificate::SerialNumber() const {
  BnPtr bn(ASN1_INTEGER_to_BN(X509_get0_serialNumber(Native(*this)), nullptr));
  CLOISTER_CHECK(bn != nullptr);
  Bytes out(BN_num_bytes(bn.get()));
  BN_bn2bin(bn.get(), out.data());
  return out;
}

std::string Certificate::SerialDecimal() const {
  BnPtr bn(ASN1_INTEGER_to_BN(X509_get0_serialNumber(Native(*this)), nullptr));
  CLOISTER_CHECK(bn != nullptr);
  char* text = BN_bn2dec(bn.get());
  CLOISTER_CHECK(text != nullptr);
  std::string out(text);
  OPENSSL_free(text);
  return out;
}

absl::Time Certificate::NotBefore() const {
  return FromAsn1Time(X509_get0_notBefore(Native(*this)));
}
absl::Time Certificate::NotAfter() const { return FromAsn1Time(X509_get0_notAfter(Native(*this))); }

Bytes Certificate::PublicKeyDer() const {
  unsigned char* der = nullptr;
  int size = i2d_PUBKEY(X509_get0_pubkey(Native(*this)), &der);
  if (size <= 0) return {};
  Bytes out(der, der + size);
  OPENSSL_free(der);
  return out;
}

absl::StatusOr<crypto::EcCurve> Certificate::KeyCurve() const {
  EVP_PKEY* key = X509_get0_pubkey(Native(*this));
  if (key == nullptr || !EVP_PKEY_is_a(key, "EC")) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate '", SubjectCommonName(), "' does not hold an EC key"));
  }
  char group[64] = {};
  size_t group_size = 0;
  if (EVP_PKEY_get_group_name(key, group, sizeof(group), &group_size) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("certificate '", SubjectCommonName(),
                                                   "' has an EC key without a named curve"));
  }
  int nid = OBJ_sn2nid(group);
  if (nid == NID_secp384r1) return crypto::EcCurve::kP384;
  if (nid == NID_X9_62_prime256v1) return crypto::EcCurve::kP256;
  return absl::InvalidArgumentError(absl::StrCat("certificate '", SubjectCommonName(),
                                                 "' has a key on unsupported curve ", group));
}

bool Certificate::IsCa() const { return X509_check_ca(Native(*this)) != 0; }

absl::StatusOr<Bytes> Certificate::ExtensionValue(std::string_view oid_text) const {
  absl::string_view oid = Sv(oid_text);
  ObjectPtr object(OBJ_txt2obj(std::string(oid).c_str(), 1));
  if (object == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("'", oid, "' is not a dotted OID"));
  }
  X509* x509 = Native(*this);
  int index = X509_get_ext_by_OBJ(x509, object.get(), -1);
  if (index < 0) {
    return absl::NotFoundError(
        absl::StrCat("certificate '", SubjectCommonName(), "' has no extension ", oid));
  }
  if (X509_get_ext_by_OBJ(x509, object.get(), index) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("certificate '", SubjectCommonName(),
                                                   "' has extension ", oid, " more than once"));
  }
  const ASN1_OCTET_STRING* data = X509_EXTENSION_get_data(X509_get_ext(x509, index));
  const unsigned char* bytes = ASN1_STRING_get0_data(data);
  return Bytes(bytes, bytes + ASN1_STRING_length(data));
}

// ---- chains ----

absl::StatusOr<std::vector<Certificate>> ParsePemChain(std::string_view pem, size_t max_count) {
  std::vector<Certificate> chain;
  absl::string_view rest = absl::StripAsciiWhitespace(Sv(pem));
  while (!rest.empty()) {
    if (!absl::StartsWith(rest, kPemBegin)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PEM chain: expected '", kPemBegin, "' after certificate ", chain.size()));
    }
    size_t end = rest.find(kPemEnd);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("PEM chain: certificate ", chain.size(), " has no END line"));
    }
    absl::string_view block = rest.substr(0, end + kPemEnd.size());
    rest = absl::StripLeadingAsciiWhitespace(rest.substr(block.size()));
    if (chain.size() == max_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("PEM chain: more than ", max_count, " certificates"));
    }
    ERR_clear_error();
    BioPtr bio(BIO_new_mem_buf(block.data(), static_cast<int>(block.size())));
    CLOISTER_CHECK(bio != nullptr);
    X509Ptr x509(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (x509 == nullptr) {
      return OpenSslError(absl::StatusCode::kInvalidArgument,
                          absl::StrCat("PEM chain: parsing certificate ", chain.size()));
    }
    chain.push_back(Certificate(x509.release()));
  }
  if (chain.empty()) return absl::InvalidArgumentError("PEM chain: no certificate");
  return chain;
}

std::string ChainToPem(const std::vector<Certificate>& chain) {
  std::string out;
  for (const Certificate& cert : chain) out += cert.ToPem();
  return out;
}

absl::Status VerifyChain(const std::vector<Certificate>& chain, const Certificate& trusted_root,
                         absl::Time at) {
  if (chain.empty()) return absl::InvalidArgumentError("certificate chain is empty");
  const Certificate& leaf = chain[0];
  if (leaf.IsCa()) {
    return absl::PermissionDeniedError(
        absl::StrCat("leaf certificate '", leaf.SubjectCommonName(), "' is a CA certificate"));
  }
  uint32_t usage = X509_get_key_usage(Native(leaf));
  if (usage != UINT32_MAX && (usage & KU_DIGITAL_SIGNATURE) == 0) {
    return absl::PermissionDeniedError(absl::StrCat("leaf certificate '", leaf.SubjectCommonName(),
                                                    "' does not allow digital signatures"));
  }
  ERR_clear_error();
  StorePtr store(X509_STORE_new());
  StackPtr untrusted(sk_X509_new_null());
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (store == nullptr || untrusted == nullptr || ctx == nullptr ||
      X509_STORE_add_cert(store.get(), Native(trusted_root)) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "setting up the certificate store");
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    X509* cert = Native(chain[i]);
    // A self-signed certificate from the evidence is a root the sender chose: never used.
    if (X509_check_issued(cert, cert) == X509_V_OK) continue;
    sk_X509_push(untrusted.get(), cert);
  }
  if (X509_STORE_CTX_init(ctx.get(), store.get(), Native(leaf), untrusted.get()) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "X509_STORE_CTX_init");
  }
  X509_VERIFY_PARAM_set_time(X509_STORE_CTX_get0_param(ctx.get()), absl::ToTimeT(at));
  if (X509_verify_cert(ctx.get()) == 1) return absl::OkStatus();

  int error = X509_STORE_CTX_get_error(ctx.get());
  int depth = X509_STORE_CTX_get_error_depth(ctx.get());
  X509* failed = X509_STORE_CTX_get_current_cert(ctx.get());
  std::string who = failed != nullptr ? NameEntry(X509_get_subject_name(failed), NID_commonName)
                                      : std::string("?");
  ERR_clear_error();
  return absl::PermissionDeniedError(absl::StrCat(
      "certificate chain does not verify to the pinned root '", trusted_root.SubjectCommonName(),
      "': ", X509_verify_cert_error_string(error), " (at '", who, "', depth ", depth, ")"));
}

absl::Status VerifyP1363WithCertificate(const Certificate& signer, crypto::HashAlg hash,
                                        ByteSpan message, ByteSpan signature) {
  ASSIGN_OR_RETURN(crypto::EcCurve curve, signer.KeyCurve());
  return crypto::EcdsaVerifyP1363(curve, hash, signer.PublicKeyDer(), message, signature);
}

absl::StatusOr<Bytes> DiceFwid(const Certificate& leaf) {
  ASSIGN_OR_RETURN(Bytes value, leaf.ExtensionValue(kTcgDiceFwidOid));
  if (value.size() < kFwidSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the DICE extension of '", leaf.SubjectCommonName(), "' is only ", value.size(), " bytes"));
  }
  return Bytes(value.end() - kFwidSize, value.end());
}

// ---- issuing ----

absl::StatusOr<Certificate> IssueCertificate(const CertificateTemplate& spec,
                                             ByteSpan subject_public_key_der,
                                             const Certificate* issuer,
                                             const crypto::EcPrivateKey& issuer_key) {
  ERR_clear_error();
  const unsigned char* cursor = subject_public_key_der.data();
  PkeyPtr subject_key(
      d2i_PUBKEY(nullptr, &cursor, static_cast<long>(subject_public_key_der.size())));
  if (subject_key == nullptr) {
    return OpenSslError(absl::StatusCode::kInvalidArgument, "parsing the subject public key");
  }
  X509Ptr cert(X509_new());
  CLOISTER_CHECK(cert != nullptr);
  X509_set_version(cert.get(), 2);  // v3

  Bytes serial = crypto::RandomBytes(16);
  serial[0] &= 0x7F;  // positive
  serial[0] |= 0x40;  // and exactly 16 bytes
  BnPtr serial_bn(BN_bin2bn(serial.data(), static_cast<int>(serial.size()), nullptr));
  if (serial_bn == nullptr ||
      BN_to_ASN1_INTEGER(serial_bn.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    return OpenSslError(absl::StatusCode::kInternal, "setting the serial number");
  }

  X509_NAME* name = X509_get_subject_name(cert.get());
  if (!spec.organization.empty() &&
      X509_NAME_add_entry_by_NID(name, NID_organizationName, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(spec.organization.c_str()),
                                 -1, -1, 0) != 1) {
    return OpenSslError(absl::StatusCode::kInvalidArgument, "setting the organization");
  }
  if (X509_NAME_add_entry_by_NID(name, NID_commonName, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(spec.common_name.c_str()),
                                 -1, -1, 0) != 1) {
    return OpenSslError(absl::StatusCode::kInvalidArgument, "setting the common name");
  }
  X509* issuer_x509 = issuer != nullptr ? Native(*issuer) : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer_x509)) != 1 ||
      X509_set_pubkey(cert.get(), subject_key.get()) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "setting issuer and key");
  }
  RETURN_IF_ERROR(SetTime(X509_getm_notBefore(cert.get()), spec.not_before));
  RETURN_IF_ERROR(SetTime(X509_getm_notAfter(cert.get()), spec.not_after));

  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer_x509, cert.get(), nullptr, nullptr, 0);
  if (spec.is_ca) {
    std::string constraints = "critical,CA:TRUE";
    if (spec.path_length >= 0) absl::StrAppend(&constraints, ",pathlen:", spec.path_length);
    RETURN_IF_ERROR(AddConfExtension(cert.get(), &ctx, NID_basic_constraints, constraints.c_str()));
    RETURN_IF_ERROR(
        AddConfExtension(cert.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    RETURN_IF_ERROR(AddConfExtension(cert.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE"));
    RETURN_IF_ERROR(AddConfExtension(cert.get(), &ctx, NID_key_usage, "critical,digitalSignature"));
  }
  RETURN_IF_ERROR(AddConfExtension(cert.get(), &ctx, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(AddConfExtension(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always"));
  for (const auto& [oid, value] : spec.extensions) {
    ObjectPtr object(OBJ_txt2obj(oid.c_str(), 1));
    OctetPtr data(ASN1_OCTET_STRING_new());
    if (object == nullptr || data == nullptr ||
        ASN1_OCTET_STRING_set(data.get(), value.data(), static_cast<int>(value.size())) != 1) {
      return OpenSslError(absl::StatusCode::kInvalidArgument,
                          absl::StrCat("encoding extension ", oid));
    }
    ExtensionPtr ext(X509_EXTENSION_create_by_OBJ(nullptr, object.get(), 0, data.get()));
    if (ext == nullptr || X509_add_ext(cert.get(), ext.get(), -1) != 1) {
      return OpenSslError(absl::StatusCode::kInternal, absl::StrCat("adding extension ", oid));
    }
  }
  if (X509_sign(cert.get(), static_cast<EVP_PKEY*>(issuer_key.evp_pkey()), EVP_sha384()) <= 0) {
    return OpenSslError(absl::StatusCode::kInternal, "signing the certificate");
  }
  return Certificate(cert.release());
}

// ---- DER ----

namespace der {

Bytes Integer(uint64_t value) {
  Bytes contents;
  do {
    contents.insert(contents.begin(), static_cast<uint8_t>(value));
    value >>= 8;
  } while (value != 0);
  if (contents[0] & 0x80) contents.insert(contents.begin(), 0);
  return DerElement(0x02, contents);
}

Bytes Ia5String(std::string_view text) { return DerElement(0x16, AsBytes(text)); }
Bytes OctetString(ByteSpan data) { return DerElement(0x04, data); }

Bytes Sequence(const std::vector<Bytes>& elements) {
  Bytes contents;
  for (const Bytes& element : elements) Append(contents, element);
  return DerElement(0x30, contents);
}

absl::StatusOr<Bytes> ObjectId(std::string_view dotted_text) {
  absl::string_view dotted = Sv(dotted_text);
  std::vector<absl::string_view> parts = absl::StrSplit(dotted, '.');
  std::vector<uint64_t> arcs;
  for (absl::string_view part : parts) {
    uint64_t arc;
    if (part.empty() || !absl::SimpleAtoi(part, &arc)) {
      return absl::InvalidArgumentError(absl::StrCat("'", dotted, "' is not a dotted OID"));
    }
    arcs.push_back(arc);
  }
  if (arcs.size() < 2 || arcs[0] > 2 || (arcs[0] < 2 && arcs[1] >= 40)) {
    return absl::InvalidArgumentError(absl::StrCat("'", dotted, "' is not a valid OID"));
  }
  Bytes contents;
  auto append_arc = [&](uint64_t arc) {
    Bytes digits;
    do {
      digits.insert(digits.begin(),
                    static_cast<uint8_t>((arc & 0x7F) | (digits.empty() ? 0 : 0x80)));
      arc >>= 7;
    } while (arc != 0);
    Append(contents, digits);
  };
  append_arc(arcs[0] * 40 + arcs[1]);
  for (size_t i = 2; i < arcs.size(); ++i) append_arc(arcs[i]);
  return DerElement(0x06, contents);
}

absl::StatusOr<uint64_t> ParseInteger(ByteSpan der) {
  ASSIGN_OR_RETURN(ByteSpan contents, ParseDerElement(der, 0x02, "INTEGER"));
  if (contents.empty()) return absl::InvalidArgumentError("DER INTEGER: empty");
  if (contents[0] & 0x80) return absl::InvalidArgumentError("DER INTEGER: negative");
  if (contents.size() > 1 && contents[0] == 0 && (contents[1] & 0x80) == 0) {
    return absl::InvalidArgumentError("DER INTEGER: non-minimal encoding");
  }
  size_t start = contents[0] == 0 ? 1 : 0;
  if (contents.size() - start > 8) return absl::InvalidArgumentError("DER INTEGER: too large");
  uint64_t value = 0;
  for (size_t i = start; i < contents.size(); ++i) value = value << 8 | contents[i];
  return value;
}

absl::StatusOr<std::string> ParseIa5String(ByteSpan der) {
  ASSIGN_OR_RETURN(ByteSpan contents, ParseDerElement(der, 0x16, "IA5String"));
  for (uint8_t c : contents) {
    if (c > 0x7F) return absl::InvalidArgumentError("DER IA5String: non-ASCII byte");
  }
  return ToString(contents);
}

}  // namespace der
}  // namespace cloister::attest
