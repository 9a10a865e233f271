//! Reading a libvirt network's XML: its first IPv4 subnet, DHCP ranges and
//! DHCP host reservations, and its DNS host entries.

use std::net::Ipv4Addr;

use super::xml_tree::XmlElement;

/// One `<host mac=.. name=.. ip=../>` entry of a network's `<dhcp>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpHost {
    pub mac: Option<String>,
    pub name: Option<String>,
    pub ip: Option<Ipv4Addr>,
}

/// An inclusive address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Range {
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
}

/// The first IPv4 `<ip>` element of a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Subnet {
    /// The host's own address on the network (the guests' gateway).
    pub address: Ipv4Addr,
    pub prefix: u8,
    /// `<dhcp><range>` entries; empty when the network sets none.
    pub ranges: Vec<Ipv4Range>,
    pub hosts: Vec<DhcpHost>,
}

/// One `<dns><host ip=..><hostname>..</hostname></host>` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsHost {
    /// `None` for an IPv6 entry (the provider only allocates IPv4).
    pub ip: Option<Ipv4Addr>,
    pub hostnames: Vec<String>,
}

/// What the provider reads from a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkInfo {
    pub name: String,
    pub ipv4: Option<Ipv4Subnet>,
    pub dns_hosts: Vec<DnsHost>,
    /// `<forward mode=..>`: none for an isolated network, `nat`, `route`,
    /// `open`, or `bridge` (a network onto an existing host bridge, on which
    /// libvirt runs no DHCP).
    pub forward_mode: Option<String>,
    /// `<bridge name=..>`: the Linux bridge libvirt made (NAT, routed and
    /// isolated networks) or, in forward mode bridge, the host's own bridge the
    /// network puts guests on.
    pub bridge: Option<String>,
}

impl NetworkInfo {
    /// A network onto an existing host bridge or interface: the guests share
    /// the host's L2 and libvirt gives them no addresses.
    pub fn is_host_bridge(&self) -> bool {
        matches!(self.forward_mode.as_deref(), Some("bridge" | "macvtap" | "passthrough" | "private" | "vepa"))
    }

    /// The host's Linux bridge a network in forward mode bridge puts its guests
    /// on: libvirt neither makes it nor checks that it exists.
    pub fn host_bridge(&self) -> Option<&str> {
        (self.forward_mode.as_deref() == Some("bridge")).then_some(self.bridge.as_deref()).flatten()
    }
}

impl Ipv4Subnet {
    pub fn network_address(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.address) & mask(self.prefix))
    }

    pub fn broadcast_address(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.address) | !mask(self.prefix))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.network_address())
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) }
}

/// Parses `virNetworkGetXMLDesc` output.
pub fn parse_network(xml: &str) -> Result<NetworkInfo, String> {
    let root = XmlElement::parse(xml)?;
    if root.name != "network" {
        return Err(format!("expected <network>, found <{}>", root.name));
    }
    let name = root.path_text(&["name"]).unwrap_or_default().to_string();
    let ipv4 = root
        .children_named("ip")
        .find(|ip| matches!(ip.attr("family"), None | Some("ipv4")))
        .map(parse_ip)
        .transpose()?;
    let forward_mode = root.child("forward").map(|f| f.attr("mode").unwrap_or("nat").to_string());
    let dns_hosts = root
        .child("dns")
        .into_iter()
        .flat_map(|dns| dns.children_named("host"))
        .map(|host| DnsHost {
            ip: host.attr("ip").and_then(|ip| ip.parse().ok()),
            hostnames: host.children_named("hostname").map(|h| h.text.trim().to_string()).collect(),
        })
        .collect();
    let bridge = root.child("bridge").and_then(|b| b.attr("name")).map(str::to_string);
    Ok(NetworkInfo { name, ipv4, forward_mode, dns_hosts, bridge })
}

