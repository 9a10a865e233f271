//! DHCP reservations: which addresses a network offers, which one a machine
//! gets, the `<host>` XML that reserves it, and the per-network lock that
//! keeps concurrent reconciles from choosing the same address.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, LazyLock, Mutex};

use super::network_xml::{Ipv4Range, Ipv4Subnet};
use super::xml_tree::escape;
use crate::hypervisor::DhcpLease;

/// How many addresses at the end of the subnet are used when the network sets no DHCP range.
pub const TAIL_ADDRESSES: u32 = 200;

/// The `<host>` element for `virNetworkUpdate` on the `ip-dhcp-host` section.
///
/// The entry's name is the domain name: it is unique on the host (libvirt
/// rejects two entries with the same name on one network), and together with
/// the MAC it is the marker by which the provider recognises its own entries.
pub fn dhcp_host_xml(mac: &str, name: &str, ip: Ipv4Addr) -> String {
    format!("<host mac='{}' name='{}' ip='{ip}'/>", escape(mac), escape(name))
}

/// The ranges reservations are taken from: the network's DHCP ranges, or the
/// last [`TAIL_ADDRESSES`] addresses of the subnet (before broadcast) when it has none.
/// Network and broadcast addresses are never part of a range.
pub fn address_ranges(subnet: &Ipv4Subnet) -> Vec<Ipv4Range> {
    let first_host = u32::from(subnet.network_address()).saturating_add(1);
    let last_host = u32::from(subnet.broadcast_address()).saturating_sub(1);
    if subnet.prefix >= 31 || first_host > last_host {
        return Vec::new();
    }
    let configured = if subnet.ranges.is_empty() {
        vec![Ipv4Range {
            start: Ipv4Addr::from(last_host.saturating_sub(TAIL_ADDRESSES - 1).max(first_host)),
            end: Ipv4Addr::from(last_host),
        }]
    } else {
        subnet.ranges.clone()
    };
    configured
        .into_iter()
        .filter_map(|range| {
            let start = u32::from(range.start).max(first_host);
            let end = u32::from(range.end).min(last_host);
            (start <= end).then(|| Ipv4Range { start: Ipv4Addr::from(start), end: Ipv4Addr::from(end) })
        })
        .collect()
}

/// A human-readable description of the ranges, for error messages.
pub fn describe_ranges(ranges: &[Ipv4Range]) -> String {
    if ranges.is_empty() {
        return "an empty address range".to_string();
    }
    ranges.iter().map(|r| format!("{}-{}", r.start, r.end)).collect::<Vec<_>>().join(", ")
}

/// The first free address of the ranges, in order.
///
/// Never the host's own address (the gateway), an address reserved by any
/// `<host>` entry, an address leased to another MAC, or one of `avoid` (the
/// control-plane endpoint).
pub fn choose_address(
    subnet: &Ipv4Subnet,
    leases: &[DhcpLease],
    own_mac: &str,
    avoid: &[Ipv4Addr],
) -> Option<Ipv4Addr> {
    let mut taken: HashSet<Ipv4Addr> = HashSet::new();
    taken.insert(subnet.address);
    taken.extend(avoid.iter().copied());
    taken.extend(subnet.hosts.iter().filter_map(|h| h.ip));
    taken.extend(
        leases
            .iter()
            .filter(|lease| !lease.mac.eq_ignore_ascii_case(own_mac))
            .filter_map(|lease| lease.ip.parse::<Ipv4Addr>().ok()),
    );
    address_ranges(subnet)
        .into_iter()
        .flat_map(|r| u32::from(r.start)..=u32::from(r.end))
        .map(Ipv4Addr::from)
        .find(|ip| !taken.contains(ip))
}

type LockMap = Mutex<HashMap<(String, String), Arc<Mutex<()>>>>;
static NETWORK_LOCKS: LazyLock<LockMap> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The process-wide lock for DHCP changes on one network of one host.
///
/// Held from reading the network's reservations to the end of the update, so
/// two reconciles in this process never pick the same address. Another
/// process writing the same network is caught by libvirt refusing a duplicate
/// entry, after which the caller re-reads and chooses again.
///
/// The map holds an entry only while someone holds the returned
/// [`NetworkLock`]: dropping the last one removes it, so a process that saw
/// many hosts keeps no lock for a host it no longer uses.
pub fn network_lock(uri: &str, network: &str) -> NetworkLock {
    let key = (uri.to_string(), network.to_string());
    let mut locks = NETWORK_LOCKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let lock = locks.entry(key.clone()).or_default().clone();
    NetworkLock { key, lock }
}

