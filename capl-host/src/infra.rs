//! The LibvirtCluster check: the network and both pools exist and are active.
//! Nothing on the host is created or started.

use super::error::{HostError, HostResult, ObjectKind};
use crate::hypervisor::{ErrorKind, Hypervisor};

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
/// Costs one libvirt call per object (`network_is_active`, `pool_is_active`):
/// 3 calls, 2 when the pools are the same.
pub fn check_infrastructure(hv: &dyn Hypervisor, spec: &InfraSpec) -> HostResult<()> {
    check_network(hv, &spec.network)?;
    check_pool(hv, &spec.base_pool)?;
    if spec.domain_pool != spec.base_pool {
        check_pool(hv, &spec.domain_pool)?;
    }
    Ok(())
}

/// The network exists and is active.
pub fn check_network(hv: &dyn Hypervisor, network: &str) -> HostResult<()> {
    let uri = hv.uri().to_string();
    match hv.network_is_active(network) {
        Ok(true) => Ok(()),
        Ok(false) => Err(HostError::NetworkInactive { network: network.to_string(), uri }),
        Err(e) if e.kind == ErrorKind::NoNetwork => {
            Err(HostError::NetworkMissing { network: network.to_string(), uri })
        }
        Err(source) => Err(HostError::Libvirt {
            action: "check",
            kind: ObjectKind::Network,
            object: network.to_string(),
            uri,
            source,
        }),
    }
}

/// The storage pool exists and is active.
pub fn check_pool(hv: &dyn Hypervisor, pool: &str) -> HostResult<()> {
    let uri = hv.uri().to_string();
    match hv.pool_is_active(pool) {
        Ok(true) => Ok(()),
        Ok(false) => Err(HostError::PoolInactive { pool: pool.to_string(), uri }),
        Err(e) if e.kind == ErrorKind::NoStoragePool => Err(HostError::PoolMissing { pool: pool.to_string(), uri }),
        Err(source) => Err(HostError::Libvirt {
            action: "check",
            kind: ObjectKind::StoragePool,
            object: pool.to_string(),
            uri,
            source,
        }),
    }
}
