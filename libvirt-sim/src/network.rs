//! Virtual networks: the definition (parsed from and formatted to libvirt's network XML),
//! DHCP host reservations and DNS host entries with `virNetworkUpdate`'s semantics, and
//! leases.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use serde::Deserialize;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::{Mac, Uuid};
use crate::xml_scan::{check_document, escape, serde_error};

#[derive(Deserialize)]
struct NetworkDoc {
    name: Option<String>,
    uuid: Option<String>,
    forward: Option<ForwardEl>,
    bridge: Option<BridgeEl>,
    mac: Option<MacEl>,
    dns: Option<DnsEl>,
    #[serde(default)]
    ip: Vec<IpEl>,
}

#[derive(Deserialize)]
struct DnsEl {
    #[serde(default)]
    host: Vec<DnsHostEl>,
}

#[derive(Deserialize)]
struct DnsHostEl {
    #[serde(rename = "@ip")]
    ip: Option<String>,
    #[serde(default)]
    hostname: Vec<String>,
}

/// One `<dns><host>` entry: an address and its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsHost {
    pub ip: Ipv4Addr,
    pub hostnames: Vec<String>,
}

#[derive(Deserialize)]
struct ForwardEl {
    #[serde(rename = "@mode")]
    mode: Option<String>,
}

#[derive(Deserialize)]
struct BridgeEl {
    #[serde(rename = "@name")]
    name: Option<String>,
}

#[derive(Deserialize)]
struct MacEl {
    #[serde(rename = "@address")]
    address: Option<String>,
}

#[derive(Deserialize)]
struct IpEl {
    #[serde(rename = "@address")]
    address: Option<String>,
    #[serde(rename = "@netmask")]
    netmask: Option<String>,
    #[serde(rename = "@prefix")]
    prefix: Option<String>,
    #[serde(rename = "@family")]
    family: Option<String>,
    dhcp: Option<DhcpEl>,
}

#[derive(Deserialize)]
struct DhcpEl {
    #[serde(default)]
    range: Vec<RangeEl>,
    #[serde(default)]
    host: Vec<HostEl>,
}

#[derive(Deserialize)]
struct RangeEl {
    #[serde(rename = "@start")]
    start: Option<String>,
    #[serde(rename = "@end")]
    end: Option<String>,
}

#[derive(Deserialize)]
struct HostEl {
    #[serde(rename = "@mac")]
    mac: Option<String>,
    #[serde(rename = "@name")]
    name: Option<String>,
    #[serde(rename = "@ip")]
    ip: Option<String>,
}

/// One `<host>` of a network's `<dhcp>`: a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpHost {
    pub mac: Option<Mac>,
    pub name: Option<String>,
    pub ip: Option<Ipv4Addr>,
}

/// One DHCP range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DhcpRange {
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
}

/// The IPv4 `<ip>` element of a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkIp {
    pub address: Ipv4Addr,
    pub prefix: u8,
    /// Whether the source wrote `netmask=` (kept so the XML comes back the same).
    pub netmask_form: bool,
    pub ranges: Vec<DhcpRange>,
    pub hosts: Vec<DhcpHost>,
}

impl NetworkIp {
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = prefix_mask(self.prefix);
        u32::from(ip) & mask == u32::from(self.address) & mask
    }
}

/// A network definition as the simulator keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkDef {
    pub name: String,
    pub uuid: Uuid,
    pub forward_mode: Option<String>,
    pub bridge: Option<String>,
    pub mac: Option<Mac>,
    pub dns_hosts: Vec<DnsHost>,
    pub ip: Option<NetworkIp>,
}

fn prefix_mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) }
}

fn parse_ip(text: &str, what: impl FnOnce() -> String) -> Result<Ipv4Addr> {
    text.trim().parse().map_err(|_| Error::xml(what()))
}

