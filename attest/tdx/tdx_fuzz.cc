// libFuzzer target for the TDX quote parser and the verifier's handling of any quote.
// Invariants: what parses has a signed region of the exact header + body size and a body of the
// size its type names; verification never crashes and never passes (no policy accepts it here).
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"
#include "attest/tdx/tdx_quote.h"
#include "attest/tdx/tdx_verifier.h"
#include "base/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cloister;
  using namespace cloister::attest;
  ByteSpan input(data, size);
  auto quote = ParseTdxQuote(input);
  if (quote.ok()) {
    const size_t body_size =
        quote->body_type == kTdxBodyType15 ? kTdReportBody15Size : kTdReportBody10Size;
    const size_t descriptor_size = quote->header.version == 5 ? 6 : 0;
    CLOISTER_CHECK(quote->signed_size == kTdxQuoteHeaderSize + descriptor_size + body_size);
    CLOISTER_CHECK(quote->signed_size + 4 + quote->signature_data_size + quote->trailing_size ==
                   size);
    CLOISTER_CHECK(quote->body.tee_tcb_svn2.has_value() == (quote->body_type == kTdxBodyType15));
  }
  TdxInput tdx;
  tdx.quote = Bytes(input.begin(), input.end());
  Policy policy;
  policy.add_enclave_measurements(std::string(96, '0'));
  auto verdict = VerifyTdxQuote(tdx, policy, absl::FromUnixSeconds(1687219200));
  CLOISTER_CHECK(verdict.ok());
  CLOISTER_CHECK(!verdict->pass);
  return 0;
}
