//! LibvirtMachine: one VM.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::shared::{Initialization, MachineAddress, PoolReference, SecretReference};

/// One virtual machine: CPU, memory, disk size and the base image to boot from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "LibvirtMachine",
    plural = "libvirtmachines",
    namespaced,
    status = "LibvirtMachineStatus",
    shortname = "lvm",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "LibvirtMachine is one virtual machine on the cluster's libvirt host.",
    derive = "PartialEq",
    validation = Rule::new("self.metadata.name.size() <= 64").message("the name is the guest's hostname, and a Linux hostname has at most 64 characters: use a shorter name (for a MachineDeployment or KubeadmControlPlane, a shorter name of it or of its Cluster)"),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this machine belongs to"
    ),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state", description = "libvirt domain state"),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type==\"InternalIP\")].address",
        description = "Address leased by the network's DHCP"
    ),
    printcolumn(
        name = "Domain",
        type_ = "string",
        json_path = ".status.domainName",
        description = "libvirt domain name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = 1,
        description = "Provider ID"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)").message("providerID can be set once and is immutable after that"))]
#[x_kube(validation = Rule::new("has(self.addressesFromPools) == has(oldSelf.addressesFromPools)").message("addressesFromPools is immutable: the machine's addresses came from where it says; roll out a new LibvirtMachineTemplate instead"))]
#[x_kube(validation = Rule::new("has(self.image) != has(self.imageURL)").message("set exactly one of image (a volume already in the cluster's basePool) and imageURL (a URL and checksum the provider downloads the image from)"))]
#[x_kube(validation = Rule::new("has(self.image) == has(oldSelf.image) && has(self.imageURL) == has(oldSelf.imageURL)").message("image and imageURL are immutable: the root disk is an overlay on the image; roll out a new LibvirtMachineTemplate instead"))]
#[x_kube(validation = Rule::new("has(self.cpu) == has(oldSelf.cpu)").message("cpu is immutable: the CPU is made with the domain; roll out a new LibvirtMachineTemplate instead"))]
#[x_kube(validation = Rule::new("has(self.firmware) == has(oldSelf.firmware)").message("firmware is immutable: the firmware is chosen with the domain; roll out a new LibvirtMachineTemplate instead"))]
#[x_kube(validation = Rule::new("!has(self.cpu) || !has(self.cpu.topology) || self.cpu.topology.sockets * self.cpu.topology.cores * self.cpu.topology.threads == self.vcpu").message("spec.cpu.topology sockets x cores x threads must equal spec.vcpu: make them equal"))]
#[x_kube(validation = Rule::new("has(self.dataDisks) == has(oldSelf.dataDisks)").message("dataDisks is immutable: the disks are made with the machine; roll out a new LibvirtMachineTemplate instead"))]
#[x_kube(validation = Rule::new("has(self.additionalNetworks) == has(oldSelf.additionalNetworks)").message("additionalNetworks is immutable: the machine's NICs are made with its domain; roll out a new LibvirtMachineTemplate instead"))]
pub struct LibvirtMachineSpec {
    /// Virtual CPUs. Immutable.
    #[serde(default = "default_vcpu")]
    // QEMU's x86 machine types (pc, q35 without an IOMMU) stop at 255 vCPUs.
    #[schemars(range(min = 1, max = 255))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("vcpu is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub vcpu: i32,
    /// Memory in MiB. Immutable.
    #[serde(default = "default_memory_mib", rename = "memoryMiB")]
    #[schemars(range(min = 256, max = 16777216))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("memoryMiB is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub memory_mib: i32,
    /// Size of the root disk in GiB; at least the image's virtual size. Immutable.
    #[serde(default = "default_disk_gib", rename = "diskGiB")]
    #[schemars(range(min = 1, max = 65536))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("diskGiB is immutable: the disk is created once; roll out a new LibvirtMachineTemplate instead"))]
    pub disk_gib: i32,
    /// Name of a qcow2 volume in the cluster's basePool to boot from. Set
    /// exactly one of image and imageURL. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("image is immutable: the root disk is an overlay on it; roll out a new LibvirtMachineTemplate instead"))]
    pub image: Option<String>,
    /// Where the provider downloads the base image from, and its checksum: it
    /// downloads it once per host and basePool into a volume named after the
    /// checksum (`capl-image-<checksumType>-<first 32 hex digits>.<format>`),
    /// which machines with the same checksum share. Set exactly one of image
    /// and imageURL. Immutable.
    #[serde(default, rename = "imageURL", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("imageURL is immutable: the root disk is an overlay on the image; roll out a new LibvirtMachineTemplate instead"))]
    pub image_url: Option<ImageUrl>,
    /// IPAM pools (CAPI's IPAM contract) to take the machine's addresses from,
    /// e.g. an InClusterIPPool of the in-cluster IPAM provider: one
    /// IPAddressClaim per pool, named `<LibvirtMachine>-<index>`, owned by the
    /// LibvirtMachine and deleted with it. The guest gets the addresses, with
    /// the pool's prefix and gateway, from a cloud-init network-config on its
    /// seed ISO; the network's DHCP is then not used (no reservation), so this
    /// works on a network onto a host bridge, where libvirt runs no DHCP.
    /// Without it, the address comes from a DHCP reservation. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("addressesFromPools is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub addresses_from_pools: Option<Vec<PoolReference>>,
    /// DNS servers the guest uses with addresses from addressesFromPools (the
    /// network's DHCP would otherwise give them). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 3), inner(length(min = 2, max = 45), pattern(r"^[0-9A-Fa-f.:]+$")))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("nameservers is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub nameservers: Option<Vec<String>>,
    /// NICs after the first (the first is on the LibvirtCluster's network),
    /// in order, at most 3: each on a libvirt network of the machine's host or
    /// straight on a Linux bridge of the host that libvirt does not manage,
    /// with its addresses from IPAM pools or, without pools, from DHCP the
    /// guest asks for on that NIC (no reservation is made for it). The guest
    /// learns its NICs from a cloud-init network-config on its seed ISO; its
    /// default route stays on the first NIC. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 3))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("additionalNetworks is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub additional_networks: Option<Vec<AdditionalNetwork>>,
    /// The guest CPU: its mode, model and topology, and nested
    /// virtualisation. Without it the guest gets the host CPU as it is
    /// (host-passthrough) on KVM and QEMU's default CPU without KVM.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("cpu is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub cpu: Option<CpuSpec>,
    /// The guest firmware: BIOS or UEFI, Secure Boot, an emulated TPM 2.0.
    /// Without it: BIOS and no TPM. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("firmware is immutable: roll out a new LibvirtMachineTemplate instead"))]
    pub firmware: Option<FirmwareSpec>,
    /// Empty disks made with the machine besides its root disk, at most 8:
    /// each a volume `<domain>-data-<name>.<format>` in its pool, deleted with
    /// the machine (never reused by another machine), and attached after the
    /// root disk with its name as the disk's serial, so the guest finds it
    /// as `/dev/disk/by-id/virtio-<name>` (bus virtio). Formatting and
    /// mounting them is the bootstrap data's job (cloud-init `disk_setup`,
    /// `fs_setup` and `mounts`; in a KubeadmConfig, `diskSetup` and
    /// `mounts`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 8))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("dataDisks is immutable: roll out a new LibvirtMachineTemplate instead"))]
    #[x_kube(validation = Rule::new("self.all(d, self.exists_one(e, e.name == d.name))").message("spec.dataDisks names a disk twice: give each disk its own name"))]
    #[x_kube(validation = Rule::new("self.all(d, !has(d.device) || self.exists_one(e, has(e.device) && e.device == d.device))").message("spec.dataDisks asks for a device twice: give each disk its own device, or leave device out"))]
    pub data_disks: Option<Vec<DataDisk>>,
    /// Set by the provider to libvirt://<LibvirtMachine UID>; the kubelet must
    /// report the same provider ID.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub provider_id: Option<String>,
}

