//! The names and identity table of the provider (README, "Names and identity").
//!
//! | Item                   | Value                                                       |
//! |------------------------|-------------------------------------------------------------|
//! | Domain name            | `<namespace>-<name>-<hash>`, a DNS label unique on the host |
//! | Guest hostname         | the LibvirtMachine name                                     |
//! | Domain UUID            | the LibvirtMachine UID                                      |
//! | Provider ID            | `libvirt://<LibvirtMachine UID>`                            |
//! | cloud-init instance-id | the domain UUID                                             |
//! | Volumes                | `<domain>.qcow2`, `cloudinit-<domain>.iso` in domainPool    |
//! | MAC address            | `52:54:00` + 3 bytes derived from the domain name           |
//!
//! The hash is the first 6 hex digits of SHA-256 over `"<namespace>/<name>"`.
//! It is taken from namespace and name rather than from the UID so that the
//! domain name can be computed from what a user sees (`kubectl get`), and it
//! separates pairs that print alike (`a-b`/`c` and `a`/`b-c` both read
//! `a-b-c`) and names that truncation made equal. A LibvirtMachine deleted
//! and created again under the same name gets the same domain name; its UID,
//! kept in the domain's UUID and in our metadata, tells the incarnations apart
//! (a leftover domain of an older UID is reported as a collision, never reused).
//!
//! Long names: the DNS label limit is 63 characters, so `<namespace>-<name>`
//! is cut to 56 characters (63 minus `-` and 6 hash digits) and trailing
//! dashes are dropped. Characters a DNS label cannot hold (`.` of a DNS
//! subdomain name, upper case) become `-` or lower case.

use sha2::{Digest, Sha256};

/// The longest DNS label (RFC 1123).
pub const DNS_LABEL_MAX: usize = 63;
/// Hex digits of the hash suffix.
pub const HASH_LEN: usize = 6;
/// The locally administered prefix QEMU/KVM uses, also used by libvirt.
pub const MAC_PREFIX: [u8; 3] = [0x52, 0x54, 0x00];
/// The prefix of every provider ID the provider sets (`libvirt://<UID>`);
/// the one definition of it.
pub const PROVIDER_ID_PREFIX: &str = "libvirt://";

/// The identity of one LibvirtMachine, and every name derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineNames {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub domain: String,
}

impl MachineNames {
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            domain: domain_name(namespace, name),
        }
    }

    /// The guest hostname: the LibvirtMachine name.
    pub fn hostname(&self) -> &str {
        &self.name
    }

    /// The domain UUID: the LibvirtMachine UID.
    pub fn domain_uuid(&self) -> &str {
        &self.uid
    }

    /// `libvirt://<UID>`.
    pub fn provider_id(&self) -> String {
        provider_id(&self.uid)
    }

    /// cloud-init's instance-id: the domain UUID.
    pub fn instance_id(&self) -> &str {
        &self.uid
    }

    /// The root disk: `<domain>.qcow2`.
    pub fn overlay_volume(&self) -> String {
        format!("{}.qcow2", self.domain)
    }

    /// The cloud-init NoCloud ISO: `cloudinit-<domain>.iso`.
    pub fn cloud_init_volume(&self) -> String {
        format!("cloudinit-{}.iso", self.domain)
    }

    /// The NIC's MAC address, derived from the domain name.
    pub fn mac(&self) -> String {
        mac_address(&self.domain)
    }
}

/// `libvirt://<uid>`.
pub fn provider_id(uid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{uid}")
}

/// The first [`HASH_LEN`] hex digits of SHA-256 over `namespace/name`.
pub fn name_hash(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    hex(&digest)[..HASH_LEN].to_string()
}

/// `<namespace>-<name>-<hash>`, shortened to fit a DNS label.
pub fn domain_name(namespace: &str, name: &str) -> String {
    let readable: String = format!("{namespace}-{name}")
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    let room = DNS_LABEL_MAX - HASH_LEN - 1;
    let cut: String = readable.chars().take(room).collect();
    let prefix = cut.trim_matches('-');
    let hash = name_hash(namespace, name);
    if prefix.is_empty() { hash } else { format!("{prefix}-{hash}") }
}

/// `52:54:00:xx:yy:zz` with the last three bytes from SHA-256 of the domain name.
pub fn mac_address(domain: &str) -> String {
    let digest = Sha256::digest(domain.as_bytes());
    let bytes = [MAC_PREFIX[0], MAC_PREFIX[1], MAC_PREFIX[2], digest[0], digest[1], digest[2]];
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Whether `label` is an RFC 1123 DNS label: 1-63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= DNS_LABEL_MAX
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
