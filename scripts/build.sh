#!/usr/bin/env bash
# Configures and builds Cloister in ./build (the "default" preset). Pass extra CMake
# arguments after the script name, e.g. -DCLOISTER_BUILD_TESTS=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
# Let ccache share results between clones in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
cmake --preset default "$@" >/dev/null
cmake --build --preset default -j "$(nproc)"
