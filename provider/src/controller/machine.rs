//! The LibvirtMachine reconciler: gather, decide ([`super::machine_decision`]), act, report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use super::addresses::{self, Claimed};
use super::condition_list::{self, Status};
use super::context::{Context, cached_or_get, get_optional};
use super::error::Error;
use super::machine_decision::{
    Bootstrap, Host, LEASE_REFRESH_AFTER, MachineAction, MachinePlan, MachineSnapshot, Requeue, decide,
};
use super::owners::{owner_name, paused_reason};
use super::{credentials, object_patch, own_changes, placement};
use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use crate::api::conditions::{DOMAIN_PROVISIONING_READY, MACHINE_CREATED, reasons};
use crate::api::{
    ClusterHost, CpuMode, CpuSpec, DataDisk, DataDiskFormat, DataDiskStatus, DiskBus, FirmwareSpec, FirmwareType,
    Initialization, LibvirtCluster, LibvirtMachine, LibvirtMachineStatus, MACHINE_FINALIZER, MachineAddress,
    SKIP_HOST_CLEANUP_ANNOTATION, SecretReference,
};
use crate::image::{ImageRequest, ImageState};
use capl_host::error::HostError;
use capl_host::guest_hardware::{self, CpuSettings, FirmwareSettings};
use capl_host::machine::{
    self as host_machine, AdditionalNic, BootstrapFormat, MachineReport, MachineSpec, NicAttachment,
};
use capl_host::naming::NameScheme;

/// While the bootstrap Secret is missing, look again this often even without
/// a watch event (Secrets of other types than CAPI's are not watched).
const RECHECK_MISSING_SECRET: Duration = Duration::from_secs(60);

/// Everything gathered from the API for one LibvirtMachine.
struct Gathered {
    machine: Option<Machine>,
    cluster: Option<Cluster>,
    libvirt_cluster: Option<LibvirtCluster>,
    /// The addresses IPAM gave the machine (spec.addressesFromPools), once claimed.
    /// The addresses IPAM gave the machine's NICs, once claimed.
    addresses: addresses::MachineAddresses,
}

pub async fn reconcile(object: Arc<LibvirtMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&object, &ctx).await;
    ctx.metrics.reconciled("libvirtmachine", started.elapsed());
    result
}

/// The LibvirtMachine's Machine, Cluster and LibvirtCluster, from the watch
/// caches when the controller runs ([`Context::inputs`]), else from the API.
async fn gather(object: &LibvirtMachine, ctx: &Context, ns: &str) -> Result<Gathered, Error> {
    let client = &ctx.client;
    let caches = ctx.inputs();
    let machine = match owner_name(object, "Machine") {
        Some(name) => {
            let api = Api::<Machine>::namespaced(client.clone(), ns);
            cached_or_get(caches.map(|c| &c.machines), &api, ns, &name).await?
        }
        None => None,
    };
    let cluster_name = object
        .labels()
        .get(CLUSTER_NAME_LABEL)
        .cloned()
        .or_else(|| machine.as_ref().map(|m| m.spec.cluster_name.clone()).filter(|n| !n.is_empty()));
    let cluster = match &cluster_name {
        Some(name) => {
            let api = Api::<Cluster>::namespaced(client.clone(), ns);
            cached_or_get(caches.map(|c| &c.clusters), &api, ns, name).await?
        }
        None => None,
    };
    let libvirt_cluster = match cluster.as_ref().and_then(|c| c.spec.infrastructure_ref.as_ref()) {
        Some(r) if r.kind == "LibvirtCluster" => {
            let api = Api::<LibvirtCluster>::namespaced(client.clone(), ns);
            cached_or_get(caches.map(|c| &c.libvirt_clusters), &api, ns, &r.name).await?
        }
        _ => None,
    };
    Ok(Gathered { machine, cluster, libvirt_cluster, addresses: Default::default() })
}

/// The bootstrap data: `Machine.spec.bootstrap.dataSecretName` -> Secret key
/// `value`, in the format of its key `format` (cloud-config when absent).
async fn bootstrap_data(
    ctx: &Context,
    ns: &str,
    machine: &Machine,
) -> Result<(Bootstrap, Vec<u8>, BootstrapFormat), Error> {
    let nothing = |state| Ok((state, Vec::new(), BootstrapFormat::CloudConfig));
    let Some(name) = machine.spec.bootstrap.data_secret_name.clone() else {
        return nothing(Bootstrap::NotSet);
    };
    let Some(secret) = get_optional(&Api::<Secret>::namespaced(ctx.client.clone(), ns), &name).await? else {
        return nothing(Bootstrap::SecretMissing(name));
    };
    let data = secret.data.unwrap_or_default();
    match data.get("value") {
        Some(value) if !value.0.is_empty() => {
            let format = match data.get("format").map(|f| String::from_utf8_lossy(&f.0).to_string()).as_deref() {
                None | Some("cloud-config") => BootstrapFormat::CloudConfig,
                Some("ignition") => BootstrapFormat::Ignition,
                Some(other) => {
                    return nothing(Bootstrap::Invalid(format!(
                        "bootstrap Secret {ns}/{name} has format {other:?}; this provider takes \"cloud-config\" (cloud-init's user-data, on the seed ISO) and \"ignition\" (an Ignition config, in QEMU's firmware config): configure the bootstrap provider for one of them"
                    )));
                }
            };
            Ok((Bootstrap::Ready, value.0.clone(), format))
        }
        _ => nothing(Bootstrap::Invalid(format!(
            "bootstrap Secret {ns}/{name} has no non-empty key \"value\": put the bootstrap data (cloud-init user-data or an Ignition config) under data.value (CAPI bootstrap providers do this)"
        ))),
    }
}