fn parse_ip_el(name: &str, el: &IpEl) -> Result<NetworkIp> {
    let address_text = el
        .address
        .as_deref()
        .ok_or_else(|| Error::xml(format!("Missing required address attribute in network '{name}'")))?;
    let address = parse_ip(address_text, || format!("Invalid address '{address_text}' in network '{name}'"))?;
    let (prefix, netmask_form) = match (&el.netmask, &el.prefix) {
        (Some(mask), _) => {
            let m = u32::from(parse_ip(mask, || format!("Invalid netmask '{mask}' in network '{name}'"))?);
            if m.leading_ones() + m.trailing_zeros() != 32 {
                return Err(Error::xml(format!("Invalid netmask '{mask}' in network '{name}'")));
            }
            (m.leading_ones() as u8, true)
        }
        (None, Some(p)) => match p.trim().parse::<u8>() {
            Ok(p) if p <= 32 => (p, false),
            _ => {
                return Err(Error::xml(format!("Invalid ipv4 prefix '{p}' in network '{name}'")));
            }
        },
        (None, None) => (24, false),
    };
    let mut ip = NetworkIp { address, prefix, netmask_form, ranges: Vec::new(), hosts: Vec::new() };
    if let Some(dhcp) = &el.dhcp {
        for r in &dhcp.range {
            let start_text = r
                .start
                .as_deref()
                .ok_or_else(|| Error::xml(format!("Missing 'start' attribute in dhcp range for network '{name}'")))?;
            let end_text = r
                .end
                .as_deref()
                .ok_or_else(|| Error::xml(format!("Missing 'end' attribute in dhcp range for network '{name}'")))?;
            let start =
                parse_ip(start_text, || format!("Invalid dhcp range start '{start_text}' in network '{name}'"))?;
            let end = parse_ip(end_text, || format!("Invalid dhcp range end '{end_text}' in network '{name}'"))?;
            if !ip.contains(start) || !ip.contains(end) || u32::from(start) > u32::from(end) {
                return Err(Error::new(
                    ErrorCode::InvalidArg,
                    format!("range {start} - {end} is not entirely within network {address}/{prefix}"),
                ));
            }
            ip.ranges.push(DhcpRange { start, end });
        }
        for h in &dhcp.host {
            ip.hosts.push(parse_host(name, h, false)?);
        }
    }
    Ok(ip)
}

fn parse_host(network: &str, h: &HostEl, partial_ok: bool) -> Result<DhcpHost> {
    let mac = match &h.mac {
        None => None,
        Some(text) => {
            let mac = Mac::parse(text)
                .ok_or_else(|| Error::xml(format!("Cannot parse MAC address '{text}' in network '{network}'")))?;
            if mac.is_multicast() {
                return Err(Error::xml(format!(
                    "expected unicast mac address, found multicast '{text}' in network '{network}'"
                )));
            }
            Some(mac)
        }
    };
    if let Some(n) = &h.name
        && !n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
    {
        return Err(Error::xml(format!("Cannot use host name '{n}' in network '{network}'")));
    }
    let ip = match &h.ip {
        None => None,
        Some(text) => {
            Some(parse_ip(text, || format!("Invalid IP address in static host definition for network '{network}'"))?)
        }
    };
    if partial_ok {
        if mac.is_none() && h.name.is_none() && ip.is_none() {
            return Err(Error::xml(format!(
                "At least one of name, mac, or ip attribute must be specified for static host definition in network '{network}'"
            )));
        }
    } else {
        if mac.is_none() && h.name.is_none() {
            return Err(Error::xml(format!(
                "Static host definition in IPv4 network '{network}' must have mac or name attribute"
            )));
        }
        if ip.is_none() {
            return Err(Error::xml(format!("Missing IP address in static host definition for network '{network}'")));
        }
    }
    Ok(DhcpHost { mac, name: h.name.clone(), ip })
}

