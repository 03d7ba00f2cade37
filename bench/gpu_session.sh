#!/usr/bin/env bash
# gpu_session.sh — everything one GPU session runs, in one go, from a build
# made on the build host (carried as build/): the GPU test suite, the
# benchmarks and the comparison with PyTorch. Logs go to $OUT (or ./gpu-out).
#   bench/gpu_session.sh [tests] [tests-mma] [bench] [det] [torch] [order] [sanitize]
#                                               (default: tests bench torch)
# tests runs the GPU suite with the default family choice (the sm_90a
# family where it covers a case), tests-mma with mma.sync forced; torch
# compares with PyTorch in both memory orders, head dims beyond 64 and 128
# included (--more-head-dims); det times the deterministic plans against
# the others with each family forced; order checks THD's longest-first
# launch order (bench_hopper --longest-first) and times and traces it
# against batch order. Each step has a time cap (TESTS_S, BENCH_S,
# TORCH_S seconds).
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
      CK_DEFAULT_TIMEOUT=1200 timeout ${TESTS_S:-400} ./build/tests/test_gpu_bwd 2>&1 \
        | tee "$OUT/test_gpu_bwd.txt" | tail -60 ;;
    tests-mma)
      SDPA_JIT_FAMILY=mma CK_DEFAULT_TIMEOUT=1200 timeout ${TESTS_S:-400} \
        ./build/tests/test_gpu_bwd 2>&1 | tee "$OUT/test_gpu_bwd_mma.txt" | tail -60 ;;
    bench)
      timeout ${BENCH_S:-300} ./build/bench/bench_bwd 2>&1 | tee "$OUT/bench_bwd.txt" | tail -40 ;;
    jit)
      ./build/bench/bench_jit 2>&1 | tee "$OUT/bench_jit.txt" | tail -20 ;;
    det) # deterministic against not, each family forced, bf16 --quick grid
      for family in hopper mma; do
        for det in "" --deterministic; do
          SDPA_JIT_FAMILY=$family timeout ${BENCH_S:-300} ./build/bench/bench_bwd --quick $det 2>&1 \
            | tee -a "$OUT/bench_det.txt" | grep -E "^(bf16|fp16)"
        done
      done ;;
    torch)
      for memory in bhsd bshd; do
        PYTHONUNBUFFERED=1 timeout ${TORCH_S:-400} python3 bench/compare_torch.py \
          --lib build/libsdpa_jit.so --memory $memory --more-head-dims \
          --csv "$OUT/compare_torch_$memory.csv" 2>&1 | tee "$OUT/compare_torch_$memory.txt" | tail -40
      done ;;
    order) # THD's longest-first launch order: checked, then timed and traced against batch order
      timeout 120 ./build/bench/bench_hopper --checks --case thd --longest-first 2>&1 \
        | tee "$OUT/order_checks.txt" | tail -3
      for round in 1 2; do
        for order in --longest-first ""; do
          timeout 120 ./build/bench/bench_hopper --timed --no-twin --runs 10 --case "thd mixed" \
            --case "hd128 bshd S4k full" $order 2>&1 | tee -a "$OUT/order_timed.txt" \
            | grep -E "^time .*(thd|S4k).* [0-9.]+ +[0-9.]+ +[0-9.]+ " | sed "s/^/${order:-batch-order} /"
        done
      done
      for order in --longest-first ""; do
        rm -rf "$OUT/trace${order}" && mkdir -p "$OUT/trace${order}"
        timeout 120 ./build/bench/bench_hopper --timed --no-twin --runs 5 --case "thd mixed full" \
          $order --trace "$OUT/trace${order}" > /dev/null 2>&1
        python3 bench/trace_summary.py "$OUT/trace${order}"/*.csv
      done 2>&1 | tee "$OUT/order_traces.txt" ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        CK_FORK=no compute-sanitizer --tool $tool --error-exitcode 99 \
          ./build/tests/test_gpu_bwd 2>&1 | tail -30 > "$OUT/sanitize_$tool.txt"
        echo "$tool: rc=$?" | tee -a "$OUT/sanitize.txt"; tail -5 "$OUT/sanitize_$tool.txt"
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
