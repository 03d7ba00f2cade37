"""Test setup: the package from this checkout (python/), and the library
from $SDPA_JIT_LIBRARY, else the checkout's build/libsdpa_jit.so."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
# The header the library was built from: the checkout's, unless
# SDPA_JIT_HEADER names another (a library built from another tree).
HEADER = os.environ.get("SDPA_JIT_HEADER") or os.path.join(REPO, "include", "sdpa_jit.h")

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

if not os.environ.get("SDPA_JIT_LIBRARY"):
    for build in ("build", "build-py"):
        candidate = os.path.join(REPO, build, "libsdpa_jit.so")
        if os.path.exists(candidate):
            os.environ["SDPA_JIT_LIBRARY"] = candidate
            break