impl NetworkDef {
    /// Parses network XML as `virNetworkDefineXML` does (UUID generated when absent).
    pub fn parse(xml: &str) -> Result<Self> {
        check_document(xml, "network")?;
        let doc: NetworkDoc = quick_xml::de::from_str(xml).map_err(|e| serde_error("network", e))?;
        let name = doc
            .name
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::new(ErrorCode::NoName, "missing name information"))?;
        if name.contains('/') {
            return Err(Error::xml(format!("name {name} cannot contain '/'")));
        }
        let uuid = match doc.uuid {
            Some(u) => Uuid::parse(&u)?,
            None => Uuid::generate(),
        };
        let mut ip = None;
        for el in &doc.ip {
            let v6 = el.family.as_deref() == Some("ipv6") || el.address.as_deref().is_some_and(|a| a.contains(':'));
            if v6 {
                continue;
            }
            if ip.is_none() {
                ip = Some(parse_ip_el(&name, el)?);
            }
        }
        let mac = match doc.mac.and_then(|m| m.address) {
            Some(text) => Some(
                Mac::parse(&text)
                    .ok_or_else(|| Error::xml(format!("Invalid bridge mac address '{text}' in network '{name}'")))?,
            ),
            None => None,
        };
        let dns_hosts = doc
            .dns
            .map(|dns| dns.host)
            .unwrap_or_default()
            .iter()
            .map(|h| parse_dns_host(&name, h, false))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .map(|(ip, hostnames)| DnsHost { ip: ip.expect("checked"), hostnames })
            .collect();
        Ok(NetworkDef {
            name,
            uuid,
            forward_mode: doc.forward.map(|f| f.mode.unwrap_or_else(|| "nat".to_string())),
            bridge: doc.bridge.and_then(|b| b.name),
            mac,
            dns_hosts,
            ip,
        })
    }

    /// The network XML in libvirt's layout.
    pub fn to_xml(&self) -> String {
        let mut x = String::new();
        let _ = writeln!(x, "<network>");
        let _ = writeln!(x, "  <name>{}</name>", escape(&self.name));
        let _ = writeln!(x, "  <uuid>{}</uuid>", self.uuid);
        if let Some(mode) = &self.forward_mode {
            let _ = writeln!(x, "  <forward mode='{}'/>", escape(mode));
        }
        if let Some(bridge) = &self.bridge {
            let _ = writeln!(x, "  <bridge name='{}' stp='on' delay='0'/>", escape(bridge));
        }
        if let Some(mac) = &self.mac {
            let _ = writeln!(x, "  <mac address='{mac}'/>");
        }
        if !self.dns_hosts.is_empty() {
            let _ = writeln!(x, "  <dns>");
            for h in &self.dns_hosts {
                let _ = writeln!(x, "    <host ip='{}'>", h.ip);
                for name in &h.hostnames {
                    let _ = writeln!(x, "      <hostname>{}</hostname>", escape(name));
                }
                let _ = writeln!(x, "    </host>");
            }
            let _ = writeln!(x, "  </dns>");
        }
        if let Some(ip) = &self.ip {
            if ip.netmask_form {
                let _ =
                    write!(x, "  <ip address='{}' netmask='{}'", ip.address, Ipv4Addr::from(prefix_mask(ip.prefix)));
            } else {
                let _ = write!(x, "  <ip address='{}' prefix='{}'", ip.address, ip.prefix);
            }
            if ip.ranges.is_empty() && ip.hosts.is_empty() {
                let _ = writeln!(x, "/>");
            } else {
                let _ = writeln!(x, ">\n    <dhcp>");
                for r in &ip.ranges {
                    let _ = writeln!(x, "      <range start='{}' end='{}'/>", r.start, r.end);
                }
                for h in &ip.hosts {
                    let _ = writeln!(x, "      {}", host_xml(h));
                }
                let _ = writeln!(x, "    </dhcp>\n  </ip>");
            }
        }
        x.push_str("</network>\n");
        x
    }

    /// The reservation for `mac`, if any.
    pub fn reservation_for(&self, mac: Mac) -> Option<&DhcpHost> {
        self.ip.as_ref()?.hosts.iter().find(|h| h.mac == Some(mac))
    }

    /// Applies one `virNetworkUpdate` on section `ip-dhcp-host` with libvirt's matching rules.
    pub fn update_dhcp_host(&mut self, command: UpdateCommand, host_xml: &str) -> Result<()> {
        let name = self.name.clone();
        check_host_document(&name, host_xml)?;
        let el: HostEl = quick_xml::de::from_str(host_xml).map_err(|e| serde_error("dhcp host", e))?;
        let ip_def = self.ip.as_mut().ok_or_else(|| {
            Error::invalid(format!(
                "couldn't update dhcp host entry - no <ip family='ipv4'> element found in network '{name}'"
            ))
        })?;
        let partial = command == UpdateCommand::Delete;
        let host = parse_host(&name, &el, partial)?;
        let describe = |h: &DhcpHost| {
            format!(
                "<host mac='{}' name='{}' ip='{}'/>",
                h.mac.map(|m| m.to_string()).unwrap_or_else(|| "unknown".into()),
                h.name.as_deref().unwrap_or("(null)"),
                h.ip.map(|i| i.to_string()).unwrap_or_else(|| "unknown".into())
            )
        };
        match command {
            UpdateCommand::AddFirst | UpdateCommand::AddLast => {
                let clash = ip_def.hosts.iter().any(|e| {
                    (host.mac.is_some() && e.mac == host.mac)
                        || (host.name.is_some() && e.name == host.name)
                        || (host.ip.is_some() && e.ip == host.ip)
                });
                if clash {
                    return Err(Error::invalid(format!(
                        "there is an existing dhcp host entry in network '{name}' that matches \"{}\"",
                        describe(&host)
                    )));
                }
                if command == UpdateCommand::AddFirst {
                    ip_def.hosts.insert(0, host);
                } else {
                    ip_def.hosts.push(host);
                }
            }
            UpdateCommand::Delete => {
                let found = ip_def.hosts.iter().position(|e| {
                    (host.mac.is_none() || e.mac.is_none() || e.mac == host.mac)
                        && (host.name.is_none() || e.name == host.name)
                        && (host.ip.is_none() || e.ip == host.ip)
                });
                let i = found.ok_or_else(|| {
                    Error::invalid(format!("couldn't locate a matching dhcp host entry in network '{name}'"))
                })?;
                ip_def.hosts.remove(i);
            }
            UpdateCommand::Modify => {
                let found = ip_def.hosts.iter().position(|e| {
                    (host.mac.is_some() && e.mac == host.mac)
                        || (host.ip.is_some() && e.ip == host.ip)
                        || (host.name.is_some() && e.name == host.name)
                });
                let i = found.ok_or_else(|| {
                    Error::invalid(format!(
                        "couldn't locate an existing dhcp host entry with \"mac='{}'\" \"name='{}'\" \"ip='{}'\" in network '{name}'",
                        host.mac.map(|m| m.to_string()).unwrap_or_else(|| "unknown".into()),
                        host.name.as_deref().unwrap_or("(null)"),
                        host.ip.map(|i| i.to_string()).unwrap_or_else(|| "unknown".into())
                    ))
                })?;
                ip_def.hosts[i] = host;
            }
        }
        Ok(())
    }

    /// Applies one `virNetworkUpdate` on section `dns-host`, as libvirt 11.3 does (measured):
    /// an add is refused when an entry has the same address (names may repeat); a delete or
    /// modify takes the one entry that has the address or one of the names, and is refused
    /// when none or several do.
    pub fn update_dns_host(&mut self, command: UpdateCommand, host_xml: &str) -> Result<()> {
        let name = self.name.clone();
        check_host_document(&name, host_xml)?;
        let el: DnsHostEl = quick_xml::de::from_str(host_xml).map_err(|e| serde_error("dns host", e))?;
        let (ip, hostnames) = parse_dns_host(&name, &el, command == UpdateCommand::Delete)?;
        let not_found = || Error::invalid(format!("couldn't locate a matching DNS HOST record in network {name}"));
        match command {
            UpdateCommand::AddFirst | UpdateCommand::AddLast => {
                let ip = ip.expect("an add has an address");
                if self.dns_hosts.iter().any(|h| h.ip == ip) {
                    return Err(Error::invalid(format!(
                        "there is already at least one DNS HOST record with a matching field in network {name}"
                    )));
                }
                let host = DnsHost { ip, hostnames };
                if command == UpdateCommand::AddFirst {
                    self.dns_hosts.insert(0, host);
                } else {
                    self.dns_hosts.push(host);
                }
            }
            UpdateCommand::Delete | UpdateCommand::Modify => {
                // libvirt matches an entry on its address or on any of its names, and
                // wants exactly one match.
                let matches: Vec<usize> = (0..self.dns_hosts.len())
                    .filter(|&i| {
                        let h = &self.dns_hosts[i];
                        ip == Some(h.ip) || hostnames.iter().any(|n| h.hostnames.contains(n))
                    })
                    .collect();
                let found = match matches.as_slice() {
                    [] => return Err(not_found()),
                    [one] => *one,
                    _ => {
                        return Err(Error::invalid(format!(
                            "multiple matching DNS HOST records were found in network {name}"
                        )));
                    }
                };
                if command == UpdateCommand::Delete {
                    self.dns_hosts.remove(found);
                } else {
                    let ip = ip.ok_or_else(not_found)?;
                    self.dns_hosts[found] = DnsHost { ip, hostnames };
                }
            }
        }
        Ok(())
    }

    /// Every IP some reservation holds (a guest without that reservation cannot get it).
    pub(crate) fn reserved_ips(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.ip.iter().flat_map(|ip| ip.hosts.iter().filter_map(|h| h.ip))
    }

    /// The first address of the DHCP ranges, at or after `cursor`, not in `taken`
    /// (which holds leased and reserved addresses). Advances `cursor` past it, so a
    /// batch of requests scans the ranges once.
    pub(crate) fn free_address(&self, taken: &HashSet<Ipv4Addr>, cursor: &mut u32) -> Option<Ipv4Addr> {
        let ip = self.ip.as_ref()?;
        for range in &ip.ranges {
            let start = u32::from(range.start).max(*cursor);
            for n in start..=u32::from(range.end) {
                let candidate = Ipv4Addr::from(n);
                if !taken.contains(&candidate) && candidate != ip.address {
                    *cursor = n.saturating_add(1);
                    return Some(candidate);
                }
            }
        }
        None
    }
}

