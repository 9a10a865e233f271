//! The LibvirtCluster check: the network and both pools exist, are active and
//! are of a kind the provider can use (the network has IPv4, or is onto a host
//! bridge the host has; the pools are of a file-based type). Nothing on the
//! host is created or started.

use super::error::{HostError, HostResult, ObjectKind};
use crate::hypervisor::{ErrorKind, Hypervisor};
use crate::network_xml::{NetworkInfo, parse_network};
use crate::xml_tree::XmlElement;

/// Pool types whose volumes are files: qcow2 overlays with a backing file and
/// uploaded ISOs work there (not in logical, disk, iscsi, rbd, ... pools).
pub const SUPPORTED_POOL_TYPES: [&str; 3] = ["dir", "fs", "netfs"];

/// The host objects a LibvirtCluster points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfraSpec {
    pub network: String,
    pub base_pool: String,
    pub domain_pool: String,
}

/// Checks the network, then the base pool, then the domain pool (once when
/// both pools are the same), and returns the first problem found.
///
/// Costs one libvirt call per object (`network_is_active`, `pool_is_active`)
/// and one to read the network's XML: 4 calls, 3 when the pools are the same,
/// one more for a network onto a host bridge (the bridge's lookup).
pub fn check_infrastructure(hv: &dyn Hypervisor, spec: &InfraSpec) -> HostResult<()> {
    check_network(hv, &spec.network)?;
    check_pool(hv, &spec.base_pool)?;
    if spec.domain_pool != spec.base_pool {
        check_pool(hv, &spec.domain_pool)?;
    }
    Ok(())
}

/// What the host says of a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkState {
    Active,
    Inactive,
    Missing,
}

/// Whether `network` exists on the host and is active (one libvirt call).
pub fn network_state(hv: &dyn Hypervisor, network: &str) -> HostResult<NetworkState> {
    match hv.network_is_active(network) {
        Ok(true) => Ok(NetworkState::Active),
        Ok(false) => Ok(NetworkState::Inactive),
        Err(e) if e.kind == ErrorKind::NoNetwork => Ok(NetworkState::Missing),
        Err(source) => Err(libvirt_error(hv, "check", ObjectKind::Network, network, source)),
    }
}

/// The network's live XML, parsed (one libvirt call).
pub fn network_info(hv: &dyn Hypervisor, network: &str) -> HostResult<NetworkInfo> {
    let xml =
        hv.network_xml(network).map_err(|source| libvirt_error(hv, "read", ObjectKind::Network, network, source))?;
    parse_network(&xml).map_err(|detail| HostError::UnreadableXml {
        kind: ObjectKind::Network,
        object: network.to_string(),
        uri: hv.uri().to_string(),
        detail,
    })
}

/// Whether the host has the network interface `name` (a bridge), or `None`
/// when its libvirtd cannot say (no interface driver: `VIR_ERR_NO_SUPPORT`),
/// in which case the first domain's start is what finds out.
pub fn host_has_interface(hv: &dyn Hypervisor, name: &str) -> HostResult<Option<bool>> {
    match hv.interface_xml(name) {
        Ok(_) => Ok(Some(true)),
        Err(e) if e.kind == ErrorKind::NoInterface => Ok(Some(false)),
        Err(e) if e.kind == ErrorKind::NoSupport => Ok(None),
        Err(source) => Err(libvirt_error(hv, "look up", ObjectKind::Interface, name, source)),
    }
}

fn libvirt_error(
    hv: &dyn Hypervisor,
    action: &'static str,
    kind: ObjectKind,
    object: &str,
    source: crate::hypervisor::HypervisorError,
) -> HostError {
    HostError::Libvirt { action, kind, object: object.to_string(), uri: hv.uri().to_string(), source }
}

/// The network exists and is active.
pub fn check_network(hv: &dyn Hypervisor, network: &str) -> HostResult<()> {
    let uri = hv.uri().to_string();
    match network_state(hv, network)? {
        NetworkState::Active => check_network_ipv4(hv, network),
        NetworkState::Inactive => Err(HostError::NetworkInactive { network: network.to_string(), uri }),
        NetworkState::Missing => Err(HostError::NetworkMissing { network: network.to_string(), uri }),
    }
}

/// Machines get their addresses by a DHCP reservation in the network's IPv4
/// subnet, so the network needs one; or, on a network onto a host bridge
/// (where libvirt runs no DHCP), from IPAM, which needs nothing of it.
fn check_network_ipv4(hv: &dyn Hypervisor, network: &str) -> HostResult<()> {
    let info = network_info(hv, network)?;
    check_host_bridge(hv, &info)?;
    match info.ipv4 {
        Some(_) => Ok(()),
        None if info.is_host_bridge() => Ok(()),
        None => Err(HostError::NoIpv4 { network: network.to_string(), uri: hv.uri().to_string() }),
    }
}

/// The host bridge a network in forward mode bridge puts guests on exists, as
/// far as the host can say ([`host_has_interface`]). libvirt starts such a
/// network without looking for its bridge; without this check the first
/// domain's start finds out ([`HostError::BridgeMissing`]).
pub fn check_host_bridge(hv: &dyn Hypervisor, info: &NetworkInfo) -> HostResult<()> {
    let Some(bridge) = info.host_bridge() else { return Ok(()) };
    match host_has_interface(hv, bridge)? {
        Some(false) => Err(HostError::BridgeNotOnHost {
            network: info.name.clone(),
            device: bridge.to_string(),
            uri: hv.uri().to_string(),
        }),
        Some(true) | None => Ok(()),
    }
}

/// The storage pool exists and is active (and of a file-based type).
pub fn check_pool(hv: &dyn Hypervisor, pool: &str) -> HostResult<()> {
    let uri = hv.uri().to_string();
    // The type first: an unusable pool is reported as such, active or not.
    match hv.pool_xml(pool) {
        Ok(xml) => {
            let pool_type = XmlElement::parse(&xml).ok().and_then(|root| root.attr("type").map(str::to_string));
            if let Some(pool_type) = pool_type
                && !SUPPORTED_POOL_TYPES.contains(&pool_type.as_str())
            {
                return Err(HostError::PoolTypeUnsupported { pool: pool.to_string(), uri, pool_type });
            }
        }
        Err(e) if e.kind == ErrorKind::NoStoragePool => {
            return Err(HostError::PoolMissing { pool: pool.to_string(), uri });
        }
        Err(source) => return Err(libvirt_error(hv, "read", ObjectKind::StoragePool, pool, source)),
    }
    match hv.pool_is_active(pool) {
        Ok(true) => Ok(()),
        Ok(false) => Err(HostError::PoolInactive { pool: pool.to_string(), uri }),
        Err(e) if e.kind == ErrorKind::NoStoragePool => Err(HostError::PoolMissing { pool: pool.to_string(), uri }),
        Err(source) => Err(libvirt_error(hv, "check", ObjectKind::StoragePool, pool, source)),
    }
}
