#!/usr/bin/env bash
# Installs the peer runtimes the benchmarks in bench/ compare against. For now that is ONNX
# Runtime for Node.js (npm onnxruntime-node, CPU build), which cloister-bench runtime-vs-ort
# drives through bench/ort_peer.js.
#
#   scripts/install-bench-deps.sh [DIR]
#
# DIR defaults to $CLOISTER_ORT_DIR, else bench/ortpeer in the source tree (ignored by git).
# The package lands in DIR/node_modules; pass that folder to cloister-bench with --ort-dir (or
# set CLOISTER_ORT_DIR=DIR) when it is not the default. Does nothing when the pinned version is
# already there. Needs node and npm (Debian: apt-get install nodejs npm) and access to the npm
# registry.
set -euo pipefail

ORT_VERSION="1.30.0"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-${CLOISTER_ORT_DIR:-$root/bench/ortpeer}}"

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-bench-deps: $tool not found; install Node.js and npm first (apt-get install nodejs npm)" >&2
    exit 1
  fi
done

installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
    "$dir/node_modules/onnxruntime-node/package.json" 2>/dev/null || true
}

loads() {
  node -e 'require(process.argv[1])' "$dir/node_modules/onnxruntime-node" >/dev/null 2>&1
}

if [ "$(installed_version)" = "$ORT_VERSION" ] && loads; then
  echo "onnxruntime-node $ORT_VERSION already in $dir/node_modules"
  exit 0
fi

mkdir -p "$dir"
cd "$dir"
if [ ! -f package.json ]; then
  # A private package so npm does not ask for a name, version or licence.
  printf '{\n  "name": "cloister-bench-peers",\n  "private": true\n}\n' > package.json
fi
# The package's install script only fetches CUDA/TensorRT binaries through nuget; the CPU
# library ships inside the npm tarball, so the script is skipped.
ONNXRUNTIME_NODE_INSTALL=skip npm install --no-audit --no-fund --save-exact \
  "onnxruntime-node@$ORT_VERSION"

if [ "$(installed_version)" != "$ORT_VERSION" ] || ! loads; then
  echo "install-bench-deps: onnxruntime-node $ORT_VERSION did not load from $dir/node_modules" >&2
  exit 1
fi
echo "onnxruntime-node $ORT_VERSION installed in $dir/node_modules"
