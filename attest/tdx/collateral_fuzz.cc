// libFuzzer target for the PCS collateral parsers (signed JSON splitting, TCB info, QE
// identity) and the CRL parser: any input gives a value or an error, never a crash or a throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "attest/tdx/tdx_collateral.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cloister;
  using namespace cloister::attest;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (std::string_view member : {"tcbInfo", "enclaveIdentity"}) {
    auto signed_json = SplitSignedJson(text, member);
    if (signed_json.ok()) {
      (void)ParseTdxTcbInfo(signed_json->signed_text);
      (void)ParseQeIdentity(signed_json->signed_text);
    }
  }
  (void)ParseTdxTcbInfo(text);
  (void)ParseQeIdentity(text);
  (void)Crl::Parse(ByteSpan(data, size));
  return 0;
}
