//! A control-plane endpoint from a libvirt network: a free address of the network's
//! IPv4 subnet outside the addresses the provider (and libvirt's DHCP) hand to guests,
//! recorded on the host as a DNS host entry whose name proves it is the owner's
//! (`capl-endpoint-<owner UID>`): libvirt refuses a second entry with the same address,
//! so two clusters never get one address, and guests on the network resolve the name.
//! Released by deleting exactly that entry; an entry of another name is never touched.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use crate::dhcp::address_ranges;
use crate::error::{HostError, HostResult, ObjectKind};
use crate::hypervisor::{ErrorKind, Hypervisor, NetworkUpdateCommand};
use crate::network_xml::{NetworkInfo, parse_network};

/// The DNS host name that marks an endpoint address as `owner_uid`'s.
pub fn endpoint_hostname(owner_uid: &str) -> String {
    format!("capl-endpoint-{owner_uid}")
}

/// How many taken addresses an allocation tries past before it gives up (each refusal
/// means another client took the address between our read and our add).
const ATTEMPTS: usize = 8;

fn read(hv: &dyn Hypervisor, network: &str) -> HostResult<NetworkInfo> {
    let uri = hv.uri().to_string();
    let xml = hv.network_xml(network).map_err(|source| match source.kind {
        ErrorKind::NoNetwork => HostError::NetworkMissing { network: network.to_string(), uri: uri.clone() },
        _ => HostError::Libvirt { action: "read", kind: ObjectKind::Network, object: network.to_string(), uri, source },
    })?;
    parse_network(&xml).map_err(|detail| HostError::UnreadableXml {
        kind: ObjectKind::Network,
        object: network.to_string(),
        uri: hv.uri().to_string(),
        detail,
    })
}

/// The address a DNS host entry of the network records for `hostname`, if any.
fn recorded(info: &NetworkInfo, hostname: &str) -> Option<Ipv4Addr> {
    info.dns_hosts.iter().find(|h| h.hostnames.iter().any(|n| n == hostname)).and_then(|h| h.ip)
}

/// The address recorded for `hostname` on `network`, if any.
pub fn endpoint_of(hv: &dyn Hypervisor, network: &str, hostname: &str) -> HostResult<Option<Ipv4Addr>> {
    Ok(recorded(&read(hv, network)?, hostname))
}

/// The endpoint address of `hostname` on `network`: the one already recorded, else the
/// highest free address of the subnet outside the guests' ranges (not the host's own,
/// not reserved, leased or named in DNS), recorded as a DNS host entry.
pub fn allocate_endpoint(hv: &dyn Hypervisor, network: &str, hostname: &str) -> HostResult<Ipv4Addr> {
    let uri = hv.uri().to_string();
    let mut refused = HashSet::new();
    for _ in 0..ATTEMPTS {
        let info = read(hv, network)?;
        if let Some(ip) = recorded(&info, hostname) {
            return Ok(ip);
        }
        let Some(subnet) = &info.ipv4 else {
            return Err(HostError::NoEndpointAddress {
                network: network.to_string(),
                uri,
                detail: format!(
                    "it has no IPv4 <ip> element: add one (virsh net-edit {network}), or take the endpoint from an IPAM pool (controlPlaneEndpointFrom.pool)"
                ),
            });
        };
        let guests = address_ranges(subnet);
        let leased: HashSet<Ipv4Addr> = hv
            .network_dhcp_leases(network)
            .map_err(|source| HostError::Libvirt {
                action: "read the leases of",
                kind: ObjectKind::Network,
                object: network.to_string(),
                uri: uri.clone(),
                source,
            })?
            .into_iter()
            .filter_map(|l| l.ip.parse().ok())
            .collect();
        let mut taken: HashSet<Ipv4Addr> = leased;
        taken.extend(subnet.hosts.iter().filter_map(|h| h.ip));
        taken.extend(info.dns_hosts.iter().filter_map(|h| h.ip));
        taken.insert(subnet.address);
        taken.extend(&refused);
        let first = u32::from(subnet.network_address()).saturating_add(1);
        let last = u32::from(subnet.broadcast_address()).saturating_sub(1);
        let free = (first..=last).rev().map(Ipv4Addr::from).find(|ip| {
            !taken.contains(ip)
                && !guests.iter().any(|r| u32::from(r.start) <= u32::from(*ip) && u32::from(*ip) <= u32::from(r.end))
        });
        let Some(ip) = free else {
            return Err(HostError::NoEndpointAddress {
                network: network.to_string(),
                uri,
                detail: format!(
                    "every address of {}/{} outside the DHCP ranges is the host's, reserved, leased or named in its DNS: narrow a <dhcp> <range> (virsh net-edit {network}) to leave addresses outside it, or take the endpoint from an IPAM pool (controlPlaneEndpointFrom.pool)",
                    subnet.network_address(),
                    subnet.prefix
                ),
            });
        };
        let entry = format!("<host ip='{ip}'><hostname>{hostname}</hostname></host>");
        match hv.network_update_dns_host(network, NetworkUpdateCommand::AddLast, &entry) {
            Ok(()) => return Ok(ip),
            // Another client named that address since we read: try the next one.
            Err(e) if e.kind == ErrorKind::OperationInvalid && e.message.contains("matching field") => {
                refused.insert(ip);
            }
            Err(source) => {
                return Err(HostError::Libvirt {
                    action: "add a DNS host entry to",
                    kind: ObjectKind::Network,
                    object: network.to_string(),
                    uri,
                    source,
                });
            }
        }
    }
    Err(HostError::NoEndpointAddress {
        network: network.to_string(),
        uri,
        detail: format!("{ATTEMPTS} free addresses were taken by others while this one was being added: it is retried"),
    })
}

