#include "attest/nvidia/test_pki.h"

#include <openssl/evp.h>
#include <openssl/ocsp.h>
#include <openssl/x509.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "attest/test_util.h"
#include "crypto/hash.h"
#include "gtest/gtest.h"

namespace cloister::attest::testing {
namespace {

template <typename T>
T Must(absl::StatusOr<T> value) {
  if (!value.ok()) {
    ADD_FAILURE() << value.status();
    std::abort();
  }
  return std::move(*value);
}

X509* Native(const Certificate& cert) { return static_cast<X509*>(cert.native()); }

}  // namespace

absl::Time DefaultNotBefore() { return ParseTestTime("2020-01-01T00:00:00Z"); }
absl::Time DefaultNotAfter() { return ParseTestTime("2099-01-01T00:00:00Z"); }

TestIdentity MakeTestRoot(const std::string& common_name, absl::Time not_before,
                          absl::Time not_after) {
  auto key = Must(crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384));
  CertificateTemplate spec;
  spec.common_name = common_name;
  spec.organization = "Cloister Test";
  spec.is_ca = true;
  spec.not_before = not_before;
  spec.not_after = not_after;
  Certificate cert = Must(IssueCertificate(spec, key->PublicKeyDer(), nullptr, *key));
  return TestIdentity{std::move(key), std::move(cert)};
}

TestIdentity IssueTestCert(const TestIdentity& issuer, const std::string& common_name, bool is_ca,
                           std::vector<std::pair<std::string, Bytes>> extensions,
                           absl::Time not_before, absl::Time not_after) {
  auto key = Must(crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384));
  CertificateTemplate spec;
  spec.common_name = common_name;
  spec.organization = "Cloister Test";
  spec.is_ca = is_ca;
  spec.not_before = not_before;
  spec.not_after = not_after;
  spec.extensions = std::move(extensions);
  Certificate cert = Must(IssueCertificate(spec, key->PublicKeyDer(), &issuer.cert, *issuer.key));
  return TestIdentity{std::move(key), std::move(cert)};
}

std::string TestDevicePki::ChainPem() const {
  return ChainToPem({leaf.cert, brom.cert, ica.cert, identity.cert, root.cert});
}

TestDevicePki MakeTestDevicePki(const std::string& chip) {
  TestIdentity root = MakeTestRoot("Cloister Test Device Identity CA");
  TestIdentity identity = IssueTestCert(root, absl::StrCat("NVIDIA ", chip, " Identity"), true);
  TestIdentity ica =
      IssueTestCert(identity, absl::StrCat("NVIDIA ", chip, " Provisioner ICA 1"), true);
  TestIdentity brom = IssueTestCert(ica, absl::StrCat(chip, " A01 GSP BROM"), true);
  Bytes fwid = TestDigest(0xF1);
  // Hopper layout: INTEGER 1, the issuer's key, then (SHA-384 OID, FWID): the FWID is last.
  Bytes dice = der::Sequence(
      {der::Integer(1), der::OctetString(brom.cert.PublicKeyDer()),
       der::Sequence({Must(der::ObjectId("2.16.840.1.101.3.4.2.2")), der::OctetString(fwid)})});
  TestIdentity leaf = IssueTestCert(brom, absl::StrCat(chip, " A01 GSP FMC LF"), false,
                                    {{std::string(kTcgDiceFwidOid), dice}});
  return TestDevicePki{std::move(root), std::move(identity), std::move(ica),
                       std::move(brom), std::move(leaf),     std::move(fwid)};
}

std::vector<Certificate> TestRimPki::Chain() const {
  return {signer.cert, l3.cert, ca.cert, root.cert};
}

TestRimPki MakeTestRimPki(absl::Time signer_not_before, absl::Time signer_not_after) {
  TestIdentity root = MakeTestRoot("Cloister Test CoRIM signing Root CA");
  TestIdentity ca = IssueTestCert(root, "Cloister Test Reference Value GH100 CA", true);
  TestIdentity l3 = IssueTestCert(ca, "Cloister Test Reference Value L3 GH100 001", true);
  TestIdentity signer =
      IssueTestCert(l3, "HCC RIM L4 Signer", false, {}, signer_not_before, signer_not_after);
  return TestRimPki{std::move(root), std::move(ca), std::move(l3), std::move(signer)};
}

Bytes TestDigest(uint8_t seed) {
  Bytes input = {seed};
  return crypto::Sha384(input);
}

SpdmReport MakeTestReport(const TestReportSpec& spec) {
  SpdmReport report;
  report.requester_nonce = spec.nonce;
  report.responder_nonce = Bytes(32, 0x22);
  for (int index = 1; index <= 64; ++index) {
    SpdmMeasurementBlock block;
    block.index = static_cast<uint8_t>(index);
    block.value_type = 0x01;
    block.value = Bytes(48, 0);
    for (const auto& [value_index, value] : spec.block_values) {
      if (value_index == index) block.value = value;
    }
    report.blocks.push_back(std::move(block));
  }
  auto add = [&](OpaqueType type, Bytes value) {
    report.opaque_field_order.push_back(static_cast<uint16_t>(type));
    report.opaque_fields[static_cast<uint16_t>(type)] = std::move(value);
  };
  auto text = [](const std::string& s) {
    Bytes out = ToBytes(s);
    out.push_back(0);
    return out;
  };
  add(OpaqueType::kVbiosVersion, Must(EncodeVbiosVersion(spec.vbios_version)));
  add(OpaqueType::kBoardId, Bytes{0xB1, 0x03, 0x00, 0x00});
  add(OpaqueType::kChipSku, text("882"));
  add(OpaqueType::kChipSkuMod, text("0"));
  add(OpaqueType::kProject, text("1010"));
  add(OpaqueType::kProjectSku, text("0200"));
  add(OpaqueType::kProjectSkuMod, Bytes{0});
  add(OpaqueType::kDriverVersion, text(spec.driver_version));
  add(OpaqueType::kNvdec0Status, Bytes{spec.nvdec0_status});
  if (spec.fwid.has_value()) add(OpaqueType::kFwid, *spec.fwid);
  add(OpaqueType::kProtectedPcieStatus, Bytes{0x55});
  // Parse the encoding back so that the decoded fields (versions, NVDEC, FWID) are filled.
  Bytes bytes = Must(EncodeSpdmReportToSign(report));
  Append(bytes, Bytes(kSpdmSignatureSize, 0));
  return Must(ParseSpdmReport(bytes));
}

