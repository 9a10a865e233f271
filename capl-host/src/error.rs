//! Every way a host operation fails, each message naming the object, the value
//! and the fix, and each of a [`FailureKind`] (which the provider's
//! controllers map to the condition reasons they report).

use std::fmt;

use crate::hypervisor::connections::CallError;
use crate::hypervisor::{ErrorKind, HypervisorError};

/// The kind of libvirt object an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Domain,
    Volume,
    Network,
    StoragePool,
    DhcpHost,
    Host,
    /// A host interface (`virInterface`), e.g. a Linux bridge.
    Interface,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Domain => "domain",
            ObjectKind::Volume => "volume",
            ObjectKind::Network => "network",
            ObjectKind::StoragePool => "storage pool",
            ObjectKind::DhcpHost => "DHCP host entry",
            ObjectKind::Host => "host",
            ObjectKind::Interface => "host interface",
        })
    }
}

/// What kind of failure a [`HostError`] is, for whoever reports it (the
/// provider's controllers turn it into a condition reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// A network, pool or base image does not exist.
    InfrastructureMissing,
    /// A network or pool exists but is not active.
    InfrastructureInactive,
    /// A network or pool exists but is of a kind the provider cannot use
    /// (a network without IPv4, a pool type other than dir, fs or netfs).
    InfrastructureUnsupported,
    /// A libvirt call failed, or the host's state cannot be used (e.g. no free address).
    ProvisioningFailed,
    /// The machine asks for something the host cannot give (e.g. a disk smaller than its image).
    InvalidMachineSpec,
    /// A domain with the machine's name exists on the host but is not the machine's.
    DomainCollision,
    /// A volume or DHCP entry with one of the machine's names exists but is not the machine's.
    ObjectCollision,
    /// The libvirt connection broke; the caller should reconnect and retry.
    HostUnreachable,
    /// The host or the client refused the credentials (a certificate, a key,
    /// an unknown host key): a person must fix them.
    AuthenticationFailed,
}

impl FailureKind {
    pub const ALL: [FailureKind; 9] = [
        FailureKind::InfrastructureMissing,
        FailureKind::InfrastructureInactive,
        FailureKind::InfrastructureUnsupported,
        FailureKind::ProvisioningFailed,
        FailureKind::InvalidMachineSpec,
        FailureKind::DomainCollision,
        FailureKind::ObjectCollision,
        FailureKind::HostUnreachable,
        FailureKind::AuthenticationFailed,
    ];
}

/// What is wrong with a storage pool a data disk names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolProblem {
    Missing,
    Inactive,
    /// Its type, which holds no volume files.
    Unsupported(String),
}

