//! `cargo xtask guest-image`: the tiny test guest the e2e tests and the demo boot.
//!
//! Built from the distribution's packages only (`cargo xtask host deps` installs
//! them): the cloud kernel (`linux-image-cloud-amd64`), `busybox-static`,
//! `syslinux`, `mtools`, `dosfstools`, `qemu-utils`, `xz-utils`, and for the
//! UEFI boot path `systemd-boot-efi` (the EFI stub) and `binutils` (objcopy).
//!
//! The guest is a kernel plus a busybox initramfs whose `/init`:
//! 1. loads the virtio (with virtio-scsi), IDE, AHCI, SCSI disk, cdrom, isofs,
//!    ext4 and fw_cfg modules (whatever of them the kernel has as modules,
//!    dependencies first, resolved from `modules.dep`);
//! 2. mounts the NoCloud seed (the ISO labelled `cidata`, an IDE or SATA cdrom, `/dev/sr0`);
//! 3. prints one line to the serial console that tests grep for:
//!    `CAPL-GUEST instance-id=<id> local-hostname=<name> user-data-sha256=<hex>`;
//! 4. with a `network-config` on the seed (the provider's cloud-init v2:
//!    interfaces matched by MAC, each with static addresses from IPAM or
//!    `dhcp4: true`, a default route through the first one's gateway),
//!    configures each interface, printing
//!    `CAPL-GUEST static ip=<address> dev=<interface> gateway=<gateway>` for
//!    each static one, and runs `udhcpc` on each DHCP one; without one, brings
//!    `eth0` up and runs `udhcpc -x hostname:<local-hostname>` on it; udhcpc
//!    prints `CAPL-GUEST dhcp bound ip=<address>` when it has a lease;
//! 5. prints the SHA-256 of each firmware config entry Ignition reads that
//!    QEMU has (`CAPL-GUEST fw_cfg opt/com.coreos/config sha256=<hex>`, and
//!    the same for `opt/org.flatcar-linux/config`);
//! 6. prints each disk but the seed, `CAPL-GUEST disk <dev> serial=<serial>
//!    bytes=<size>`; for each serial a `#capl-mount <serial>...` line of the
//!    user-data names, makes a file system on that disk, mounts it and
//!    writes and reads back a file, printing `CAPL-GUEST mounted serial=<serial>
//!    dev=<dev> at /data/<serial>`;
//! 7. pings every address a `#capl-ping <address>...` line of the user-data
//!    names (but its own) until it answers, printing `CAPL-GUEST ping <address> ok`
//!    (or `failed` after 5 minutes): tests see guests reach each other;
//! 8. stays alive.
//!
//! The disk is a FAT "superfloppy" written with mtools (no loop devices, no
//! mounts), then converted to qcow2. It boots with BIOS firmware (syslinux in
//! its boot sector) and with UEFI firmware (OVMF starts the removable-media
//! path `EFI/BOOT/BOOTX64.EFI`, here a unified kernel image: systemd's EFI
//! stub with the kernel, the initramfs and the command line added as PE
//! sections by objcopy), so tests boot guests with `spec.firmware.type uefi`
//! too. It is cached at
//! `~/.cache/cluster-api-provider-libvirt/guest/<kernel>-<hash>/base.qcow2`,
//! where the hash covers everything written into the image besides the kernel,
//! busybox and the EFI stub (init script, DHCP script, boot config, module
//! list); a cached image is reused.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::short_hash;

/// The file name of the image inside its cache directory.
pub const IMAGE_FILE: &str = "base.qcow2";
/// The environment variable that overrides the cache root (tests, CI).
pub const CACHE_ENV: &str = capl_testbed::env::GUEST_CACHE_DIR;

/// Modules the guest needs, by name; each is loaded with its dependencies
/// unless the kernel has it built in.
const NEEDED_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
    "virtio_scsi",
    "ata_piix",
    "ahci",
    "sd_mod",
    "sr_mod",
    "isofs",
    "ext4",
    "qemu_fw_cfg",
];

