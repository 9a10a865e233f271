//! The cloud-init NoCloud seed: `meta-data`, and a minimal ISO 9660 writer
//! that packs it with `user-data` into an image labelled `cidata`.
//!
//! The image holds one root directory with two files. Plain ISO 9660 names
//! are upper case, so a Joliet supplementary volume descriptor carries the
//! exact names `user-data` and `meta-data` (Linux's isofs, blkid, xorriso and
//! isoinfo all read Joliet). Layout, in 2048-byte sectors:
//!
//! | sector | content                                        |
//! |--------|------------------------------------------------|
//! | 0-15   | system area (zero)                             |
//! | 16     | primary volume descriptor, label `cidata`      |
//! | 17     | Joliet supplementary volume descriptor         |
//! | 18     | volume descriptor set terminator               |
//! | 19-22  | path tables: primary L, M; Joliet L, M         |
//! | 23     | primary root directory                         |
//! | 24     | Joliet root directory                          |
//! | 25-    | `meta-data`, then `user-data`, sector-aligned  |
//!
//! All timestamps are a fixed date, so the same input gives the same bytes.
//!
//! # Why not a crate
//!
//! `hadris-iso` 2.5, the maintained ISO 9660 writer on crates.io, was tried
//! in place of this writer (December 2026). It writes a cidata seed Linux
//! reads, but it stamps the current time into every volume descriptor and
//! directory record, with no option to fix it: the same seed gives different
//! bytes (and a different blkid UUID) on every call. The provider relies on
//! byte-identical seeds (a crashed create is recognised and finished by
//! comparing the seed on the host with the one it would write; the host tests
//! assert exactly one seed per machine, byte for byte). It also added about
//! 20 crates and 27 s to a cold build, and its 2.x API is being replaced by
//! 3.0, whose release candidate can fix the time. Revisit with hadris-iso
//! 3.0 final: switch if it passes the same independent readers
//! (`capl-host/tests/offline/host_cloud_init_iso.rs`: xorriso, blkid) and the
//! guest boot of `cargo xtask e2e`.

pub const VOLUME_LABEL: &str = "cidata";
pub const SECTOR: usize = 2048;

const PVD_SECTOR: u32 = 16;
const PATH_TABLE_PRIMARY_L: u32 = 19;
const PATH_TABLE_PRIMARY_M: u32 = 20;
const PATH_TABLE_JOLIET_L: u32 = 21;
const PATH_TABLE_JOLIET_M: u32 = 22;
const ROOT_PRIMARY: u32 = 23;
const ROOT_JOLIET: u32 = 24;
const FIRST_FILE: u32 = 25;
/// 2020-01-01 00:00:00 UTC in the 7-byte directory record format.
const RECORD_DATE: [u8; 7] = [120, 1, 1, 0, 0, 0, 0];
/// The same date in the 17-byte volume descriptor format.
const VOLUME_DATE: &[u8; 17] = b"2020010100000000\0";

/// `meta-data` for NoCloud: instance-id (the domain UUID) and local-hostname.
pub fn meta_data(instance_id: &str, local_hostname: &str) -> String {
    format!("instance-id: {}\nlocal-hostname: {}\n", yaml_scalar(instance_id), yaml_scalar(local_hostname))
}

/// A YAML scalar that reads back as the same string: plain when it is
/// unambiguous, double-quoted when YAML would read it as a number, bool or null.
fn yaml_scalar(value: &str) -> String {
    let ambiguous = value.is_empty()
        || value.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e')
        || matches!(
            value.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "true" | "false" | "on" | "off" | "null" | "~"
        )
        || !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
    if ambiguous { yaml_double_quoted(value) } else { value.to_string() }
}

/// `value` as a YAML double-quoted scalar: a quote, a backslash or a line
/// break in it cannot end the scalar or start a new key.
fn yaml_double_quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A static address of a guest interface: address, prefix length and gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticAddress {
    pub address: std::net::IpAddr,
    pub prefix: u8,
    pub gateway: Option<std::net::IpAddr>,
}

/// One guest interface of a `network-config`, found by its MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestInterface {
    pub mac: String,
    /// Static addresses; empty with `dhcp`.
    pub addresses: Vec<StaticAddress>,
    /// The interface asks DHCP (v4) for its address instead.
    pub dhcp: bool,
}