/// The machine's identity on the host (see `capl_host::naming`): the UUID in
/// `spec.providerID` once set, which `clusterctl move` carries over, else the
/// UID. Err (with the fix) for a provider ID this provider did not set; the
/// UID then stands in, which finds nothing of ours.
pub fn machine_identity(object: &LibvirtMachine) -> Result<String, String> {
    match &object.spec.provider_id {
        Some(provider_id) => capl_host::naming::identity_from_provider_id(provider_id)
            .map_err(|why| format!("LibvirtMachine {}: {why}", object.name_any())),
        None => Ok(object.uid().unwrap_or_default()),
    }
}

/// How long the hash in the machine's names is: the scheme of the domain name
/// the status records; for a machine with a provider ID and no recorded
/// domain name (as after `clusterctl move`), the host decides
/// ([`NameScheme::Either`]); a new machine gets the current names.
pub fn name_scheme(object: &LibvirtMachine, identity: &str) -> NameScheme {
    let recorded = object.status.as_ref().and_then(|s| s.domain_name.as_deref());
    let ns = object.namespace().unwrap_or_default();
    match recorded {
        Some(domain) => NameScheme::of_domain(domain, &ns, &object.name_any(), identity).unwrap_or_default(),
        None if object.spec.provider_id.is_some() => NameScheme::Either,
        None => NameScheme::Current,
    }
}

/// The machine's domain name as far as the API objects tell (see [`name_scheme`]).
pub fn machine_domain_name(object: &LibvirtMachine, identity: &str) -> String {
    let ns = object.namespace().unwrap_or_default();
    capl_host::naming::domain_name_in(name_scheme(object, identity), &ns, &object.name_any(), identity)
}

/// How to reach a machine that exists on its host: the URI and credentials
/// Secret its status recorded (with the credentials its LibvirtCluster now
/// gives that host, when it is at hand), and the host spec that names its
/// objects. Enough for an action on the existing domain (a reboot), not for a
/// create: it carries no bootstrap data and no addresses. `Ok(None)` when no
/// host was recorded (nothing was ever created); `Err` for a provider ID this
/// provider did not set.
pub(super) struct RecordedMachine {
    pub uri: String,
    pub credentials: Option<String>,
    pub spec: MachineSpec,
}

pub(super) fn recorded_machine(
    object: &LibvirtMachine,
    libvirt_cluster: Option<&LibvirtCluster>,
    ctx: &Context,
) -> Result<Option<RecordedMachine>, String> {
    let identity = machine_identity(object)?;
    let Some(location) = HostLocation::recorded(object) else { return Ok(None) };
    let location = location.with_current_credentials(libvirt_cluster);
    let gathered = Gathered { machine: None, cluster: None, libvirt_cluster: None, addresses: Default::default() };
    let spec = host_spec(object, &identity, &location, &gathered, ctx);
    Ok(Some(RecordedMachine { uri: location.uri, credentials: location.credentials, spec }))
}

/// Where a machine lives: the host and the network and pools its objects are in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostLocation {
    uri: String,
    network: String,
    base_pool: String,
    domain_pool: String,
    /// The Secret with the host's credentials (`credentialsRef`), if any.
    credentials: Option<String>,
    /// The host's name, when the LibvirtCluster lists hosts.
    failure_domain: Option<String>,
}

impl HostLocation {
    fn of_host(h: &ClusterHost) -> Self {
        Self {
            uri: h.uri.clone(),
            network: h.network.clone(),
            base_pool: h.base_pool.clone(),
            domain_pool: h.domain_pool.clone(),
            credentials: h.credentials.clone(),
            failure_domain: h.failure_domain().map(str::to_string),
        }
    }

    /// What the status recorded before anything was created.
    fn recorded(object: &LibvirtMachine) -> Option<Self> {
        let s = object.status.as_ref()?;
        Some(Self {
            uri: s.host_uri.clone()?,
            network: s.network.clone()?,
            base_pool: s.base_pool.clone()?,
            domain_pool: s.domain_pool.clone()?,
            credentials: s.credentials_ref.as_ref().map(|r| r.name.clone()),
            failure_domain: s.failure_domain.clone(),
        })
    }

    /// The recorded location with the credentials the LibvirtCluster now
    /// gives its host (a Secret can be replaced; the host, network and pools
    /// of a machine never change).
    fn with_current_credentials(mut self, lc: Option<&LibvirtCluster>) -> Self {
        if let Some(host) = lc.and_then(|lc| lc.spec.hosts().into_iter().find(|h| h.uri == self.uri)) {
            self.credentials = host.credentials;
        }
        self
    }

    fn write_into(&self, status: &mut LibvirtMachineStatus) {
        status.host_uri = Some(self.uri.clone());
        status.network = Some(self.network.clone());
        status.base_pool = Some(self.base_pool.clone());
        status.domain_pool = Some(self.domain_pool.clone());
        status.credentials_ref = self.credentials.clone().map(|name| SecretReference { name });
        status.failure_domain = self.failure_domain.clone();
    }
}