/// Size of the FAT image in KiB (kernel ~10 MiB, initramfs ~3 MiB).
const FAT_KIB: &str = "65536";

const INIT_SCRIPT: &str = r#"#!/bin/sh
# /init of the cluster-api-provider-libvirt test guest (cargo xtask guest-image).
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "CAPL-GUEST $*" > /dev/console; }
say "init kernel=$(uname -r)"
for m in @MODULES@; do
  insmod "/lib/modules/$m.ko" || say "error: insmod $m failed"
done
seed=""
i=0
while [ $i -lt 100 ]; do
  seed=$(findfs LABEL=cidata 2>/dev/null)
  [ -z "$seed" ] && [ -b /dev/sr0 ] && seed=/dev/sr0
  [ -n "$seed" ] && break
  sleep 0.2
  i=$((i + 1))
done
iid=""
host=""
if [ -n "$seed" ] && mount -t iso9660 -o ro "$seed" /mnt/cidata; then
  value() { sed -n "s/^$1:[[:space:]]*//p" /mnt/cidata/meta-data | tr -d "\"'\r"; }
  iid=$(value instance-id)
  host=$(value local-hostname)
  ud=$(sha256sum /mnt/cidata/user-data 2>/dev/null | cut -d' ' -f1)
  say "instance-id=$iid local-hostname=$host user-data-sha256=$ud"
else
  say "error: no cidata seed found (findfs LABEL=cidata, /dev/sr0)"
