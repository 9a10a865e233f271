#!/bin/sh
# rootfs.sh HACK_DIR QEMU_CONF OUT_TAR
#
# The root filesystem of the containerized libvirtd (cargo xtask
# libvirtd-image): Debian bookworm with the packages of HACK_DIR/packages,
# libvirt and QEMU from bookworm-backports (the versions the host's private
# libvirtd runs, so both give the same errors), and this directory's
# configuration and start script. QEMU_CONF is the qemu.conf of every private
# libvirtd (testbed/src/qemu.conf), to which the container adds
# `cgroup_controllers = [ ]`: the container's cgroup tree is read-only.
# Written as a tarball for `docker import`. Run as root.
set -eu
hack=$1
qemu_conf=$2
out=$3
include=$(grep -v '^[[:space:]]*#' "$hack/packages" | grep -v '^[[:space:]]*$' | paste -sd, -)
mmdebstrap \
  --mode=root \
  --variant=minbase \
  --format=tar \
  --aptopt='APT::Install-Recommends "false"' \
  --aptopt='APT::Default-Release "bookworm-backports"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --include="$include" \
  --customize-hook="copy-in $hack/libvirtd.conf $hack/virtlogd.conf /etc/libvirt/" \
  --customize-hook="upload $qemu_conf /etc/libvirt/qemu.conf" \
  --customize-hook='printf "cgroup_controllers = [ ]\n" >> "$1"/etc/libvirt/qemu.conf' \
  --customize-hook="copy-in $hack/capl-libvirtd-start /usr/local/bin/" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log' \
  bookworm "$out" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian bookworm-backports main"
