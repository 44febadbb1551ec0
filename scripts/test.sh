#!/usr/bin/env bash
# One command to run Cloister's tests on a fresh Debian bookworm machine: installs what is
# missing, builds, checks the lock annotations with clang, and runs ctest without the tests
# labelled gpu or slow (set CLOISTER_TEST_ALL=1 to run those as well). CI runs exactly this
# (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DCLOISTER_BUILD_TESTS=ON
# The official openai npm package (pinned) for the proxy's client test; without the npm
# registry that one case skips and says so.
tests/integration/openai/install-openai.sh build/openai-node ||
  echo "test.sh: openai npm package not installed; OpenAiProxyTest.TheOpenAiNpmPackageDrivesTheProxy will skip" >&2
# The lock annotations, checked by clang 14 with -Werror=thread-safety: the trusted program
# (cloister-enclave and every library it links), the scheduler and the receipt log, in
# ./build-tsa (the "tsa" presets name the targets).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
cmake --preset tsa >/dev/null
cmake --build --preset tsa -j "$(nproc)"
if [ "${CLOISTER_TEST_ALL:-0}" = "1" ]; then
  ctest --preset all -j "$(nproc)"
else
  ctest --preset default -j "$(nproc)"
fi