fn host_spec(
    object: &LibvirtMachine,
    identity: &str,
    location: &HostLocation,
    g: &Gathered,
    ctx: &Context,
) -> MachineSpec {
    let cluster = g.cluster.as_ref();
    let endpoint = g
        .libvirt_cluster
        .as_ref()
        .and_then(|lc| lc.spec.control_plane_endpoint.clone())
        .or_else(|| cluster.and_then(|c| c.spec.control_plane_endpoint.clone()));
    let (image, image_format) = match (&object.spec.image, &object.spec.image_url) {
        (_, Some(url)) => {
            let request = ImageRequest::of(url);
            (request.volume(), Some(request.format.as_str().to_string()))
        }
        (Some(image), None) => (image.clone(), None),
        // The API server's validation refuses this; a volume of that name cannot exist.
        (None, None) => (String::new(), None),
    };
    MachineSpec {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        identity: identity.to_string(),
        name_scheme: name_scheme(object, identity),
        cluster_name: cluster.map(|c| c.name_any()).unwrap_or_default(),
        vcpu: object.spec.vcpu.max(1) as u32,
        memory_mib: object.spec.memory_mib.max(1) as u64,
        disk_gib: object.spec.disk_gib.max(1) as u64,
        image,
        image_format,
        network: location.network.clone(),
        base_pool: location.base_pool.clone(),
        domain_pool: location.domain_pool.clone(),
        control_plane_host: endpoint.map(|e| e.host).filter(|h| !h.is_empty()),
        domain_type: ctx.settings.domain_type,
        console_log_dir: ctx.settings.console_log_dir.clone(),
        ipam: object.spec.addresses_from_pools.is_some(),
        static_addresses: g.addresses.first.clone(),
        nameservers: object.spec.nameservers.clone().unwrap_or_default(),
        additional_nics: object
            .spec
            .additional_networks
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, nic)| AdditionalNic {
                attach: match (&nic.network, &nic.bridge) {
                    (Some(network), _) => NicAttachment::Network(network.clone()),
                    (None, Some(bridge)) => NicAttachment::Bridge(bridge.clone()),
                    // The API server's validation refuses this; a network of that name cannot exist.
                    (None, None) => NicAttachment::Network(String::new()),
                },
                static_addresses: g.addresses.additional.get(i).cloned().unwrap_or_default(),
            })
            .collect(),
        cpu: object.spec.cpu.as_ref().map(guest_cpu),
        firmware: object.spec.firmware.as_ref().map(guest_firmware),
        data_disks: object
            .spec
            .data_disks
            .iter()
            .flatten()
            .map(|disk| data_disk(disk, &location.domain_pool))
            .collect(),
        // What the bootstrap Secret says, set by the create that read it.
        bootstrap_format: BootstrapFormat::CloudConfig,
    }
}

/// `spec.dataDisks[]` in the host layer's terms, its pool defaulting to `domain_pool`.
fn data_disk(disk: &DataDisk, domain_pool: &str) -> capl_host::data_disk::DataDisk {
    use capl_host::data_disk::{DiskBus as Bus, DiskFormat as Format};
    capl_host::data_disk::DataDisk {
        name: disk.name.clone(),
        size_gib: disk.size_gib.max(0) as u64,
        pool: disk.pool.clone().unwrap_or_else(|| domain_pool.to_string()),
        format: match disk.format {
            DataDiskFormat::Qcow2 => Format::Qcow2,
            DataDiskFormat::Raw => Format::Raw,
        },
        bus: match disk.bus {
            DiskBus::Virtio => Bus::Virtio,
            DiskBus::Sata => Bus::Sata,
            DiskBus::Scsi => Bus::Scsi,
        },
        device: disk.device.clone(),
    }
}

/// `spec.cpu` in the host layer's terms.
fn guest_cpu(cpu: &CpuSpec) -> CpuSettings {
    CpuSettings {
        mode: match cpu.mode {
            CpuMode::HostPassthrough => guest_hardware::CpuMode::HostPassthrough,
            CpuMode::HostModel => guest_hardware::CpuMode::HostModel,
            CpuMode::Custom => guest_hardware::CpuMode::Custom,
        },
        model: cpu.model.clone(),
        // The API server keeps each at 1 or more; a negative one becomes 0, which the host layer refuses.
        topology: cpu.topology.map(|t| guest_hardware::CpuTopology {
            sockets: t.sockets.max(0) as u32,
            cores: t.cores.max(0) as u32,
            threads: t.threads.max(0) as u32,
        }),
        nested_virtualization: cpu.nested_virtualization,
    }
}

/// `spec.firmware` in the host layer's terms.
fn guest_firmware(firmware: &FirmwareSpec) -> FirmwareSettings {
    FirmwareSettings {
        kind: match firmware.kind {
            FirmwareType::Bios => guest_hardware::FirmwareType::Bios,
            FirmwareType::Uefi => guest_hardware::FirmwareType::Uefi,
        },
        secure_boot: firmware.secure_boot,
        tpm: firmware.tpm,
    }
}

/// What may remain on the host of a machine whose host cleanup was skipped.
/// `mac` is the MAC the machine reported (`status.macAddress`); the DHCP
/// entry is named after the domain either way.
fn what_may_remain(spec: &MachineSpec, uri: &str, mac: Option<&str>) -> String {
    let names = spec.names();
    let entry = match mac {
        Some(mac) => format!("mac={mac} name={}", names.domain),
        None => format!("name={}", names.domain),
    };
    let data: String = spec
        .data_disks
        .iter()
        .map(|disk| format!(", \"{}/{}\"", disk.pool, names.data_volume(&disk.name, disk.format.as_str())))
        .collect();
    format!(
        "domain \"{d}\", volumes \"{p}/{o}\"{data} and \"{p}/{i}\", and the DHCP host entry {entry} on network \"{n}\", on {uri}",
        d = names.domain,
        p = spec.domain_pool,
        o = names.overlay_volume(),
        i = names.cloud_init_volume(),
        n = spec.network,
    )
}

/// The host's answer, folded into the snapshot's terms.
fn host_view(result: &Result<Option<MachineReport>, HostError>, object: &LibvirtMachine) -> Host {
    match result {
        Ok(None) => Host::Absent,
        Ok(Some(report)) => Host::Present {
            state: report.state,
            has_address: report.addresses.iter().any(|a| matches!(a, host_machine::MachineAddress::InternalIp(_))),
        },
        Err(err) => Host::Failed {
            reason: super::host_failure::machine_reason(err.kind()),
            message: format!("LibvirtMachine {}: {err}", object.name_any()),
            transient: err.is_transient(),
        },
    }
}

