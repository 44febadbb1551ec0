// Temporary folders for tests, removed when the test process exits. Its own small library
// (cloister_test_temp_dir, layer base), so that tests of every layer can use it.
#pragma once

#include <string>

namespace cloister::testing {

// A fresh folder "$TMPDIR/PREFIX-XXXXXX" (/tmp without TMPDIR), removed with its contents when
// the process exits (kept when CLOISTER_TEST_KEEP_TMP or CLOISTER_TEST_KEEP_CORE is set); "" if
// it cannot be made.
std::string MakeTempDir(const std::string& prefix);

}  // namespace cloister::testing
