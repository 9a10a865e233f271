//! *contention*: 100 machines' DHCP reservations at once on one real
//! network of the private libvirtd, through the provider's own reservation
//! code (`capl_host::machine`, the create step `DhcpReservation`, with its
//! per-network lock), each machine on its own thread as the manager's
//! concurrent reconciles would be. Measures: distinct addresses (must be
//! all), reservations per second, and where a reservation's time goes (each
//! of its libvirt calls timed alone on the full network).
//!
//! The domains are not defined or started: 100 guests under software
//! emulation do not fit this benchmark's 2-core machine, and a reservation
//! does not depend on them. The network is the benchmark's own
//! (`capl-bench-net`, 10.252.0.0/24, DHCP .2-.254, no forwarding), defined
//! on the private libvirtd and removed afterwards, so the shared test
//! network is not touched.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capl_host::domain_xml::DomainTypePreference;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::{HostAdmin, Hypervisor, NetworkUpdateCommand};
use capl_host::machine::{CreateStep, MachineSpec, run_create_steps};
use serde_json::json;

use super::report::{fmt, print_table, write_json};
use super::stack::NAME_PREFIX;

pub const NETWORK: &str = "capl-bench-net";
const BRIDGE: &str = "caplbench0";
const SUBNET: &str = "10.252.0";

/// Serial repetitions of each call when timing it alone.
const CALL_SAMPLES: usize = 20;

/// Removes the benchmark's network (and with it every reservation) when dropped.
struct OwnNetwork<'a>(&'a LibvirtHypervisor);

impl Drop for OwnNetwork<'_> {
    fn drop(&mut self) {
        let _ = self.0.network_stop(NETWORK);
        let _ = self.0.network_undefine(NETWORK);
    }
}

fn spec(i: usize) -> MachineSpec {
    MachineSpec {
        namespace: format!("{NAME_PREFIX}contention"),
        name: format!("m-{i:03}"),
        identity: format!("00000000-0000-4000-8000-{i:012}"),
        name_scheme: capl_host::naming::NameScheme::Current,
        cluster_name: "bench".into(),
        vcpu: 1,
        memory_mib: 256,
        disk_gib: 2,
        image: "unused.qcow2".into(),
        image_format: None,
        network: NETWORK.into(),
        base_pool: "unused".into(),
        domain_pool: "unused".into(),
        control_plane_host: None,
        domain_type: DomainTypePreference::Auto,
        console_log_dir: None,
        ipam: false,
        static_addresses: Vec::new(),
        nameservers: Vec::new(),
        additional_nics: Vec::new(),
        cpu: None,
        firmware: None,
        data_disks: Vec::new(),
        bootstrap_format: capl_host::BootstrapFormat::CloudConfig,
    }
}

/// Mean seconds of `f` over [`CALL_SAMPLES`] serial runs.
fn mean_of(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let started = Instant::now();
    for _ in 0..CALL_SAMPLES {
        f()?;
    }
    Ok(started.elapsed().as_secs_f64() / CALL_SAMPLES as f64)
}

