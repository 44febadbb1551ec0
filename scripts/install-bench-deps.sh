#!/usr/bin/env bash
# Installs the peer runtimes the benchmarks in bench/ compare against:
#   - ONNX Runtime for Node.js (npm onnxruntime-node, CPU build), which cloister-bench
#     runtime-vs-ort drives through bench/ort_peer.js;
#   - llama.cpp for Node.js (npm node-llama-cpp with only its prebuilt linux-x64 CPU binary),
#     which cloister-bench llm-vs-llamacpp drives through bench/llama_peer.mjs.
#
#   scripts/install-bench-deps.sh [ORT_DIR [LLAMA_DIR]]
#
# ORT_DIR defaults to $CLOISTER_ORT_DIR, else bench/ortpeer in the source tree; LLAMA_DIR to
# $CLOISTER_LLAMA_DIR, else bench/ortpeer/llama-cpp (both ignored by git). Each package lands in
# its folder's node_modules; pass that folder to cloister-bench with --ort-dir / --llama-dir (or
# set the variable) when it is not the default. node-llama-cpp gets a folder of its own because
# it lists a dozen GPU builds (CUDA, Vulkan, ...) as optional dependencies: installed with
# --omit=optional, and a later plain `npm install` in a shared folder would fetch them all.
# Each part does nothing when its pinned version is already there and loads. Needs node and npm
# (Debian: apt-get install nodejs npm) and access to the npm registry.
set -euo pipefail

ORT_VERSION="1.30.0"
LLAMA_VERSION="3.21.1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-${CLOISTER_ORT_DIR:-$root/bench/ortpeer}}"
llama_dir="${2:-${CLOISTER_LLAMA_DIR:-$root/bench/ortpeer/llama-cpp}}"

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-bench-deps: $tool not found; install Node.js and npm first (apt-get install nodejs npm)" >&2
    exit 1
  fi
done

# The version in FOLDER/node_modules/PACKAGE/package.json, or nothing.
installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
    "$1/node_modules/$2/package.json" 2>/dev/null || true
}

# A private package.json so npm does not ask for a name, version or licence.
make_package_folder() {
  mkdir -p "$1"
  if [ ! -f "$1/package.json" ]; then
    printf '{\n  "name": "%s",\n  "private": true\n}\n' "$2" > "$1/package.json"
  fi
}

# --- onnxruntime-node -------------------------------------------------------------------------
ort_loads() {
  node -e 'require(process.argv[1])' "$dir/node_modules/onnxruntime-node" >/dev/null 2>&1
}

if [ "$(installed_version "$dir" onnxruntime-node)" = "$ORT_VERSION" ] && ort_loads; then
  echo "onnxruntime-node $ORT_VERSION already in $dir/node_modules"
else
  make_package_folder "$dir" cloister-bench-peers
  # The package's install script only fetches CUDA/TensorRT binaries through nuget; the CPU
  # library ships inside the npm tarball, so the script is skipped.
  (cd "$dir" && ONNXRUNTIME_NODE_INSTALL=skip npm install --no-audit --no-fund --save-exact \
    "onnxruntime-node@$ORT_VERSION")
  if [ "$(installed_version "$dir" onnxruntime-node)" != "$ORT_VERSION" ] || ! ort_loads; then
    echo "install-bench-deps: onnxruntime-node $ORT_VERSION did not load from $dir/node_modules" >&2
    exit 1
  fi
  echo "onnxruntime-node $ORT_VERSION installed in $dir/node_modules"
fi

# --- node-llama-cpp ---------------------------------------------------------------------------
# Loads the prebuilt CPU binary the way bench/llama_peer.mjs does: never building or downloading.
# From a file, not `node -e`: node-llama-cpp first tests the binary in a forked node, and a fork
# inherits -e and its code instead of running node-llama-cpp's test file.
llama_loads() {
  local probe
  [ -d "$llama_dir/node_modules/node-llama-cpp" ] || return 1
  probe="$(mktemp "$llama_dir/load-check-XXXXXX.mjs")"
  cat > "$probe" <<'PROBE'
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true,
                               skipDownload: true, logLevel: LlamaLogLevel.error });
await llama.dispose();
PROBE
  local status=0
  node "$probe" >/dev/null 2>&1 || status=$?
  rm -f "$probe"
  return "$status"
}

if [ "$(installed_version "$llama_dir" node-llama-cpp)" = "$LLAMA_VERSION" ] &&
   [ "$(installed_version "$llama_dir" @node-llama-cpp/linux-x64)" = "$LLAMA_VERSION" ] &&
   llama_loads; then
  echo "node-llama-cpp $LLAMA_VERSION already in $llama_dir/node_modules"
else
  make_package_folder "$llama_dir" cloister-bench-llama-peer
  # --omit=optional keeps npm from fetching the GPU builds; the CPU build is named explicitly.
  # NODE_LLAMA_CPP_SKIP_DOWNLOAD stops the postinstall step from ever downloading or building
  # llama.cpp when the prebuilt binary does not fit this machine: the check below says so.
  (cd "$llama_dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund \
    --save-exact --omit=optional \
    "node-llama-cpp@$LLAMA_VERSION" "@node-llama-cpp/linux-x64@$LLAMA_VERSION")
  if [ "$(installed_version "$llama_dir" node-llama-cpp)" != "$LLAMA_VERSION" ] || ! llama_loads; then
    echo "install-bench-deps: node-llama-cpp $LLAMA_VERSION (prebuilt linux-x64 CPU build) did not load from $llama_dir/node_modules" >&2
    exit 1
  fi
  echo "node-llama-cpp $LLAMA_VERSION installed in $llama_dir/node_modules"
fi
