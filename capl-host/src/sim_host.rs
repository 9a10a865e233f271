//! The simulated host behind `--hypervisor sim`: what an admin would have
//! prepared, so that the book's examples work against it unchanged.

pub use libvirt_sim::Host as SimHost;
use libvirt_sim::Host;

/// Network, pools and base image names of the simulated host; they match the
/// book's plain example (`docs/src/flavors.md`, "Without a flavor").
pub const NETWORK: &str = "libvirt-lab";
pub const BASE_POOL: &str = "capi-base-images";
pub const DOMAIN_POOL: &str = "capi-vm-disks";
pub const BASE_IMAGE: &str = "ubuntu-noble-base.qcow2";

/// Builds and registers a simulated host under `uri`, with a NAT network
/// `libvirt-lab` (192.168.122.0/24, DHCP .100-.199), the two pools, and a
/// 2 GiB qcow2 base image. Guests get their DHCP lease one second after start.
pub fn register(uri: &str) -> Result<Host, libvirt_sim::Error> {
    register_with_range(uri, "192.168.122.1", "255.255.255.0", "192.168.122.100", "192.168.122.199", None)
}

/// [`register`] with `memory_mib` of memory, all of it free before any
/// domain runs (for placement by memory across several hosts).
pub fn register_with_memory(uri: &str, memory_mib: u64) -> Result<Host, libvirt_sim::Error> {
    let capabilities = libvirt_sim::Capabilities {
        memory_kib: memory_mib * 1024,
        free_memory_bytes: memory_mib << 20,
        ..Default::default()
    };
    register_with_range(uri, "192.168.122.1", "255.255.255.0", "192.168.122.100", "192.168.122.199", Some(capabilities))
}

/// [`register`] with a /22 network (10.20.0.0/22, DHCP 10.20.0.10-10.20.3.250:
/// 1,009 addresses), for runs with hundreds of machines on one host.
pub fn register_large(uri: &str) -> Result<Host, libvirt_sim::Error> {
    register_with_range(uri, "10.20.0.1", "255.255.252.0", "10.20.0.10", "10.20.3.250", None)
}

fn register_with_range(
    uri: &str,
    address: &str,
    netmask: &str,
    start: &str,
    end: &str,
    capabilities: Option<libvirt_sim::Capabilities>,
) -> Result<Host, libvirt_sim::Error> {
    let network = format!(
        "<network><name>{NETWORK}</name><forward mode='nat'/><bridge name='virbr-lab'/>\
         <ip address='{address}' netmask='{netmask}'><dhcp><range start='{start}' end='{end}'/></dhcp></ip></network>"
    );
    let pool = |name: &str| {
        format!("<pool type='dir'><name>{name}</name><target><path>/var/lib/libvirt/capi/{name}</path></target></pool>")
    };
    let mut builder = Host::builder(uri);
    if let Some(capabilities) = capabilities {
        builder = builder.capabilities(capabilities);
    }
    let host = builder
        .network(&network, true)
        .pool(&pool(BASE_POOL), true)
        .pool(&pool(DOMAIN_POOL), true)
        .dhcp_delay(std::time::Duration::from_secs(1))
        .build()?;
    let conn = libvirt_sim::connect(uri)?;
    conn.storage_vol_create_xml(
        BASE_POOL,
        &format!("<volume><name>{BASE_IMAGE}</name><capacity unit='GiB'>2</capacity><target><format type='qcow2'/></target></volume>"),
    )?;
    Ok(host)
}

/// Applies one fault to a simulated host, as the manager's `/sim/fault`
/// route does for the benchmarks (`cargo xtask bench faults`). `command` is
/// one of:
///
/// - `fail-randomly <probability> <seed>`: from now on that share of calls
///   (all but connects) fails as if the connection had dropped;
/// - `drop-connections`: every open connection breaks;
/// - `restart-daemon`: libvirtd restarts (connections break, everything
///   on the host stays);
/// - `hang`: every call but a connect blocks, as on a daemon that accepts
///   connections and never answers;
/// - `clear`: no more faults; hung calls go on.
///
/// Returns what was done, or why the command was not understood.
pub fn inject_fault(host: &Host, command: &str) -> Result<String, String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["fail-randomly", probability, seed] => {
            let probability: f64 =
                probability.parse().map_err(|e| format!("fail-randomly: probability {probability:?}: {e}"))?;
            let seed: u64 = seed.parse().map_err(|e| format!("fail-randomly: seed {seed:?}: {e}"))?;
            let error = libvirt_sim::Error::new(libvirt_sim::ErrorCode::NoConnect, "client socket is closed");
            host.faults().fail_randomly(probability, seed, error);
            Ok(format!("{probability} of calls fail from now on"))
        }
        ["drop-connections"] => {
            host.drop_connections();
            Ok("every connection dropped".into())
        }
        ["restart-daemon"] => {
            host.restart_daemon();
            Ok("daemon restarted".into())
        }
        ["hang"] => {
            for op in libvirt_sim::Op::ALL.iter().filter(|op| **op != libvirt_sim::Op::Connect) {
                host.faults().hang(*op, None);
            }
            Ok("every call but connect hangs".into())
        }
        ["clear"] => {
            host.faults().clear();
            Ok("no more faults".into())
        }
        _ => Err(format!(
            "unknown fault {command:?}: use fail-randomly <probability> <seed>, drop-connections, restart-daemon, hang or clear"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hypervisor::Hypervisor;
    use crate::hypervisor::sim::SimHypervisor;

    #[test]
    fn faults_by_command_reach_the_host_and_clear_ends_them() {
        let uri = "sim:///capl-sim-host-faults";
        let host = register(uri).unwrap();
        let hv = SimHypervisor::connect(uri).unwrap();
        assert!(hv.pool_is_active(BASE_POOL).unwrap());

        inject_fault(&host, "fail-randomly 1.0 7").unwrap();
        let e = hv.pool_is_active(BASE_POOL).unwrap_err();
        assert!(e.to_string().contains("client socket is closed"), "{e}");
        inject_fault(&host, "clear").unwrap();
        assert!(hv.pool_is_active(BASE_POOL).unwrap());

        inject_fault(&host, "drop-connections").unwrap();
        assert!(!hv.is_alive(), "the open connection broke");
        let hv = SimHypervisor::connect(uri).unwrap();
        assert!(hv.pool_is_active(BASE_POOL).unwrap());

        for wrong in ["fail-randomly", "fail-randomly x 1", "explode"] {
            let e = inject_fault(&host, wrong).unwrap_err();
            assert!(e.contains(&format!("{wrong:?}")) || e.starts_with("fail-randomly: "), "{e}");
        }
        host.unregister();
    }
}
