//! The names and identity table of the provider (the book's design page,
//! "Names and identity").
//!
//! | Item                   | Value                                                       |
//! |------------------------|-------------------------------------------------------------|
//! | Identity               | the UUID in `spec.providerID` once set, else the LibvirtMachine UID |
//! | Domain name            | `<namespace>-<name>-<hash>`, a DNS label unique on the host |
//! | Guest hostname         | the LibvirtMachine name                                     |
//! | Domain UUID            | the identity                                                |
//! | Provider ID            | `libvirt://<identity>`                                      |
//! | cloud-init instance-id | the identity                                                |
//! | Volumes                | `<domain>.qcow2`, `cloudinit-<domain>.iso` in domainPool    |
//! | MAC address            | `52:54:00` + 3 bytes derived from the domain name; the next candidate when another entry or guest on the network uses it (see below) |
//!
//! # Identity
//!
//! Everything the provider makes on a host derives from one identity, a UUID.
//! A new LibvirtMachine's identity is its UID; the provider writes it into
//! `spec.providerID` (`libvirt://<UID>`) when the domain is created, and from
//! then on the identity is read back from `spec.providerID`. `clusterctl move`
//! recreates objects with new UIDs but copies their spec, so a moved machine
//! keeps its identity and the provider on the target finds its domain, disks,
//! seed and DHCP entry as its own. `clusterctl move` refuses to start while any
//! Machine has no Node (so no providerID yet): a machine is never moved
//! half-made.
//!
//! The hash is the first 16 hex digits (64 bits) of SHA-256 over
//! `"<namespace>/<name>/<identity>"`. It separates pairs that print alike
//! (`a-b`/`c` and `a`/`b-c` both read `a-b-c`) and names that truncation made
//! equal, and it binds every name to the identity: a LibvirtMachine deleted
//! (with host cleanup skipped) and created again under the same name, or the
//! same namespace and name in another management cluster on the same host,
//! gets another domain name, another MAC address and other volumes, so it
//! can never adopt the old machine's disk or DHCP entry. A tenant may set
//! `spec.providerID` (and so the identity) on a new LibvirtMachine; with 64
//! bits, finding an identity whose names equal another machine's takes about
//! 2^64 hashes, out of reach. The domain name is in the LibvirtMachine's
//! `status.domainName`.
//!
//! Machines created while the hash had 6 digits keep their names
//! ([`NameScheme::Legacy`]): the provider reads the scheme from
//! `status.domainName`, and when a moved machine has no status yet it takes the
//! 6-digit names only if a domain of its identity exists under them.
//!
//! A root disk found at the machine's name is adopted only when the identity
//! recorded beside it agrees: the `instance-id` in the seed ISO of the same
//! name (written with the identity, and removed only after the root disk).
//! A disk whose seed names another identity is another machine's and is
//! neither used nor deleted.
//!
//! # MAC address
//!
//! Three bytes leave about 16.7 million MACs: among 1,000 machines on one
//! network two share one with odds of about 3 %, among 10,000 about 95 %. A
//! machine therefore has a fixed sequence of [`MAC_CANDIDATES`] MACs
//! ([`mac_candidates`]): first `52:54:00` + SHA-256 of the domain name (what
//! every machine used before), then `52:54:00` + SHA-256 of `<domain>#1`,
//! `<domain>#2`, ... When it reserves its address, the machine takes the first
//! candidate that no other DHCP host entry of the network and no lease of the
//! network (a running guest's interface) uses. The MAC it took is in its DHCP
//! host entry (named after the domain) and its domain's `<interface>`, and is
//! read back from there ever after; the LibvirtMachine reports it in
//! `status.macAddress`. An entry is the machine's when its name is the domain
//! name and its MAC one of the candidates. A second and further NIC
//! (`spec.additionalNetworks`) has one fixed MAC each,
//! [`MachineNames::additional_mac`]: it reserves nothing.
//!
//! Long names: the DNS label limit is 63 characters, so `<namespace>-<name>`
//! is cut to 46 characters (63 minus `-` and 16 hash digits; 56 under the
//! 6-digit scheme) and trailing dashes are dropped. Characters a DNS label
//! cannot hold (`.` of a DNS subdomain name, upper case) become `-` or lower
//! case.

use sha2::{Digest, Sha256};

/// The longest DNS label (RFC 1123).
pub const DNS_LABEL_MAX: usize = 63;
/// Hex digits of the hash suffix (64 bits).
pub const HASH_LEN: usize = 16;
/// Hex digits of the hash suffix of machines named under [`NameScheme::Legacy`].
pub const LEGACY_HASH_LEN: usize = 6;

/// How long a machine's hash suffix is (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NameScheme {
    /// [`HASH_LEN`] digits: every new machine.
    #[default]
    Current,
    /// [`LEGACY_HASH_LEN`] digits: a machine created when names had 6 digits.
    Legacy,
    /// Not known yet (a machine with a provider ID and no `status.domainName`,
    /// as after `clusterctl move`): [`Self::Legacy`] when a domain of the
    /// machine's identity exists under the 6-digit name, else [`Self::Current`].
    Either,
}

