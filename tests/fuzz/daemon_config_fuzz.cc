// Fuzz target for cloisterd's config loader (host/config/daemon_config.h): operators write these
// files by hand, so any text must give a config or a FILE:LINE error, never a crash. File checks
// are off (they would read the paths the text names).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "host/config/daemon_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = cloister::host::ParseDaemonConfig(absl::string_view(text.data(), text.size()),
                                                  "fuzz.yaml");
  (void)config;
  return 0;
}