async fn reconcile_inner(object: &LibvirtMachine, ctx: &Context) -> Result<Action, Error> {
    let ns = object.namespace().ok_or_else(|| Error::NoNamespace(object.name_any()))?;
    let mut g = gather(object, ctx, &ns).await?;
    let uid = object.uid().unwrap_or_default();
    let identity = machine_identity(object);
    // With a provider ID we never set, the UID stands in for the host lookups: it finds nothing of ours.
    let host_identity = identity.clone().unwrap_or_else(|_| uid.clone());
    let recorded = HostLocation::recorded(object);
    let paused = paused_reason(object, g.cluster.as_ref());
    let (location, unplaced) = locate(object, ctx, &ns, &g, recorded.as_ref(), paused.is_none()).await?;
    let mut snapshot = snapshot_of(object, ctx, &g, &host_identity, paused, &recorded, location.as_ref());
    if let Some(why) = unplaced {
        snapshot.host = Host::Failed { reason: why.reason, message: why.message, transient: why.transient };
    }
    if let Err(message) = identity
        && !snapshot.deleting
    {
        // Nothing of ours can exist under an identity we never set: report and wait for a new object.
        snapshot.host = Host::Failed { reason: reasons::INVALID_MACHINE_SPEC, message, transient: false };
    }
    let opened = connect(object, ctx, &ns, location.as_ref(), &mut snapshot).await?;
    claim_addresses(object, ctx, &ns, &mut g, location.as_ref(), &mut snapshot).await?;
    let user_uri = location.as_ref().map(|l| l.uri.clone()).unwrap_or_default();
    if location.is_some() && !matches!(snapshot.host, Host::Failed { .. }) {
        // A reconnect is announced under the URI opened; its machines record the user's.
        ctx.note_opened_uri(&opened, &user_uri);
    }
    let mut acting = Acting {
        object,
        ctx,
        api: Api::namespaced(ctx.client.clone(), &ns),
        ns,
        uid,
        host_identity,
        g,
        location,
        opened,
        user_uri,
        snapshot,
        report: None,
        user_data: Vec::new(),
        bootstrap_format: BootstrapFormat::CloudConfig,
        held: None,
    };
    let plan = loop {
        let plan = decide(&acting.snapshot);
        match act(&mut acting, plan).await? {
            Step::Again => {}
            Step::Report(plan) => break plan,
            Step::Finished(action) => return Ok(action),
        }
    };
    report(&acting, &plan).await
}

/// Where the machine lives: where the status recorded before anything was
/// created, once it did (it never moves); else, while the LibvirtCluster
/// exists, the host placement chooses (nothing is created before the choice
/// is recorded), or why no host can take it; else nowhere.
async fn locate(
    object: &LibvirtMachine,
    ctx: &Context,
    ns: &str,
    g: &Gathered,
    recorded: Option<&HostLocation>,
    not_paused: bool,
) -> Result<(Option<HostLocation>, Option<placement::Unplaced>), Error> {
    let deleting = object.meta().deletion_timestamp.is_some();
    // Hosts are asked for their memory only once the machine would record one,
    // and the host is chosen only once the owner Machine is known: its
    // spec.failureDomain names the host, and KubeadmControlPlane and
    // MachineSets create the LibvirtMachine before the Machine that owns it.
    let placement_due = not_paused
        && g.machine.is_some()
        && g.cluster
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.infrastructure_provisioned)
            == Some(true);
    let location = match (recorded, &g.libvirt_cluster) {
        (Some(r), lc) if deleting || lc.is_some() => Some(r.clone().with_current_credentials(lc.as_ref())),
        (None, Some(lc)) if !deleting && placement_due => {
            match placement::place(ctx, ns, object, g.machine.as_ref(), lc).await? {
                Ok(host) => Some(HostLocation::of_host(&host)),
                Err(why) => return Ok((None, Some(why))),
            }
        }
        // A machine that recorded no host (made before hosts were recorded) on the one-host form.
        (None, Some(lc)) if lc.spec.hosts.is_none() => lc.spec.hosts().first().map(HostLocation::of_host),
        _ => None,
    };
    Ok((location, None))
}

/// The facts [`decide`] starts from, before the host is looked at.
#[allow(clippy::too_many_arguments)]
fn snapshot_of(
    object: &LibvirtMachine,
    ctx: &Context,
    g: &Gathered,
    host_identity: &str,
    paused: Option<String>,
    recorded: &Option<HostLocation>,
    location: Option<&HostLocation>,
) -> MachineSnapshot {
    let deleting = object.meta().deletion_timestamp.is_some();
    let uid = object.uid().unwrap_or_default();
    MachineSnapshot {
        deleting,
        has_finalizer: object.finalizers().iter().any(|f| f == MACHINE_FINALIZER),
        paused,
        owner_machine: g.machine.as_ref().map(|m| m.name_any()),
        cluster: g.cluster.as_ref().map(|c| {
            let provisioned =
                c.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.infrastructure_provisioned);
            (c.name_any(), provisioned == Some(true))
        }),
        libvirt_cluster_found: g.libvirt_cluster.is_some(),
        location_recorded: location.is_some() && recorded.as_ref() == location,
        host_known: location.is_some(),
        skip_host_cleanup: object.annotations().contains_key(SKIP_HOST_CLEANUP_ANNOTATION),
        deleting_for: object
            .meta()
            .deletion_timestamp
            .as_ref()
            .and_then(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).ok())
            .unwrap_or_default(),
        bootstrap: Bootstrap::NotSet,
        host: Host::NotObserved,
        provisioned: object.spec.provider_id.is_some()
            || object.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.provisioned) == Some(true),
        lease_refresh_due: !deleting && ctx.lease_waited(&uid) >= LEASE_REFRESH_AFTER,
        domain: machine_domain_name(object, host_identity),
        host_uri: location.map(|l| l.uri.clone()).unwrap_or_default(),
    }
}

