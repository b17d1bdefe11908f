#!/usr/bin/env bash
# Installs the Debian 12 packages cpsched builds with, and, where a CUDA
# toolkit with cuDNN is installed, the cuDNN frontend headers (cuDNN's
# header-only C++ graph API, from PyPI) into build/deps/, where CMake finds
# them (cmake/FindCudnnFrontend.cmake). Idempotent: does nothing when
# everything is already there. apt needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
  echo "installing: $*"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

pkgs=(build-essential cmake ninja-build pkg-config
      libboost-dev libboost-program-options-dev libboost-filesystem-dev
      libyaml-cpp-dev libfmt-dev doctest-dev nlohmann-json3-dev xtensor-dev
      libglpk-dev openmpi-bin libopenmpi-dev librsvg2-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

# cuDNN frontend: only useful next to cuDNN itself (the CUDA runtime's range
# args run on cuDNN's fused attention when both are found). Only its headers
# are used: --no-deps, because the wheel's dependencies serve its Python side.
fe_version=1.32.0
fe_dir="build/deps/cudnn_frontend-$fe_version"
cudnn_header=""
for d in "${CUDNN_HOME:-}" "${CUDNN_ROOT:-}" /usr/local/cuda /usr; do
  [ -n "$d" ] && [ -f "$d/include/cudnn_version.h" ] && { cudnn_header="$d/include/cudnn_version.h"; break; }
done
[ -n "$cudnn_header" ] || [ -f /usr/include/x86_64-linux-gnu/cudnn_version.h ] || exit 0
[ -f "$fe_dir/include/cudnn_frontend.h" ] && exit 0
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || apt_install python3
"$py" -m pip --version >/dev/null 2>&1 || apt_install python3-pip
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "installing: nvidia-cudnn-frontend==$fe_version (headers) into $fe_dir"
# --target installs beside the system's packages, never into them (so
# Debian's externally-managed Python allows it).
# Optional: without it (no index reachable, say) the CUDA runtime builds with its own kernels only.
if ! "$py" -m pip install -q --root-user-action=ignore --no-deps --no-compile --target "$tmp/wheel" \
     "nvidia-cudnn-frontend==$fe_version" || [ ! -f "$tmp/wheel/include/cudnn_frontend.h" ]; then
  echo "install_deps: nvidia-cudnn-frontend==$fe_version not installed: the CUDA runtime builds without cuDNN's path"
  exit 0
fi
mkdir -p "$fe_dir.partial"
rm -rf "$fe_dir.partial/include"
mv "$tmp/wheel/include" "$fe_dir.partial/include"
cp -r "$tmp"/wheel/nvidia_cudnn_frontend-*.dist-info/licenses "$fe_dir.partial/" 2>/dev/null || true
# Complete or absent: a build never sees half the headers.
rm -rf "$fe_dir"
mv "$fe_dir.partial" "$fe_dir"
