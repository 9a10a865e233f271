#!/bin/sh
# rootfs.sh PACKAGES_FILE ROOTDIR
#
# Creates the Debian bookworm root directory of the Kubernetes node image with
# mmdebstrap (no loop devices, no mounts outside the chroot), without
# documentation, man pages or locales. Run as root. Part of `cargo xtask node-image`.
set -eu
packages_file=$1
root=$2
include=$(grep -v '^[[:space:]]*#' "$packages_file" | grep -v '^[[:space:]]*$' | paste -sd, -)
rm -rf "$root"
mmdebstrap \
  --mode=root \
  --variant=apt \
  --format=directory \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --dpkgopt='path-exclude=/usr/share/linda/*' \
  --setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"' \
  --setup-hook='printf "MODULES=list\nCOMPRESS=zstd\n" > "$1/etc/initramfs-tools/conf.d/capl-node.conf"' \
  --setup-hook='mkdir -p "$1/usr/share/initramfs-tools/modules.d"' \
  --setup-hook='printf "virtio_pci\nvirtio_blk\nvirtio_scsi\nsd_mod\next4\n" > "$1/usr/share/initramfs-tools/modules.d/capl-node"' \
  --include="$include" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log "$1"/var/cache/debconf/*-old' \
  --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
  --customize-hook=': > "$1/etc/machine-id"; rm -f "$1/var/lib/dbus/machine-id" "$1/etc/resolv.conf"' \
  bookworm "$root" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
