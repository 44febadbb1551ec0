#!/usr/bin/env bash
# Installs the Debian packages Cloister needs to build, run and test (bookworm, as root or
# through sudo). Does nothing when they are all present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git clang-14
  libssl-dev libsodium-dev zlib1g-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libonnx-dev libopenblas-dev
  libgtest-dev libgmock-dev
  gdb libxmlsec1-dev libxml2-dev nlohmann-json3-dev python3-onnx python3-numpy libonnx-testdata
  pybind11-dev python3-dev python3-pytest python3-pip python3-venv yamllint prometheus-cpp-dev
  libpcre2-dev libutf8proc-dev tmux
  libcpp-httplib-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "installing: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
