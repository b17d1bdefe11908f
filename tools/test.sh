#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: install, build and run every test.
#   tools/test.sh          release build (what CI runs), then the Python package's tests
#   tools/test.sh asan     the ASan + UBSan build (C++ tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
tools/install_deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" -j "$(nproc)"
[ "$preset" = release ] || exit 0

# The Python package (docs/python.md): `pip install .` into a fresh virtual
# environment, then pytest, comparing with the tool built above.
root="$(pwd)"
py="${PYTHON:-python3}"
apt_install() {
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: $*"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
# Debian's python3 needs python3-venv (ensurepip) and python3-dev (Python.h) for this.
if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then apt_install python3-venv python3-pip; fi
if [ ! -e "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then
  apt_install python3-dev
fi
venv="$root/build/python-venv"
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q scikit-build-core nanobind numpy pytest
# The package's build folder is kept between runs (rebuilds only what changed).
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
fi
"$venv/bin/python" -m pip install -q --no-build-isolation --config-settings=build-dir=build/python-test .
# cpsched.torch's tests (docs/torch.md) run on the CPU: PyTorch from the package index, gloo between processes.
"$venv/bin/python" -m pip install -q "torch>=2.4"
# The transformers integration's tests (python/tests/test_torch_hf*.py): models from configs, nothing downloaded.
"$venv/bin/python" -m pip install -q transformers
# Run from outside the tree: the installed package is what is imported.
cd "$root/build"
CPSCHED_CLI="$root/build/$preset/bin/cpsched" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$root/python/tests"
