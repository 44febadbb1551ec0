// Fuzz target for the SPDM report parser (attest/spdm.h), which reads untrusted GPU evidence:
// any input must give a report or an error, never a crash. A report that parses must encode
// back to the bytes it was parsed from (everything before the signature).
#include <cstddef>
#include <cstdint>

#include "attest/spdm.h"
#include "base/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cloister::ByteSpan bytes(data, size);
  auto report = cloister::attest::ParseSpdmReport(bytes);
  if (!report.ok()) return 0;
  CLOISTER_CHECK(report->signed_size + cloister::attest::kSpdmSignatureSize == size);
  auto encoded = cloister::attest::EncodeSpdmReportToSign(*report);
  CLOISTER_CHECK(encoded.ok());
  CLOISTER_CHECK(cloister::Bytes(bytes.begin(), bytes.begin() + report->signed_size) == *encoded);
  return 0;
}