/// The URI to open: the host's, with the files of its credentials Secret.
/// A host the URI policy refuses, or credentials that cannot be used, are a
/// failure in the snapshot.
async fn connect(
    object: &LibvirtMachine,
    ctx: &Context,
    ns: &str,
    location: Option<&HostLocation>,
    snapshot: &mut MachineSnapshot,
) -> Result<String, Error> {
    if let Some(l) = location
        && let Err(message) = ctx.settings.uri_policy.check(&l.uri, ns)
    {
        // The manager does not open this URI, not even to delete (also when it
        // comes from the status, which is not the LibvirtCluster's to vouch for):
        // report it (the LibvirtCluster reports it too) and wait.
        snapshot.host = Host::Failed { reason: reasons::URI_NOT_ALLOWED, message, transient: false };
    }
    let mut opened = location.map(|l| l.uri.clone()).unwrap_or_default();
    if let Some(l) = location
        && !matches!(snapshot.host, Host::Failed { .. })
    {
        let owner = format!("LibvirtMachine {}", object.name_any());
        match credentials::connection_uri(ctx, ns, &l.uri, l.credentials.as_deref(), &owner, snapshot.deleting).await? {
            Ok(uri) => opened = uri,
            Err(unusable) => {
                snapshot.host =
                    Host::Failed { reason: unusable.reason, message: unusable.message, transient: unusable.transient };
            }
        }
    }
    Ok(opened)
}

/// Addresses from IPAM: claimed once the machine has a host, known before anything is created.
async fn claim_addresses(
    object: &LibvirtMachine,
    ctx: &Context,
    ns: &str,
    g: &mut Gathered,
    location: Option<&HostLocation>,
    snapshot: &mut MachineSnapshot,
) -> Result<(), Error> {
    if addresses::uses_ipam(object)
        && !snapshot.deleting
        && location.is_some()
        && !matches!(snapshot.host, Host::Failed { .. })
    {
        let cluster = g.cluster.as_ref().map(|c| c.name_any());
        match addresses::claim(ctx, object, ns, cluster.as_deref()).await? {
            Claimed::Ready(found) => g.addresses = found,
            Claimed::Waiting { reason, message } => {
                snapshot.host = Host::Failed { reason, message, transient: true };
            }
            Claimed::Failed { reason, message } => {
                snapshot.host = Host::Failed { reason, message, transient: false };
            }
        }
    }
    Ok(())
}

/// One reconcile between its decisions: what it gathered, where the machine
/// lives, and what its steps have found out so far.
struct Acting<'a> {
    object: &'a LibvirtMachine,
    ctx: &'a Context,
    api: Api<LibvirtMachine>,
    ns: String,
    uid: String,
    host_identity: String,
    g: Gathered,
    location: Option<HostLocation>,
    /// The URI opened (with the files of the credentials Secret) and the one the user wrote.
    opened: String,
    user_uri: String,
    snapshot: MachineSnapshot,
    /// The domain as the host last reported it.
    report: Option<MachineReport>,
    /// The bootstrap data, read when the host said the domain is absent.
    user_data: Vec<u8>,
    /// The format of `user_data` (the bootstrap Secret's `format`).
    bootstrap_format: BootstrapFormat,
    /// The object as this reconcile's last metadata write left it, once there is one.
    held: Option<LibvirtMachine>,
}

impl Acting<'_> {
    /// Where the machine lives; decide acts on the host only when it knows that.
    fn at(&self) -> &HostLocation {
        self.location.as_ref().expect("decide acts on the host only when it knows the host")
    }

    fn host_spec(&self) -> MachineSpec {
        host_spec(self.object, &self.host_identity, self.at(), &self.g, self.ctx)
    }

    /// [`host_view`], with the URI in a failure as the user wrote it.
    fn host_view(&self, result: &Result<Option<MachineReport>, HostError>) -> Host {
        let mut view = host_view(result, self.object);
        if let Host::Failed { message, .. } = &mut view {
            *message = credentials::as_user_wrote_it(std::mem::take(message), &self.opened, &self.user_uri);
        }
        view
    }
}

/// What comes after one step.
enum Step {
    /// Decide again on the updated snapshot.
    Again,
    /// Stop acting and report this plan.
    Report(MachinePlan),
    /// The object is done with (its finalizer removed).
    Finished(Action),
}

/// Performs the plan's step. Each `act_*` function below performs the steps
/// of the `decide_*` function of the same name in `machine_decision`, in the
/// same order; this one performs those [`decide`] returns itself: the
/// finalizer, the host recorded, the host looked at. (`decide_lost` returns
/// no step: a lost domain is only reported.)
async fn act(a: &mut Acting<'_>, plan: MachinePlan) -> Result<Step, Error> {
    match plan.action {
        MachineAction::Nothing => Ok(Step::Report(plan)),
        MachineAction::AddFinalizer => add_finalizer(a).await,
        MachineAction::RecordHost => record_host(a).await,
        MachineAction::ObserveHost => observe_host(a).await,
        MachineAction::Create => act_creation(a).await,
        MachineAction::Start | MachineAction::RefreshReservation => act_running(a, plan.action).await,
        MachineAction::Delete | MachineAction::RemoveFinalizer | MachineAction::SkipHostCleanup => {
            act_deletion(a, plan).await
        }
    }
}

async fn add_finalizer(a: &mut Acting<'_>) -> Result<Step, Error> {
    let (object, ctx) = (a.object, a.ctx);
    // This reconcile goes on with the finalizer in place; its watch event brings nothing new.
    let mut expected = object.clone();
    expected.finalizers_mut().push(MACHINE_FINALIZER.to_string());
    let before = ctx.seen_machines.will_write(&expected);
    match object_patch::add_finalizer(&a.api, object, MACHINE_FINALIZER).await {
        Ok(written) => a.held = written.or(a.held.take()),
        Err(err) => {
            ctx.seen_machines.write_failed(&expected, before);
            return Err(err);
        }
    }
    a.snapshot.has_finalizer = true;
    Ok(Step::Again)
}

