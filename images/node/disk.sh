#!/bin/sh
# disk.sh ROOTDIR OUT.qcow2
#
# Turns the node's root directory into a bootable disk image without loop
# devices or mounts (part of `cargo xtask node-image`; run as root):
#   MBR (syslinux's mbr.bin) | p1: FAT, syslinux + kernel + initrd | p2: ext4 root
# The ext4 file system is written by `mkfs.ext4 -d` straight into the disk file at
# the partition's offset, the FAT one by mkfs.fat --offset and mtools. cloud-init's
# growpart grows p2 to the machine's disk size at first boot. The raw disk is
# converted to a compressed qcow2.
set -eu
root=$1
out=$2
work=$(dirname "$out")/disk-work
rm -rf "$work"
mkdir -p "$work"
raw=$work/disk.raw

kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n 1)
version=${kernel##*/vmlinuz-}
initrd=$root/boot/initrd.img-$version
[ -f "$initrd" ] || { echo "disk.sh: no initramfs $initrd for kernel $version" >&2; exit 1; }
mbr=/usr/lib/syslinux/mbr/mbr.bin
[ -f "$mbr" ] || { echo "disk.sh: $mbr missing: apt-get install syslinux-common" >&2; exit 1; }

boot_start=2048                   # sectors (1 MiB)
boot_sectors=$((128 * 2048))      # 128 MiB
root_start=$((boot_start + boot_sectors))
used_mib=$(du -sxm "$root" | cut -f1)
# Room for the unpacked container images, etcd and logs until growpart runs.
root_mib=$(( (used_mib * 13 / 10 + 1024 + 255) / 256 * 256 ))
root_sectors=$((root_mib * 2048))
total_sectors=$((root_start + root_sectors))
truncate -s $((total_sectors * 512)) "$raw"
sfdisk --quiet "$raw" <<PARTS
label: dos
start=$boot_start, size=$boot_sectors, type=c, bootable
start=$root_start, size=$root_sectors, type=83
PARTS
dd if="$mbr" of="$raw" bs=440 count=1 conv=notrunc status=none

mkfs.fat -F 16 -n CAPLBOOT --offset=$boot_start -h $boot_start "$raw" $((boot_sectors / 2)) >/dev/null
syslinux --offset $((boot_start * 512)) --install "$raw"
# tsc=reliable: under QEMU's software emulation (TCG) a guest with more than one
# vCPU of the default CPU model marks the TSC unstable and falls back to the HPET,
# so every clock read of every Go program (kubelet, containerd, etcd, the API
# server) becomes a system call plus an emulated device access. TCG's TSC comes
# from one host clock for all vCPUs, so it is safe to trust; under KVM the kernel
# still prefers kvm-clock, whose rating is higher.
cat > "$work/syslinux.cfg" <<CFG
DEFAULT node
PROMPT 0
TIMEOUT 0
LABEL node
  KERNEL vmlinuz
  APPEND initrd=initrd.img root=LABEL=capl-root ro console=tty0 console=ttyS0,115200n8 net.ifnames=0 apparmor=0 tsc=reliable
CFG
fat="$raw@@$((boot_start * 512))"
mcopy -o -i "$fat" "$kernel" ::vmlinuz
mcopy -o -i "$fat" "$initrd" ::initrd.img
mcopy -o -i "$fat" "$work/syslinux.cfg" ::syslinux.cfg

mkfs.ext4 -q -F -L capl-root -E offset=$((root_start * 512)) -d "$root" "$raw" "${root_mib}M"

qemu-img convert -c -f raw -O qcow2 "$raw" "$out"
rm -rf "$work"
echo "disk.sh: kernel $version, root ${used_mib} MiB used of ${root_mib} MiB, $(du -m "$out" | cut -f1) MiB qcow2"
