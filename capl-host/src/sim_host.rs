//! The simulated host behind `--hypervisor sim`: what an admin would have
//! prepared, so that the book's examples work against it unchanged.

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
