#!/usr/bin/env bash
# main_job.sh — the main job on a fresh machine: install the build
# dependencies, build sdpa-jit (library, CLI, tests, benchmarks) in build/,
# preheat the kernel cache with the default grid for this machine's GPU
# (sm_90 when there is none), show the cache, and — when a CUDA device is
# present — run backward passes and check them against the float64 CPU
# reference (the GPU test suite).
#
# Environment: SDPA_JIT_CACHE picks the cache file (default
# ~/.cache/sdpa-jit/kernels.sqlite); JOBS the compile parallelism.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash src/tools/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
jobs=${JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"

echo "== preheat"
./build/sdpa-jit preheat -j "$jobs"
echo "== cache"
./build/sdpa-jit stats
./build/sdpa-jit ls | sed -n 1,12p   # sed reads it all: no SIGPIPE under pipefail

echo "== checked backward"
set +e
./build/tests/test_gpu_bwd
rc=$?
set -e
case $rc in
  0) echo "main job: backward checked against the float64 reference on the GPU: ok" ;;
  77) echo "main job: no CUDA device here; the cache is preheated, the GPU check was skipped" ;;
  *) echo "main job: the GPU check FAILED (exit $rc)"; exit "$rc" ;;
esac
