//! Defines and starts N domains (default 10,000) on one simulated host from T callers
//! (default 1), then reads the DHCP leases; prints the time of each phase and the
//! process's peak memory (VmHWM). Run through `cargo xtask bench-sim`.
//!
//! Usage: bench_10k [--domains N] [--threads T]

use std::sync::Arc;
use std::time::{Duration, Instant};

use libvirt_sim::{Connection, Host, connect};

const NET: &str = "<network><name>bench</name><bridge name='virbr-bench'/><ip address='10.50.0.1' prefix='16'>\
    <dhcp><range start='10.50.0.10' end='10.50.255.250'/></dhcp></ip></network>";
const POOL: &str = "<pool type='dir'><name>disks</name><target><path>/bench/disks</path></target></pool>";

/// A domain shaped like the provider's: metadata, a disk, a cdrom, an interface, a console.
fn domain_xml(i: usize) -> String {
    let mac =
        format!("52:54:{:02x}:{:02x}:{:02x}:{:02x}", (i >> 24) & 0xff, (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff);
    format!(
        "<domain type='qemu'><name>bench-{i}</name>\
         <metadata><capl:machine xmlns:capl='https://capl.example/v1'>default/bench-{i}</capl:machine></metadata>\
         <memory unit='MiB'>512</memory><vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>\
         <features><acpi/><apic/></features><cpu mode='host-model'/>\
         <devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/bench/disks/bench-{i}.qcow2'/><target dev='vda' bus='virtio'/></disk>\
         <disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='/bench/disks/bench-{i}-seed.iso'/><target dev='hdc' bus='ide'/><readonly/></disk>\
         <interface type='network'><mac address='{mac}'/><source network='bench'/><model type='virtio'/></interface>\
         <serial type='pty'/><console type='pty'/></devices></domain>"
    )
}

/// What the provider creates per machine: a qcow2 overlay on the base image and a seed ISO.
fn create_volumes(conn: &Connection, i: usize) {
    let overlay = format!(
        "<volume><name>bench-{i}.qcow2</name><capacity unit='GiB'>20</capacity><target><format type='qcow2'/></target>\
         <backingStore><path>/bench/disks/base.qcow2</path><format type='qcow2'/></backingStore></volume>"
    );
    conn.storage_vol_create_xml("disks", &overlay).expect("create overlay");
    let seed = format!(
        "<volume><name>bench-{i}-seed.iso</name><capacity unit='bytes'>{SEED_BYTES}</capacity><target><format type='raw'/></target></volume>"
    );
    let name = conn.storage_vol_create_xml("disks", &seed).expect("create seed ISO");
    conn.storage_vol_upload("disks", &name, 0, &[0x42; SEED_BYTES]).expect("upload seed ISO");
}

/// A NoCloud seed ISO is a few hundred KiB; the benchmark keeps 2 KiB per machine in memory.
const SEED_BYTES: usize = 2048;

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} takes a number, got '{v}'")))
        .unwrap_or(default)
}

fn main() {
    let domains = arg("--domains", 10_000);
    let threads = arg("--threads", 1).max(1);
    let baseline = vm_hwm_kib().unwrap_or(0);
    let host =
        Host::builder("sim:///bench").network(NET, true).pool(POOL, true).build().expect("build the simulated host");
    let conn = Arc::new(connect(host.uri()).expect("connect"));
    conn.storage_vol_create_xml(
        "disks",
        "<volume><name>base.qcow2</name><capacity unit='GiB'>2</capacity><target><format type='qcow2'/></target></volume>",
    )
    .expect("create the base image");

    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let conn = Arc::clone(&conn);
            std::thread::spawn(move || {
                let mut slowest = Duration::ZERO;
                for i in (t..domains).step_by(threads) {
                    let call = Instant::now();
                    create_volumes(&conn, i);
                    let name = conn.domain_define_xml(&domain_xml(i)).expect("define");
                    conn.domain_create(&name).expect("start");
                    slowest = slowest.max(call.elapsed());
                }
                slowest
            })
        })
        .collect();
    let slowest = workers.into_iter().map(|w| w.join().expect("worker")).max().unwrap_or_default();
    let define_start = start.elapsed();

    let lease_start = Instant::now();
    let leases = conn.network_get_dhcp_leases("bench", None).expect("leases").len();
    let lease_time = lease_start.elapsed();

    let list_start = Instant::now();
    let listed = conn.list_all_domains().expect("list").len();
    let list_time = list_start.elapsed();

    assert_eq!(host.domain_count(), domains, "every domain was defined");
    assert_eq!(leases, domains, "every guest got a lease");
    let peak = vm_hwm_kib().unwrap_or(0);
    println!(
        "libvirt-sim: {domains} domains (each with an overlay and a 2 KiB seed ISO) defined and started by {threads} caller(s)"
    );
    println!(
        "  volumes+define+start: {define_start:.2?} total, {:.1} µs per machine, slowest machine {slowest:.2?}",
        define_start.as_secs_f64() * 1e6 / domains as f64
    );
    println!("  DHCP leases:  {leases} handed out in {lease_time:.2?}");
    println!("  list domains: {listed} in {list_time:.2?}");
    println!("  calls:        {} in total", host.counters().total_calls());
    println!(
        "  peak memory:  VmHWM {} KiB ({} KiB above the {} KiB at start)",
        peak,
        peak.saturating_sub(baseline),
        baseline
    );
}
