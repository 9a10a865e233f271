//! Two real libvirt hosts on one machine and one L2: two private libvirtd
//! started here (`testenv::lab`; separate sockets, state and pools, like the
//! test host), each with a network in forward mode bridge onto one Linux
//! bridge made by the test, whose only
//! address is the lab gateway inside a network namespace of its own. A machine
//! on each host takes a static address (what IPAM gives), the test guests boot
//! (`cargo xtask guest-image`), configure that address from the seed's
//! network-config and ping each other across the hosts; the namespace reaches
//! both. Each guest has a second NIC straight on a second Linux bridge
//! (`<interface type='bridge'>`, no libvirt network), in a second namespace,
//! with a static address on another subnet: the guests reach each other
//! and that namespace over it too. Deleting them leaves nothing on either host.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capl_host::cloud_init::StaticAddress;
use capl_host::hypervisor::HostAdmin;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::{AdditionalNic, MachineSpec, NicAttachment, create_machine, delete_machine};
use testenv::lab::{ExtraLibvirtd, LabBridge};

use capl_host_test_support::host::{Fixture, IMAGE_BYTES, leftovers, spec};
use capl_host_test_support::real_host::guest_image_volume_in;

/// The lab subnet: `10.78.0.0/24`, gateway `.1` (in the lab namespace), guests `.10` and `.11`.
const GATEWAY: &str = "10.78.0.1";
const GUESTS: [&str; 2] = ["10.78.0.10", "10.78.0.11"];
/// The second lab subnet, on the guests' second NICs: `10.79.0.0/24`, gateway `.1`.
const SECOND_GATEWAY: &str = "10.79.0.1";
const SECOND: [&str; 2] = ["10.79.0.10", "10.79.0.11"];
/// How long a guest may take to boot, configure its address and reach its peer (TCG).
const GUEST_WITHIN: Duration = Duration::from_secs(420);

/// The serial console log of `spec`'s domain in `dir`.
fn console(dir: &Path, spec: &MachineSpec) -> String {
    std::fs::read_to_string(dir.join(format!("{}-console.log", spec.names().domain))).unwrap_or_default()
}

