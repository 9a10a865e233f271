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
    ClusterHost, Initialization, LibvirtCluster, LibvirtMachine, LibvirtMachineStatus, MACHINE_FINALIZER,
    MachineAddress, SKIP_HOST_CLEANUP_ANNOTATION, SecretReference,
};
use capl_host::error::HostError;
use capl_host::machine::{self as host_machine, AdditionalNic, MachineReport, MachineSpec, NicAttachment};

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

/// The bootstrap data: `Machine.spec.bootstrap.dataSecretName` -> Secret key `value`.
async fn bootstrap_data(ctx: &Context, ns: &str, machine: &Machine) -> Result<(Bootstrap, Vec<u8>), Error> {
    let Some(name) = machine.spec.bootstrap.data_secret_name.clone() else {
        return Ok((Bootstrap::NotSet, Vec::new()));
    };
    let Some(secret) = get_optional(&Api::<Secret>::namespaced(ctx.client.clone(), ns), &name).await? else {
        return Ok((Bootstrap::SecretMissing(name), Vec::new()));
    };
    let data = secret.data.unwrap_or_default();
    match data.get("value") {
        Some(value) if !value.0.is_empty() => {
            if let Some(format) = data.get("format").map(|f| String::from_utf8_lossy(&f.0).to_string())
                && format != "cloud-config"
            {
                return Ok((
                    Bootstrap::Invalid(format!(
                        "bootstrap Secret {ns}/{name} has format {format:?}; this provider seeds cloud-init NoCloud and needs format \"cloud-config\": use a bootstrap provider configured for cloud-init"
                    )),
                    Vec::new(),
                ));
            }
            Ok((Bootstrap::Ready, value.0.clone()))
        }
        _ => Ok((
            Bootstrap::Invalid(format!(
                "bootstrap Secret {ns}/{name} has no non-empty key \"value\": put the cloud-init user-data under data.value (CAPI bootstrap providers do this)"
            )),
            Vec::new(),
        )),
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
    MachineSpec {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        identity: identity.to_string(),
        cluster_name: cluster.map(|c| c.name_any()).unwrap_or_default(),
        vcpu: object.spec.vcpu.max(1) as u32,
        memory_mib: object.spec.memory_mib.max(1) as u64,
        disk_gib: object.spec.disk_gib.max(1) as u64,
        image: object.spec.image.clone(),
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
    format!(
        "domain \"{d}\", volumes \"{p}/{o}\" and \"{p}/{i}\", and the DHCP host entry {entry} on network \"{n}\", on {uri}",
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
    let api: Api<LibvirtMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let mut g = gather(object, ctx, &ns).await?;
    let uid = object.uid().unwrap_or_default();
    let identity = machine_identity(object);
    // With a provider ID we never set, the UID stands in for the host lookups: it finds nothing of ours.
    let host_identity = identity.clone().unwrap_or_else(|_| uid.clone());
    let deleting = object.meta().deletion_timestamp.is_some();
    let recorded = HostLocation::recorded(object);
    // Where the machine lives: where the status recorded before anything was
    // created, once it did (it never moves); else, while the LibvirtCluster
    // exists, the host placement chooses (nothing is created before the
    // choice is recorded); else nowhere.
    let mut unplaced = None;
    let paused = paused_reason(object, g.cluster.as_ref());
    // Hosts are asked for their memory only once the machine would record one,
    // and the host is chosen only once the owner Machine is known: its
    // spec.failureDomain names the host, and KubeadmControlPlane and
    // MachineSets create the LibvirtMachine before the Machine that owns it.
    let placement_due = paused.is_none()
        && g.machine.is_some()
        && g.cluster
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.infrastructure_provisioned)
            == Some(true);
    let location = match (&recorded, &g.libvirt_cluster) {
        (Some(r), lc) if deleting || lc.is_some() => Some(r.clone().with_current_credentials(lc.as_ref())),
        (None, Some(lc)) if !deleting && placement_due => {
            match placement::place(ctx, &ns, object, g.machine.as_ref(), lc).await? {
                Ok(host) => Some(HostLocation::of_host(&host)),
                Err(why) => {
                    unplaced = Some(why);
                    None
                }
            }
        }
        // A machine that recorded no host (made before hosts were recorded) on the one-host form.
        (None, Some(lc)) if lc.spec.hosts.is_none() => lc.spec.hosts().first().map(HostLocation::of_host),
        _ => None,
    };

    let mut snapshot = MachineSnapshot {
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
        location_recorded: location.is_some() && recorded == location,
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
        domain: capl_host::naming::domain_name(&ns, &object.name_any(), &host_identity),
        host_uri: location.as_ref().map(|l| l.uri.clone()).unwrap_or_default(),
    };
    if let Some(why) = unplaced {
        snapshot.host = Host::Failed { reason: why.reason, message: why.message, transient: why.transient };
    }
    if let Err(message) = identity
        && !snapshot.deleting
    {
        // Nothing of ours can exist under an identity we never set: report and wait for a new object.
        snapshot.host = Host::Failed { reason: reasons::INVALID_MACHINE_SPEC, message, transient: false };
    }
    if let Some(l) = &location
        && let Err(message) = ctx.settings.uri_policy.check(&l.uri)
    {
        // The manager does not open this URI, not even to delete (also when it
        // comes from the status, which is not the LibvirtCluster's to vouch for):
        // report it (the LibvirtCluster reports it too) and wait.
        snapshot.host = Host::Failed { reason: reasons::URI_NOT_ALLOWED, message, transient: false };
    }
    // The URI to open: the host's, with the files of its credentials Secret.
    let mut opened = location.as_ref().map(|l| l.uri.clone()).unwrap_or_default();
    if let Some(l) = &location
        && !matches!(snapshot.host, Host::Failed { .. })
    {
        let owner = format!("LibvirtMachine {}", object.name_any());
        match credentials::connection_uri(ctx, &ns, &l.uri, l.credentials.as_deref(), &owner, deleting).await? {
            Ok(uri) => opened = uri,
            Err(unusable) => {
                snapshot.host =
                    Host::Failed { reason: unusable.reason, message: unusable.message, transient: unusable.transient };
            }
        }
    }
    if addresses::uses_ipam(object) && !deleting && location.is_some() && !matches!(snapshot.host, Host::Failed { .. })
    {
        // Addresses from IPAM: claimed once the machine has a host, known before anything is created.
        let cluster = g.cluster.as_ref().map(|c| c.name_any());
        match addresses::claim(ctx, object, &ns, cluster.as_deref()).await? {
            Claimed::Ready(found) => g.addresses = found,
            Claimed::Waiting { reason, message } => {
                snapshot.host = Host::Failed { reason, message, transient: true };
            }
            Claimed::Failed { reason, message } => {
                snapshot.host = Host::Failed { reason, message, transient: false };
            }
        }
    }
    let user_uri = location.as_ref().map(|l| l.uri.clone()).unwrap_or_default();
    if location.is_some() && !matches!(snapshot.host, Host::Failed { .. }) {
        // A reconnect is announced under the URI opened; its machines record the user's.
        ctx.note_opened_uri(&opened, &user_uri);
    }
    let host_view = |result: &Result<Option<MachineReport>, HostError>, object: &LibvirtMachine| {
        let mut view = host_view(result, object);
        if let Host::Failed { message, .. } = &mut view {
            *message = credentials::as_user_wrote_it(std::mem::take(message), &opened, &user_uri);
        }
        view
    };
    let mut report: Option<MachineReport> = None;
    let mut user_data = Vec::new();
    // The object as this reconcile's last metadata write left it, once there is one.
    let mut held: Option<LibvirtMachine> = None;

    let plan = loop {
        let plan = decide(&snapshot);
        // decide acts on the host only when it knows where the host is.
        let at = || location.as_ref().expect("decide acts on the host only when it knows the host");
        match plan.action {
            MachineAction::Nothing => break plan,
            MachineAction::AddFinalizer => {
                // This reconcile goes on with the finalizer in place; its watch event brings nothing new.
                let mut expected = object.clone();
                expected.finalizers_mut().push(MACHINE_FINALIZER.to_string());
                let before = ctx.seen_machines.will_write(&expected);
                match object_patch::add_finalizer(&api, object, MACHINE_FINALIZER).await {
                    Ok(written) => held = written.or(held),
                    Err(err) => {
                        ctx.seen_machines.write_failed(&expected, before);
                        return Err(err);
                    }
                }
                snapshot.has_finalizer = true;
            }
            MachineAction::RemoveFinalizer => {
                ctx.event(object, EventType::Warning, "HostUnknown", "Delete", &plan.conditions[0].message).await;
                addresses::release(ctx, object, &ns).await?;
                object_patch::remove_finalizer(&api, object, MACHINE_FINALIZER).await?;
                return Ok(Action::await_change());
            }
            MachineAction::SkipHostCleanup => {
                let note = match &location {
                    Some(l) => format!(
                        "{SKIP_HOST_CLEANUP_ANNOTATION} is set: the host was not cleaned up. What may remain: {}",
                        what_may_remain(
                            &host_spec(object, &host_identity, l, &g, ctx),
                            &l.uri,
                            object.status.as_ref().and_then(|s| s.mac_address.as_deref())
                        )
                    ),
                    None => format!(
                        "{SKIP_HOST_CLEANUP_ANNOTATION} is set: the host was not cleaned up. No host is recorded, so the machine created nothing on one"
                    ),
                };
                ctx.event(object, EventType::Warning, "HostCleanupSkipped", "Delete", &note).await;
                ctx.lease_found(&uid);
                addresses::release(ctx, object, &ns).await?;
                object_patch::remove_finalizer(&api, object, MACHINE_FINALIZER).await?;
                return Ok(Action::await_change());
            }
            MachineAction::RecordHost => {
                let l = at();
                let mut status = object.status.clone().unwrap_or_default();
                l.write_into(&mut status);
                let patch = serde_json::json!({
                    "hostURI": status.host_uri, "network": status.network,
                    "basePool": status.base_pool, "domainPool": status.domain_pool,
                    "credentialsRef": status.credentials_ref, "failureDomain": status.failure_domain,
                });
                object_patch::patch_status(&api, &object.name_any(), &patch).await?;
                snapshot.location_recorded = true;
            }
            MachineAction::ObserveHost => {
                let spec = host_spec(object, &host_identity, at(), &g, ctx);
                let result = timed(
                    ctx,
                    "observe",
                    ctx.connections.host(&opened).call(move |h| host_machine::observe_machine(h, &spec)),
                )
                .await;
                snapshot.host = host_view(&result, object);
                if let Ok(found) = result {
                    if found.is_some() {
                        // The host counts the domain's memory now.
                        ctx.placements.created(&uid);
                    }
                    report = found;
                }
                // The bootstrap data is read only to create, and a provisioned machine is never created.
                if snapshot.host == Host::Absent
                    && !snapshot.provisioned
                    && let Some(machine) = &g.machine
                {
                    let (bootstrap, data) = bootstrap_data(ctx, &ns, machine).await?;
                    snapshot.bootstrap = bootstrap;
                    user_data = data;
                }
            }
            MachineAction::Create | MachineAction::Start => {
                let spec = host_spec(object, &host_identity, at(), &g, ctx);
                let host = ctx.connections.host(&opened);
                // The lifecycle events of this action tell this reconcile nothing it will not see.
                let kinds = match plan.action {
                    MachineAction::Create => own_changes::CREATE_EVENTS,
                    _ => own_changes::START_EVENTS,
                };
                ctx.expected_events.expect(&snapshot.domain, kinds);
                let result = if plan.action == MachineAction::Create {
                    // The bootstrap data was read when the host said the domain is absent.
                    let seed = std::mem::take(&mut user_data);
                    let metrics = ctx.metrics.clone();
                    let create = move |h: &dyn capl_host::hypervisor::Hypervisor| {
                        let mut took = |step: host_machine::CreateStep, d| metrics.create_step(step.name(), d);
                        host_machine::create_machine_timed(h, &spec, &seed, &mut took).map(Some)
                    };
                    timed(ctx, "create", host.call(create)).await
                } else {
                    timed(ctx, "start", host.call(move |h| host_machine::start_machine(h, &spec))).await
                };
                snapshot.host = host_view(&result, object);
                match result {
                    Ok(Some(r)) => {
                        ctx.placements.created(&uid);
                        let (reason, note) = if r.created {
                            ("DomainCreated", format!("created and started domain {} on {}", r.domain, at().uri))
                        } else {
                            ("DomainStarted", format!("started domain {} on {}", r.domain, at().uri))
                        };
                        ctx.event(object, EventType::Normal, reason, if r.created { "Create" } else { "Start" }, &note)
                            .await;
                        report = Some(r);
                    }
                    Ok(None) => {
                        // The domain vanished between the look and the start. It existed,
                        // so the machine was provisioned and is now lost: decide reports
                        // that, and nothing is created.
                        ctx.expected_events.forget(&snapshot.domain);
                        snapshot.provisioned = true;
                    }
                    Err(_) => {
                        // A failed step is decided again below and reported as a
                        // condition. The events it did not bring are not waited
                        // for: a start by someone else must reconcile.
                        ctx.expected_events.forget(&snapshot.domain);
                    }
                }
                if let Host::Failed { .. } = snapshot.host {
                    // Do not loop on a failed create: report it.
                    break decide(&snapshot);
                }
            }
            MachineAction::RefreshReservation => {
                snapshot.lease_refresh_due = false;
                let l = at();
                if ctx.claim_lease_refresh(&l.uri, &l.network) {
                    let spec = host_spec(object, &host_identity, l, &g, ctx);
                    let result = timed(
                        ctx,
                        "refresh_reservation",
                        ctx.connections.host(&opened).call(move |h| host_machine::refresh_reservation(h, &spec)),
                    )
                    .await;
                    match result {
                        Ok(refreshed) => tracing::info!(
                            machine = %object.name_any(),
                            network = %l.network,
                            uri = %l.uri,
                            refreshed,
                            waited_s = ctx.lease_waited(&uid).as_secs(),
                            "the guest waits long for its DHCP lease: wrote its reservation again (libvirt restarts a dead dnsmasq on that)"
                        ),
                        // The look at the host succeeded a moment ago; the next one reports a lasting failure.
                        Err(err) => {
                            tracing::warn!(machine = %object.name_any(), %err, "cannot refresh the DHCP reservation")
                        }
                    }
                }
            }
            MachineAction::Delete => {
                let l = at();
                let spec = host_spec(object, &host_identity, l, &g, ctx);
                let result = timed(
                    ctx,
                    "delete",
                    ctx.connections.host(&opened).call(move |h| host_machine::delete_machine(h, &spec)),
                )
                .await;
                match result {
                    Ok(left) => {
                        if left.is_empty() {
                            let note =
                                format!("removed the domain, its volumes and its DHCP reservation from {}", l.uri);
                            ctx.event(object, EventType::Normal, "DomainDeleted", "Delete", &note).await;
                        } else {
                            let left: Vec<String> = left.iter().map(|o| o.to_string()).collect();
                            let note = format!(
                                "removed what was this LibvirtMachine's from {}; left what is not: {}",
                                l.uri,
                                left.join("; ")
                            );
                            ctx.event(object, EventType::Warning, "ForeignObjectsLeft", "Delete", &note).await;
                        }
                        ctx.lease_found(&uid);
                        addresses::release(ctx, object, &ns).await?;
                        object_patch::remove_finalizer(&api, object, MACHINE_FINALIZER).await?;
                        return Ok(Action::await_change());
                    }
                    Err(err) => {
                        snapshot.host = host_view(&Err(err), object);
                        break decide(&snapshot);
                    }
                }
            }
        }
    };

    let held = held.as_ref().unwrap_or(object);
    report_status(object, held, ctx, &api, &plan, report.as_ref(), location.as_ref()).await?;
    let waiting_for_secret = matches!(snapshot.bootstrap, Bootstrap::SecretMissing(_)) && snapshot.host == Host::Absent;
    let requeue = match plan.requeue {
        Requeue::Never if waiting_for_secret => Some(RECHECK_MISSING_SECRET),
        Requeue::Never => {
            ctx.lease_found(&uid);
            None
        }
        Requeue::WaitingForAddress => Some(ctx.lease_backoff(&uid)),
        Requeue::Resync => {
            ctx.lease_found(&uid);
            Some(ctx.settings.resync_interval)
        }
        Requeue::After(after) => {
            ctx.lease_found(&uid);
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
            if !matches!(u.reason, reasons::WAITING_FOR_BOOTSTRAP_DATA | reasons::DOMAIN_PROVISIONING) =>
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
