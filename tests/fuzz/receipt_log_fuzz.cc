// Fuzz target for the receipt log audit (host/receipts/receipt_log.h, `cloister-audit receipts`):
// the log comes from the untrusted host, so any bytes must give an audit or a DataLoss naming a
// line, never a crash.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "host/receipts/receipt_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto audit = cloister::host::AuditReceiptLines(in, "fuzz.jsonl");
  (void)audit;
  return 0;
}