/// A handle on one network's lock (see [`network_lock`]).
pub struct NetworkLock {
    key: (String, String),
    lock: Arc<Mutex<()>>,
}

impl NetworkLock {
    /// Waits for the network; a poisoned lock is taken over (the data it
    /// guards is libvirt's, re-read under the lock).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for NetworkLock {
    fn drop(&mut self) {
        let mut locks = NETWORK_LOCKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The map's reference and ours: nobody else holds or waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

/// The (URI, network) pairs that have a lock entry now: those whose lock is
/// held or awaited.
pub fn network_locks_in_use() -> Vec<(String, String)> {
    NETWORK_LOCKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).keys().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::super::network_xml::DhcpHost;
    use super::*;

    fn subnet(ranges: Vec<Ipv4Range>, hosts: Vec<DhcpHost>) -> Ipv4Subnet {
        Ipv4Subnet { address: Ipv4Addr::new(10, 0, 0, 1), prefix: 24, ranges, hosts }
    }

    fn lease(mac: &str, ip: &str) -> DhcpLease {
        DhcpLease { mac: mac.into(), ip: ip.into(), prefix: 24, hostname: None, expiry_time: 0 }
    }

    #[test]
    fn without_a_range_uses_the_last_200_addresses() {
        let ranges = address_ranges(&subnet(vec![], vec![]));
        assert_eq!(ranges, vec![Ipv4Range { start: Ipv4Addr::new(10, 0, 0, 55), end: Ipv4Addr::new(10, 0, 0, 254) }]);
    }

    #[test]
    fn a_small_subnet_without_range_stops_at_the_network_address() {
        let s = Ipv4Subnet { address: Ipv4Addr::new(10, 0, 0, 1), prefix: 28, ranges: vec![], hosts: vec![] };
        assert_eq!(
            address_ranges(&s),
            vec![Ipv4Range { start: Ipv4Addr::new(10, 0, 0, 1), end: Ipv4Addr::new(10, 0, 0, 14) }]
        );
        // .1 is the gateway, so the first choice is .2
        assert_eq!(choose_address(&s, &[], "52:54:00:00:00:01", &[]), Some(Ipv4Addr::new(10, 0, 0, 2)));
    }

    #[test]
    fn skips_gateway_reserved_leased_and_endpoint() {
        let range = Ipv4Range { start: Ipv4Addr::new(10, 0, 0, 1), end: Ipv4Addr::new(10, 0, 0, 6) };
        let hosts =
            vec![DhcpHost { mac: Some("52:54:00:00:00:09".into()), name: None, ip: Some(Ipv4Addr::new(10, 0, 0, 2)) }];
        let s = subnet(vec![range], hosts);
        let leases = [lease("52:54:00:00:00:08", "10.0.0.3"), lease("52:54:00:00:00:01", "10.0.0.5")];
        let avoid = [Ipv4Addr::new(10, 0, 0, 4)];
        // .1 gateway, .2 reserved, .3 leased to another MAC, .4 the endpoint; .5 is leased to us.
        assert_eq!(choose_address(&s, &leases, "52:54:00:00:00:01", &avoid), Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(choose_address(&s, &leases, "52:54:00:00:00:02", &avoid), Some(Ipv4Addr::new(10, 0, 0, 6)));
    }

    #[test]
    fn reports_exhaustion() {
        let range = Ipv4Range { start: Ipv4Addr::new(10, 0, 0, 1), end: Ipv4Addr::new(10, 0, 0, 1) };
        assert_eq!(choose_address(&subnet(vec![range], vec![]), &[], "m", &[]), None);
    }

    #[test]
    fn one_lock_per_host_and_network_and_only_while_used() {
        let held = network_lock("u", "n");
        assert!(Arc::ptr_eq(&held.lock, &network_lock("u", "n").lock));
        assert!(!Arc::ptr_eq(&held.lock, &network_lock("u", "m").lock));
        assert!(!Arc::ptr_eq(&held.lock, &network_lock("v", "n").lock));
        let ours = |pair: &(String, String)| ["u", "v"].contains(&pair.0.as_str());
        assert_eq!(network_locks_in_use().into_iter().filter(ours).collect::<Vec<_>>(), [("u".into(), "n".into())]);
        drop(held);
        assert!(!network_locks_in_use().iter().any(ours), "the last handle removes its entry");
    }
}