impl fmt::Display for PoolProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolProblem::Missing => {
                f.write_str("does not exist (virsh pool-define-as, then pool-build and pool-start)")
            }
            PoolProblem::Inactive => f.write_str("is inactive (virsh pool-start)"),
            PoolProblem::Unsupported(kind) => {
                write!(
                    f,
                    "is of type {kind}, which holds no volume files a domain can use: use a pool of type dir, fs or netfs"
                )
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error(
        "network \"{network}\" on {uri} does not exist: define it (virsh net-define) or, since spec.network cannot be changed, create a new LibvirtCluster that names an existing network"
    )]
    NetworkMissing { network: String, uri: String },

    #[error("network \"{network}\" on {uri} is inactive: run virsh net-start {network}")]
    NetworkInactive { network: String, uri: String },

    #[error(
        "storage pool \"{pool}\" on {uri} does not exist: define it (virsh pool-define-as) or, since basePool and domainPool cannot be changed, create a new LibvirtCluster that names existing pools"
    )]
    PoolMissing { pool: String, uri: String },

    #[error("storage pool \"{pool}\" on {uri} is inactive: run virsh pool-start {pool}")]
    PoolInactive { pool: String, uri: String },

    #[error(
        "storage pool \"{pool}\" on {uri} is of type {pool_type}, which cannot hold qcow2 overlays and uploaded seed ISOs: use a pool of type dir, fs or netfs; basePool and domainPool cannot be changed, so create a new LibvirtCluster that names one"
    )]
    PoolTypeUnsupported { pool: String, uri: String, pool_type: String },

    #[error(
        "base image \"{image}\" is not a volume of storage pool \"{pool}\" on {uri}: upload it (virsh vol-create-as + vol-upload, or copy it and run virsh pool-refresh {pool}) or, since spec.image cannot be changed, roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) that names an existing image"
    )]
    ImageMissing { image: String, pool: String, uri: String },

    #[error(
        "base image \"{image}\" in storage pool \"{pool}\" {why}: a machine's disk is an overlay on its image, so the image must be a standalone volume that the provider did not make and no domain writes to; since spec.image cannot be changed, roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) that names one (qemu-img convert makes a standalone copy of an overlay)"
    )]
    /// The caller names the LibvirtMachine (once) in front of this message.
    ImageUnusable { image: String, pool: String, why: String },

    #[error(
        "spec.nameservers has \"{value}\", which is not an IP address: the guest's network-config takes IPv4 or IPv6 addresses only; since spec.nameservers cannot be changed, roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) that lists addresses"
    )]
    /// The caller names the LibvirtMachine (once) in front of this message.
    NameserverNotAnAddress { value: String },

    #[error(
        "the guest hostname \"{hostname}\" (the LibvirtMachine's name) has {length} characters, more than the {max} a Linux hostname may have: give the Machine a shorter name (for a MachineDeployment or KubeadmControlPlane, a shorter name of it or of the Cluster, since machine names are made from them)"
    )]
    /// The caller names the LibvirtMachine (once) in front of this message.
    HostnameTooLong { hostname: String, length: usize, max: usize },

    #[error(
        "{field} {detail}; since spec.cpu, spec.firmware and spec.vcpu cannot be changed, roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) with it put right"
    )]
    /// `spec.cpu` or `spec.firmware` contradicts itself or `spec.vcpu`.
    /// The caller names the LibvirtMachine (once) in front of this message.
    GuestHardwareContradiction { field: &'static str, detail: String },

    #[error(
        "{setting} is not available on {uri}: {reason}: {fix}; nothing was created on the host; spec.cpu and spec.firmware cannot be changed, so roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) that asks for what the host offers"
    )]
    /// The host's domain capabilities lack a CPU mode or model, nested
    /// virtualisation, UEFI, Secure Boot or an emulated TPM the machine asks for.
    GuestHardwareUnavailable { setting: String, uri: String, reason: String, fix: &'static str },

    #[error(
        "spec.diskGiB {disk_gib} is smaller than the virtual size of base image \"{image}\" ({image_bytes} bytes): spec.diskGiB cannot be changed, so roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) with diskGiB of at least {min_gib}"
    )]
    /// The caller names the LibvirtMachine (once) in front of this message.
    DiskTooSmall { disk_gib: u64, image: String, image_bytes: u64, min_gib: u64 },

    #[error(
        "the bootstrap data is an Ignition config, and Ignition does not read the seed's network-config that static addresses from IPAM (spec.addressesFromPools, or addressesFromPools of an additional network) need: give the machine its addresses by DHCP, or use a bootstrap format of cloud-init (cloud-config); nothing was created on the host"
    )]
    /// The caller names the LibvirtMachine (once) in front of this message.
    IgnitionWithStaticAddresses,

    #[error(
        "spec.dataDisks {detail}; nothing was created on the host; since spec.dataDisks cannot be changed, roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) with it put right"
    )]
    /// `spec.dataDisks` contradicts itself (the API server refuses the same).
    /// The caller names the LibvirtMachine (once) in front of this message.
    DataDiskInvalid { detail: String },

    #[error(
        "spec.dataDisks \"{disk}\" names storage pool \"{pool}\" on {uri}, which {problem}; nothing was created on the host; spec.dataDisks cannot be changed, so make the pool usable or roll out a new LibvirtMachineTemplate (or a new LibvirtMachine) naming a pool the host has (without pool: the cluster's domainPool)"
    )]
    /// The pool of a data disk is missing, inactive or of a type without volume files.
    DataDiskPool { disk: String, pool: String, uri: String, problem: PoolProblem },

    #[error(
        "network \"{network}\" on {uri} has no IPv4 <ip> element with an address and a netmask or prefix: add one with a <dhcp> range (virsh net-edit {network}), or give the machines addresses from an IPAM pool (LibvirtMachine spec.addressesFromPools, which cannot be changed on an existing machine: set it in a new LibvirtMachineTemplate)"
    )]
    NoIpv4 { network: String, uri: String },

    #[error(
        "network \"{network}\" on {uri} has no free address in {pool_description}: widen the DHCP range or remove unused reservations (virsh net-dumpxml {network})"
    )]
    NoFreeAddress { network: String, uri: String, pool_description: String },

    #[error(
        "{kind} \"{object}\" on {uri} exists but does not belong to this LibvirtMachine ({detail}): remove or rename it, or rename the LibvirtMachine"
    )]
    Collision { kind: ObjectKind, object: String, uri: String, detail: String },

    #[error(
        "libvirt at {uri} is unreachable: {}: check that libvirtd there accepts connections, and the host URI (the LibvirtCluster's spec.uri, which cannot be changed: a wrong URI needs a new LibvirtCluster)",
        without_uri(source, uri)
    )]
    Unreachable { uri: String, source: HypervisorError },

    #[error("libvirt at {uri} refused the credentials: {}: {}", without_uri(source, uri), credentials_fix(uri))]
    AuthenticationFailed { uri: String, source: HypervisorError },

    #[error("{}", crate::hypervisor::connections::threads_used_up_message(uri, what, *max))]
    /// Every thread the manager may hold in connects or calls, over all
    /// hosts, is taken (by hosts that do not answer): nothing was sent.
    ThreadsUsedUp { uri: String, what: &'static str, max: usize },

    #[error(
        "no answer from {uri} within {within}{note}: libvirtd there accepts connections but does not answer (hung or overloaded); check it with virsh version and restart it if it hangs; the provider keeps retrying and clears this once the host answers"
    )]
    /// A connect, a wait for a call slot, or a call took longer than its
    /// timeout (`within`, e.g. "30 s"); `note` is empty or starts with a space.
    NoAnswer { uri: String, within: String, note: String },

    #[error("{action} {kind} \"{object}\" on {uri} failed: {source}{}", fix_hint(source))]
    Libvirt { action: &'static str, kind: ObjectKind, object: String, uri: String, source: HypervisorError },

    #[error(
        "console log directory \"{dir}\" does not exist on the libvirt host {uri} ({detail}): create it on that host (mkdir -p {dir}; virtlogd must be able to write there) or change the provider's --console-log-dir"
    )]
    ConsoleLogDirMissing { dir: String, uri: String, detail: String },

    #[error(
        "network \"{network}\" on {uri} puts guests on the host interface \"{device}\", which does not exist on that host ({detail}): create the bridge there (ip link add {device} type bridge, with the port onto the LAN in it) or point the network at a bridge the host has (virsh net-edit {network}); the domain stays defined, stopped, and starts on a later try once the bridge is there"
    )]
    /// A start failed because the network's bridge (or other host device) is missing:
    /// libvirt starts a network in forward mode bridge without looking for its bridge,
    /// and has no call that says whether a host interface exists when its interface
    /// driver is not installed.
    BridgeMissing { network: String, device: String, uri: String, detail: String },

    #[error(
        "network \"{network}\" on {uri} puts guests on the host bridge \"{device}\", which that host does not have (libvirt's interface driver knows no interface of that name): create the bridge there (ip link add {device} type bridge, with the port onto the LAN in it) or point the network at a bridge the host has (virsh net-edit {network}); nothing was created on the host, and the next try goes on once the bridge is there"
    )]
    /// Found before anything is created: the host's libvirtd has its interface
    /// driver and knows no interface named like the bridge of a network in
    /// forward mode bridge. (Without that driver the domain's start finds out:
    /// [`HostError::BridgeMissing`].)
    BridgeNotOnHost { network: String, device: String, uri: String },

    #[error(
        "spec.additionalNetworks[{index}] names {target} on {uri}: {detail}, or roll out a LibvirtMachineTemplate that names one the host has (additionalNetworks cannot be changed); nothing was created on the host, and the next try goes on once it is there"
    )]
    /// An additional NIC's network is missing or inactive, or its host bridge
    /// does not exist: found before anything is created.
    AdditionalNicUnattachable { index: usize, target: String, uri: String, detail: String },

    #[error("network \"{network}\" on {uri} has no address for a control-plane endpoint: {detail}")]
    /// A control-plane endpoint from a libvirt network: no IPv4 subnet, or every address
    /// outside the DHCP ranges is taken; `detail` says which, and the fix.
    NoEndpointAddress { network: String, uri: String, detail: String },

    #[error(
        "{kind} \"{object}\" on {uri}: cannot read its XML ({detail}): this libvirt returns XML the provider does not understand, please report it"
    )]
    UnreadableXml { kind: ObjectKind, object: String, uri: String, detail: String },
}