/// cloud-init's `network-config` (version 2) for one interface, found by its
/// MAC: the static addresses, a default route through each address family's
/// first gateway, and the nameservers; no DHCP.
pub fn network_config(mac: &str, addresses: &[StaticAddress], nameservers: &[String]) -> String {
    network_config_for(
        &[GuestInterface { mac: mac.to_string(), addresses: addresses.to_vec(), dhcp: false }],
        nameservers,
    )
}

/// cloud-init's `network-config` (version 2) for several interfaces, each
/// found by its MAC (`id0`, `id1`, ... in order): static addresses or DHCP.
/// The default routes go through the first interface's gateways only (a
/// guest has one default route per family; further interfaces reach their
/// own subnets); the nameservers are given with the first interface that has
/// static addresses (a DHCP interface gets them from its server).
pub fn network_config_for(interfaces: &[GuestInterface], nameservers: &[String]) -> String {
    let mut out = String::from("version: 2\nethernets:\n");
    let first_static = interfaces.iter().position(|i| !i.dhcp);
    for (index, nic) in interfaces.iter().enumerate() {
        out.push_str(&format!("  id{index}:\n    match:\n      macaddress: \"{}\"\n", nic.mac));
        if nic.dhcp {
            out.push_str("    dhcp4: true\n    dhcp6: false\n");
            continue;
        }
        out.push_str("    dhcp4: false\n    dhcp6: false\n");
        if !nic.addresses.is_empty() {
            out.push_str("    addresses:\n");
            for a in &nic.addresses {
                out.push_str(&format!("      - \"{}/{}\"\n", a.address, a.prefix));
            }
        }
        let v4 = nic.addresses.iter().filter_map(|a| a.gateway).find(|g| g.is_ipv4());
        let v6 = nic.addresses.iter().filter_map(|a| a.gateway).find(|g| g.is_ipv6());
        if index == 0 && (v4.is_some() || v6.is_some()) {
            out.push_str("    routes:\n");
            if let Some(g) = v4 {
                out.push_str(&format!("      - to: \"0.0.0.0/0\"\n        via: \"{g}\"\n"));
            }
            if let Some(g) = v6 {
                out.push_str(&format!("      - to: \"::/0\"\n        via: \"{g}\"\n"));
            }
        }
        if Some(index) == first_static && !nameservers.is_empty() {
            out.push_str("    nameservers:\n      addresses:\n");
            for n in nameservers {
                out.push_str(&format!("        - {}\n", yaml_double_quoted(n)));
            }
        }
    }
    out
}

/// One file of the image.
struct IsoFile<'a> {
    /// The ISO 9660 name (upper case, with version).
    primary: &'static str,
    /// The exact name, written in the Joliet tree.
    joliet: &'static str,
    content: &'a [u8],
    sector: u32,
}

/// The NoCloud seed image: label `cidata`, files `meta-data` and `user-data`.
pub fn nocloud_iso(user_data: &[u8], meta_data: &[u8]) -> Vec<u8> {
    nocloud_iso_with_network(user_data, meta_data, None)
}

/// [`nocloud_iso`] with a `network-config` file too, when given.
pub fn nocloud_iso_with_network(user_data: &[u8], meta_data: &[u8], network_config: Option<&[u8]>) -> Vec<u8> {
    // Directory records are sorted by name: meta-data, network-config, user-data.
    let mut files = vec![IsoFile { primary: "META-DATA.;1", joliet: "meta-data", content: meta_data, sector: 0 }];
    if let Some(network) = network_config {
        files.push(IsoFile { primary: "NETWORK-CONFIG.;1", joliet: "network-config", content: network, sector: 0 });
    }
    files.push(IsoFile { primary: "USER-DATA.;1", joliet: "user-data", content: user_data, sector: 0 });
    let mut next = FIRST_FILE;
    for file in &mut files {
        file.sector = next;
        next += sectors(file.content.len());
    }
    let total_sectors = next;
    let mut image = vec![0u8; total_sectors as usize * SECTOR];

    write_sector(&mut image, PVD_SECTOR, &volume_descriptor(1, total_sectors, false));
    write_sector(&mut image, PVD_SECTOR + 1, &volume_descriptor(2, total_sectors, true));
    let mut terminator = vec![0u8; SECTOR];
    terminator[0] = 255;
    terminator[1..6].copy_from_slice(b"CD001");
    terminator[6] = 1;
    write_sector(&mut image, PVD_SECTOR + 2, &terminator);

    write_sector(&mut image, PATH_TABLE_PRIMARY_L, &path_table(ROOT_PRIMARY, false));
    write_sector(&mut image, PATH_TABLE_PRIMARY_M, &path_table(ROOT_PRIMARY, true));
    write_sector(&mut image, PATH_TABLE_JOLIET_L, &path_table(ROOT_JOLIET, false));
    write_sector(&mut image, PATH_TABLE_JOLIET_M, &path_table(ROOT_JOLIET, true));

    write_sector(&mut image, ROOT_PRIMARY, &root_directory(ROOT_PRIMARY, &files, false));
    write_sector(&mut image, ROOT_JOLIET, &root_directory(ROOT_JOLIET, &files, true));
    for file in &files {
        let start = file.sector as usize * SECTOR;
        image[start..start + file.content.len()].copy_from_slice(file.content);
    }
    image
}