fi
[ -n "$host" ] && hostname "$host"
ip link set lo up
# A network-config (the provider's v2: interfaces matched by MAC, each with
# static addresses or dhcp4) configures those interfaces; without one, DHCP on
# eth0. The default route comes from the first interface's gateway only.
nc=/mnt/cidata/network-config
self=""
dhcp_on() {
  if [ -n "$host" ]; then
    udhcpc -f -i "$1" -s /etc/udhcpc.script -x "hostname:$host" -t 30 -T 2 -A 2 &
  else
    udhcpc -f -i "$1" -s /etc/udhcpc.script -t 30 -T 2 -A 2 &
  fi
}
if [ -f "$nc" ]; then
  # One line per interface: mac dhcp4 addresses(comma separated or -) gateway(or -)
  awk '
    function out() { if (m != "") print m, d, (a == "" ? "-" : a), (g == "" ? "-" : g) }
    /^  id[0-9]+:/ { out(); m = ""; d = "false"; a = ""; g = "" }
    /macaddress:/ { x = $2; gsub(/"/, "", x); m = x }
    /dhcp4:/ { d = $2 }
    /^ *- *"[0-9a-fA-F.:]*\/[0-9]*" *$/ { x = $2; gsub(/"/, "", x); a = (a == "" ? x : a "," x) }
    /via:/ { x = $2; gsub(/"/, "", x); if (g == "") g = x }
    END { out() }
  ' "$nc" > /tmp/nics
  n=0
  while read -r mac dhcp addrs gw; do
    dev=""
    for d in /sys/class/net/*; do
      [ "$(cat "$d/address")" = "$mac" ] && dev=${d##*/}
    done
    if [ -z "$dev" ]; then
      say "error: network-config names MAC $mac, no interface has it"
      n=$((n + 1))
      continue
    fi
    ip link set "$dev" up
    if [ "$dhcp" = "true" ]; then
      dhcp_on "$dev"
    else
      [ "$gw" = "-" ] && gw=""
      for a in $(echo "$addrs" | tr ',' ' '); do
        [ "$a" = "-" ] || ip addr add "$a" dev "$dev"
      done
      [ "$n" = 0 ] && [ -n "$gw" ] && ip route add default via "$gw"
      first=$(echo "$addrs" | cut -d, -f1)
      self="$self ${first%/*}"
      say "static ip=${first%/*} dev=$dev gateway=$gw"
    fi
    n=$((n + 1))
  done < /tmp/nics
else
  ip link set eth0 up || say "error: no eth0"
  dhcp_on eth0
fi
# The firmware config entries Ignition reads (QEMU's fw_cfg, in sysfs).
for entry in opt/com.coreos/config opt/org.flatcar-linux/config; do
  f="/sys/firmware/qemu_fw_cfg/by_name/$entry/raw"
  [ -f "$f" ] && say "fw_cfg $entry sha256=$(sha256sum "$f" | cut -d' ' -f1)"
done
# Every disk but the seed, with its serial: virtio's from sysfs, SATA's and
# SCSI's from the unit serial number page (VPD 0x80, after its 4-byte header).
serial_of() {
  if [ -f "/sys/block/$1/serial" ]; then cat "/sys/block/$1/serial"
  elif [ -f "/sys/block/$1/device/vpd_pg80" ]; then tail -c +5 "/sys/block/$1/device/vpd_pg80" | tr -d '\000 '
  fi
}
for b in /sys/block/vd* /sys/block/sd*; do
  [ -e "$b" ] || continue
  d=${b##*/}
  say "disk $d serial=$(serial_of "$d") bytes=$(($(cat "$b/size") * 512))"
done
# A line "capl-mount <serial>..." after a hash in the user-data: make a file
# system on the disk with that serial (ext2, which busybox makes and the ext4
# driver mounts), mount it, write and read back a file.
for want in $(sed -n 's/^#capl-mount[[:space:]]*//p' /mnt/cidata/user-data 2>/dev/null); do
  dev=""
  for b in /sys/block/vd* /sys/block/sd*; do
    [ -e "$b" ] && [ "$(serial_of "${b##*/}")" = "$want" ] && dev=${b##*/}
  done
  if [ -z "$dev" ]; then say "error: no disk with serial $want"; continue; fi
  mkdir -p "/data/$want"
  if mke2fs -F "/dev/$dev" > /dev/null 2>&1 && mount -t ext4 "/dev/$dev" "/data/$want" \
    && echo "$iid" > "/data/$want/owner" && sync && [ "$(cat "/data/$want/owner")" = "$iid" ]; then
    say "mounted serial=$want dev=$dev at /data/$want"
  else
    say "error: mounting serial=$want dev=$dev failed"
  fi
done
# A line "capl-ping <address>..." after a hash in the user-data: ping each (not our own)
# until it answers, for up to 5 minutes, and say so.
reach() {
  n=0
  while [ $n -lt 150 ]; do
    if ping -c 1 -W 2 "$1" > /dev/null 2>&1; then say "ping $1 ok"; return; fi
    n=$((n + 1))
    sleep 1
  done
  say "ping $1 failed"
}
peers=$(sed -n 's/^#capl-ping[[:space:]]*//p' /mnt/cidata/user-data 2>/dev/null)
for p in $peers; do
  case " $self " in
    *" $p "*) ;;
    *) reach "$p" & ;;
  esac
done
while true; do
  wait
  sleep 60
done
"#;

const UDHCPC_SCRIPT: &str = r#"#!/bin/sh
case "$1" in
  deconfig)
    ip addr flush dev "$interface"
    ;;
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route replace default via "${router%% *}"
    echo "CAPL-GUEST dhcp $1 ip=$ip" > /dev/console
    ;;
esac
exit 0
"#;

/// The kernel's command line, with either firmware.
const KERNEL_CMDLINE: &str = "console=ttyS0 loglevel=4 panic=5";

/// syslinux's configuration (BIOS): the kernel, the initramfs, [`KERNEL_CMDLINE`].
fn syslinux_cfg() -> String {
    format!(
        "DEFAULT guest\nPROMPT 0\nTIMEOUT 0\nLABEL guest\n  KERNEL vmlinuz\n  APPEND initrd=initrd.img {KERNEL_CMDLINE}\n"
    )
}

/// systemd's EFI stub for x86-64 (Debian's and Ubuntu's `systemd-boot-efi`):
/// started by the firmware, it boots the kernel, initramfs and command line
/// found in its own PE sections.
const EFI_STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

/// Where UEFI firmware looks for a boot loader on removable media (x86-64).
const EFI_BOOT_PATH: &str = "::EFI/BOOT/BOOTX64.EFI";

#[derive(clap::Args)]
pub struct Args {
    /// Build again even when the cached image exists.
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> Result<()> {
    let path = build(args.force)?;
    println!("{}", path.display());
    Ok(())
}

/// The kernel the guest boots: its version, the vmlinuz and the modules directory.
struct Kernel {
    version: String,
    vmlinuz: PathBuf,
    modules: PathBuf,
}

/// Builds the image unless it is cached; returns the path of `base.qcow2`.
pub fn build(force: bool) -> Result<PathBuf> {
    let started = Instant::now();
    let kernel = find_kernel()?;
    let busybox = find_busybox()?;
    let modules = module_load_order(&kernel.modules, NEEDED_MODULES)?;
    let names: Vec<String> = modules.iter().map(|m| module_name(m)).collect();
    let init = INIT_SCRIPT.replace("@MODULES@", &names.join(" "));
    let syslinux_cfg = syslinux_cfg();
    let key = format!(
        "{}-{}",
        kernel.version,
        &short_hash(&[&init, UDHCPC_SCRIPT, &syslinux_cfg, KERNEL_CMDLINE, EFI_BOOT_PATH, FAT_KIB])
    );
    let dir = cache_root()?.join(&key);
    let image = dir.join(IMAGE_FILE);
    if image.is_file() && !force {
        eprintln!("guest-image: reusing {}", image.display());
        return Ok(image);
    }
    let sh = Shell::new()?;
    require_tools(&sh)?;
    let work = dir.with_extension("partial");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    // initramfs
    let mut cpio = Cpio::default();
    for d in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "mnt",
        "mnt/cidata",
        "etc",
        "lib",
        "lib/modules",
        "tmp",
        "usr",
        "usr/bin",
        "usr/sbin",
    ] {
        cpio.dir(d);
    }
    cpio.char_device("dev/console", 5, 1);
    let busybox_bytes = fs::read(&busybox).with_context(|| format!("reading {}", busybox.display()))?;
    cpio.file("bin/busybox", 0o755, &busybox_bytes);
    cpio.symlink("bin/sh", "busybox");
    cpio.file("init", 0o755, init.as_bytes());
    cpio.file("etc/udhcpc.script", 0o755, UDHCPC_SCRIPT.as_bytes());
    for module in &modules {
        let bytes = read_module(&sh, &kernel.modules, module)?;
        cpio.file(&format!("lib/modules/{}.ko", module_name(module)), 0o644, &bytes);
    }
    let initrd = work.join("initrd.img");
    fs::write(&initrd, cpio.finish()).with_context(|| format!("writing {}", initrd.display()))?;
    let cfg = work.join("syslinux.cfg");
    fs::write(&cfg, &syslinux_cfg).with_context(|| format!("writing {}", cfg.display()))?;
    let uki = unified_kernel_image(&sh, &work, &kernel.vmlinuz, &initrd)?;

    // FAT superfloppy, syslinux, files; all without mounting.
    let raw = work.join("disk.raw");
    let vmlinuz = &kernel.vmlinuz;
    cmd!(sh, "mkfs.vfat -n CAPLGUEST -C {raw} {FAT_KIB}").quiet().ignore_stdout().run().context("mkfs.vfat failed")?;
    cmd!(sh, "syslinux --install {raw}").quiet().run().context("syslinux --install failed")?;
    for (src, name) in
        [(vmlinuz.as_path(), "::vmlinuz"), (initrd.as_path(), "::initrd.img"), (cfg.as_path(), "::syslinux.cfg")]
    {
        cmd!(sh, "mcopy -o -i {raw} {src} {name}")
            .quiet()
            .run()
            .with_context(|| format!("mcopy {} into the FAT image failed", src.display()))?;
    }
    cmd!(sh, "mmd -i {raw} ::EFI ::EFI/BOOT").quiet().run().context("mmd EFI/BOOT in the FAT image failed")?;
    cmd!(sh, "mcopy -o -i {raw} {uki} {EFI_BOOT_PATH}")
        .quiet()
        .run()
        .context("mcopy of the unified kernel image into the FAT image failed")?;
    fs::remove_file(&uki).ok();
    let qcow2 = work.join(IMAGE_FILE);
    cmd!(sh, "qemu-img convert -f raw -O qcow2 {raw} {qcow2}").quiet().run().context("qemu-img convert failed")?;
    fs::remove_file(&raw).ok();
    fs::write(work.join("init"), &init).ok();
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::rename(&work, &dir).with_context(|| format!("moving {} to {}", work.display(), dir.display()))?;
    eprintln!(
        "guest-image: built {} (kernel {}, modules: {}) in {:.1} s",
        image.display(),
        kernel.version,
        names.join(" "),
        started.elapsed().as_secs_f64()
    );
    Ok(image)
}

/// The unified kernel image `work/BOOTX64.EFI`: [`EFI_STUB`] with the
/// sections `.osrel`, `.cmdline`, `.linux` and `.initrd` added by objcopy,
/// each at its own address after the stub's last section (the stub finds them
/// by name; they must not overlap it or each other).
fn unified_kernel_image(sh: &Shell, work: &Path, vmlinuz: &Path, initrd: &Path) -> Result<PathBuf> {
    let osrel = work.join("os-release");
    fs::write(&osrel, "ID=capl-test-guest\nNAME=\"cluster-api-provider-libvirt test guest\"\n")?;
    let cmdline = work.join("cmdline");
    fs::write(&cmdline, KERNEL_CMDLINE)?;
    let headers = cmd!(sh, "objdump -h {EFI_STUB}").quiet().read().context("objdump -h of the EFI stub failed")?;
    let mut address = align_up(stub_end(&headers)?, SECTION_ALIGN);
    let mut args: Vec<String> = Vec::new();
    for (name, file) in
        [(".osrel", osrel.as_path()), (".cmdline", cmdline.as_path()), (".linux", vmlinuz), (".initrd", initrd)]
    {
        let size = fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
        args.push("--add-section".into());
        args.push(format!("{name}={}", file.display()));
        args.push("--change-section-vma".into());
        args.push(format!("{name}={address:#x}"));
        address = align_up(address + size, SECTION_ALIGN);
    }
    let out = work.join("BOOTX64.EFI");
    cmd!(sh, "objcopy {args...} {EFI_STUB} {out}")
        .quiet()
        .run()
        .context("objcopy of the unified kernel image failed")?;
    Ok(out)
}

/// The alignment of the unified kernel image's added sections.
const SECTION_ALIGN: u64 = 0x10000;

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

/// The end of the highest section in `objdump -h` output (VMA + size).
fn stub_end(headers: &str) -> Result<u64> {
    let ends: Vec<u64> = headers
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "Idx Name Size VMA LMA File-off Algn" rows start with the index.
            fields.first()?.parse::<u32>().ok()?;
            let size = u64::from_str_radix(fields.get(2)?, 16).ok()?;
            let vma = u64::from_str_radix(fields.get(3)?, 16).ok()?;
            Some(vma + size)
        })
        .collect();
    ends.into_iter().max().context("objdump -h listed no sections of the EFI stub")
}

fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .context("HOME is not set: cannot place the guest image cache (or set CAPL_GUEST_CACHE_DIR)")?;
    Ok(PathBuf::from(home).join(".cache/cluster-api-provider-libvirt/guest"))
}

fn require_tools(sh: &Shell) -> Result<()> {
    let missing: Vec<&str> = ["mkfs.vfat", "syslinux", "mcopy", "mmd", "qemu-img", "xz", "objcopy", "objdump"]
        .into_iter()
        .filter(|tool| {
            let check = format!("command -v {tool} || test -x /usr/sbin/{tool} || test -x /sbin/{tool}");
            cmd!(sh, "sh -c {check}").quiet().ignore_stdout().ignore_stderr().run().is_err()
        })
        .collect();
    if !missing.is_empty() {
        bail!("guest-image needs {} on PATH: run `cargo xtask host deps` (as root)", missing.join(", "));
    }
    if !Path::new(EFI_STUB).is_file() {
        bail!("guest-image needs systemd's EFI stub {EFI_STUB}: run `cargo xtask host deps` (as root)");
    }
    Ok(())
}

/// The newest kernel in /boot that has a modules directory; a `cloud` flavour
/// (Debian's linux-image-cloud-amd64) wins over others.
fn find_kernel() -> Result<Kernel> {
    let mut candidates = Vec::new();
    for entry in fs::read_dir("/boot").context("reading /boot")?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(version) = name.strip_prefix("vmlinuz-") else {
            continue;
        };
        let modules = Path::new("/lib/modules").join(version);
        if modules.join("modules.dep").is_file() {
            candidates.push(Kernel { version: version.to_string(), vmlinuz: entry.path(), modules });
        }
    }
    candidates.sort_by_key(|k| (k.version.contains("cloud"), version_key(&k.version)));
    candidates.pop().context(
        "no kernel with modules in /boot and /lib/modules: install linux-image-cloud-amd64 \
         with `cargo xtask host deps` (as root)",
    )
}

/// Numeric parts of a kernel version, for ordering (6.12.9 < 6.12.10).
fn version_key(version: &str) -> Vec<u64> {
    version.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok()).collect()
}

