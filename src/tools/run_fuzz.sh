#!/usr/bin/env bash
# run_fuzz.sh — builds the libFuzzer targets (tests/fuzz) with clang,
# AddressSanitizer and UBSan in build-fuzz/ and runs each one.
#
#   src/tools/run_fuzz.sh [SECONDS]     each target for SECONDS (default 60)
#   FUZZ_RUNS=N src/tools/run_fuzz.sh   each target for N executions instead
#
# fuzz_plan decodes bytes into a descriptor and checks validation, key,
# plan and execute's argument checks; fuzz_cache_open writes bytes where
# the cache file (and a shipped one) should be and drives every cache call.
# Corpora persist in build-fuzz/corpus/<target>; fuzz_cache_open starts
# from the seeds fuzz_make_seeds writes. A crash, a sanitizer report, a
# leak or a timeout stops the run with a nonzero exit; the input that
# caused it is kept in build-fuzz/artifacts/.
#
# Needs clang and its libFuzzer runtime (Debian: libclang-rt-<N>-dev; this
# script installs it when clang cannot link -fsanitize=fuzzer).
set -euo pipefail
seconds="${1:-60}"
cd "$(dirname "$0")/../.."
root="$(pwd)"
build="${FUZZ_BUILD:-build-fuzz}"
export PATH="/usr/local/cuda/bin:$PATH"

command -v clang >/dev/null || { echo "run_fuzz: clang is needed" >&2; exit 1; }
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)\n{ (void)d; (void)n; return 0; }\n' >"$probe/probe.c"
if ! clang -fsanitize=fuzzer "$probe/probe.c" -o "$probe/probe" 2>/dev/null; then
  version="$(clang -dumpversion | cut -d. -f1)"
  echo "run_fuzz: installing libclang-rt-$version-dev (libFuzzer runtime)"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "libclang-rt-$version-dev"
fi

CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSDPA_JIT_FUZZ=ON -DSDPA_JIT_SANITIZE=ON -DSDPA_JIT_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_plan fuzz_cache_open fuzz_make_seeds

fuzz_dir="$root/$build/tests/fuzz"
corpus="$root/$build/corpus"
artifacts="$root/$build/artifacts"
mkdir -p "$corpus/fuzz_plan" "$corpus/fuzz_cache_open" "$corpus/seeds" "$artifacts"
"$fuzz_dir/fuzz_make_seeds" "$corpus/seeds"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
if [ -n "${FUZZ_RUNS:-}" ]; then
  budget=(-runs="$FUZZ_RUNS")
else
  budget=(-max_total_time="$seconds")
fi

status=0
for target in fuzz_plan fuzz_cache_open; do
  dirs=("$corpus/$target")
  [ "$target" = fuzz_cache_open ] && dirs+=("$corpus/seeds")
  echo "run_fuzz: $target (${budget[*]})"
  log="$root/$build/$target.log"
  start=$(date +%s)
  if ! "$fuzz_dir/$target" "${budget[@]}" -max_len=16384 -timeout=20 \
       -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$artifacts/$target-" "${dirs[@]}" >"$log" 2>&1; then
    status=1
    echo "run_fuzz: $target FAILED; the end of $log:" >&2
    tail -40 "$log" >&2
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "run_fuzz: $target: ${runs:-?} executions in $(( $(date +%s) - start )) s"
done
exit $status
