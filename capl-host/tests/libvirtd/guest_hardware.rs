//! CPU and firmware settings (`spec.cpu`, `spec.firmware`) on the private
//! libvirtd (`cargo xtask host up`; QEMU with TCG, OVMF and swtpm from
//! `cargo xtask host deps`): what libvirt accepts and keeps of the domain
//! XML, and what the host's domain capabilities refuse.
//!
//! What the host offers is read from its domain capabilities, never assumed:
//! the test machines have no KVM, but a host with KVM runs the same tests.
//! The test guest (`cargo xtask guest-image`) boots with BIOS and with UEFI
//! firmware, so a machine with UEFI firmware is also booted and seen to
//! read its seed; its boot loader is not signed, so with Secure Boot the
//! firmware is seen to refuse it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capl_host::domain_capabilities::DomainCapabilities;
use capl_host::domain_xml::{DomainDefinition, OwnerMarker, domain_xml, host_kvm_support, parse_domain};
use capl_host::guest_hardware::{CpuMode, CpuSettings, CpuTopology, FirmwareSettings, FirmwareType, machine_type};
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::{DomainState, ErrorKind, HostAdmin, Hypervisor, UndefineFlags};
use capl_host::{FailureKind, HostError, MachineSpec, RebootMethod, create_machine, reboot_machine};
use capl_host_test_support::host::{domain_id, fresh_spec, user_data};
use capl_host_test_support::real_host::{connect_checked, fixture, guest_image_volume_in, ours_on_host};
use testenv::test_host::{BASE_POOL, DISK_POOL, NETWORK};

/// The host architecture and the domain type a machine gets there (kvm
/// when offered; the machine specs of these tests ask for qemu).
fn arch_and_kvm(h: &LibvirtHypervisor) -> (String, bool) {
    host_kvm_support(&h.capabilities_xml().expect("capabilities")).expect("capabilities XML")
}

fn domain_capabilities(h: &LibvirtHypervisor, machine: Option<&str>, domain_type: &str) -> DomainCapabilities {
    let (arch, _) = arch_and_kvm(h);
    let xml = h.domain_capabilities_xml(&arch, machine, domain_type).expect("domain capabilities");
    DomainCapabilities::parse(&xml).unwrap_or_else(|e| panic!("unreadable domain capabilities ({e}):\n{xml}"))
}

/// A domain definition of `name` (its disks need not exist: it is defined, never started).
fn definition(h: &LibvirtHypervisor, name: &str, uuid: &str) -> DomainDefinition {
    let (arch, _) = arch_and_kvm(h);
    DomainDefinition {
        name: name.into(),
        uuid: uuid.into(),
        domain_type: "qemu".into(),
        arch,
        vcpu: 2,
        memory_mib: 128,
        overlay_path: format!("/var/lib/capl-libvirt/pools/disks/{name}.qcow2"),
        iso_path: format!("/var/lib/capl-libvirt/pools/disks/{name}-cidata.iso"),
        network: NETWORK.into(),
        mac: "52:54:00:c0:fe:01".into(),
        additional_nics: Vec::new(),
        console_log_path: None,
        owner: OwnerMarker {
            namespace: "capl-hw".into(),
            name: name.into(),
            uid: uuid.into(),
            cluster: "host-tests".into(),
        },
        cpu: None,
        nested_feature: None,
        firmware: None,
        data_disks: Vec::new(),
        ignition_path: None,
    }
}

fn undefine_if_present(h: &LibvirtHypervisor, name: &str) {
    if let Err(e) = h.domain_undefine(name, UndefineFlags::all()) {
        assert_eq!(e.kind, ErrorKind::NoDomain, "cleaning up domain {name}: {e}");
    }
}

