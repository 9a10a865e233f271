//! The machine's DHCP host entry on the network (its reserved address) and
//! the address read back from the network's leases.

use std::net::Ipv4Addr;

use crate::dhcp::{address_ranges, choose_address, describe_ranges, dhcp_host_xml, network_lock};
use crate::error::{HostError, HostResult, ObjectKind};
use crate::hypervisor::{ErrorKind, NetworkUpdateCommand};
use crate::network_xml::{DhcpHost, Ipv4Subnet, parse_network};

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
    pub(super) fn network_hosts(&self) -> HostResult<(Ipv4Subnet, Option<DhcpHost>)> {
        let network = &self.spec.network;
        let xml = self.hv.network_xml(network).map_err(|e| match e.kind {
            ErrorKind::NoNetwork => HostError::NetworkMissing { network: network.clone(), uri: self.uri.clone() },
            _ => self.error("read", ObjectKind::Network, network, e),
        })?;
        let info = parse_network(&xml).map_err(|e| self.unreadable(ObjectKind::Network, network, e))?;
        let subnet = info.ipv4.ok_or_else(|| HostError::NoIpv4 { network: network.clone(), uri: self.uri.clone() })?;
        let mine = self.our_dhcp_host(&subnet.hosts)?;
        Ok((subnet, mine))
    }

    /// Our entry among the network's hosts; an error when our MAC or name is used by a different entry.
    pub(super) fn our_dhcp_host(&self, hosts: &[DhcpHost]) -> HostResult<Option<DhcpHost>> {
        let mac = self.names.mac();
        let domain = &self.names.domain;
        for host in hosts {
            let mac_matches = host.mac.as_deref() == Some(mac.as_str());
            let name_matches = host.name.as_deref() == Some(domain.as_str());
            match (mac_matches, name_matches) {
                (true, true) => return Ok(Some(host.clone())),
                (false, false) => {}
                _ => {
                    return Err(self.collision(
                        ObjectKind::DhcpHost,
                        &format!(
                            "{} mac={} name={}",
                            self.spec.network,
                            host.mac.as_deref().unwrap_or("-"),
                            host.name.as_deref().unwrap_or("-")
                        ),
                        format!("the provider's entry for domain {domain} would be mac={mac} name={domain}"),
                    ));
                }
            }
        }
        Ok(None)
    }

    /// Whether [`Self::ensure_reservation`] would find an address, without
    /// reserving one.
    pub(super) fn address_available(&self) -> HostResult<()> {
        let (subnet, mine) = self.network_hosts()?;
        if mine.is_some_and(|host| host.ip.is_some()) {
            return Ok(());
        }
        self.free_address(&subnet, &[]).map(|_| ())
    }

    /// The first address of the network's ranges that no entry, lease, the
    /// control-plane endpoint or `refused` holds.
    fn free_address(&self, subnet: &Ipv4Subnet, refused: &[Ipv4Addr]) -> HostResult<Ipv4Addr> {
        let leases = self
            .hv
            .network_dhcp_leases(&self.spec.network)
            .map_err(|e| self.error("read the DHCP leases of", ObjectKind::Network, &self.spec.network, e))?;
        let mut avoid: Vec<Ipv4Addr> = self.spec.control_plane_host.iter().filter_map(|h| h.parse().ok()).collect();
        avoid.extend_from_slice(refused);
        choose_address(subnet, &leases, &self.names.mac(), &avoid).ok_or_else(|| HostError::NoFreeAddress {
            network: self.spec.network.clone(),
            uri: self.uri.clone(),
            pool_description: describe_ranges(&address_ranges(subnet)),
        })
    }

    /// The reserved address: the existing entry for our MAC, or a new one.
    ///
    /// When libvirt refuses the new entry as a duplicate, another writer took
    /// the address (or, for the same machine, added our entry) since we read
    /// the network: read it again and choose again, never that address, which
    /// also gets past an address only the network's persistent config holds.
    pub(super) fn ensure_reservation(&self) -> HostResult<Ipv4Addr> {
        let lock = network_lock(&self.uri, &self.spec.network);
        let _guard = lock.lock();
        let mac = self.names.mac();
        let mut refused = Vec::new();
        loop {
            let (subnet, mine) = self.network_hosts()?;
            if let Some(ip) = mine.and_then(|host| host.ip) {
                return Ok(ip);
            }
            let ip = self.free_address(&subnet, &refused)?;
            let host = dhcp_host_xml(&mac, &self.names.domain, ip);
            match self.hv.network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::AddLast, &host) {
                Ok(()) => return Ok(ip),
                Err(e) if e.kind == ErrorKind::OperationInvalid && refused.len() + 1 < DHCP_ATTEMPTS => {
                    tracing::debug!(%ip, network = %self.spec.network, error = %e, "DHCP reservation refused; choosing again");
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
    pub(super) fn refresh_reservation(&self) -> HostResult<bool> {
        let (_, mine) = self.network_hosts()?;
        let Some(host) = mine else { return Ok(false) };
        let Some(ip) = host.ip else { return Ok(false) };
        let xml = dhcp_host_xml(&self.names.mac(), &self.names.domain, ip);
        self.hv
            .network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::Modify, &xml)
            .map_err(|e| self.error("refresh a DHCP host of", ObjectKind::Network, &self.spec.network, e))?;
        Ok(true)
    }

    /// Removes our DHCP entry, unless the foreign domain at our name has an
    /// interface with our MAC (the entry then serves it): that is left alone.
    pub(super) fn remove_reservation(&self, foreign: Option<&DomainInfo>) -> HostResult<Option<LeftOnHost>> {
        let lock = network_lock(&self.uri, &self.spec.network);
        let _guard = lock.lock();
        let (_, mine) = match self.network_hosts() {
            Ok(found) => found,
            Err(HostError::NetworkMissing { .. } | HostError::NoIpv4 { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(host) = mine else { return Ok(None) };
        let mac = self.names.mac();
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

    /// The InternalIP from the network's leases, matched by our MAC (the newest lease wins).
    pub(super) fn addresses(&self) -> HostResult<Vec<MachineAddress>> {
        let mac = self.names.mac();
        let leases = self
            .hv
            .network_dhcp_leases(&self.spec.network)
            .map_err(|e| self.error("read the DHCP leases of", ObjectKind::Network, &self.spec.network, e))?;
        let ip = leases
            .iter()
            .filter(|lease| lease.mac.eq_ignore_ascii_case(&mac))
            .max_by_key(|lease| lease.expiry_time)
            .and_then(|lease| lease.ip.parse::<Ipv4Addr>().ok());
        Ok(ip.map(MachineAddress::InternalIp).into_iter().collect())
    }
}