impl NameScheme {
    /// The digits of the hash; [`Self::Either`] counts as [`Self::Current`].
    pub fn hash_len(self) -> usize {
        match self {
            NameScheme::Legacy => LEGACY_HASH_LEN,
            NameScheme::Current | NameScheme::Either => HASH_LEN,
        }
    }

    /// The scheme a recorded domain name was made under, for this namespace,
    /// name and identity; `None` when neither scheme gives it.
    pub fn of_domain(domain: &str, namespace: &str, name: &str, identity: &str) -> Option<Self> {
        [NameScheme::Current, NameScheme::Legacy]
            .into_iter()
            .find(|scheme| domain_name_in(*scheme, namespace, name, identity) == domain)
    }
}

/// The locally administered prefix QEMU/KVM uses, also used by libvirt.
pub const MAC_PREFIX: [u8; 3] = [0x52, 0x54, 0x00];
/// How many MACs a machine may choose from ([`mac_candidates`]). The chance
/// that all of them are taken on a network of 10,000 machines is below 1e-45.
pub const MAC_CANDIDATES: usize = 16;
/// The prefix of every provider ID the provider sets (`libvirt://<identity>`);
/// the one definition of it.
pub const PROVIDER_ID_PREFIX: &str = "libvirt://";

/// Whether `domain` is named like a machine's domain under either scheme:
/// a DNS label that ends in [`HASH_LEN`] or [`LEGACY_HASH_LEN`] lower-case
/// hex digits, after a `-` or as the whole name.
pub fn is_machine_domain_name(domain: &str) -> bool {
    let hash = domain.rsplit('-').next().unwrap_or_default();
    is_dns_label(domain) && [HASH_LEN, LEGACY_HASH_LEN].contains(&hash.len()) && is_lower_hex(hash)
}

/// A seed ISO's name: `cloudinit-<domain>.iso`.
pub const SEED_VOLUME_PREFIX: &str = "cloudinit-";
pub const SEED_VOLUME_SUFFIX: &str = ".iso";

/// Whether `volume` is named like a seed ISO the provider makes.
pub fn is_seed_volume_name(volume: &str) -> bool {
    volume
        .strip_prefix(SEED_VOLUME_PREFIX)
        .and_then(|rest| rest.strip_suffix(SEED_VOLUME_SUFFIX))
        .is_some_and(is_dns_label)
}

/// A downloaded base image's volume starts with this.
pub const IMAGE_VOLUME_PREFIX: &str = "capl-image-";
/// Hex digits of the checksum in a downloaded image's volume name (128 bits).
pub const IMAGE_VOLUME_CHECKSUM_DIGITS: usize = 32;

/// The volume of a base image the provider downloads:
/// `capl-image-<algorithm>-<first 32 hex digits of the checksum>.<format>`,
/// e.g. `capl-image-sha256-9f86d081884c7d659a2feaa0c55ad015.qcow2`. Images
/// with the same checksum share it; the name says the provider made it.
pub fn image_volume_name(algorithm: &str, checksum: &str, format: &str) -> String {
    let hex: String = checksum.chars().take(IMAGE_VOLUME_CHECKSUM_DIGITS).collect::<String>().to_ascii_lowercase();
    format!("{IMAGE_VOLUME_PREFIX}{algorithm}-{hex}.{format}")
}

/// Whether `volume` is named like a base image the provider downloaded.
pub fn is_image_volume_name(volume: &str) -> bool {
    let Some(rest) = volume.strip_prefix(IMAGE_VOLUME_PREFIX) else { return false };
    let Some((algorithm, rest)) = rest.split_once('-') else { return false };
    let Some((hex, format)) = rest.split_once('.') else { return false };
    matches!(algorithm, "sha256" | "sha512")
        && matches!(format, "qcow2" | "raw")
        && hex.len() == IMAGE_VOLUME_CHECKSUM_DIGITS
        && is_lower_hex(hex)
}

/// Whether `s` is all lowercase hex digits, as the provider writes hashes.
fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The identity of one LibvirtMachine, and every name derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineNames {
    pub namespace: String,
    pub name: String,
    /// The UUID in `spec.providerID` once set, else the LibvirtMachine UID (see the module docs).
    pub identity: String,
    pub domain: String,
}