Bytes SignTestReport(const SpdmReport& report, const crypto::EcPrivateKey& leaf_key) {
  Bytes out = Must(EncodeSpdmReportToSign(report));
  Bytes signature = Must(leaf_key.SignP1363(crypto::HashAlg::kSha384, out));
  Append(out, signature);
  return out;
}

Rim MakeTestRim(const std::string& version,
                const std::vector<std::pair<uint32_t, std::vector<Bytes>>>& active) {
  Rim rim;
  rim.name = "GH100";
  rim.tag_id = std::string(96, 'a');
  rim.version = "1.0";
  rim.tag_version = "0";
  rim.creator = "NVIDIA Corporation";
  rim.colloquial_version = version;
  rim.product = "GH100";
  rim.edition = "GPU";
  rim.revision = "r1";
  rim.binding_spec = "RIMIM";
  rim.binding_spec_version = "1.01";
  rim.platform_manufacturer_id = "5703";
  rim.platform_model = "GH100";
  rim.firmware_manufacturer_id = "5703";
  for (uint32_t index = 0; index < 64; ++index) {
    RimMeasurement m;
    m.index = index;
    m.size = 48;
    m.name = absl::StrCat("Measurement_", index);
    m.alternatives = {Bytes(48, 0)};
    for (const auto& [active_index, values] : active) {
      if (active_index == index) {
        m.active = true;
        m.alternatives = values;
      }
    }
    rim.measurements.push_back(std::move(m));
  }
  return rim;
}

std::string SignTestRim(const Rim& rim, const TestRimPki& pki) {
  return Must(SignRimXml(RimToXml(rim), *pki.signer.key, pki.Chain()));
}

Bytes MakeTestOcspResponse(const Certificate& cert, const Certificate& issuer,
                           const TestIdentity& responder, TestOcspStatus status,
                           absl::Time this_update, std::optional<absl::Time> next_update) {
  OCSP_CERTID* id = OCSP_cert_to_id(EVP_sha384(), Native(cert), Native(issuer));
  OCSP_BASICRESP* basic = OCSP_BASICRESP_new();
  ASN1_TIME* this_time = ASN1_GENERALIZEDTIME_set(nullptr, absl::ToTimeT(this_update));
  ASN1_TIME* next_time = next_update.has_value()
                             ? ASN1_GENERALIZEDTIME_set(nullptr, absl::ToTimeT(*next_update))
                             : nullptr;
  ASN1_TIME* revoked_time = ASN1_GENERALIZEDTIME_set(nullptr, absl::ToTimeT(this_update));
  int code = V_OCSP_CERTSTATUS_GOOD;
  int reason = -1;
  if (status == TestOcspStatus::kRevoked) {
    code = V_OCSP_CERTSTATUS_REVOKED;
    reason = OCSP_REVOKED_STATUS_KEYCOMPROMISE;
  } else if (status == TestOcspStatus::kHold) {
    code = V_OCSP_CERTSTATUS_REVOKED;
    reason = OCSP_REVOKED_STATUS_CERTIFICATEHOLD;
  } else if (status == TestOcspStatus::kUnknown) {
    code = V_OCSP_CERTSTATUS_UNKNOWN;
  }
  EXPECT_NE(OCSP_basic_add1_status(basic, id, code, reason,
                                   code == V_OCSP_CERTSTATUS_REVOKED ? revoked_time : nullptr,
                                   this_time, next_time),
            nullptr);
  EXPECT_EQ(
      OCSP_basic_sign(basic, Native(responder.cert),
                      static_cast<EVP_PKEY*>(responder.key->evp_pkey()), EVP_sha384(), nullptr, 0),
      1);
  OCSP_RESPONSE* response = OCSP_response_create(OCSP_RESPONSE_STATUS_SUCCESSFUL, basic);
  unsigned char* der = nullptr;
  int size = i2d_OCSP_RESPONSE(response, &der);
  Bytes out(der, der + size);
  OPENSSL_free(der);
  OCSP_RESPONSE_free(response);
  OCSP_BASICRESP_free(basic);
  OCSP_CERTID_free(id);
  ASN1_TIME_free(this_time);
  ASN1_TIME_free(next_time);
  ASN1_TIME_free(revoked_time);
  return out;
}

std::string NvidiaPath(const std::string& relative) {
  return TestDataPath("nvidia-cc/" + relative);
}
std::string ReadNvidiaText(const std::string& relative) {
  return ReadTestText("nvidia-cc/" + relative);
}
Bytes ReadNvidiaHex(const std::string& relative) { return ReadTestHex("nvidia-cc/" + relative); }

absl::Time ParseTestTime(const std::string& rfc3339) {
  absl::Time time;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, rfc3339, &time, &error)) {
    ADD_FAILURE() << "bad time " << rfc3339 << ": " << error;
  }
  return time;
}

}  // namespace cloister::attest::testing
