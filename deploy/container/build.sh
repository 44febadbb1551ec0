#!/usr/bin/env bash
# Builds Cloister's OCI image with podman, from Debian packages only (no image registry).
#
#   deploy/container/build.sh [--tag TAG] [--ccache-dir DIR] [--cache-dir DIR] [--bases-only]
#
# 1. Makes two base images with mmdebstrap (bookworm, minbase): one with the -dev packages the
#    build needs, one with only the runtime libraries. Each is named after a hash of its
#    package list and made once: the rootfs tarball is kept in the cache dir
#    (default ~/.cache/cloister-images) and the image in podman's store.
# 2. Builds deploy/container/Containerfile on them into cloister:TAG (default: the project
#    version), with DIR mounted as the build's ccache when --ccache-dir is given.
# 3. Prints the image id, its size, the SHA-384 measurement of its enclave binary (what a
#    policy pins as `measurements`) and, last, the image's name as `cloister:TAG`.
#
# Runs as root or rootless. CONTAINERS_CONF defaults to deploy/container/containers.conf
# (runc, cgroupfs, modest ulimits). Exit 0 on success; 1 with the failed command's output.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

version="$(sed -n 's/^project(cloister VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")"
tag="$version"
ccache_dir=""
cache_dir="${XDG_CACHE_HOME:-$HOME/.cache}/cloister-images"
suite=bookworm
bases_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --ccache-dir) ccache_dir="$2"; shift 2 ;;
    --cache-dir) cache_dir="$2"; shift 2 ;;
    --bases-only) bases_only=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

for tool in podman mmdebstrap; do
  if ! command -v "$tool" >/dev/null; then
    echo "build.sh: $tool is not installed (apt-get install podman runc mmdebstrap uidmap)" >&2
    exit 1
  fi
done

# What the build stage compiles with: scripts/install-deps.sh without the debugger, clang,
# Python and test tools.
build_packages=(
  build-essential cmake ninja-build ccache pkg-config ca-certificates
  libssl-dev libsodium-dev zlib1g-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libonnx-dev libopenblas-dev libgtest-dev libgmock-dev
  libxmlsec1-dev libxml2-dev nlohmann-json3-dev prometheus-cpp-dev
  libpcre2-dev libutf8proc-dev libcpp-httplib-dev
)
# What the binaries load (each one's ldd, mapped to its Debian package).
runtime_packages=(
  ca-certificates libssl3 libsodium23 zlib1g
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libonnx1
  libopenblas0-pthread libxmlsec1 libxmlsec1-openssl libxml2
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libpcre2-8-0 libutf8proc2
  libcpp-httplib0.11 socat
)

# Leave documentation, manuals and translations out of both bases, and merge /usr with
# mmdebstrap's hook rather than the usrmerge package (which would pull in all of Perl).
slim_options=(
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
)

step() { printf 'build.sh: %s\n' "$*" >&2; }

# run CMD...: runs CMD with its output captured; on failure prints the command and its output.
run() {
  local log
  log="$(mktemp)"
  if ! "$@" >"$log" 2>&1; then
    echo "build.sh: failed: $*" >&2
    tail -n 60 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

# base NAME PACKAGES...: makes localhost/cloister-base-NAME:KEY unless it exists; prints its name.
base() {
  local name="$1"; shift
  local key
  key="$(printf '%s\n' "$suite" "$@" "${slim_options[@]}" | sha256sum | cut -c1-12)"
  local image="localhost/cloister-base-$name:$suite-$key"
  if podman image exists "$image"; then
    echo "$image"
    return
  fi
  mkdir -p "$cache_dir"
  local tarball="$cache_dir/base-$name-$suite-$key.tar"
  if [ ! -s "$tarball" ]; then
    step "making the $name base from Debian packages (mmdebstrap, once)"
    local include
    include="$(IFS=,; echo "$*")"
    run mmdebstrap --variant=minbase --format=tar --include="$include" "${slim_options[@]}" \
      "$suite" "$tarball.partial"
    mv "$tarball.partial" "$tarball"
  fi
  # An imported image has no environment: kube play and plain `podman run` need PATH.
  run podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' "$tarball" "$image"
  echo "$image"
}

started=$(date +%s)
build_base="$(base build "${build_packages[@]}")"
runtime_base="$(base runtime "${runtime_packages[@]}")"
if [ "$bases_only" = 1 ]; then
  echo "$build_base"
  echo "$runtime_base"
  exit 0
fi

volume_args=()
if [ -n "$ccache_dir" ]; then
  mkdir -p "$ccache_dir"
  volume_args=(--volume "$(cd "$ccache_dir" && pwd):/ccache")
fi
image="localhost/cloister:$tag"
step "building $image on $build_base and $runtime_base"
run podman build --file "$here/Containerfile" --ignorefile "$here/Containerfile.dockerignore" \
  --build-arg "BUILD_BASE=$build_base" --build-arg "RUNTIME_BASE=$runtime_base" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)" \
  "${volume_args[@]}" --tag "$image" "$root"

# The build stage's image is the whole build tree: drop it (ccache keeps what rebuilds need).
podman image prune --force --filter label=org.cloister.stage=build >/dev/null 2>&1 || true

id="$(podman image inspect --format '{{.Id}}' "$image")"
size="$(podman image inspect --format '{{.Size}}' "$image")"
measurement="$(podman run --rm --entrypoint /usr/bin/sha384sum "$image" /usr/bin/cloister-enclave | cut -d' ' -f1)"
echo "image id: ${id:0:12}"
echo "image size: $((size / 1000000)) MB ($size bytes)"
echo "enclave measurement (sha384 of /usr/bin/cloister-enclave): $measurement"
echo "built in $(( $(date +%s) - started )) s"
echo "cloister:$tag"