fn parse_ip(ip: &XmlElement) -> Result<Ipv4Subnet, String> {
    let address = parse_addr(ip.attr("address").ok_or("<ip> has no address attribute")?)?;
    let prefix = match (ip.attr("prefix"), ip.attr("netmask")) {
        (Some(prefix), _) => prefix.parse::<u8>().map_err(|_| format!("<ip prefix='{prefix}'> is not a number"))?,
        (None, Some(netmask)) => u32::from(parse_addr(netmask)?).leading_ones() as u8,
        (None, None) => return Err(format!("<ip address='{address}'> has neither prefix nor netmask")),
    };
    if prefix > 32 {
        return Err(format!("<ip prefix='{prefix}'> is larger than 32"));
    }
    let mut ranges = Vec::new();
    let mut hosts = Vec::new();
    if let Some(dhcp) = ip.child("dhcp") {
        for range in dhcp.children_named("range") {
            let start = parse_addr(range.attr("start").ok_or("<range> has no start")?)?;
            let end = parse_addr(range.attr("end").ok_or("<range> has no end")?)?;
            ranges.push(Ipv4Range { start, end });
        }
        for host in dhcp.children_named("host") {
            hosts.push(DhcpHost {
                mac: host.attr("mac").map(str::to_ascii_lowercase),
                name: host.attr("name").map(str::to_string),
                ip: host.attr("ip").map(parse_addr).transpose()?,
            });
        }
    }
    Ok(Ipv4Subnet { address, prefix, ranges, hosts })
}

fn parse_addr(text: &str) -> Result<Ipv4Addr, String> {
    text.parse().map_err(|_| format!("\"{text}\" is not an IPv4 address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_subnet_ranges_and_hosts() {
        let xml = r#"<network><name>n</name><ip family='ipv6' address='fd00::1' prefix='64'/>
            <ip address='192.168.122.1' netmask='255.255.255.0'><dhcp>
            <range start='192.168.122.2' end='192.168.122.254'/>
            <host mac='52:54:00:AA:bb:cc' name='x' ip='192.168.122.5'/></dhcp></ip></network>"#;
        let net = parse_network(xml).unwrap();
        let v4 = net.ipv4.unwrap();
        assert_eq!(v4.prefix, 24);
        assert_eq!(v4.address, Ipv4Addr::new(192, 168, 122, 1));
        assert_eq!(v4.ranges[0].end, Ipv4Addr::new(192, 168, 122, 254));
        assert_eq!(v4.hosts[0].mac.as_deref(), Some("52:54:00:aa:bb:cc"));
        assert_eq!(v4.broadcast_address(), Ipv4Addr::new(192, 168, 122, 255));
        assert!(v4.contains(Ipv4Addr::new(192, 168, 122, 200)));
        assert!(!v4.contains(Ipv4Addr::new(192, 168, 123, 1)));
    }

    #[test]
    fn reads_dns_hosts() {
        let xml = "<network><name>n</name><dns><host ip='10.0.0.250'><hostname>a</hostname><hostname>b</hostname>\
                   </host><host ip='fd00::5'><hostname>v6</hostname></host></dns></network>";
        let net = parse_network(xml).unwrap();
        assert_eq!(
            net.dns_hosts,
            vec![
                DnsHost { ip: Some(Ipv4Addr::new(10, 0, 0, 250)), hostnames: vec!["a".into(), "b".into()] },
                DnsHost { ip: None, hostnames: vec!["v6".into()] },
            ]
        );
    }

    #[test]
    fn only_a_network_in_forward_mode_bridge_names_a_host_bridge() {
        let onto = parse_network("<network><name>lan</name><forward mode='bridge'/><bridge name='br-lab'/></network>");
        assert_eq!(onto.unwrap().host_bridge(), Some("br-lab"));
        let nat =
            parse_network("<network><name>n</name><forward mode='nat'/><bridge name='virbr0'/></network>").unwrap();
        assert_eq!((nat.bridge.as_deref(), nat.host_bridge()), (Some("virbr0"), None));
        let macvtap = "<network><name>m</name><forward mode='bridge'><interface dev='eth0'/></forward></network>";
        assert_eq!(parse_network(macvtap).unwrap().host_bridge(), None);
    }

    #[test]
    fn a_network_without_ipv4_has_none() {
        let net = parse_network("<network><name>iso</name></network>").unwrap();
        assert_eq!(net.ipv4, None);
    }
}
