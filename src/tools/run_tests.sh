#!/usr/bin/env bash
# run_tests.sh — installs the build dependencies, builds sdpa-jit with its
# tests in build/, runs every Check suite through ctest, then the Python
# package's tests (python/run_tests.sh) against the library just built.
# GPU suites and tests skip (reported as skipped) on a machine without a
# CUDA device, the PyTorch tests without PyTorch.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash src/tools/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
SDPA_JIT_LIBRARY="$PWD/build/libsdpa_jit.so" bash python/run_tests.sh