fn find_busybox() -> Result<PathBuf> {
    for path in ["/bin/busybox", "/usr/bin/busybox"] {
        let path = Path::new(path);
        if let Ok(bytes) = fs::read(path) {
            // A dynamically linked busybox names its loader; the guest has none.
            let dynamic = bytes.windows(14).any(|w| w == b"/lib64/ld-linu");
            if !dynamic {
                return Ok(path.to_path_buf());
            }
        }
    }
    bail!(
        "no statically linked busybox at /bin/busybox: install busybox-static with \
         `cargo xtask host deps` (as root)"
    )
}

/// `kernel/drivers/net/virtio_net.ko.xz` -> `virtio_net`.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// The module files (relative to the modules directory) to load for `needed`,
/// dependencies before dependents, each once; built-in modules are skipped.
fn module_load_order(modules_dir: &Path, needed: &[&str]) -> Result<Vec<String>> {
    let dep_file = modules_dir.join("modules.dep");
    let deps_text = fs::read_to_string(&dep_file).with_context(|| format!("reading {}", dep_file.display()))?;
    let builtin_text = fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
    let builtin: BTreeSet<String> = builtin_text.lines().map(module_name).collect();
    let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in deps_text.lines() {
        let Some((module, rest)) = line.split_once(':') else {
            continue;
        };
        deps.insert(module_name(module), (module.to_string(), rest.split_whitespace().map(str::to_string).collect()));
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        deps: &BTreeMap<String, (String, Vec<String>)>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(name.to_string()) {
            return;
        }
        if let Some((path, requires)) = deps.get(name) {
            for dep in requires {
                visit(&module_name(dep), deps, seen, order);
            }
            order.push(path.clone());
        }
    }
    for name in needed {
        if builtin.contains(*name) {
            continue;
        }
        if !deps.contains_key(*name) {
            bail!(
                "kernel module {name} is neither built in nor listed in {}: this kernel cannot \
                 run the test guest (use Debian's linux-image-cloud-amd64)",
                dep_file.display()
            );
        }
        visit(name, &deps, &mut seen, &mut order);
    }
    Ok(order)
}