#[test]
fn a_custom_cpu_model_the_host_lists_and_a_topology_are_kept() {
    let _daemon = crate::share_real_daemon_blocking();
    let (_, h) = connect_checked();
    let (arch, _) = arch_and_kvm(&h);
    let caps = domain_capabilities(&h, machine_type(&arch, None), "qemu");
    let model = ["qemu64", "kvm64", "qemu32"]
        .into_iter()
        .find(|m| caps.custom_model_usable(m) == Some(true))
        .unwrap_or_else(|| panic!("the host lists none of qemu64, kvm64, qemu32 as usable: {:?}", caps.custom_models));
    let name = "capl-hw-custom-cpu";
    undefine_if_present(&h, name);
    let mut d = definition(&h, name, "7d3e1c52-0b1a-4c55-9e1f-3c2a6b8d0a01");
    d.cpu = Some(CpuSettings {
        mode: CpuMode::Custom,
        model: Some(model.into()),
        topology: Some(CpuTopology { sockets: 1, cores: 2, threads: 1 }),
        nested_virtualization: false,
    });
    h.domain_define(&domain_xml(&d)).unwrap_or_else(|e| panic!("libvirt refused a custom CPU {model}: {e}"));
    let back = h.domain_xml(name).expect("domain XML");
    undefine_if_present(&h, name);
    assert!(back.contains("<cpu mode='custom' match='exact'"), "{back}");
    assert!(back.contains(&format!(">{model}</model>")), "model {model} missing: {back}");
    assert!(back.contains("sockets='1'") && back.contains("cores='2'") && back.contains("threads='1'"), "{back}");
    assert_eq!(parse_domain(&back).unwrap().owner, Some(d.owner));
}

#[test]
fn uefi_firmware_gets_an_efi_loader() {
    let _daemon = crate::share_real_daemon_blocking();
    let (_, h) = connect_checked();
    let (arch, _) = arch_and_kvm(&h);
    let firmware = FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: false, tpm: false };
    let caps = domain_capabilities(&h, machine_type(&arch, Some(&firmware)), "qemu");
    assert!(
        caps.firmware.iter().any(|f| f == "efi") && !caps.loaders.is_empty(),
        "the test host offers no EFI firmware (firmware {:?}, loaders {:?}): install OVMF with `cargo xtask host deps`",
        caps.firmware,
        caps.loaders
    );
    let name = "capl-hw-uefi";
    undefine_if_present(&h, name);
    let mut d = definition(&h, name, "7d3e1c52-0b1a-4c55-9e1f-3c2a6b8d0a02");
    d.firmware = Some(firmware);
    h.domain_define(&domain_xml(&d)).unwrap_or_else(|e| panic!("libvirt refused UEFI firmware: {e}"));
    let back = h.domain_xml(name).expect("domain XML");
    undefine_if_present(&h, name);
    // Auto-selection happens at define: the read-back XML names the loader image it chose.
    let loader = back
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("<loader"))
        .unwrap_or_else(|| panic!("no <loader> in the defined domain: {back}"));
    assert!(caps.loaders.iter().any(|path| loader.contains(path.as_str())), "{loader} is none of {:?}", caps.loaders);
    assert!(back.contains("firmware='efi'") && back.contains("q35"), "{back}");
}

/// How long a UEFI guest's console may take to show what a test waits for (OVMF and the kernel under TCG).
const UEFI_GUEST_WITHIN: Duration = Duration::from_secs(300);

/// Creates the machine `name` from the test guest as `shape` makes it, with
/// the bootstrap data `bootstrap` makes of its spec and its serial console
/// logged; runs `check` on it (the host, the spec, the console log's path),
/// then deletes it: nothing of it may be left on the host. Returns what
/// `check` returned.
fn on_a_guest_with<T>(
    name: &str,
    shape: impl FnOnce(&mut MachineSpec),
    bootstrap: impl FnOnce(&MachineSpec) -> Vec<u8>,
    check: impl FnOnce(&LibvirtHypervisor, &MachineSpec, &Path) -> T,
) -> T {
    let _daemon = crate::share_real_daemon_blocking();
    let (_, h) = connect_checked();
    let fx = fixture(&guest_image_volume_in(&h, BASE_POOL));
    let logs = PathBuf::from(format!("/var/tmp/capl-hw-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    let mut spec = fresh_spec(&h, &fx, "capl-hw", name);
    // OVMF with its 4 MiB variable store wants more than the tests' usual 128 MiB.
    spec.memory_mib = 256;
    spec.console_log_dir = Some(logs.display().to_string());
    shape(&mut spec);
    let _ = capl_host::delete_machine(&h, &spec);
    let console = logs.join(format!("{}-console.log", spec.names().domain));
    let seed = bootstrap(&spec);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        create_machine(&h, &spec, &seed).unwrap_or_else(|e| panic!("create machine {name}: {e}"));
        check(&h, &spec, &console)
    }));
    let deleted = capl_host::delete_machine(&h, &spec);
    let left = ours_on_host(&h, &fx, name);
    std::fs::remove_dir_all(&logs).ok();
    let checked = outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    deleted.unwrap_or_else(|e| panic!("delete machine {name}: {e}"));
    assert!(left.is_empty(), "left on the host: {left:?}");
    checked
}

