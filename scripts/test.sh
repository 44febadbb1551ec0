#!/usr/bin/env bash
# One command to run Cloister's tests on a fresh Debian bookworm machine: installs what is
# missing, builds, and runs ctest without the tests labelled gpu or slow (set
# CLOISTER_TEST_ALL=1 to run those as well). CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DCLOISTER_BUILD_TESTS=ON
if [ "${CLOISTER_TEST_ALL:-0}" = "1" ]; then
  ctest --preset all -j "$(nproc)"
else
  ctest --preset default -j "$(nproc)"
fi
