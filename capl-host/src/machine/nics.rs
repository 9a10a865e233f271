//! The machine's NICs after the first (`spec.additionalNetworks`): each on a
//! libvirt network or straight on a host bridge, with a fixed MAC
//! ([`crate::naming::MachineNames::additional_mac`]), no DHCP reservation,
//! and its addresses in the seed's network-config (static from IPAM, or DHCP
//! in the guest). Nothing of them stays on the host once the domain is gone.

use crate::cloud_init::{GuestInterface, StaticAddress};
use crate::domain_xml::{NicAttachment, NicDevice};
use crate::error::{HostError, HostResult};
use crate::infra::{NetworkState, check_host_bridge, host_has_interface, network_info, network_state};

use super::MachineRun;

impl MachineRun<'_> {
    /// The devices of the additional NICs, in order.
    pub(super) fn additional_devices(&self) -> Vec<NicDevice> {
        self.spec
            .additional_nics
            .iter()
            .enumerate()
            .map(|(i, nic)| NicDevice { attach: nic.attach.clone(), mac: self.names.additional_mac(i + 1) })
            .collect()
    }

    /// The guest interfaces of the seed's network-config: the first NIC (its
    /// static addresses, or DHCP with the MAC it reserves), then the others.
    pub(super) fn guest_interfaces(&mut self) -> HostResult<Vec<GuestInterface>> {
        let first = if self.spec.is_static() {
            GuestInterface { mac: self.static_mac(), addresses: self.spec.static_addresses.clone(), dhcp: false }
        } else {
            GuestInterface { mac: self.reserved_mac()?, addresses: Vec::new(), dhcp: true }
        };
        let rest =
            self.spec.additional_nics.iter().zip(self.additional_devices()).map(|(nic, device)| GuestInterface {
                mac: device.mac,
                addresses: nic.static_addresses.clone(),
                dhcp: nic.static_addresses.is_empty(),
            });
        Ok(std::iter::once(first).chain(rest).collect())
    }

    /// The IPv4 addresses of the additional NICs that come from IPAM.
    pub(super) fn additional_static_ipv4(&self) -> impl Iterator<Item = std::net::Ipv4Addr> + '_ {
        self.spec.additional_nics.iter().flat_map(|nic| nic.static_addresses.iter()).filter_map(|a: &StaticAddress| {
            match a.address {
                std::net::IpAddr::V4(ip) => Some(ip),
                std::net::IpAddr::V6(_) => None,
            }
        })
    }

    /// Every additional NIC's network exists and is active (and its host
    /// bridge, for a network onto one), and every host bridge named directly
    /// exists, as far as the host can say: found before anything is created.
    pub(super) fn additional_nics_attachable(&self) -> HostResult<()> {
        for (i, nic) in self.spec.additional_nics.iter().enumerate() {
            let missing = |detail: String| HostError::AdditionalNicUnattachable {
                index: i,
                target: nic.attach.describe(),
                uri: self.uri.clone(),
                detail,
            };
            match &nic.attach {
                NicAttachment::Network(network) => {
                    match network_state(self.hv, network)? {
                        NetworkState::Active => {}
                        NetworkState::Inactive => {
                            return Err(missing(format!("it is inactive: run virsh net-start {network}")));
                        }
                        NetworkState::Missing => {
                            return Err(missing(
                                "it does not exist: define and start it there (virsh net-define, net-start)"
                                    .to_string(),
                            ));
                        }
                    }
                    check_host_bridge(self.hv, &network_info(self.hv, network)?)?;
                }
                NicAttachment::Bridge(bridge) => {
                    if host_has_interface(self.hv, bridge)? == Some(false) {
                        return Err(missing(format!(
                            "the host has no interface of that name: create the bridge there (ip link add {bridge} type bridge, with the port onto the LAN in it)"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}