/// A base image the provider downloads over HTTP(S) and checks against its checksum.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.checksumType == 'sha512' ? self.checksum.size() == 128 : self.checksum.size() == 64").message("checksum must be the image's digest as hex: 64 hex digits for checksumType sha256, 128 for sha512 (sha256sum or sha512sum of the image file prints it)"))]
pub struct ImageUrl {
    /// An http:// or https:// URL of the image file (https is checked against
    /// the system's root certificates).
    #[schemars(length(min = 8, max = 2048), pattern(r"^https?://[^\s/?#]+[^\s]*$"))]
    pub url: String,
    /// The image file's digest, hex: the download is checked against it
    /// before any machine uses the image.
    #[schemars(length(min = 64, max = 128), pattern(r"^[0-9a-fA-F]+$"))]
    pub checksum: String,
    /// The digest's algorithm: sha256 or sha512.
    pub checksum_type: ChecksumType,
    /// The image file's format: qcow2 or raw.
    #[serde(default)]
    pub format: ImageFormat,
}

/// The algorithm of an image's checksum.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ChecksumType {
    Sha256,
    Sha512,
}

impl ChecksumType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumType::Sha256 => "sha256",
            ChecksumType::Sha512 => "sha512",
        }
    }
}

/// The format of a downloaded image file.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    #[default]
    Qcow2,
    Raw,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Raw => "raw",
        }
    }
}