/// The document of a `virNetworkUpdate` on a host section must be one `<host>`.
fn check_host_document(network: &str, host_xml: &str) -> Result<()> {
    check_document(host_xml, "host").map_err(|e| {
        if e.code() == ErrorCode::XmlError {
            Error::xml(format!("unexpected element in update of network '{network}', expecting <host>"))
        } else {
            e
        }
    })
}

/// A `<dns><host>`'s address and names; an entry in a definition or an add needs both
/// (libvirt: "Missing IP address in network '...' DNS HOST record", "Missing hostname ...").
fn parse_dns_host(network: &str, h: &DnsHostEl, partial_ok: bool) -> Result<(Option<Ipv4Addr>, Vec<String>)> {
    let ip = match &h.ip {
        None if partial_ok => None,
        None => return Err(Error::xml(format!("Missing IP address in network '{network}' DNS HOST record"))),
        Some(text) => Some(parse_ip(text, || format!("Invalid IP address in network '{network}' DNS HOST record"))?),
    };
    let hostnames: Vec<String> = h.hostname.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
    if hostnames.is_empty() && !partial_ok {
        return Err(Error::xml(format!("Missing hostname in network '{network}' DNS HOST record")));
    }
    Ok((ip, hostnames))
}

fn host_xml(h: &DhcpHost) -> String {
    let mut s = String::from("<host");
    if let Some(mac) = h.mac {
        let _ = write!(s, " mac='{mac}'");
    }
    if let Some(name) = &h.name {
        let _ = write!(s, " name='{}'", escape(name));
    }
    if let Some(ip) = h.ip {
        let _ = write!(s, " ip='{ip}'");
    }
    s.push_str("/>");
    s
}

