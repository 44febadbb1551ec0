#include "base/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>

namespace cloister {

bool KeepFreedBuffersForReuse() {
  if (std::getenv("GLIBC_TUNABLES") != nullptr || std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    return false;
  }
  bool applied = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapBufferLimit)) == 1;
  applied = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapKeepLimit)) == 1 && applied;
  return applied;
}

}  // namespace cloister