/// Reads the console log every 2 s until `seen` says the guest got where
/// the test waits for (`Ok(true)`) or somewhere it must not (`Err`), for at
/// most [`UEFI_GUEST_WITHIN`].
fn watch_console(console: &Path, waiting_for: &str, seen: impl Fn(&str) -> Result<bool, String>) {
    let deadline = Instant::now() + UEFI_GUEST_WITHIN;
    loop {
        let log = std::fs::read_to_string(console).unwrap_or_default();
        match seen(&log) {
            Ok(true) => return,
            Err(wrong) => panic!("{wrong}; the console:\n{log}"),
            Ok(false) => {}
        }
        assert!(Instant::now() < deadline, "no {waiting_for} within {UEFI_GUEST_WITHIN:?}; the console:\n{log}");
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A machine with UEFI firmware boots: OVMF starts the guest disk's
/// `EFI/BOOT/BOOTX64.EFI` from the root disk (the overlay on the base
/// image), and the guest finds its seed on the cdrom, printing the
/// machine's identity on its serial console.
#[test]
fn a_machine_with_uefi_firmware_boots_and_reads_its_seed() {
    let firmware = FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: false, tpm: false };
    on_a_guest_with(
        "uefi-boot",
        |s| s.firmware = Some(firmware),
        user_data,
        |h, spec, console| {
            let xml = h.domain_xml(&spec.names().domain).expect("domain XML");
            assert!(xml.contains("firmware='efi'") && xml.contains("<loader"), "no EFI loader: {xml}");
            assert!(xml.contains("q35") && xml.contains("bus='sata'"), "the seed is a SATA cdrom on q35: {xml}");
            let want = format!("CAPL-GUEST instance-id={} ", spec.identity);
            watch_console(console, &want, |log| {
                // The guest reports a seed it cannot find (after 20 s) instead of its identity.
                if log.contains("CAPL-GUEST error: no cidata seed") {
                    return Err(format!("the UEFI guest found no seed; its domain:\n{xml}"));
                }
                Ok(log.contains(&want))
            });
        },
    );
}

/// A machine with Secure Boot and a TPM runs: libvirt picks a Secure Boot
/// OVMF build with the usual keys enrolled, swtpm serves the TPM, and the
/// firmware refuses the test guest's boot loader, which is not signed (that
/// refusal is Secure Boot at work). Deleting the machine removes its UEFI
/// variables and its TPM state with the domain.
#[test]
fn a_machine_with_secure_boot_and_a_tpm_runs_and_refuses_an_unsigned_loader() {
    let firmware = FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: true, tpm: true };
    let state_files = on_a_guest_with(
        "secure-boot",
        |s| s.firmware = Some(firmware),
        user_data,
        |h, spec, console| {
            let domain = spec.names().domain;
            assert_eq!(h.domain_state(&domain).unwrap(), DomainState::Running);
            let xml = h.domain_xml(&domain).expect("domain XML");
            for part in ["<feature enabled='yes' name='secure-boot'/>", "<smm state='on'/>", "<backend type='emulator'"]
            {
                assert!(xml.contains(part), "{part} missing: {xml}");
            }
            let loader = xml.lines().map(str::trim).find(|l| l.starts_with("<loader")).unwrap_or_default();
            assert!(loader.contains("secure='yes'"), "not a Secure Boot firmware build: {loader}");
            let nvram = xml
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("<nvram"))
                .and_then(|l| l.split('>').nth(1))
                .and_then(|rest| rest.split('<').next())
                .unwrap_or_else(|| panic!("no UEFI variable store: {xml}"))
                .to_string();
            let state_files =
                [seen_from_here(&nvram), seen_from_here(&format!("/var/lib/libvirt/swtpm/{}", spec.identity))];
            for file in &state_files {
                assert!(file.exists(), "{} does not exist while the machine runs", file.display());
            }
            watch_console(console, "refusal of the unsigned loader", |log| {
                if log.contains("CAPL-GUEST init") {
                    return Err("the unsigned guest kernel started under Secure Boot".into());
                }
                Ok(log.contains("Access Denied"))
            });
            state_files
        },
    );
    for file in &state_files {
        assert!(!file.exists(), "{} is left after the machine was deleted", file.display());
    }
}