async fn record_host(a: &mut Acting<'_>) -> Result<Step, Error> {
    let mut status = a.object.status.clone().unwrap_or_default();
    a.at().write_into(&mut status);
    let patch = serde_json::json!({
        "hostURI": status.host_uri, "network": status.network,
        "basePool": status.base_pool, "domainPool": status.domain_pool,
        "credentialsRef": status.credentials_ref, "failureDomain": status.failure_domain,
    });
    object_patch::patch_status(&a.api, &a.object.name_any(), &patch).await?;
    a.snapshot.location_recorded = true;
    Ok(Step::Again)
}

async fn observe_host(a: &mut Acting<'_>) -> Result<Step, Error> {
    let ctx = a.ctx;
    let spec = a.host_spec();
    let result =
        timed(ctx, "observe", ctx.connections.host(&a.opened).call(move |h| host_machine::observe_machine(h, &spec)))
            .await;
    a.snapshot.host = a.host_view(&result);
    if let Ok(found) = result {
        if found.is_some() {
            // The host counts the domain's memory now.
            ctx.placements.created(&a.uid);
        }
        a.report = found;
    }
    // The bootstrap data is read only to create, and a provisioned machine is never created.
    if a.snapshot.host == Host::Absent
        && !a.snapshot.provisioned
        && let Some(machine) = &a.g.machine
    {
        let (bootstrap, data, format) = bootstrap_data(ctx, &a.ns, machine).await?;
        a.snapshot.bootstrap = bootstrap;
        a.user_data = data;
        a.bootstrap_format = format;
    }
    Ok(Step::Again)
}

/// The step of `decide_creation`: create the domain and start it.
async fn act_creation(a: &mut Acting<'_>) -> Result<Step, Error> {
    if let Some(step) = wait_for_image(a).await {
        return Ok(step);
    }
    let mut spec = a.host_spec();
    spec.bootstrap_format = a.bootstrap_format;
    let metrics = a.ctx.metrics.clone();
    // The bootstrap data was read when the host said the domain is absent.
    let seed = std::mem::take(&mut a.user_data);
    let create = move |h: &dyn capl_host::hypervisor::Hypervisor| {
        let mut took = |step: host_machine::CreateStep, d| metrics.create_step(step.name(), d);
        host_machine::create_machine_timed(h, &spec, &seed, &mut took).map(Some)
    };
    let host = a.ctx.connections.host(&a.opened);
    // The lifecycle events of this action tell this reconcile nothing it will not see.
    a.ctx.expected_events.expect(&a.snapshot.domain, own_changes::CREATE_EVENTS);
    let result = timed(a.ctx, "create", host.call(create)).await;
    created_or_started(a, result).await
}

/// A machine whose image comes from a URL is created once the image is in
/// its basePool: until then it reports the download's progress (looking
/// again every `progress_interval`) or its failure. `None`: go on.
async fn wait_for_image(a: &mut Acting<'_>) -> Option<Step> {
    let url = a.object.spec.image_url.as_ref()?;
    let request = ImageRequest::of(url);
    let host = a.ctx.connections.host(&a.opened);
    let object = format!("LibvirtMachine {}/{}", a.ns, a.object.name_any());
    let (reason, message, requeue) = match a.ctx.images.ensure(&host, &a.at().base_pool, &request, &object).await {
        ImageState::Ready => return None,
        ImageState::Downloading(message) => {
            (reasons::DOWNLOADING_IMAGE, message, Some(a.ctx.images.settings().progress_interval))
        }
        ImageState::Failed { reason, message } => (reason, message, None),
    };
    a.snapshot.host = Host::Failed { reason, message, transient: true };
    let mut plan = decide(&a.snapshot);
    if let Some(after) = requeue {
        plan.requeue = Requeue::After(after);
    }
    Some(Step::Report(plan))
}

/// The steps of `decide_running`: start a stopped domain, or write the DHCP
/// reservation of a guest that waits long for its lease again.
async fn act_running(a: &mut Acting<'_>, action: MachineAction) -> Result<Step, Error> {
    let ctx = a.ctx;
    if action == MachineAction::Start {
        let spec = a.host_spec();
        let host = ctx.connections.host(&a.opened);
        // The lifecycle events of this action tell this reconcile nothing it will not see.
        ctx.expected_events.expect(&a.snapshot.domain, own_changes::START_EVENTS);
        let result = timed(ctx, "start", host.call(move |h| host_machine::start_machine(h, &spec))).await;
        return created_or_started(a, result).await;
    }
    a.snapshot.lease_refresh_due = false;
    let l = a.at();
    if ctx.claim_lease_refresh(&l.uri, &l.network) {
        let spec = a.host_spec();
        let result = timed(
            ctx,
            "refresh_reservation",
            ctx.connections.host(&a.opened).call(move |h| host_machine::refresh_reservation(h, &spec)),
        )
        .await;
        match result {
            Ok(refreshed) => tracing::info!(
                machine = %a.object.name_any(),
                network = %l.network,
                uri = %l.uri,
                refreshed,
                waited_s = ctx.lease_waited(&a.uid).as_secs(),
                "the guest waits long for its DHCP lease: wrote its reservation again (libvirt restarts a dead dnsmasq on that)"
            ),
            // The look at the host succeeded a moment ago; the next one reports a lasting failure.
            Err(err) => {
                tracing::warn!(machine = %a.object.name_any(), %err, "cannot refresh the DHCP reservation")
            }
        }
    }
    Ok(Step::Again)
}