/// Deletes the DNS host entry of `hostname` (with its address) from `network`; an entry
/// of another name is left alone. Returns the address released, `None` when there was
/// none (or the network is gone).
pub fn release_endpoint(hv: &dyn Hypervisor, network: &str, hostname: &str) -> HostResult<Option<Ipv4Addr>> {
    let info = match read(hv, network) {
        Ok(info) => info,
        Err(HostError::NetworkMissing { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(entry) = info.dns_hosts.iter().find(|h| h.hostnames.len() == 1 && h.hostnames[0] == hostname) else {
        return Ok(None);
    };
    let Some(ip) = entry.ip else { return Ok(None) };
    let xml = format!("<host ip='{ip}'><hostname>{hostname}</hostname></host>");
    match hv.network_update_dns_host(network, NetworkUpdateCommand::Delete, &xml) {
        Ok(()) => Ok(Some(ip)),
        Err(e) if e.kind == ErrorKind::OperationInvalid && e.message.contains("couldn't locate") => Ok(None),
        Err(source) => Err(HostError::Libvirt {
            action: "delete a DNS host entry from",
            kind: ObjectKind::Network,
            object: network.to_string(),
            uri: hv.uri().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hypervisor::sim::SimHypervisor;

    fn host(tag: &str) -> SimHypervisor {
        let uri = format!("sim:endpoint-{tag}");
        crate::sim_host::register(&uri).unwrap();
        SimHypervisor::connect(&uri).unwrap()
    }

    #[test]
    fn allocates_outside_the_ranges_once_per_owner_and_releases_only_its_own() {
        let hv = host("alloc");
        let net = crate::sim_host::NETWORK;
        let a = allocate_endpoint(&hv, net, &endpoint_hostname("a")).unwrap();
        assert_eq!(
            allocate_endpoint(&hv, net, &endpoint_hostname("a")).unwrap(),
            a,
            "the same owner, the same address"
        );
        let b = allocate_endpoint(&hv, net, &endpoint_hostname("b")).unwrap();
        assert_ne!(a, b);
        let info = parse_network(&hv.network_xml(net).unwrap()).unwrap();
        let subnet = info.ipv4.unwrap();
        for ip in [a, b] {
            assert!(subnet.contains(ip) && ip != subnet.address, "{ip}");
            assert!(address_ranges(&subnet).iter().all(|r| ip < r.start || ip > r.end), "{ip} is in a guest range");
        }
        assert_eq!(release_endpoint(&hv, net, "someone-else").unwrap(), None);
        assert_eq!(release_endpoint(&hv, net, &endpoint_hostname("a")).unwrap(), Some(a));
        assert_eq!(release_endpoint(&hv, net, &endpoint_hostname("a")).unwrap(), None);
        assert_eq!(endpoint_of(&hv, net, &endpoint_hostname("b")).unwrap(), Some(b));
    }
}