/// A NIC after the first: where it is plugged in on the machine's host, and
/// where its addresses come from.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.network) != has(self.bridge)").message("set exactly one of network (a libvirt network of the host) and bridge (a Linux bridge of the host)"))]
pub struct AdditionalNetwork {
    /// A libvirt network of the machine's host (any forward mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub network: Option<String>,
    /// A Linux bridge of the machine's host, e.g. br1, which libvirt does not
    /// manage (`<interface type='bridge'>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
    #[schemars(length(min = 1, max = 15), pattern(r"^[^/\s]+$"))]
    pub bridge: Option<String>,
    /// IPAM pools to take this NIC's static addresses from: one
    /// IPAddressClaim per pool, named `<LibvirtMachine>-nic<n>-<index>` (n = 1
    /// for the first additional NIC), owned by the LibvirtMachine. Without
    /// pools the guest asks DHCP on this NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    pub addresses_from_pools: Option<Vec<PoolReference>>,
}

/// An empty disk made with the machine.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.device) || (self.bus == 'virtio' ? self.device.startsWith('vd') : self.device.startsWith('sd'))").message("spec.dataDisks[].device must be on the disk's bus: vd<letters> for bus virtio, sd<letters> for sata and scsi"))]
pub struct DataDisk {
    /// The disk's name, unique among the machine's data disks: its serial in
    /// the guest (a virtio serial holds 20 bytes) and part of its volume's name.
    #[schemars(length(min = 1, max = 20), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub size_gib: i32,
    /// The storage pool of the host to make the volume in (of type dir, fs
    /// or netfs, active). Default: the LibvirtCluster's domainPool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    pub pool: Option<String>,
    /// qcow2 (default: allocated as the guest writes, snapshots) or raw
    /// (sparse, a little faster).
    #[serde(default)]
    pub format: DataDiskFormat,
    /// virtio (default), sata, or scsi (on a virtio-scsi controller).
    #[serde(default)]
    pub bus: DiskBus,
    /// The target device libvirt gives the disk (vdb, vdc, ... on virtio,
    /// sdb, ... on sata and scsi; vda is the root disk and sda the seed).
    /// Default: the next free one, in order. Guests name disks in the order
    /// they find them, so the name inside the guest can differ: find the
    /// disk by its serial (the name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 4), pattern(r"^(vd|sd)[b-z][a-z]?$"))]
    pub device: Option<String>,
}

/// How a data disk's volume stores its data.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum DataDiskFormat {
    #[default]
    Qcow2,
    Raw,
}

/// The bus a data disk is on.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    #[default]
    Virtio,
    Sata,
    Scsi,
}