/// Waits until every log has each of `lines`; fails with the logs.
fn wait_for_lines(dir: &Path, specs: &[&MachineSpec], lines: &[Vec<String>]) {
    let deadline = Instant::now() + GUEST_WITHIN;
    loop {
        let logs: Vec<String> = specs.iter().map(|s| console(dir, s)).collect();
        let missing: Vec<String> = logs
            .iter()
            .zip(lines)
            .zip(specs)
            .flat_map(|((log, want), s)| {
                want.iter().filter(|l| !log.contains(l.as_str())).map(move |l| format!("{}: {l}", s.name))
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        let failed: Vec<&String> =
            logs.iter().filter(|l| l.contains("CAPL-GUEST ping") && l.contains("failed")).collect();
        if Instant::now() > deadline || !failed.is_empty() {
            panic!(
                "the guests did not print {missing:?} within {GUEST_WITHIN:?}; their consoles:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[test]
fn guests_on_two_hosts_share_one_bridge_and_reach_each_other() {
    let pid = std::process::id();
    let (base, disks) = ("capl-lab-base", "capl-lab-disks");
    let daemons = ["one", "two"].map(|name| {
        let daemon = ExtraLibvirtd::start(name).unwrap_or_else(|e| panic!("{e:#}"));
        for pool in [base, disks] {
            daemon.add_dir_pool(pool).unwrap_or_else(|e| panic!("{e:#}"));
        }
        daemon
    });
    let [first, second] = daemons
        .each_ref()
        .map(|d| LibvirtHypervisor::connect(d.uri()).unwrap_or_else(|e| panic!("connecting to {}: {e}", d.uri())));
    let lab = LabBridge::create(&format!("2h{}", pid % 10_000), GATEWAY, 24).unwrap_or_else(|e| panic!("{e:#}"));
    let second_lab =
        LabBridge::create(&format!("2s{}", pid % 10_000), SECOND_GATEWAY, 24).unwrap_or_else(|e| panic!("{e:#}"));
    let namespace = format!("two-hosts-{pid}");
    let network = format!("{namespace}-lan");
    let logs = PathBuf::from(format!("/var/tmp/capl-two-hosts-{pid}"));
    std::fs::create_dir_all(&logs).unwrap();

    let fixture = |hv: &LibvirtHypervisor| Fixture {
        network: network.clone(),
        base_pool: base.into(),
        domain_pool: disks.into(),
        image: guest_image_volume_in(hv, base),
        image_bytes: IMAGE_BYTES,
    };
    let hosts: [(&dyn HostAdmin, Fixture); 2] = [(&first, fixture(&first)), (&second, fixture(&second))];
    let mut specs = Vec::new();
    for (i, (hv, fx)) in hosts.iter().enumerate() {
        let _ = hv.network_stop(&network);
        let _ = hv.network_undefine(&network);
        hv.network_define(&format!(
            "<network><name>{network}</name><forward mode='bridge'/><bridge name='{}'/></network>",
            lab.bridge()
        ))
        .unwrap();
        hv.network_start(&network).unwrap();
        let mut s = spec(fx, &namespace, &format!("guest-{i}"));
        s.memory_mib = 256;
        s.console_log_dir = Some(logs.display().to_string());
        s.ipam = true;
        s.static_addresses = vec![StaticAddress {
            address: GUESTS[i].parse().unwrap(),
            prefix: 24,
            gateway: Some(GATEWAY.parse().unwrap()),
        }];
        s.additional_nics = vec![AdditionalNic {
            attach: NicAttachment::Bridge(second_lab.bridge().to_string()),
            static_addresses: vec![StaticAddress {
                address: SECOND[i].parse().unwrap(),
                prefix: 24,
                // Not the default route: that stays on the first NIC.
                gateway: Some(SECOND_GATEWAY.parse().unwrap()),
            }],
        }];
        let _ = delete_machine(*hv, &s);
        specs.push(s);
    }

    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for ((hv, _), s) in hosts.iter().zip(&specs) {
            // Each guest pings its peer on the other host and the lab gateways, on both NICs.
            let user_data = format!(
                "#cloud-config\n#capl-ping {} {GATEWAY} {} {SECOND_GATEWAY}\n",
                GUESTS.join(" "),
                SECOND.join(" ")
            );
            create_machine(*hv, s, user_data.as_bytes())
                .unwrap_or_else(|e| panic!("create {} on {}: {e}", s.name, hv.uri()));
        }
        let want: Vec<Vec<String>> = (0..2)
            .map(|i| {
                vec![
                    format!("CAPL-GUEST static ip={} ", GUESTS[i]),
                    format!("CAPL-GUEST ping {} ok", GUESTS[1 - i]),
                    format!("CAPL-GUEST ping {GATEWAY} ok"),
                    format!("CAPL-GUEST static ip={} ", SECOND[i]),
                    format!("CAPL-GUEST ping {} ok", SECOND[1 - i]),
                    format!("CAPL-GUEST ping {SECOND_GATEWAY} ok"),
                ]
            })
            .collect();
        wait_for_lines(&logs, &specs.iter().collect::<Vec<_>>(), &want);
        for address in GUESTS {
            assert!(lab.ping(address), "the lab namespace does not reach {address}");
        }
        for address in SECOND {
            assert!(second_lab.ping(address), "the second lab namespace does not reach {address}");
        }
        for ((hv, fx), s) in hosts.iter().zip(&specs) {
            assert!(!hv.network_xml(&fx.network).unwrap().contains("<host"), "no DHCP entry on {}", hv.uri());
            assert_eq!(delete_machine(*hv, s).unwrap(), Vec::new(), "delete {} on {}", s.name, hv.uri());
            assert_eq!(leftovers(*hv, fx, std::slice::from_ref(s)), Vec::<String>::new(), "left on {}", hv.uri());
        }
    }));
    for ((hv, _), s) in hosts.iter().zip(&specs) {
        let _ = delete_machine(*hv, s);
        let _ = hv.network_stop(&network);
        let _ = hv.network_undefine(&network);
    }
    let _ = std::fs::remove_dir_all(&logs);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
