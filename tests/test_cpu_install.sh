#!/usr/bin/env bash
# test_cpu_install.sh — the installed package is relocatable: install the
# build into a fresh prefix, move the prefix, and check that pkg-config
# (sdpa_jit.pc) and the CMake package config point into the new place,
# and that a program built from them finds the header and links.
#   tests/test_cpu_install.sh BUILD_DIR
set -euo pipefail
build=$1
command -v pkg-config >/dev/null || { echo "skipped: no pkg-config"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/first" >/dev/null
mv "$work/first" "$work/moved"
pc=$(find "$work/moved" -name sdpa_jit.pc)
[ -n "$pc" ] || { echo "FAIL: no sdpa_jit.pc installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
cflags=$(pkg-config --cflags sdpa_jit)
libs=$(pkg-config --libs sdpa_jit)
case "$cflags" in *"$work/moved/"*include*) ;; *) echo "FAIL: --cflags '$cflags' is not under the moved prefix"; exit 1 ;; esac
case "$libs" in *"-L$work/moved/"*) ;; *) echo "FAIL: --libs '$libs' is not under the moved prefix"; exit 1 ;; esac
[ -f "$(pkg-config --variable=includedir sdpa_jit)/sdpa_jit.h" ] || { echo "FAIL: no header where the .pc says"; exit 1; }
cat > "$work/use.c" <<'C'
#include <sdpa_jit.h>
#include <stdio.h>
int main(void) { printf("%s\n", sdpa_version()); return 0; }
C
# shellcheck disable=SC2086
cc "$work/use.c" -o "$work/use" $cflags $libs -Wl,-rpath,"$(pkg-config --variable=libdir sdpa_jit)"
# A sanitizer build's library wants its runtime first; the program is plain.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
  "$work/use" | grep -q '^[0-9]' || { echo "FAIL: the program built from the .pc did not run"; exit 1; }
[ -f "$(find "$work/moved" -name sdpa_jit-config.cmake)" ] || { echo "FAIL: no CMake package config"; exit 1; }
echo "install: relocatable (.pc prefix from pcfiledir; a program built from it runs)"
