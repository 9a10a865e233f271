#!/bin/sh
# copy-runtime-libs.sh [--all] OUT BINARY...
#
# Copies into OUT (keeping their paths) every shared library the BINARYs load,
# as ldd resolves them, except those that gcr.io/distroless/cc already ships
# (glibc, libgcc_s, libstdc++). The Dockerfile runs it on the manager binary
# and libvirt.so.0; provider/tests/dockerfile.rs runs it on a local build and
# checks that nothing the binary needs is left out.
#
# With --all nothing is left out, the dynamic loader included: for an image
# with no base at all (`cargo xtask docker-build --offline`).
set -eu
all=no
if [ "${1:-}" = "--all" ]; then
  all=yes
  shift
fi
out=$1
shift
provided='^(ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libgcc_s\.so\.1|libstdc\+\+\.so\.6)$'
mkdir -p "$out"
for binary in "$@"; do
  ldd "$binary" | awk '/=> \// { print $1, $3 } $1 ~ /^\// { n = split($1, p, "/"); print p[n], $1 }'
done | sort -u | while read -r soname path; do
  if [ "$all" = no ] && printf '%s\n' "$soname" | grep -Eq "$provided"; then
    continue
  fi
  # Copy the file the soname resolves to, and the soname link itself.
  real=$(readlink -f "$path")
  mkdir -p "$out$(dirname "$path")"
  cp "$real" "$out$(dirname "$path")/$soname"
  echo "$soname"
done