/// The guest CPU. The host must offer what is asked for (`virsh
/// domcapabilities` lists it); the provider checks that before it creates
/// anything and reports what the host lacks on the LibvirtMachine.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode == 'custom' ? has(self.model) : !has(self.model)").message("spec.cpu.model is required with mode custom and refused with the other modes: set mode custom to name a model (e.g. qemu64), or drop the model"))]
#[x_kube(validation = Rule::new("!has(self.nestedVirtualization) || !self.nestedVirtualization || self.mode != 'custom'").message("spec.cpu.nestedVirtualization needs mode host-passthrough or host-model, which carry the host CPU's vmx or svm, not custom"))]
pub struct CpuSpec {
    /// host-passthrough: the host CPU as it is (needs KVM); host-model: the
    /// named model closest to the host CPU with its extra features; custom:
    /// exactly the model named in model.
    pub mode: CpuMode,
    /// The CPU model of mode custom, as libvirt names it (e.g. qemu64,
    /// Skylake-Client, EPYC); the host must list it as usable. Only with
    /// mode custom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(r"^[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub model: Option<String>,
    /// How the vCPUs are laid out: sockets x cores x threads must equal
    /// spec.vcpu. Without it, one socket per vCPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<CpuTopology>,
    /// Lets the guest run virtual machines of its own: needs mode
    /// host-passthrough or host-model and a host CPU with vmx (Intel) or
    /// svm (AMD), i.e. a host with KVM and nested virtualisation on.
    #[serde(default)]
    pub nested_virtualization: bool,
}

/// How the guest CPU is made.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum CpuMode {
    HostPassthrough,
    HostModel,
    Custom,
}

/// The guest CPU topology.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopology {
    /// Sockets.
    #[schemars(range(min = 1, max = 255))]
    pub sockets: i32,
    /// Cores per socket.
    #[schemars(range(min = 1, max = 255))]
    pub cores: i32,
    /// Threads per core.
    #[schemars(range(min = 1, max = 255))]
    pub threads: i32,
}

/// The guest firmware.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.secureBoot) || !self.secureBoot || (has(self.type) && self.type == 'uefi')").message("spec.firmware.secureBoot needs spec.firmware.type uefi: set type uefi or drop secureBoot"))]
pub struct FirmwareSpec {
    /// bios (the default) or uefi. UEFI uses the firmware libvirt picks from
    /// what the host has installed (OVMF on x86_64).
    #[serde(default, rename = "type")]
    pub kind: FirmwareType,
    /// UEFI Secure Boot with the usual keys enrolled. Needs type uefi; the
    /// machine type is then q35 (otherwise pc) with SMM on.
    #[serde(default)]
    pub secure_boot: bool,
    /// An emulated TPM 2.0 (tpm-crb, swtpm on the host).
    #[serde(default)]
    pub tpm: bool,
}

/// The kind of guest firmware.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum FirmwareType {
    #[default]
    Bios,
    Uefi,
}

pub(crate) fn default_vcpu() -> i32 {
    1
}

pub(crate) fn default_memory_mib() -> i32 {
    1024
}

pub(crate) fn default_disk_gib() -> i32 {
    20
}

/// Observed state of a LibvirtMachine.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtMachineStatus {
    /// Contract field: `provisioned` is true once the domain exists and
    /// spec.providerID is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Standard conditions: Ready, Paused, InfrastructureReady,
    /// DomainProvisioningReady, MachineCreated, DomainRunning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Addresses of the VM: InternalIP from the DHCP lease and the Hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<MachineAddress>>,
    /// The failure domain the machine was placed in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Name of the libvirt domain, for `virsh -c <hostURI> dominfo <domainName>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    /// The libvirt URI of the host the domain lives on. Recorded, with
    /// network, basePool and domainPool, from the LibvirtCluster before
    /// anything is created, so that deleting the machine finds its host
    /// objects even when the LibvirtCluster is gone.
    #[serde(default, rename = "hostURI", skip_serializing_if = "Option::is_none")]
    pub host_uri: Option<String>,
    /// The libvirt network holding the machine's DHCP reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The storage pool of the base image the root disk is an overlay on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_pool: Option<String>,
    /// The storage pool holding the machine's root disk and cloud-init ISO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_pool: Option<String>,
    /// The LibvirtCluster's credentialsRef when the host was recorded: the
    /// Secret deleting the machine connects with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
    /// The domain's state as libvirt reports it (running, shutoff, paused, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The MAC address of the VM's NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// The data disks, in spec.dataDisks order: where each volume is and
    /// the target device libvirt gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_disks: Option<Vec<DataDiskStatus>>,
}

/// Where one data disk is.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataDiskStatus {
    /// The disk's name (spec.dataDisks[].name), its serial in the guest.
    pub name: String,
    /// `<pool>/<volume>` on the host, for `virsh vol-info --pool <pool> <volume>`.
    pub volume: String,
    /// The target device in the domain, e.g. vdb.
    pub device: String,
}
