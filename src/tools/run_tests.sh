#!/usr/bin/env bash
# run_tests.sh — installs the build dependencies, builds sdpa-jit with its
# tests in build/, and runs every Check suite through ctest. GPU suites skip
# (reported as skipped) on a machine without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash src/tools/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