/// A machine with a data disk on each bus boots, and its guest sees each
/// disk with its name as serial and its size, makes a file system on it,
/// mounts it and writes to it (the test guest does what cloud-init's
/// `disk_setup`, `fs_setup` and `mounts` do for a real node image). The
/// disks go with the machine.
#[test]
fn a_guest_sees_mounts_and_writes_its_data_disks() {
    use capl_host::data_disk::{DataDisk, DiskBus, DiskFormat};

    let disks = [
        ("etcd", 1, DiskFormat::Qcow2, DiskBus::Virtio),
        ("images", 2, DiskFormat::Raw, DiskBus::Sata),
        ("logs", 1, DiskFormat::Qcow2, DiskBus::Scsi),
    ];
    let shape = |spec: &mut MachineSpec| {
        spec.data_disks = disks
            .iter()
            .map(|&(name, size_gib, format, bus)| DataDisk {
                name: name.into(),
                size_gib,
                pool: spec.domain_pool.clone(),
                format,
                bus,
                device: None,
            })
            .collect();
    };
    let mount = |spec: &MachineSpec| [user_data(spec), b"#capl-mount etcd images logs\n".to_vec()].concat();
    on_a_guest_with("data-disks", shape, mount, |h, spec, console| {
        let volumes = h.volume_list(DISK_POOL).unwrap();
        for disk in &spec.data_disks {
            let volume = spec.names().data_volume(&disk.name, disk.format.as_str());
            assert!(volumes.contains(&volume), "{volume} is not in {DISK_POOL}: {volumes:?}");
        }
        let seen = |log: &str, serial: &str, bytes: u64| {
            log.lines()
                .any(|l| l.contains("CAPL-GUEST disk ") && l.contains(&format!(" serial={serial} bytes={bytes}")))
        };
        watch_console(console, "the data disks mounted", |log| {
            if let Some(line) = log.lines().find(|l| l.contains("CAPL-GUEST error")) {
                return Err(format!("the guest said: {line}"));
            }
            let all = disks.iter().all(|&(name, size_gib, _, _)| {
                seen(log, name, size_gib * capl_host::volume_xml::GIB)
                    && log.contains(&format!("CAPL-GUEST mounted serial={name} "))
            });
            Ok(all)
        });
    });
}

/// A machine whose bootstrap data is an Ignition config boots, and its guest
/// reads the config back from QEMU's firmware config in sysfs, where
/// Ignition reads it, under both names (Fedora CoreOS's and Flatcar's). The
/// seed is there too: the guest prints the identity it records.
#[test]
fn a_guest_reads_its_ignition_config_from_the_firmware_config() {
    use sha2::{Digest, Sha256};

    let config = br#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/capl","contents":{"source":"data:,ok"}}]}}"#;
    let digest: String = Sha256::digest(config).iter().map(|b| format!("{b:02x}")).collect();
    let shape = |spec: &mut MachineSpec| spec.bootstrap_format = capl_host::BootstrapFormat::Ignition;
    on_a_guest_with(
        "ignition",
        shape,
        |_| config.to_vec(),
        |_, spec, console| {
            let identity = format!("CAPL-GUEST instance-id={} ", spec.identity);
            watch_console(console, "the Ignition config read back", |log| {
                if let Some(line) =
                    log.lines().find(|l| l.contains("CAPL-GUEST fw_cfg") && !l.trim_end().ends_with(&digest))
                {
                    return Err(format!("the guest read another config: {line}"));
                }
                let both = ["opt/com.coreos/config", "opt/org.flatcar-linux/config"]
                    .iter()
                    .all(|entry| log.contains(&format!("CAPL-GUEST fw_cfg {entry} sha256={digest}")));
                Ok(both && log.contains(&identity))
            });
        },
    );
}