/// A module file's bytes, decompressed (busybox's insmod takes plain ELF).
fn read_module(sh: &Shell, modules_dir: &Path, module: &str) -> Result<Vec<u8>> {
    let path = modules_dir.join(module);
    if module.ends_with(".xz") {
        let out = cmd!(sh, "xz -dc {path}")
            .quiet()
            .output()
            .with_context(|| format!("decompressing {} with xz", path.display()))?;
        Ok(out.stdout)
    } else if module.ends_with(".zst") {
        let out = cmd!(sh, "zstd -dc {path}")
            .quiet()
            .output()
            .with_context(|| format!("decompressing {} with zstd (install zstd)", path.display()))?;
        Ok(out.stdout)
    } else if module.ends_with(".gz") {
        let out = cmd!(sh, "gzip -dc {path}")
            .quiet()
            .output()
            .with_context(|| format!("decompressing {} with gzip", path.display()))?;
        Ok(out.stdout)
    } else {
        fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }
}

/// A `newc` cpio archive, written in memory (owner root, mtime 0).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    next_ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.next_ino += 1;
        let fields =
            [self.next_ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, rdev.0, rdev.1, name.len() as u32 + 1, 0];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, (0, 0), target.as_bytes());
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_image_sections_go_after_the_stubs_last_section() {
        let headers = "\n/usr/lib/systemd/boot/efi/linuxx64.efi.stub:     file format pei-x86-64\n\nSections:\n\
            Idx Name          Size      VMA               LMA               File off  Algn\n\
            \x20 0 .text         0000bff0  0000000000004000  0000000000004000  00000400  2**4\n\
            \x20                 CONTENTS, ALLOC, LOAD, READONLY, CODE\n\
            \x20 7 .sdmagic      00000034  0000000000019100  0000000000019100  00011200  2**2\n\
            \x20 6 .sbat         000000e2  0000000000019000  0000000000019000  00011000  2**2\n";
        assert_eq!(stub_end(headers).unwrap(), 0x19134);
        assert_eq!(align_up(0x19134, SECTION_ALIGN), 0x20000);
        assert_eq!(align_up(0x20000, SECTION_ALIGN), 0x20000);
        assert!(stub_end("Sections:\nIdx Name Size VMA\n").is_err());
    }

    #[test]
    fn module_names_drop_directories_and_compression() {
        assert_eq!(module_name("kernel/drivers/net/virtio_net.ko.xz"), "virtio_net");
        assert_eq!(module_name("kernel/fs/isofs/isofs.ko"), "isofs");
    }

    #[test]
    fn dependencies_load_first_and_builtins_are_skipped() {
        let dir = std::env::temp_dir().join(format!("capl-guest-modtest-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("modules.dep"),
            "kernel/a/sr_mod.ko.xz: kernel/a/scsi_mod.ko.xz kernel/a/scsi_common.ko.xz kernel/a/cdrom.ko.xz\n\
             kernel/a/scsi_mod.ko.xz: kernel/a/scsi_common.ko.xz\nkernel/a/scsi_common.ko.xz:\n\
             kernel/a/cdrom.ko.xz:\nkernel/a/isofs.ko.xz: kernel/a/cdrom.ko.xz\n",
        )
        .unwrap();
        fs::write(dir.join("modules.builtin"), "kernel/v/virtio_pci.ko\n").unwrap();
        let order = module_load_order(&dir, &["virtio_pci", "sr_mod", "isofs"]).unwrap();
        let names: Vec<String> = order.iter().map(|m| module_name(m)).collect();
        assert_eq!(names, ["scsi_common", "scsi_mod", "cdrom", "sr_mod", "isofs"]);
        assert!(module_load_order(&dir, &["nonexistent"]).is_err());
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn cpio_entries_are_aligned_and_end_with_the_trailer() {
        let mut cpio = Cpio::default();
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        cpio.symlink("bin/sh", "busybox");
        let out = cpio.finish();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("TRAILER!!!") && text.contains("#!/bin/sh"));
    }
}