/// What a create or a start came to.
async fn created_or_started(
    a: &mut Acting<'_>,
    result: Result<Option<MachineReport>, HostError>,
) -> Result<Step, Error> {
    let (object, ctx) = (a.object, a.ctx);
    a.snapshot.host = a.host_view(&result);
    match result {
        Ok(Some(r)) => {
            ctx.placements.created(&a.uid);
            let (reason, note) = if r.created {
                ("DomainCreated", format!("created and started domain {} on {}", r.domain, a.at().uri))
            } else {
                ("DomainStarted", format!("started domain {} on {}", r.domain, a.at().uri))
            };
            ctx.event(object, EventType::Normal, reason, if r.created { "Create" } else { "Start" }, &note).await;
            a.report = Some(r);
        }
        Ok(None) => {
            // The domain vanished between the look and the start. It existed,
            // so the machine was provisioned and is now lost: decide reports
            // that, and nothing is created.
            ctx.expected_events.forget(&a.snapshot.domain);
            a.snapshot.provisioned = true;
        }
        Err(_) => {
            // A failed step is decided again below and reported as a
            // condition. The events it did not bring are not waited
            // for: a start by someone else must reconcile.
            ctx.expected_events.forget(&a.snapshot.domain);
        }
    }
    if let Host::Failed { .. } = a.snapshot.host {
        // Do not loop on a failed create: report it.
        return Ok(Step::Report(decide(&a.snapshot)));
    }
    Ok(Step::Again)
}

/// The steps of `decide_deletion`: remove the machine from the host, or drop
/// the finalizer without touching it.
async fn act_deletion(a: &mut Acting<'_>, plan: MachinePlan) -> Result<Step, Error> {
    let (object, ctx) = (a.object, a.ctx);
    match plan.action {
        MachineAction::RemoveFinalizer => {
            ctx.event(object, EventType::Warning, "HostUnknown", "Delete", &plan.conditions[0].message).await;
        }
        MachineAction::SkipHostCleanup => {
            let note = match &a.location {
                Some(l) => format!(
                    "{SKIP_HOST_CLEANUP_ANNOTATION} is set: the host was not cleaned up. What may remain: {}",
                    what_may_remain(
                        &a.host_spec(),
                        &l.uri,
                        object.status.as_ref().and_then(|s| s.mac_address.as_deref())
                    )
                ),
                None => format!(
                    "{SKIP_HOST_CLEANUP_ANNOTATION} is set: the host was not cleaned up. No host is recorded, so the machine created nothing on one"
                ),
            };
            ctx.event(object, EventType::Warning, "HostCleanupSkipped", "Delete", &note).await;
            ctx.lease_found(&a.uid);
        }
        _ => {
            let l = a.at();
            let spec = a.host_spec();
            let result = timed(
                ctx,
                "delete",
                ctx.connections.host(&a.opened).call(move |h| host_machine::delete_machine(h, &spec)),
            )
            .await;
            match result {
                Ok(left) => {
                    if left.is_empty() {
                        let note = format!("removed the domain, its volumes and its DHCP reservation from {}", l.uri);
                        ctx.event(object, EventType::Normal, "DomainDeleted", "Delete", &note).await;
                        if let Some(url) = &object.spec.image_url {
                            let host = ctx.connections.host(&a.opened);
                            if let Some(note) =
                                ctx.images.remove_if_unused(&host, &l.base_pool, &ImageRequest::of(url)).await
                            {
                                ctx.event(object, EventType::Normal, "ImageRemoved", "Delete", &note).await;
                            }
                        }
                    } else {
                        let left: Vec<String> = left.iter().map(|o| o.to_string()).collect();
                        let note = format!(
                            "removed what was this LibvirtMachine's from {}; left what is not: {}",
                            l.uri,
                            left.join("; ")
                        );
                        ctx.event(object, EventType::Warning, "ForeignObjectsLeft", "Delete", &note).await;
                    }
                    ctx.lease_found(&a.uid);
                }
                Err(err) => {
                    a.snapshot.host = a.host_view(&Err(err));
                    return Ok(Step::Report(decide(&a.snapshot)));
                }
            }
        }
    }
    addresses::release(ctx, object, &a.ns).await?;
    object_patch::remove_finalizer(&a.api, object, MACHINE_FINALIZER).await?;
    Ok(Step::Finished(Action::await_change()))
}

