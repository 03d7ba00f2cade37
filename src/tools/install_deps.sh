#!/usr/bin/env bash
# install_deps.sh — installs what building sdpa-jit needs on Debian/Ubuntu:
# a C compiler, CMake, pkg-config, SQLite (library and shell), xxHash,
# Check (+ subunit) and, when no CUDA toolkit is found, Debian's
# nvidia-cuda-toolkit (for NVRTC and cuda.h). Installs only what is missing.
set -euo pipefail

packages=(gcc make cmake pkg-config libsqlite3-dev sqlite3 libxxhash-dev
          check libsubunit-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

# The Python package's tests need an interpreter (pytest comes from pip).
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)

have_cuda=0
for d in "${CUDA_HOME:-}" /usr/local/cuda /usr; do
  if [ -n "$d" ] && [ -f "$d/include/nvrtc.h" ]; then have_cuda=1; break; fi
done
[ "$have_cuda" = 1 ] || missing+=(nvidia-cuda-toolkit)

if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