/// A file of the image's root directory by its exact (Joliet) name, as a
/// guest reading the seed would find it: for tests and checks.
pub fn iso_file(bytes: &[u8], name: &str) -> Option<Vec<u8>> {
    let at = |sector: u32| sector as usize * SECTOR;
    let le32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let svd = bytes.get(at(PVD_SECTOR + 1)..at(PVD_SECTOR + 2))?;
    if svd[0] != 2 || &svd[1..6] != b"CD001" {
        return None;
    }
    let root = &svd[156..156 + 34];
    let (dir_start, dir_len) = (at(le32(&root[2..6])), le32(&root[10..14]) as usize);
    let dir = bytes.get(dir_start..dir_start + dir_len)?;
    let wanted = ucs2(name);
    let mut offset = 0;
    // The bytes come from a host: a malformed directory ends the search, never panics.
    while offset < dir.len() && dir[offset] != 0 {
        let record = dir.get(offset..offset + dir[offset] as usize)?;
        let id_len = *record.get(32)? as usize;
        if record.get(33..33 + id_len)? == &wanted[..] {
            let start = at(le32(record.get(2..6)?));
            return bytes.get(start..start + le32(record.get(10..14)?) as usize).map(<[u8]>::to_vec);
        }
        offset += record.len();
    }
    None
}

/// The `instance-id` in a NoCloud seed's `meta-data`: the identity of the
/// machine the seed was written for. `None` when `bytes` holds no seed with one.
pub fn seed_instance_id(bytes: &[u8]) -> Option<String> {
    let meta = String::from_utf8(iso_file(bytes, "meta-data")?).ok()?;
    let value = meta.lines().find_map(|line| line.strip_prefix("instance-id:"))?.trim();
    Some(value.trim_matches('"').to_string())
}

/// The volume label of an ISO 9660 image (primary volume descriptor), if `bytes` is one.
pub fn iso_volume_label(bytes: &[u8]) -> Option<String> {
    let pvd = bytes.get(PVD_SECTOR as usize * SECTOR..(PVD_SECTOR as usize + 1) * SECTOR)?;
    if pvd[0] != 1 || &pvd[1..6] != b"CD001" {
        return None;
    }
    Some(String::from_utf8_lossy(&pvd[40..72]).trim_end().to_string())
}

fn sectors(len: usize) -> u32 {
    // An empty file still gets its own (empty) extent so every file has a distinct location.
    len.div_ceil(SECTOR).max(1) as u32
}

fn write_sector(image: &mut [u8], sector: u32, data: &[u8]) {
    let start = sector as usize * SECTOR;
    image[start..start + data.len()].copy_from_slice(data);
}

fn both_u32(value: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&value.to_le_bytes());
    out[4..].copy_from_slice(&value.to_be_bytes());
    out
}

fn both_u16(value: u16) -> [u8; 4] {
    let mut out = [0u8; 4];
    out[..2].copy_from_slice(&value.to_le_bytes());
    out[2..].copy_from_slice(&value.to_be_bytes());
    out
}

