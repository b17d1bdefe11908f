#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: install, build (release), and run
# the bundled default config. Extra arguments go to `cpsched run`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
cmake --preset release >/dev/null
cmake --build --preset release
exec build/release/bin/cpsched run configs/quickstart.yaml "$@"
