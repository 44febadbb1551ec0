// libFuzzer target for the SEV-SNP report parser and the verifier's handling of a report it
// cannot authenticate. Invariant: whatever parses re-encodes to exactly the same bytes (the
// parser accepts nothing that it would not itself produce), and verification never crashes.
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"
#include "attest/snp/snp_verifier.h"
#include "attest/snp_report.h"
#include "base/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cloister;
  using namespace cloister::attest;
  ByteSpan input(data, size);
  auto report = ParseSnpReport(input);
  if (report.ok()) {
    auto encoded = EncodeSnpReportToSign(*report);
    CLOISTER_CHECK(encoded.ok());
    CLOISTER_CHECK(SetSnpSignature(*encoded, report->signature).ok());
    CLOISTER_CHECK(*encoded == Bytes(input.begin(), input.end()));
  }
  SnpInput snp;
  snp.report = Bytes(input.begin(), input.end());
  snp.vcek_der_or_pem = snp.report;
  Policy policy;
  policy.add_enclave_measurements(std::string(96, '0'));
  auto verdict = VerifySnpReport(snp, policy, absl::FromUnixSeconds(1700000000));
  CLOISTER_CHECK(verdict.ok());
  CLOISTER_CHECK(!verdict->pass);
  return 0;
}