impl MachineNames {
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self::in_scheme(NameScheme::Current, namespace, name, identity)
    }

    /// The names under `scheme` (see [`NameScheme`]).
    pub fn in_scheme(scheme: NameScheme, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            domain: domain_name_in(scheme, namespace, name, identity),
        }
    }

    /// The guest hostname: the LibvirtMachine name.
    pub fn hostname(&self) -> &str {
        &self.name
    }

    /// The domain UUID: the identity.
    pub fn domain_uuid(&self) -> &str {
        &self.identity
    }

    /// `libvirt://<identity>`.
    pub fn provider_id(&self) -> String {
        provider_id(&self.identity)
    }

    /// cloud-init's instance-id: the identity (the domain UUID).
    pub fn instance_id(&self) -> &str {
        &self.identity
    }

    /// The root disk: `<domain>.qcow2`.
    pub fn overlay_volume(&self) -> String {
        format!("{}.qcow2", self.domain)
    }

    /// Data disk `disk` (`spec.dataDisks[].name`) in format `format`:
    /// `<domain>-data-<disk>.<format>`.
    pub fn data_volume(&self, disk: &str, format: &str) -> String {
        format!("{}-data-{disk}.{format}", self.domain)
    }

    /// The cloud-init NoCloud ISO: `cloudinit-<domain>.iso`.
    pub fn cloud_init_volume(&self) -> String {
        format!("{SEED_VOLUME_PREFIX}{}{SEED_VOLUME_SUFFIX}", self.domain)
    }

    /// The Ignition config of a machine whose bootstrap data is Ignition:
    /// `ignition-<domain>.ign`, the file of its firmware config entry.
    pub fn ignition_volume(&self) -> String {
        format!("ignition-{}.ign", self.domain)
    }

    /// The first MAC the machine tries: derived from the domain name. The MAC
    /// it uses is the first of [`Self::mac_candidates`] free on the network
    /// when it reserved its address, read back from its DHCP entry or domain.
    pub fn derived_mac(&self) -> String {
        mac_address(&self.domain)
    }

    /// The MACs the machine may use, in the order it tries them.
    pub fn mac_candidates(&self) -> Vec<String> {
        mac_candidates(&self.domain)
    }

    /// The MAC of the machine's NIC number `nic` after the first one (1 for
    /// the second NIC): `52:54:00` + SHA-256 of `<domain>/nic<nic>`. These
    /// NICs hold no DHCP reservation, so the MAC is fixed.
    pub fn additional_mac(&self, nic: usize) -> String {
        mac_from_hash(&format!("{}/nic{nic}", self.domain))
    }
}

/// `libvirt://<identity>`.
pub fn provider_id(identity: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{identity}")
}

/// The identity a provider ID carries: the UUID after `libvirt://`. An error
/// (naming the value and the form) for anything else: a provider ID this
/// provider did not set.
pub fn identity_from_provider_id(provider_id: &str) -> Result<String, String> {
    match provider_id.strip_prefix(PROVIDER_ID_PREFIX) {
        Some(uuid) if is_uuid(uuid) => Ok(uuid.to_ascii_lowercase()),
        _ => Err(format!(
            "spec.providerID {provider_id:?} is not of the form {PROVIDER_ID_PREFIX}<UUID> this provider sets; \
             leave spec.providerID unset on a new LibvirtMachine (the provider sets it)"
        )),
    }
}

/// Whether `s` is a UUID in its 8-4-4-4-12 hex form.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { c == '-' } else { c.is_ascii_hexdigit() })
}

/// The first [`HASH_LEN`] hex digits of SHA-256 over `namespace/name/identity`.
pub fn name_hash(namespace: &str, name: &str, identity: &str) -> String {
    name_hash_in(NameScheme::Current, namespace, name, identity)
}

/// The hash of `scheme`'s length.
pub fn name_hash_in(scheme: NameScheme, namespace: &str, name: &str, identity: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}/{identity}").as_bytes());
    hex(&digest)[..scheme.hash_len()].to_string()
}

/// `<namespace>-<name>-<hash>`, shortened to fit a DNS label.
pub fn domain_name(namespace: &str, name: &str, identity: &str) -> String {
    domain_name_in(NameScheme::Current, namespace, name, identity)
}

/// [`domain_name`] under `scheme`.
pub fn domain_name_in(scheme: NameScheme, namespace: &str, name: &str, identity: &str) -> String {
    let readable: String = format!("{namespace}-{name}")
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    let room = DNS_LABEL_MAX - scheme.hash_len() - 1;
    let cut: String = readable.chars().take(room).collect();
    let prefix = cut.trim_matches('-');
    let hash = name_hash_in(scheme, namespace, name, identity);
    if prefix.is_empty() { hash } else { format!("{prefix}-{hash}") }
}

/// `52:54:00:xx:yy:zz` with the last three bytes from SHA-256 of the domain
/// name: the first of [`mac_candidates`].
pub fn mac_address(domain: &str) -> String {
    mac_from_hash(domain)
}

/// The [`MAC_CANDIDATES`] distinct MACs a machine with domain name `domain`
/// may use, in order: [`mac_address`] of the domain name, then `52:54:00` +
/// the first three bytes of SHA-256 over `<domain>#1`, `<domain>#2`, ...
/// (a value already in the list is skipped). The same list on every call, in
/// every process.
pub fn mac_candidates(domain: &str) -> Vec<String> {
    let mut macs = vec![mac_address(domain)];
    let mut n = 1u32;
    while macs.len() < MAC_CANDIDATES {
        let mac = mac_from_hash(&format!("{domain}#{n}"));
        if !macs.contains(&mac) {
            macs.push(mac);
        }
        n += 1;
    }
    macs
}

fn mac_from_hash(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
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
