// Fuzz target for the RIM reader: ParseRim and VerifyRimSignature on arbitrary bytes must
// return a status, never crash, hang or fetch anything. The signature check runs against a
// throw-away root made once, so inputs exercise xmlsec's parsing and reference processing.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/time/time.h"
#include "attest/nvidia/rim.h"
#include "attest/x509.h"
#include "base/status.h"
#include "crypto/ecdsa.h"

namespace {

const cloister::attest::Certificate& FuzzRoot() {
  static const cloister::attest::Certificate* const root = [] {
    auto key = cloister::crypto::EcPrivateKey::Generate(cloister::crypto::EcCurve::kP384);
    CLOISTER_CHECK(key.ok());
    cloister::attest::CertificateTemplate spec;
    spec.common_name = "Cloister fuzz CoRIM root";
    spec.is_ca = true;
    spec.not_before = absl::FromUnixSeconds(0);
    spec.not_after = absl::FromUnixSeconds(4102444800);  // 2100-01-01
    auto cert = cloister::attest::IssueCertificate(spec, (*key)->PublicKeyDer(), nullptr, **key);
    CLOISTER_CHECK(cert.ok());
    return new cloister::attest::Certificate(*cert);
  }();
  return *root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view xml(reinterpret_cast<const char*>(data), size);
  auto rim = cloister::attest::ParseRim(xml);
  if (rim.ok()) {
    // A parsed RIM must survive a write/read round trip unchanged.
    cloister::attest::Rim copy = *rim;
    copy.signer_chain.clear();
    auto again = cloister::attest::ParseRim(cloister::attest::RimToXml(copy));
    CLOISTER_CHECK(again.ok() && again->measurements == copy.measurements &&
                   again->colloquial_version == copy.colloquial_version);
  }
  (void)cloister::attest::VerifyRimSignature(xml, FuzzRoot(), absl::FromUnixSeconds(1717200000));
  return 0;
}