/// A text field padded with spaces: ASCII for the primary descriptor, UCS-2 big endian for Joliet.
fn padded(text: &str, width: usize, joliet: bool) -> Vec<u8> {
    let mut out = if joliet { ucs2(text) } else { text.as_bytes().to_vec() };
    out.truncate(width);
    while out.len() < width {
        if joliet && width - out.len() >= 2 {
            out.extend_from_slice(&[0, b' ']);
        } else {
            out.push(b' ');
        }
    }
    out
}

fn ucs2(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(|unit| unit.to_be_bytes()).collect()
}

fn volume_descriptor(kind: u8, total_sectors: u32, joliet: bool) -> Vec<u8> {
    let mut d = vec![0u8; SECTOR];
    d[0] = kind;
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    d[8..40].copy_from_slice(&padded("LINUX", 32, joliet));
    d[40..72].copy_from_slice(&padded(VOLUME_LABEL, 32, joliet));
    d[80..88].copy_from_slice(&both_u32(total_sectors));
    if joliet {
        // Escape sequence for UCS-2 level 3.
        d[88..91].copy_from_slice(b"%/E");
    }
    d[120..124].copy_from_slice(&both_u16(1));
    d[124..128].copy_from_slice(&both_u16(1));
    d[128..132].copy_from_slice(&both_u16(SECTOR as u16));
    d[132..140].copy_from_slice(&both_u32(10));
    let (l_table, m_table) =
        if joliet { (PATH_TABLE_JOLIET_L, PATH_TABLE_JOLIET_M) } else { (PATH_TABLE_PRIMARY_L, PATH_TABLE_PRIMARY_M) };
    d[140..144].copy_from_slice(&l_table.to_le_bytes());
    d[148..152].copy_from_slice(&m_table.to_be_bytes());
    let root = if joliet { ROOT_JOLIET } else { ROOT_PRIMARY };
    d[156..190].copy_from_slice(&directory_record(&[0], root, SECTOR as u32, true));
    for (start, width) in [(190, 128), (318, 128), (446, 128), (574, 128), (702, 37), (739, 37), (776, 37)] {
        let field = padded("", width, joliet);
        d[start..start + width].copy_from_slice(&field);
    }
    for start in [813, 830] {
        d[start..start + 17].copy_from_slice(VOLUME_DATE);
    }
    for start in [847, 864] {
        d[start..start + 16].copy_from_slice(b"0000000000000000");
    }
    d[881] = 1;
    d
}

fn path_table(root_sector: u32, big_endian: bool) -> Vec<u8> {
    let mut t = vec![0u8; 10];
    t[0] = 1;
    let location = if big_endian { root_sector.to_be_bytes() } else { root_sector.to_le_bytes() };
    t[2..6].copy_from_slice(&location);
    let parent = if big_endian { 1u16.to_be_bytes() } else { 1u16.to_le_bytes() };
    t[6..8].copy_from_slice(&parent);
    t
}

fn directory_record(identifier: &[u8], sector: u32, size: u32, directory: bool) -> Vec<u8> {
    let mut length = 33 + identifier.len();
    if length % 2 == 1 {
        length += 1;
    }
    let mut r = vec![0u8; length];
    r[0] = length as u8;
    r[2..10].copy_from_slice(&both_u32(sector));
    r[10..18].copy_from_slice(&both_u32(size));
    r[18..25].copy_from_slice(&RECORD_DATE);
    r[25] = if directory { 2 } else { 0 };
    r[28..32].copy_from_slice(&both_u16(1));
    r[32] = identifier.len() as u8;
    r[33..33 + identifier.len()].copy_from_slice(identifier);
    r
}

