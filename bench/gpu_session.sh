#!/usr/bin/env bash
# gpu_session.sh — everything one GPU session runs, in one go, from a build
# made on the build host (carried as build/): the GPU test suite, the
# benchmarks and the comparison with PyTorch. Logs go to $OUT (or ./gpu-out).
#   bench/gpu_session.sh [tests] [bench] [torch] [sanitize]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export SDPA_JIT_CACHE=${SDPA_JIT_CACHE:-$PWD/build/gpu-cache.sqlite}
steps=${*:-tests bench torch}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  ldd --version | head -1; nproc
} 2>&1 | tee "$OUT/machine.txt"
for step in $steps; do
  case $step in
    preheat)
      ./build/sdpa-jit preheat -j "$(nproc)" 2>&1 | tail -3 | tee "$OUT/preheat.txt" ;;
    tests)
      CK_DEFAULT_TIMEOUT=1200 ./build/tests/test_gpu_bwd 2>&1 | tee "$OUT/test_gpu_bwd.txt" | tail -60 ;;
    bench)
      ./build/bench/bench_bwd 2>&1 | tee "$OUT/bench_bwd.txt" | tail -40 ;;
    jit)
      ./build/bench/bench_jit 2>&1 | tee "$OUT/bench_jit.txt" | tail -20 ;;
    torch)
      for memory in bhsd bshd; do
        PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --lib build/libsdpa_jit.so \
          --memory $memory 2>&1 | tee "$OUT/compare_torch_$memory.txt" | tail -40
      done ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        CK_FORK=no compute-sanitizer --tool $tool --error-exitcode 99 \
          ./build/tests/test_gpu_bwd 2>&1 | tail -30 > "$OUT/sanitize_$tool.txt"
        echo "$tool: rc=$?" | tee -a "$OUT/sanitize.txt"; tail -5 "$OUT/sanitize_$tool.txt"
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
