#!/usr/bin/env bash
# Installs the Debian packages Weft needs to build and test (idempotent; quick when
# everything is already there). Needs root or sudo when something is missing.
set -euo pipefail
PKGS=(build-essential pkg-config libhwloc-dev libudev-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
