#!/usr/bin/env bash
# gpu_check.sh — everything GPU-side of the Python package in one go, on a
# GPU machine with PyTorch, from a library built elsewhere (build-py/ or
# build/, with an optional preheated cache build-py/preheat.sqlite): the
# overhead benchmark, train_gpt.py on one GPU (torch's attention and
# sdpa_jit's, with the attention alone profiled first) and under
# torchrun with 2 ranks on one shared, initially empty cache, then the
# pytest suite with the GPU tests. Logs go to $OUT (default ./gpu-out);
# a summary is printed last.
#   python/gpu_check.sh [preheat] [tests] [accuracy] [bench] [train] [ddp]   (default: all, in this order)
# Each step has a time cap (seconds, overridable: PREHEAT_S, TESTS_S, ACCURACY_S,
# BENCH_S, TRAIN_S, DDP_S; TRAIN_ATTENTION: train_gpt's --attention; TILES_SWEEP: its --tiles-sweep, empty for none) so that a slow one leaves time to the others.
# accuracy: test_gpu_accuracy.py alone, its reports in $OUT/accuracy (SDPA_JIT_ANY_HEAD_DIM=0
# restricts it to the measured head dims; the tests step runs without that variable).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
BUILD=${BUILD:-$( [ -e build-py/libsdpa_jit.so ] && echo build-py || echo build )}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export SDPA_JIT_LIBRARY=$ROOT/$BUILD/libsdpa_jit.so
# The header the library was built from, when the build keeps a copy.
[ -e "$BUILD/sdpa_jit.h" ] && export SDPA_JIT_HEADER=$ROOT/$BUILD/sdpa_jit.h
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The tests' cache: a copy of the preheated one when there is one.
export SDPA_JIT_CACHE=/tmp/sdpa-jit-gpu-check/kernels.sqlite
rm -rf /tmp/sdpa-jit-gpu-check && mkdir -p /tmp/sdpa-jit-gpu-check && chmod 700 /tmp/sdpa-jit-gpu-check
[ -e "$BUILD/preheat.sqlite" ] && cp "$BUILD/preheat.sqlite" "$SDPA_JIT_CACHE"
steps=${*:-preheat tests accuracy bench train ddp}
summary=()
note() { summary+=("$*"); echo "$*" >> "$LOG"; }

{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "library $SDPA_JIT_LIBRARY ($(cat $BUILD/.rev 2>/dev/null || echo 'rev unknown'))"
  "$BUILD/sdpa-jit" --cache "$SDPA_JIT_CACHE" stats 2>&1 | head -8
} 2>&1 | tee "$LOG"

