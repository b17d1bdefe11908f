#!/usr/bin/env bash
# Installs the Debian 12 packages cpsched builds with. Idempotent; needs root
# (or sudo). Skips apt entirely when everything is already there.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libboost-dev libboost-program-options-dev libboost-filesystem-dev
      libyaml-cpp-dev libfmt-dev doctest-dev nlohmann-json3-dev xtensor-dev
      libglpk-dev openmpi-bin libopenmpi-dev librsvg2-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
