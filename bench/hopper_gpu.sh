#!/usr/bin/env bash
# hopper_gpu.sh — one GPU session for the sm_90a family, from a build made
# on the build host and carried as build-hopper/ (nothing is built here):
# bench_hopper's checks and timings, compute-sanitizer on small cases, and
# the SASS of the compiled keys (HGMMA / UTMALDG / spill counts). Logs go to
# $OUT (or ./hopper-out); a short summary is printed last.
#   bench/hopper_gpu.sh [checks] [timed] [quick] [memcheck] [sanitize] [sass]
#                       [variant:NAME=VALUE] ...       (default: checks quick sass)
# A variant step times the "S4k full" cases with --define NAME=VALUE;
# memcheck runs compute-sanitizer's memcheck on two small checks, sanitize
# memcheck, synccheck and racecheck.
# Extra bench_hopper arguments for the checks/timed steps: $HOPPER_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/hopper-out}
mkdir -p "$OUT"
B=./build-hopper/bench/bench_hopper
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
steps=${*:-checks quick sass}
args=${HOPPER_ARGS:-}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  nproc
  ldd "$B" | grep -E "not found|nvrtc|sqlite|xxhash"
} > "$OUT/machine.txt" 2>&1
summary=""
for step in $steps; do
  case $step in
    checks)
      mkdir -p /tmp/hopper-cubins
      timeout 105 "$B" --checks --cubin-dir /tmp/hopper-cubins $args > "$OUT/checks.txt" 2>&1
      summary+="checks: rc=$? $(tail -1 "$OUT/checks.txt")"$'\n' ;;
    timed)
      timeout 100 "$B" --timed --no-twin $args > "$OUT/timed.txt" 2>&1
      summary+="timed: rc=$? $(tail -1 "$OUT/timed.txt")"$'\n' ;;
    quick)
      timeout 150 "$B" --timed --quick $args > "$OUT/quick.txt" 2>&1
      summary+="quick: rc=$? $(tail -1 "$OUT/quick.txt")"$'\n' ;;
    variant:*)
      def=${step#variant:}
      timeout 25 "$B" --timed --no-twin --case "S4k full" --define "$def" $args > "$OUT/variant_${def//=/_}.txt" 2>&1
      summary+="variant $def: rc=$? $(tail -1 "$OUT/variant_${def//=/_}.txt")"$'\n' ;;
    memcheck|sanitize)
      : > "$OUT/sanitize.txt"
      tools="memcheck synccheck racecheck"
      [ "$step" = memcheck ] && tools=memcheck
      for tool in $tools; do
        HOPPER_NO_WATCHDOG=1 timeout 35 compute-sanitizer --tool $tool --error-exitcode 99 "$B" --checks \
          --case "bf16 hd128 bshd causal_tl S500" --case "bf16 hd64 thd none mixed" \
          > /tmp/hopper-sanitize.txt 2>&1
        rc=$?
        { echo "=== $tool rc=$rc"; tail -60 /tmp/hopper-sanitize.txt; } >> "$OUT/sanitize.txt"
        summary+="sanitize $tool: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/hopper-sanitize.txt | tail -1)"$'\n'
      done ;;
    sass) # the cubins the checks step compiled (compile-only: every class)
      if ! ls /tmp/hopper-cubins/*.cubin > /dev/null 2>&1; then
        mkdir -p /tmp/hopper-cubins
        timeout 200 "$B" --compile-only --cubin-dir /tmp/hopper-cubins > "$OUT/compile.txt" 2>&1
      fi
      {
        for f in /tmp/hopper-cubins/*.cubin; do
          cuobjdump --dump-sass --function sdpa_bwd_main "$f" > /tmp/hopper.sass 2>&1
          printf '%-56s HGMMA %3d UTMALDG %2d STL %d LDL %d REDG %3d SASS lines %5d\n' \
            "$(basename "$f" .cubin)" "$(grep -c HGMMA /tmp/hopper.sass)" \
            "$(grep -c UTMALDG /tmp/hopper.sass)" "$(grep -c 'STL' /tmp/hopper.sass)" \
            "$(grep -c 'LDL' /tmp/hopper.sass)" "$(grep -c 'RED' /tmp/hopper.sass)" \
            "$(grep -c '^ */\*[0-9a-f]*\*/' /tmp/hopper.sass)"
        done
      } > "$OUT/sass.txt"
      summary+="sass: $(wc -l < "$OUT/sass.txt") keys dumped, $(awk '$7 != 0 || $9 != 0' "$OUT/sass.txt" | wc -l) with STL/LDL"$'\n' ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "================ summary"
grep -h -E "HANG|FAILED|worst|COMPILE" "$OUT"/*.txt 2>/dev/null | head -40
for f in "$OUT"/checks.txt "$OUT"/quick.txt "$OUT"/timed.txt "$OUT"/variant_*.txt; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f")"
  sed -n '/^case  /,$p' "$f" | grep -v "^case  " | awk '{print}' | tail -40
done
printf '%s' "$summary"
