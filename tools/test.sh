#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: install, build and run every test.
#   tools/test.sh          release build (what CI runs)
#   tools/test.sh asan     the ASan + UBSan build
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
tools/install_deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" -j "$(nproc)"