/// The libvirt error without the "cannot open libvirt connection to <uri>: "
/// that `LibvirtHypervisor::connect` puts in front (the message names the URI once).
fn without_uri(source: &HypervisorError, uri: &str) -> String {
    let full = source.to_string();
    full.strip_prefix(&format!("cannot open libvirt connection to {uri}: ")).map(str::to_string).unwrap_or(full)
}

/// What to check when a host refused the credentials, by the URI's transport.
fn credentials_fix(uri: &str) -> &'static str {
    let scheme = uri.split_once("://").map(|(s, _)| s).unwrap_or_default();
    if scheme.ends_with("+tls") {
        "ca.crt (cacert.pem) must be the CA that signed the host's server certificate, which must name the host of \
         the URI, and the host must trust the CA that signed tls.crt (clientcert.pem); fix the Secret named by \
         credentialsRef (or the files the URI names) and the manager connects again with the new content"
    } else if scheme.contains("ssh") {
        "known_hosts must hold the host's key (ssh-keyscan -p <port> <host>), and the host must accept \
         ssh-privatekey for the URI's user; fix the Secret named by credentialsRef (or the files the URI names) \
         and the manager connects again with the new content"
    } else {
        "check the credentials the URI needs and the host's authentication settings"
    }
}

fn fix_hint(source: &HypervisorError) -> String {
    match source.kind {
        ErrorKind::ConnectionLost => {
            ": check that libvirtd there is running and reachable; the call is retried on the next reconcile"
                .to_string()
        }
        _ => String::new(),
    }
}