fn root_directory(sector: u32, files: &[IsoFile<'_>], joliet: bool) -> Vec<u8> {
    let mut dir = Vec::with_capacity(SECTOR);
    dir.extend(directory_record(&[0], sector, SECTOR as u32, true));
    dir.extend(directory_record(&[1], sector, SECTOR as u32, true));
    // Files are sorted by identifier; "meta-data" < "user-data" in both trees.
    for file in files {
        let identifier = if joliet { ucs2(file.joliet) } else { file.primary.as_bytes().to_vec() };
        dir.extend(directory_record(&identifier, file.sector, file.content.len() as u32, false));
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_data_quotes_only_what_yaml_would_misread() {
        assert_eq!(meta_data("3f1c-aa", "worker-0"), "instance-id: 3f1c-aa\nlocal-hostname: worker-0\n");
        assert_eq!(meta_data("u", "123"), "instance-id: u\nlocal-hostname: \"123\"\n");
        assert_eq!(meta_data("u", "yes"), "instance-id: u\nlocal-hostname: \"yes\"\n");
    }

    #[test]
    fn network_config_for_several_interfaces_routes_only_through_the_first() {
        let at = |a: &str, g: &str| StaticAddress {
            address: a.parse().unwrap(),
            prefix: 24,
            gateway: Some(g.parse().unwrap()),
        };
        let nics = [
            GuestInterface { mac: "52:54:00:00:00:01".into(), addresses: Vec::new(), dhcp: true },
            GuestInterface {
                mac: "52:54:00:00:00:02".into(),
                addresses: vec![at("10.80.0.5", "10.80.0.1")],
                dhcp: false,
            },
        ];
        let text = network_config_for(&nics, &["10.80.0.1".to_string()]);
        assert_eq!(
            text,
            "version: 2\nethernets:\n  id0:\n    match:\n      macaddress: \"52:54:00:00:00:01\"\n    dhcp4: true\n    dhcp6: false\n  id1:\n    match:\n      macaddress: \"52:54:00:00:00:02\"\n    dhcp4: false\n    dhcp6: false\n    addresses:\n      - \"10.80.0.5/24\"\n    nameservers:\n      addresses:\n        - \"10.80.0.1\"\n"
        );
    }

    #[test]
    fn a_nameserver_cannot_end_its_scalar_or_add_keys() {
        let nic = GuestInterface {
            mac: "52:54:00:00:00:01".into(),
            addresses: vec![StaticAddress { address: "10.80.0.5".parse().unwrap(), prefix: 24, gateway: None }],
            dhcp: false,
        };
        let text = network_config_for(&[nic], &["10.0.0.1\"\n  runcmd: [x]\\".to_string()]);
        assert!(text.ends_with("        - \"10.0.0.1\\\"\\x0a  runcmd: [x]\\\\\"\n"), "{text}");
        assert!(!text.lines().any(|l| l.trim_start().starts_with("runcmd")), "{text}");
    }

    #[test]
    fn network_config_is_version_2_for_the_interface_by_mac() {
        let addresses = [StaticAddress {
            address: "10.77.0.10".parse().unwrap(),
            prefix: 24,
            gateway: Some("10.77.0.1".parse().unwrap()),
        }];
        let text = network_config("52:54:00:aa:bb:cc", &addresses, &["10.77.0.2".to_string()]);
        assert_eq!(
            text,
            "version: 2\nethernets:\n  id0:\n    match:\n      macaddress: \"52:54:00:aa:bb:cc\"\n    dhcp4: false\n    dhcp6: false\n    addresses:\n      - \"10.77.0.10/24\"\n    routes:\n      - to: \"0.0.0.0/0\"\n        via: \"10.77.0.1\"\n    nameservers:\n      addresses:\n        - \"10.77.0.2\"\n"
        );
        let iso = nocloud_iso_with_network(b"#cloud-config\n", b"instance-id: i\n", Some(text.as_bytes()));
        assert_eq!(iso_volume_label(&iso).as_deref(), Some(VOLUME_LABEL));
        assert_eq!(iso_file(&iso, "network-config").as_deref(), Some(text.as_bytes()));
        assert_eq!(iso_file(&iso, "user-data").as_deref(), Some(&b"#cloud-config\n"[..]));
        assert_eq!(iso_file(&iso, "meta-data").as_deref(), Some(&b"instance-id: i\n"[..]));
        let plain = nocloud_iso(b"u", b"m");
        assert_eq!(iso_file(&plain, "network-config"), None);
        assert_eq!(iso_file(&plain, "user-data").as_deref(), Some(&b"u"[..]));
    }

    #[test]
    fn label_reads_back_and_is_deterministic() {
        let iso = nocloud_iso(b"#cloud-config\n", b"instance-id: x\n");
        assert_eq!(iso.len() % SECTOR, 0);
        assert_eq!(iso_volume_label(&iso).as_deref(), Some(VOLUME_LABEL));
        assert_eq!(iso, nocloud_iso(b"#cloud-config\n", b"instance-id: x\n"));
        assert_eq!(iso_volume_label(&vec![0u8; 40 * SECTOR]), None);
    }
}