/// Conditions, status and events of the plan; then when to look again.
async fn report(a: &Acting<'_>, plan: &MachinePlan) -> Result<Action, Error> {
    let (object, ctx, uid) = (a.object, a.ctx, &a.uid);
    let held = a.held.as_ref().unwrap_or(object);
    report_status(object, held, ctx, &a.api, plan, a.report.as_ref(), a.location.as_ref()).await?;
    let waiting_for_secret =
        matches!(a.snapshot.bootstrap, Bootstrap::SecretMissing(_)) && a.snapshot.host == Host::Absent;
    let requeue = match plan.requeue {
        Requeue::Never if waiting_for_secret => Some(RECHECK_MISSING_SECRET),
        Requeue::Never => {
            ctx.lease_found(uid);
            None
        }
        Requeue::WaitingForAddress => Some(ctx.lease_backoff(uid)),
        Requeue::Resync => {
            ctx.lease_found(uid);
            Some(ctx.settings.resync_interval)
        }
        Requeue::After(after) => {
            ctx.lease_found(uid);
            Some(after)
        }
    };
    Ok(requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
}

async fn timed<T>(ctx: &Context, operation: &str, f: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let out = f.await;
    ctx.metrics.host_operation(operation, started.elapsed());
    out
}

/// `held` is `object` with this reconcile's metadata writes (the finalizer).
#[allow(clippy::too_many_arguments)]
async fn report_status(
    object: &LibvirtMachine,
    held: &LibvirtMachine,
    ctx: &Context,
    api: &Api<LibvirtMachine>,
    plan: &MachinePlan,
    host: Option<&MachineReport>,
    location: Option<&HostLocation>,
) -> Result<(), Error> {
    if plan.conditions.is_empty() {
        return Ok(());
    }
    let name = object.name_any();
    let old = object.status.clone().unwrap_or_default();
    let already = old.initialization.as_ref().and_then(|i| i.provisioned) == Some(true);
    let lost = plan.conditions.iter().any(|u| u.reason == reasons::DOMAIN_LOST);
    let mut status = LibvirtMachineStatus {
        initialization: (plan.provisioned || already).then_some(Initialization { provisioned: Some(true) }),
        // The host the machine was placed on, when the cluster names its hosts.
        failure_domain: location.and_then(|l| l.failure_domain.clone()).or(old.failure_domain.clone()),
        ..old.clone()
    };
    // providerID first: CAPI reads it once provisioned is true. Writing it
    // bumps the generation, and the conditions observe the new one: with the
    // old one, the reconcile that the write brings about would find them stale
    // and write the same status again (and CAPI would react to that write too).
    let mut generation = object.meta().generation;
    if plan.provisioned && object.spec.provider_id.is_none() {
        let provider_id = capl_host::naming::provider_id(&object.uid().unwrap_or_default());
        // A spec change: the object comes back with the next generation, and
        // its watch event brings this reconcile nothing new.
        let mut expected = held.clone();
        expected.meta_mut().generation = held.meta().generation.map(|g| g + 1);
        let before = ctx.seen_machines.will_write(&expected);
        let patch = serde_json::json!({ "providerID": provider_id });
        let written = match object_patch::patch_spec(api, &name, patch).await {
            Ok(written) => written,
            Err(err) => {
                ctx.seen_machines.write_failed(&expected, before);
                return Err(err);
            }
        };
        generation = written.meta().generation.or(generation);
    }
    let mut conditions = old.conditions.clone().unwrap_or_default();
    condition_list::apply(&mut conditions, &plan.conditions, generation, Timestamp::now());
    status.conditions = Some(conditions);
    if let Some(report) = host {
        status.domain_name = Some(report.domain.clone());
        status.state = Some(report.state.as_str().to_string());
        status.addresses = Some(
            report
                .addresses
                .iter()
                .map(|a| match a {
                    host_machine::MachineAddress::InternalIp(ip) => MachineAddress::internal_ip(ip.to_string()),
                    host_machine::MachineAddress::Hostname(h) => MachineAddress::hostname(h.clone()),
                })
                .collect(),
        );
        // The MAC the domain has: derived from its name, or the next free
        // candidate when another entry or guest on the network had that one.
        if let Some(mac) = &report.mac {
            status.mac_address = Some(mac.clone());
        }
        status.data_disks = (!report.data_disks.is_empty()).then(|| {
            report
                .data_disks
                .iter()
                .map(|d| DataDiskStatus { name: d.name.clone(), volume: d.volume.clone(), device: d.device.clone() })
                .collect()
        });
    }
    if lost {
        // No libvirt state to show: the domain is gone.
        status.state = None;
    }
    if let Some(location) = location {
        location.write_into(&mut status);
    }

    if Some(&status) != object.status.as_ref() {
        let mut patch = serde_json::json!(status);
        if lost {
            // A merge patch leaves out what is None; null removes it.
            patch["state"] = serde_json::Value::Null;
        }
        object_patch::patch_status(api, &name, &patch).await?;
    }
    // One Warning event per new failure message: a failed provisioning, or a lost domain.
    let failure = plan.conditions.iter().filter(|u| u.status == Status::False).find_map(|u| match u.type_ {
        DOMAIN_PROVISIONING_READY
            if !matches!(
                u.reason,
                reasons::WAITING_FOR_BOOTSTRAP_DATA | reasons::DOMAIN_PROVISIONING | reasons::DOWNLOADING_IMAGE
            ) =>
        {
            Some((u, "Provision"))
        }
        MACHINE_CREATED if u.reason == reasons::DOMAIN_LOST => Some((u, "Observe")),
        _ => None,
    });
    if let Some((update, action)) = failure {
        let was = old.conditions.as_ref().and_then(|c| c.iter().find(|c| c.type_ == update.type_));
        if was.is_none_or(|c| c.message != update.message) {
            ctx.metrics.reconcile_error("libvirtmachine", update.reason);
            ctx.event(object, EventType::Warning, update.reason, action, &update.message).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10";

    fn machine(provider_id: Option<&str>, domain_name: Option<&str>) -> LibvirtMachine {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "LibvirtMachine",
            "metadata": { "name": "worker-0", "namespace": "ns", "uid": UID },
            "spec": { "vcpu": 1, "memoryMiB": 512, "diskGiB": 10, "image": "base.qcow2", "providerID": provider_id },
            "status": { "domainName": domain_name },
        }))
        .unwrap()
    }

    #[test]
    fn the_name_scheme_follows_the_recorded_domain_name() {
        use capl_host::naming::domain_name_in;
        let provider_id = format!("libvirt://{UID}");
        let legacy = domain_name_in(NameScheme::Legacy, "ns", "worker-0", UID);
        let current = domain_name_in(NameScheme::Current, "ns", "worker-0", UID);
        // A new machine: the current names.
        assert_eq!(name_scheme(&machine(None, None), UID), NameScheme::Current);
        // A machine created with 6-digit names keeps them.
        let old = machine(Some(&provider_id), Some(&legacy));
        assert_eq!(name_scheme(&old, UID), NameScheme::Legacy);
        assert_eq!(machine_domain_name(&old, UID), legacy);
        assert_eq!(name_scheme(&machine(Some(&provider_id), Some(&current)), UID), NameScheme::Current);
        // Moved (a provider ID, no status yet): the host decides.
        assert_eq!(name_scheme(&machine(Some(&provider_id), None), UID), NameScheme::Either);
    }
}