/// `virNetworkUpdateCommand`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateCommand {
    /// VIR_NETWORK_UPDATE_COMMAND_MODIFY (1)
    Modify = 1,
    /// VIR_NETWORK_UPDATE_COMMAND_DELETE (2)
    Delete = 2,
    /// VIR_NETWORK_UPDATE_COMMAND_ADD_LAST (3)
    AddLast = 3,
    /// VIR_NETWORK_UPDATE_COMMAND_ADD_FIRST (4)
    AddFirst = 4,
}

/// `virNetworkUpdateSection` values; the simulator models `IpDhcpHost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateSection {
    Bridge = 1,
    Domain = 2,
    Ip = 3,
    IpDhcpHost = 4,
    IpDhcpRange = 5,
    Forward = 6,
    ForwardInterface = 7,
    ForwardPf = 8,
    PortGroup = 9,
    DnsHost = 10,
    DnsTxt = 11,
    DnsSrv = 12,
}

/// `virNetworkUpdateFlags`.
pub mod update_flags {
    pub const AFFECT_CURRENT: u32 = 0;
    pub const AFFECT_LIVE: u32 = 1;
    pub const AFFECT_CONFIG: u32 = 2;
}

/// One DHCP lease as `virNetworkGetDHCPLeases` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub hostname: Option<String>,
    /// Seconds since the epoch.
    pub expiry_time: i64,
}