pub fn run(uri: &str, machines: usize, out: &Path) -> Result<bool> {
    let admin = LibvirtHypervisor::connect(uri).map_err(|e| anyhow::anyhow!("{e}"))?;
    if admin.network_list().map_err(|e| anyhow::anyhow!("{e}"))?.iter().any(|n| n == NETWORK) {
        // A run that was killed left it: it is ours.
        let _ = admin.network_stop(NETWORK);
        let _ = admin.network_undefine(NETWORK);
    }
    let xml = format!(
        "<network><name>{NETWORK}</name><bridge name='{BRIDGE}'/>\
         <ip address='{SUBNET}.1' netmask='255.255.255.0'><dhcp><range start='{SUBNET}.2' end='{SUBNET}.254'/></dhcp></ip></network>"
    );
    admin.network_define(&xml).map_err(|e| anyhow::anyhow!("defining {NETWORK}: {e}"))?;
    let _cleanup = OwnNetwork(&admin);
    admin.network_start(NETWORK).map_err(|e| anyhow::anyhow!("starting {NETWORK}: {e}"))?;

    // One connection shared by every thread, as the manager shares one per host.
    let hv: Arc<dyn Hypervisor> = Arc::new(LibvirtHypervisor::connect(uri).map_err(|e| anyhow::anyhow!("{e}"))?);
    eprintln!("{machines} reservations at once on {NETWORK}");
    let started = Instant::now();
    let threads: Vec<_> = (0..machines)
        .map(|i| {
            let hv = hv.clone();
            std::thread::spawn(move || -> Result<(Duration, Duration)> {
                let began = started.elapsed();
                run_create_steps(hv.as_ref(), &spec(i), b"", &[CreateStep::DhcpReservation])
                    .map_err(|e| anyhow::anyhow!("reservation {i}: {e}"))?;
                Ok((began, started.elapsed()))
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for thread in threads {
        let (began, ended) = thread.join().map_err(|_| anyhow::anyhow!("a reservation thread panicked"))??;
        latencies.push((ended - began).as_secs_f64());
    }
    let wall = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);

    let network_xml = hv.network_xml(NETWORK).map_err(|e| anyhow::anyhow!("{e}"))?;
    let hosts = capl_host::network_xml::parse_network(&network_xml)
        .map_err(anyhow::Error::msg)?
        .ipv4
        .context("the benchmark network has no IPv4")?
        .hosts;
    let ours: Vec<_> = hosts.iter().filter(|h| h.name.as_deref().is_some_and(|n| n.starts_with(NAME_PREFIX))).collect();
    let ips: HashSet<_> = ours.iter().filter_map(|h| h.ip).collect();

    // Where a reservation's time goes: each of its calls alone, on the full network.
    let read_xml = mean_of(|| hv.network_xml(NETWORK).map(|_| ()).map_err(|e| anyhow::anyhow!("{e}")))?;
    let read_leases = mean_of(|| hv.network_dhcp_leases(NETWORK).map(|_| ()).map_err(|e| anyhow::anyhow!("{e}")))?;
    let spare = format!("<host mac='52:54:00:fe:fe:fe' name='{NAME_PREFIX}spare' ip='{SUBNET}.254'/>");
    let update = mean_of(|| {
        hv.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::AddLast, &spare)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        hv.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::Delete, &spare).map_err(|e| anyhow::anyhow!("{e}"))
    })? / 2.0;
    let parse = {
        let started = Instant::now();
        for _ in 0..CALL_SAMPLES {
            let _ = capl_host::network_xml::parse_network(&network_xml);
        }
        started.elapsed().as_secs_f64() / CALL_SAMPLES as f64
    };
    let per_reservation = wall / machines as f64;

    let rows = vec![
        ("reservations at once".to_string(), machines.to_string()),
        ("DHCP hosts on the network afterwards".into(), ours.len().to_string()),
        ("distinct addresses".into(), ips.len().to_string()),
        ("all reserved (s)".into(), fmt(wall, 2)),
        ("reservations per second".into(), fmt(machines as f64 / wall, 1)),
        (
            "wait+reserve per machine: median / max (s)".into(),
            format!("{:.2} / {:.2}", latencies[latencies.len() / 2], latencies[latencies.len() - 1]),
        ),
        ("one reservation, serialised (ms)".into(), fmt(per_reservation * 1000.0, 1)),
        ("  network XML read, full network (ms)".into(), fmt(read_xml * 1000.0, 2)),
        ("  parse network XML (ms)".into(), fmt(parse * 1000.0, 3)),
        ("  DHCP leases read (ms)".into(), fmt(read_leases * 1000.0, 2)),
        ("  network update add/delete, live+config (ms)".into(), fmt(update * 1000.0, 2)),
    ];
    let title = format!("contention: {machines} reservations on one real network");
    print_table(&title, &rows);
    let value = json!({
        "table": super::report::table_json(&title, &rows),
        "benchmark": "contention",
        "machines": machines,
        "dhcp_hosts": ours.len(),
        "distinct_ips": ips.len(),
        "wall_s": wall,
        "reservations_per_s": machines as f64 / wall,
        "latency_s": {"median": latencies[latencies.len() / 2], "max": latencies[latencies.len() - 1]},
        "per_reservation_s": per_reservation,
        "call_s": {"network_xml": read_xml, "parse_network_xml": parse, "network_dhcp_leases": read_leases, "network_update": update},
    });
    let path = write_json(out, "contention", &value)?;
    println!("wrote {}", path.display());
    if ips.len() != machines || ours.len() != machines {
        bail!("{} DHCP hosts with {} distinct addresses for {machines} machines", ours.len(), ips.len());
    }
    Ok(true)
}