/// A machine rebooted while its guest runs is reset, and its guest boots
/// again: the console shows the guest reading its seed a second time, after
/// the first boot's lines in the same log (the QEMU process and its console
/// stay across a reset, so the log is appended to), and the domain runs on
/// with the same id.
#[test]
fn a_guest_boots_again_when_its_machine_is_rebooted() {
    on_a_guest_with(
        "reboot",
        |_| {},
        user_data,
        |h, spec, console| {
            let domain = spec.names().domain;
            let booted = format!("CAPL-GUEST instance-id={} ", spec.identity);
            let boots = |log: &str| log.matches(&booted).count();
            watch_console(console, "the guest's first boot", |log| Ok(boots(log) >= 1));
            let id = domain_id(h, &domain).expect("the guest runs");
            let first = std::fs::read_to_string(console).expect("the console log");
            let done = reboot_machine(h, spec).expect("reboot").expect("the machine exists");
            assert_eq!((done.method, done.was), (RebootMethod::Reset, DomainState::Running), "{}", done.describe());
            watch_console(console, "the guest's second boot", |log| {
                if !log.starts_with(&first) {
                    return Err("the console log was not appended to across the reset".into());
                }
                Ok(boots(log) >= 2)
            });
            assert_eq!(h.domain_state(&domain).unwrap(), DomainState::Running);
            assert_eq!(domain_id(h, &domain), Some(id), "a reset keeps the QEMU process");
        },
    );
}

/// Where a file of the daemon's state is seen from the tests: the private
/// libvirtd (`cargo xtask host up`) has `/var/lib/libvirt` bind-mounted from
/// `<STATE_DIR>/lib` in its mount namespace; another daemon shares ours.
fn seen_from_here(path: &str) -> PathBuf {
    let private = std::env::var(testenv::test_host::URI_ENV).is_ok_and(|uri| uri.contains(testenv::test_host::RUN_DIR));
    match path.strip_prefix("/var/lib/libvirt/") {
        Some(rest) if private => std::path::Path::new(testenv::test_host::STATE_DIR).join("lib").join(rest),
        _ => PathBuf::from(path),
    }
}

#[test]
fn host_passthrough_follows_the_domain_capabilities() {
    let _daemon = crate::share_real_daemon_blocking();
    let (_, h) = connect_checked();
    let fx = fixture("capl-host-tests-base.qcow2");
    capl_host_test_support::host::ensure_base_image(&h, &fx);
    let mut spec = fresh_spec(&h, &fx, "capl-hw", "passthrough");
    spec.cpu =
        Some(CpuSettings { mode: CpuMode::HostPassthrough, model: None, topology: None, nested_virtualization: false });
    let (arch, _) = arch_and_kvm(&h);
    // The spec asks for domain type qemu: TCG has no host CPU to pass through.
    let caps = domain_capabilities(&h, machine_type(&arch, None), "qemu");
    let result = create_machine(&h, &spec, &user_data(&spec));
    let left = ours_on_host(&h, &fx, "passthrough");
    let _ = capl_host::delete_machine(&h, &spec);
    if caps.cpu_mode_supported("host-passthrough") {
        result.expect("the host offers host-passthrough");
        return;
    }
    let err = result.expect_err("host-passthrough under TCG");
    assert_eq!(err.kind(), FailureKind::InvalidMachineSpec, "{err}");
    assert!(matches!(err, HostError::GuestHardwareUnavailable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("spec.cpu.mode host-passthrough") && message.contains("supported='no'"),
        "names the setting and the host's reason: {message}"
    );
    assert!(left.is_empty(), "created before refusing: {left:?}");
    assert!(h.volume_list(DISK_POOL).unwrap().iter().all(|v| !v.contains("passthrough")));
}
