#!/usr/bin/env bash
# Installs what building and playing the image needs on Debian bookworm (as root or through
# sudo): podman with runc (crun fails on hybrid cgroup layouts), mmdebstrap for the base
# images, uidmap for rootless use, catatonit for kube play's pause image. Does nothing when
# they are all present.
set -euo pipefail
packages=(podman runc mmdebstrap uidmap catatonit slirp4netns fuse-overlayfs openssl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