impl HostError {
    /// What kind of failure this is.
    pub fn kind(&self) -> FailureKind {
        match self {
            HostError::NetworkMissing { .. }
            | HostError::PoolMissing { .. }
            | HostError::ImageMissing { .. }
            | HostError::BridgeMissing { .. }
            | HostError::BridgeNotOnHost { .. }
            | HostError::AdditionalNicUnattachable { .. } => FailureKind::InfrastructureMissing,
            HostError::NetworkInactive { .. } | HostError::PoolInactive { .. } => FailureKind::InfrastructureInactive,
            HostError::DataDiskPool { problem, .. } => match problem {
                PoolProblem::Missing => FailureKind::InfrastructureMissing,
                PoolProblem::Inactive => FailureKind::InfrastructureInactive,
                PoolProblem::Unsupported(_) => FailureKind::InfrastructureUnsupported,
            },
            HostError::NoIpv4 { .. } | HostError::PoolTypeUnsupported { .. } => FailureKind::InfrastructureUnsupported,
            HostError::DiskTooSmall { .. }
            | HostError::ImageUnusable { .. }
            | HostError::NameserverNotAnAddress { .. }
            | HostError::HostnameTooLong { .. }
            | HostError::GuestHardwareContradiction { .. }
            | HostError::GuestHardwareUnavailable { .. }
            | HostError::DataDiskInvalid { .. }
            | HostError::IgnitionWithStaticAddresses => FailureKind::InvalidMachineSpec,
            HostError::Collision { kind: ObjectKind::Domain, .. } => FailureKind::DomainCollision,
            HostError::Collision { .. } => FailureKind::ObjectCollision,
            HostError::Unreachable { .. } | HostError::NoAnswer { .. } | HostError::ThreadsUsedUp { .. } => {
                FailureKind::HostUnreachable
            }
            HostError::AuthenticationFailed { .. } => FailureKind::AuthenticationFailed,
            HostError::Libvirt { source, .. } if source.kind == ErrorKind::ConnectionLost => {
                FailureKind::HostUnreachable
            }
            HostError::NoFreeAddress { .. }
            | HostError::NoEndpointAddress { .. }
            | HostError::ConsoleLogDirMissing { .. }
            | HostError::Libvirt { .. }
            | HostError::UnreadableXml { .. } => FailureKind::ProvisioningFailed,
        }
    }

    /// Whether retrying later can succeed without anyone changing anything
    /// (a broken connection); all other failures need a fix by a person.
    pub fn is_transient(&self) -> bool {
        self.kind() == FailureKind::HostUnreachable
    }
}

/// Host operations run through `HostHandle::call`, which drops the
/// connection when one of them failed because the connection is gone.
impl CallError for HostError {
    fn unavailable(uri: &str, source: HypervisorError) -> Self {
        if source.is_auth_failure() {
            HostError::AuthenticationFailed { uri: uri.to_string(), source }
        } else {
            HostError::Unreachable { uri: uri.to_string(), source }
        }
    }

    fn no_answer(uri: &str, timeout: std::time::Duration, note: &str) -> Self {
        HostError::NoAnswer {
            uri: uri.to_string(),
            within: crate::hypervisor::connections::seconds(timeout),
            note: note.to_string(),
        }
    }

    fn threads_used_up(uri: &str, what: &'static str, max: usize) -> Self {
        HostError::ThreadsUsedUp { uri: uri.to_string(), what, max }
    }

    fn connection_lost(&self) -> bool {
        // Nothing was sent: the connection, if any, is not in question.
        self.kind() == FailureKind::HostUnreachable && !matches!(self, HostError::ThreadsUsedUp { .. })
    }
}

pub type HostResult<T> = Result<T, HostError>;