/// A network on a host: its definition plus runtime state.
#[derive(Debug, Clone)]
pub(crate) struct Network {
    pub def: NetworkDef,
    pub active: bool,
    pub persistent: bool,
    pub autostart: bool,
    pub leases: Vec<Lease>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET: &str = "<network><name>n1</name><forward mode='nat'/><bridge name='virbr9'/>\
        <ip address='10.77.0.1' netmask='255.255.255.0'><dhcp><range start='10.77.0.100' end='10.77.0.200'/></dhcp></ip></network>";

    #[test]
    fn parses_and_formats_like_libvirt() {
        let def = NetworkDef::parse(NET).unwrap();
        let xml = def.to_xml();
        assert!(xml.contains("<ip address='10.77.0.1' netmask='255.255.255.0'>"), "{xml}");
        assert!(xml.contains("<range start='10.77.0.100' end='10.77.0.200'/>"), "{xml}");
        assert_eq!(NetworkDef::parse(&xml).unwrap(), def);
    }

    #[test]
    fn dhcp_host_add_duplicate_delete() {
        let mut def = NetworkDef::parse(NET).unwrap();
        let host = "<host mac='52:54:00:00:00:01' name='h1' ip='10.77.0.150'/>";
        def.update_dhcp_host(UpdateCommand::AddLast, host).unwrap();
        let dup = def
            .update_dhcp_host(UpdateCommand::AddLast, "<host mac='52:54:00:00:00:02' name='h2' ip='10.77.0.150'/>")
            .unwrap_err();
        assert_eq!(dup.code(), ErrorCode::OperationInvalid);
        assert!(dup.message().contains("existing dhcp host entry in network 'n1'"), "{dup}");
        def.update_dhcp_host(UpdateCommand::Delete, "<host mac='52:54:00:00:00:01'/>").unwrap();
        let gone = def.update_dhcp_host(UpdateCommand::Delete, host).unwrap_err();
        assert_eq!(gone.code(), ErrorCode::OperationInvalid);
    }

    #[test]
    fn malformed_host_attributes_are_xml_errors() {
        let mut def = NetworkDef::parse(NET).unwrap();
        for bad in [
            "<host mac='zz' ip='10.77.0.5'/>",
            "<host mac='52:54:00:00:00:01' ip='10.77.0.999'/>",
            "<host mac='52:54:00:00:00:01'/>",
        ] {
            let err = def.update_dhcp_host(UpdateCommand::AddLast, bad).unwrap_err();
            assert_eq!(err.code(), ErrorCode::XmlError, "{bad}: {err}");
        }
    }

    #[test]
    fn free_address_skips_taken_and_moves_on() {
        let mut def = NetworkDef::parse(NET).unwrap();
        def.update_dhcp_host(UpdateCommand::AddLast, "<host mac='52:54:00:00:00:01' ip='10.77.0.100'/>").unwrap();
        let mut taken: HashSet<Ipv4Addr> = def.reserved_ips().collect();
        taken.insert(Ipv4Addr::new(10, 77, 0, 101));
        let mut cursor = 0;
        assert_eq!(def.free_address(&taken, &mut cursor), Some(Ipv4Addr::new(10, 77, 0, 102)));
        assert_eq!(def.free_address(&taken, &mut cursor), Some(Ipv4Addr::new(10, 77, 0, 103)));
    }
}
