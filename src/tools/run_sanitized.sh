#!/usr/bin/env bash
# run_sanitized.sh — the whole Check suite under AddressSanitizer, UBSan and
# LeakSanitizer, then a valgrind leak check of runtime life cycles.
#
#   src/tools/run_sanitized.sh [ctest arguments]
#
# 1. Configures build-asan/ with -DSDPA_JIT_SANITIZE=ON, builds it, makes
#    sure no test binary needs libcuda.so.1 (the driver is dlopen'd, so the
#    CPU suites must start on a machine without one), and runs ctest there.
#    Check's fork mode is kept: LeakSanitizer runs when each test's process
#    exits, and a leak fails that test ("Early exit with return value 1",
#    the LSan report above it); the runner's own exit is checked too. Fork
#    mode also keeps Check's timeouts, and tests that fork ranks never
#    inherit a CUDA context on a GPU machine. (CK_FORK=no works as well
#    here; set it in the environment to run each suite in one process.)
#    GPU suites skip (exit 77) without a GPU.
# 2. Builds test_cpu_hostile without sanitizers (build-rel/, override with
#    VALGRIND_BUILD) and runs `test_cpu_hostile --leak-cycles 5` (create →
#    plan → compile → inspect → destroy, error paths included) under
#    valgrind --leak-check=full: any error or definitely lost block fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
asan_build="${ASAN_BUILD:-build-asan}"
plain_build="${VALGRIND_BUILD:-build-rel}"
jobs="$(nproc)"

echo "run_sanitized: building $asan_build (ASan + UBSan)"
cmake -S . -B "$asan_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSDPA_JIT_SANITIZE=ON -DSDPA_JIT_BUILD_BENCH=OFF >/dev/null
cmake --build "$asan_build" -j "$jobs"

for binary in "$asan_build"/tests/test_cpu_* "$asan_build"/sdpa-jit \
              "$asan_build"/libsdpa_jit.so; do
  [ -f "$binary" ] || continue
  if readelf -d "$binary" | grep -q 'NEEDED.*libcuda'; then
    echo "run_sanitized: $binary needs libcuda.so.1 (DT_NEEDED); it would not" \
         "start without a driver" >&2
    exit 1
  fi
done

# The plain pass compiles test_cpu_kernels' classes for every arch; here the
# host code around NVRTC is what is checked, which one arch exercises.
export SDPA_TEST_KERNEL_ARCHS="${SDPA_TEST_KERNEL_ARCHS:-90}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "run_sanitized: ctest in $asan_build (CK_FORK=${CK_FORK:-yes})"
(cd "$asan_build" && ctest --output-on-failure -j "$jobs" "$@")

if ! command -v valgrind >/dev/null; then
  echo "run_sanitized: valgrind not found; skipping the leak check" >&2
  exit 0
fi
echo "run_sanitized: valgrind leak check ($plain_build)"
cmake -S . -B "$plain_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$plain_build" -j "$jobs" --target test_cpu_hostile
log="$plain_build/valgrind-leak-cycles.log"
unset CK_FORK ASAN_OPTIONS UBSAN_OPTIONS
if ! valgrind --leak-check=full --errors-for-leak-kinds=definite \
     --error-exitcode=3 "$plain_build/tests/test_cpu_hostile" \
     --leak-cycles 5 >"$log" 2>&1; then
  cat "$log" >&2
  echo "run_sanitized: valgrind found errors or leaks (see above)" >&2
  exit 1
fi
grep -E "leak cycles:|definitely lost|ERROR SUMMARY" "$log"
grep -q "definitely lost: 0 bytes" "$log"
echo "run_sanitized: all clean"
