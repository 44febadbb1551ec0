#!/usr/bin/env bash
# One command to try Cloister on a fresh Debian bookworm machine: installs what is missing,
# builds, and starts cloisterd on its embedded development default (simulated TEE, one
# enclave worker, CPU executor, 127.0.0.1:7700, data in ./cloister-data). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DCLOISTER_BUILD_TESTS=OFF
exec ./build/bin/cloisterd "$@"
