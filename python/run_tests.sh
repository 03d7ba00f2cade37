#!/usr/bin/env bash
# run_tests.sh — the Python package's tests against the freshly built
# library: python3 -m pytest python/tests with SDPA_JIT_LIBRARY set to
# build/libsdpa_jit.so (installing pytest with pip when it is missing).
# Without PyTorch or a GPU the torch tests skip, visibly (-rs); the CPU
# tests (the ctypes mirror against include/sdpa_jit.h, import without
# torch, library lookup, errors naming the field, compile into a cache
# with arch=90) run everywhere.
#   python/run_tests.sh [pytest args...]      (from anywhere; build first)
set -euo pipefail
cd "$(dirname "$0")/.."
export SDPA_JIT_LIBRARY=${SDPA_JIT_LIBRARY:-$PWD/build/libsdpa_jit.so}
if [ ! -e "$SDPA_JIT_LIBRARY" ]; then
  echo "run_tests.sh: $SDPA_JIT_LIBRARY does not exist: build the library first" \
       "(cmake -S . -B build && cmake --build build --target sdpa_jit)" >&2
  exit 1
fi
if ! python3 -c "import pytest" 2>/dev/null; then
  python3 -m pip install --quiet pytest || python3 -m pip install --quiet --break-system-packages pytest
fi
# No compiled bytecode or pytest cache in the tree.
export PYTHONDONTWRITEBYTECODE=1
exec python3 -m pytest -p no:cacheprovider -rs -q python/tests "$@"