for step in $steps; do
  case $step in
    preheat)
      # Keys the tests use, compiled in parallel; instant when the carried
      # cache has them (same library and NVRTC).
      timeout ${PREHEAT_S:-30} "$BUILD/sdpa-jit" --cache "$SDPA_JIT_CACHE" preheat --arch 90 --dtype bf16,fp16 \
        --head-dim 64,128 --mask none,causal_tl,causal_br,window --layout bshd,thd --deterministic 0,1 \
        --even 0,1 -j "$(nproc)" 2>/dev/null | tail -1 | tee -a "$LOG"
      timeout 15 "$BUILD/sdpa-jit" --cache "$SDPA_JIT_CACHE" preheat --arch 90 --dtype bf16 --head-dim 128 \
        --head-dim-v 64 --mask none,causal_tl,causal_br --layout bshd --even 0,1 -j "$(nproc)" 2>/dev/null \
        | tail -1 | tee -a "$LOG"
      note "preheat: $(grep -h '^compiled [0-9]*, cached' "$LOG" | tr '\n' ';')" ;;
    bench)
      timeout ${BENCH_S:-25} python3 python/bench_overhead.py --json "$OUT/overhead.json" 2>&1 | tee -a "$LOG"
      note "bench: rc=${PIPESTATUS[0]}: $(grep -h '^Python overhead' "$LOG" | tail -1)" ;;
    train)
      timeout ${TRAIN_S:-60} python3 examples/train_gpt.py --profile --out "$OUT" \
        --attention "${TRAIN_ATTENTION:-torch,sdpa_jit,sdpa_jit:flash}" \
        --tiles-sweep "${TILES_SWEEP-64,128,8,2;128,64,8,2;64,64,8,2;128,128,8,1}" 2>&1 | tee -a "$LOG"
      note "train (1 GPU): rc=${PIPESTATUS[0]}: $(grep -h '^attention alone' "$LOG" | tail -1)"
      while read -r line; do note "  $line"; done < <(grep -hE '^  (torch|sdpa_jit) [a-z=()]+ +[0-9.n]|^    (table|[0-9]+,)' "$LOG" | tail -11)
      while read -r line; do note "  $line"; done < <(grep -hE '^(torch|sdpa_jit[:a-z]*) +[0-9.]+ +[0-9]+ ' "$LOG" | tail -3)
      while read -r line; do note "  $line"; done < <(grep -h ' vs torch: final losses' "$LOG" | tail -2) ;;
    ddp)
      ddp_cache=/tmp/sdpa-jit-ddp/kernels.sqlite
      rm -rf /tmp/sdpa-jit-ddp && mkdir -p /tmp/sdpa-jit-ddp && chmod 700 /tmp/sdpa-jit-ddp
      compare=(); [ -e "$OUT/train_single.json" ] && compare=(--compare "$OUT/train_single.json")
      SDPA_JIT_CACHE=$ddp_cache timeout ${DDP_S:-50} torchrun --standalone --nproc_per_node 2 examples/train_gpt.py \
        --attention sdpa_jit "${compare[@]}" --out "$OUT" 2>&1 | tee -a "$LOG"
      rc=${PIPESTATUS[0]}
      "$BUILD/sdpa-jit" --cache "$ddp_cache" ls 2>&1 | tee -a "$LOG"
      "$BUILD/sdpa-jit" --cache "$ddp_cache" stats 2>&1 | tee -a "$LOG"
      note "ddp (2 ranks): rc=$rc: $(grep -h '^DistributedDataParallel' "$LOG" | tail -1)"
      note "  $(grep -h '^shared cache' "$LOG" | tail -1)"
      note "  $(grep -h '^each key compiled exactly once' "$LOG" | tail -1)"
      note "  $(grep -h '^sdpa_jit ' "$LOG" | tail -1)"
      note "  $(grep -h 'vs the one-GPU run' "$LOG" | tail -1)" ;;
    tests)
      # The tests expect the library's default head dims (every multiple of
      # 8 up to 256): a caller's SDPA_JIT_ANY_HEAD_DIM is for the accuracy step.
      env -u SDPA_JIT_ANY_HEAD_DIM SDPA_JIT_TEST_REPORT=$OUT/errors.jsonl timeout ${TESTS_S:-120} \
        python3 -m pytest -p no:cacheprovider \
        -rs -q --timeout 60 --junitxml="$OUT/pytest.xml" --ignore=python/tests/test_gpu_accuracy.py \
        python/tests 2>&1 | tee -a "$LOG" | tail -40  # the accuracy test: its own step
      note "tests: rc=${PIPESTATUS[0]}: $(grep -hE '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$LOG" | tail -1)"
      "$BUILD/sdpa-jit" --cache "$SDPA_JIT_CACHE" stats 2>&1 | tee -a "$LOG" | head -3 ;;
    accuracy)
      mkdir -p "$OUT/accuracy"
      SDPA_JIT_ACCURACY_OUT=$OUT/accuracy timeout ${ACCURACY_S:-240} python3 -m pytest -p no:cacheprovider \
        -rs -q -s python/tests/test_gpu_accuracy.py 2>&1 | tee -a "$LOG" | tail -60
      note "accuracy: rc=${PIPESTATUS[0]}: reports in $OUT/accuracy"
      while read -r line; do note "  $line"; done < <(grep -h -m1 -A10 '^accuracy: [0-9]' "$LOG") ;;
    *) echo "unknown step $step" ;;
  esac
done
echo; echo "== summary"; printf '%s\n' "${summary[@]}"
