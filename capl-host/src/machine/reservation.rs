//! The machine's DHCP host entry on the network (its reserved address) and
//! the address read back from the network's leases.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use crate::dhcp::{address_ranges, choose_address, describe_ranges, dhcp_host_xml, network_lock};
use crate::error::{HostError, HostResult, ObjectKind};
use crate::hypervisor::{DhcpLease, ErrorKind, NetworkUpdateCommand};
use crate::infra::check_host_bridge;
use crate::network_xml::{DhcpHost, Ipv4Subnet, NetworkInfo, parse_network};

use super::{LeftOnHost, MachineAddress, MachineRun};
use crate::domain_xml::DomainInfo;

/// How many addresses one reservation may try. libvirt refuses an entry whose
/// address, MAC or name another entry has (VIR_ERR_OPERATION_INVALID); within
/// one process the network lock rules that out, so a refusal means another
/// writer (e.g. a second manager process without leader election) took the
/// address between our read and our update. Each refused address is skipped
/// for the rest of the reservation, so every try picks a different one; the
/// bound only stops a host that refuses everything for another reason.
const DHCP_ATTEMPTS: usize = 32;

impl MachineRun<'_> {
    fn network_info(&self) -> HostResult<NetworkInfo> {
        let network = &self.spec.network;
        let xml = self.hv.network_xml(network).map_err(|e| match e.kind {
            ErrorKind::NoNetwork => HostError::NetworkMissing { network: network.clone(), uri: self.uri.clone() },
            _ => self.error("read", ObjectKind::Network, network, e),
        })?;
        parse_network(&xml).map_err(|e| self.unreadable(ObjectKind::Network, network, e))
    }

    /// A machine with static addresses may be on a network onto a host bridge:
    /// that bridge exists, as far as the host can say ([`check_host_bridge`]).
    pub(super) fn host_bridge_present(&self) -> HostResult<()> {
        check_host_bridge(self.hv, &self.network_info()?)
    }

    pub(super) fn network_hosts(&self) -> HostResult<(Ipv4Subnet, Option<DhcpHost>)> {
        let network = &self.spec.network;
        let info = self.network_info()?;
        let subnet = info.ipv4.ok_or_else(|| HostError::NoIpv4 { network: network.clone(), uri: self.uri.clone() })?;
        let mine = self.our_dhcp_host(&subnet.hosts)?;
        Ok((subnet, mine))
    }

    /// Our entry among the network's hosts: the one named after our domain,
    /// with one of our MAC candidates. An entry with our name and any other
    /// MAC (or none) is a collision. Entries with one of our candidate MACs
    /// under another name are not ours and no collision: the MAC is taken,
    /// and a new reservation takes the next candidate.
    pub(super) fn our_dhcp_host(&self, hosts: &[DhcpHost]) -> HostResult<Option<DhcpHost>> {
        let domain = &self.names.domain;
        let Some(host) = hosts.iter().find(|host| host.name.as_deref() == Some(domain.as_str())) else {
            return Ok(None);
        };
        let candidates = self.names.mac_candidates();
        if host.mac.as_ref().is_some_and(|mac| candidates.contains(mac)) {
            return Ok(Some(host.clone()));
        }
        Err(self.collision(
            ObjectKind::DhcpHost,
            &format!("{} mac={} name={domain}", self.spec.network, host.mac.as_deref().unwrap_or("-")),
            format!(
                "the provider's entry for domain {domain} has that name and one of the MACs derived from it, {} to {}",
                candidates[0],
                candidates[candidates.len() - 1]
            ),
        ))
    }

    /// The network's DHCP leases.
    fn leases(&self) -> HostResult<Vec<DhcpLease>> {
        self.hv
            .network_dhcp_leases(&self.spec.network)
            .map_err(|e| self.error("read the DHCP leases of", ObjectKind::Network, &self.spec.network, e))
    }

    /// The first of our MAC candidates that no other DHCP entry of the
    /// network and no lease (a running guest's interface on the network)
    /// uses. An error naming the network when every one is taken.
    fn free_mac(&self, subnet: &Ipv4Subnet, leases: &[DhcpLease]) -> HostResult<String> {
        let domain = self.names.domain.as_str();
        let taken: HashSet<String> = subnet
            .hosts
            .iter()
            .filter(|host| host.name.as_deref() != Some(domain))
            .filter_map(|host| host.mac.clone())
            .chain(leases.iter().map(|lease| lease.mac.to_ascii_lowercase()))
            .collect();
        let candidates = self.names.mac_candidates();
        if let Some(free) = candidates.iter().find(|mac| !taken.contains(*mac)) {
            if *free != candidates[0] {
                tracing::info!(
                    domain,
                    network = %self.spec.network,
                    derived = %candidates[0],
                    mac = %free,
                    "the MAC derived from the domain name is in use on the network; using the next free candidate"
                );
            }
            return Ok(free.clone());
        }
        Err(self.collision(
            ObjectKind::DhcpHost,
            &format!("{} mac={}", self.spec.network, candidates[0]),
            format!(
                "all {} MACs derived from domain {domain} ({} to {}) are used by other DHCP entries or leases of the network",
                candidates.len(),
                candidates[0],
                candidates[candidates.len() - 1]
            ),
        ))
    }

    /// The MAC this machine reserves its address with: its entry's, or the first free candidate.
    fn mac_to_reserve(&self, subnet: &Ipv4Subnet, mine: Option<&DhcpHost>, leases: &[DhcpLease]) -> HostResult<String> {
        match mine.and_then(|host| host.mac.clone()) {
            Some(mac) => Ok(mac),
            None => self.free_mac(subnet, leases),
        }
    }

    /// The MAC the domain is defined with: the one of our DHCP entry (made by
    /// the reservation step, which runs first), or, without an entry, the
    /// first free candidate.
    pub(super) fn reserved_mac(&mut self) -> HostResult<String> {
        if let Some(mac) = &self.mac {
            return Ok(mac.clone());
        }
        if self.spec.is_static() {
            let mac = self.static_mac();
            self.mac = Some(mac.clone());
            return Ok(mac);
        }
        let (subnet, mine) = self.network_hosts()?;
        let mac = match mine.and_then(|host| host.mac) {
            Some(mac) => mac,
            None => self.free_mac(&subnet, &self.leases()?)?,
        };
        self.mac = Some(mac.clone());
        Ok(mac)
    }

    /// Whether [`Self::ensure_reservation`] would find a MAC and an address,
    /// without reserving one.
    pub(super) fn address_available(&self) -> HostResult<()> {
        let (subnet, mine) = self.network_hosts()?;
        if mine.as_ref().is_some_and(|host| host.ip.is_some()) {
            return Ok(());
        }
        let leases = self.leases()?;
        let mac = self.mac_to_reserve(&subnet, mine.as_ref(), &leases)?;
        self.free_address(&subnet, &leases, &mac, &[]).map(|_| ())
    }

    /// The first address of the network's ranges that no entry, lease (but
    /// one of `mac`), the control-plane endpoint or `refused` holds.
    fn free_address(
        &self,
        subnet: &Ipv4Subnet,
        leases: &[DhcpLease],
        mac: &str,
        refused: &[Ipv4Addr],
    ) -> HostResult<Ipv4Addr> {
        let mut avoid: Vec<Ipv4Addr> = self.spec.control_plane_host.iter().filter_map(|h| h.parse().ok()).collect();
        avoid.extend_from_slice(refused);
        choose_address(subnet, leases, mac, &avoid).ok_or_else(|| HostError::NoFreeAddress {
            network: self.spec.network.clone(),
            uri: self.uri.clone(),
            pool_description: describe_ranges(&address_ranges(subnet)),
        })
    }

    /// The reserved address: the existing entry of ours, or a new one with
    /// the first free MAC candidate. Remembers the entry's MAC for the define.
    ///
    /// When libvirt refuses the new entry as a duplicate, another writer took
    /// the address or the MAC (or, for the same machine, added our entry)
    /// since we read the network: read it again and choose again, never that
    /// address, which also gets past an address only the network's persistent
    /// config holds.
    pub(super) fn ensure_reservation(&mut self) -> HostResult<Ipv4Addr> {
        let lock = network_lock(&self.uri, &self.spec.network);
        let _guard = lock.lock();
        let mut refused = Vec::new();
        loop {
            let (subnet, mine) = self.network_hosts()?;
            if let Some(DhcpHost { ip: Some(ip), mac: Some(mac), .. }) = &mine {
                self.mac = Some(mac.clone());
                return Ok(*ip);
            }
            let leases = self.leases()?;
            let mac = self.mac_to_reserve(&subnet, mine.as_ref(), &leases)?;
            let ip = self.free_address(&subnet, &leases, &mac, &refused)?;
            let host = dhcp_host_xml(&mac, &self.names.domain, ip);
            match self.hv.network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::AddLast, &host) {
                Ok(()) => {
                    self.mac = Some(mac);
                    return Ok(ip);
                }
                Err(e) if e.kind == ErrorKind::OperationInvalid && refused.len() + 1 < DHCP_ATTEMPTS => {
                    tracing::debug!(%ip, %mac, network = %self.spec.network, error = %e, "DHCP reservation refused; choosing again");
                    refused.push(ip);
                }
                Err(e) => return Err(self.error("add a DHCP host to", ObjectKind::Network, &self.spec.network, e)),
            }
        }
    }

    /// Writes our DHCP entry again, unchanged. libvirt answers a change of a
    /// network's DHCP hosts by having its dnsmasq reload them, and starts the
    /// network's dnsmasq when it no longer runs (it does not notice a dead
    /// dnsmasq otherwise). `false` when there is no entry of ours to write.
    /// The MAC of a guest with static addresses: the first candidate (no DHCP
    /// entry or lease to avoid); its network-config finds the interface by it.
    pub(super) fn static_mac(&self) -> String {
        self.names.mac_candidates().swap_remove(0)
    }

    pub(super) fn refresh_reservation(&self) -> HostResult<bool> {
        if self.spec.is_static() {
            return Ok(false);
        }
        let (_, mine) = self.network_hosts()?;
        let Some(host) = mine else { return Ok(false) };
        let (Some(ip), Some(mac)) = (host.ip, host.mac) else { return Ok(false) };
        let xml = dhcp_host_xml(&mac, &self.names.domain, ip);
        self.hv
            .network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::Modify, &xml)
            .map_err(|e| self.error("refresh a DHCP host of", ObjectKind::Network, &self.spec.network, e))?;
        Ok(true)
    }

    /// Removes our DHCP entry (found by our name, with whichever of our MAC
    /// candidates it has), unless the foreign domain at our name has an
    /// interface with its MAC (the entry then serves it): that is left alone.
    pub(super) fn remove_reservation(&self, foreign: Option<&DomainInfo>) -> HostResult<Option<LeftOnHost>> {
        let lock = network_lock(&self.uri, &self.spec.network);
        let _guard = lock.lock();
        let (_, mine) = match self.network_hosts() {
            Ok(found) => found,
            Err(HostError::NetworkMissing { .. } | HostError::NoIpv4 { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(host) = mine else { return Ok(None) };
        // our_dhcp_host only returns an entry with one of our MACs.
        let mac = host.mac.clone().unwrap_or_default();
        if let Some(foreign) = foreign.filter(|d| d.macs.contains(&mac)) {
            return Ok(Some(LeftOnHost {
                kind: ObjectKind::DhcpHost,
                object: format!("{} mac={mac} name={}", self.spec.network, self.names.domain),
                why: format!(
                    "domain \"{}\", which is not this LibvirtMachine's, has an interface with this MAC",
                    foreign.name
                ),
            }));
        }
        let xml = match host.ip {
            Some(ip) => dhcp_host_xml(&mac, &self.names.domain, ip),
            None => format!("<host mac='{}' name='{}'/>", mac, self.names.domain),
        };
        match self.hv.network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::Delete, &xml) {
            Ok(()) => Ok(None),
            Err(e) if e.kind == ErrorKind::NoNetwork => Ok(None),
            Err(e) => Err(self.error("remove a DHCP host from", ObjectKind::Network, &self.spec.network, e)),
        }
    }

    // --- the address from the leases ---------------------------------------

    /// The InternalIP from the network's leases, matched by `mac`, the MAC of
    /// the domain's interface (the newest lease wins). Nothing without one.
    pub(super) fn addresses(&self, mac: Option<&str>) -> HostResult<Vec<MachineAddress>> {
        // The addresses IPAM gave the additional NICs come after the first NIC's.
        let additional = self.additional_static_ipv4().map(MachineAddress::InternalIp);
        if self.spec.is_static() {
            // The addresses IPAM gave, which the guest configures itself.
            return Ok(self
                .spec
                .static_addresses
                .iter()
                .filter_map(|a| match a.address {
                    std::net::IpAddr::V4(ip) => Some(MachineAddress::InternalIp(ip)),
                    std::net::IpAddr::V6(_) => None,
                })
                .chain(additional)
                .collect());
        }
        let Some(mac) = mac else { return Ok(Vec::new()) };
        let leases = self.leases()?;
        let ip = leases
            .iter()
            .filter(|lease| lease.mac.eq_ignore_ascii_case(mac))
            .max_by_key(|lease| lease.expiry_time)
            .and_then(|lease| lease.ip.parse::<Ipv4Addr>().ok());
        // Without the first NIC's address (not leased yet) the machine reports none.
        match ip {
            Some(ip) => Ok(std::iter::once(MachineAddress::InternalIp(ip)).chain(additional).collect()),
            None => Ok(Vec::new()),
        }
    }
}
