//! The LibvirtCluster, LibvirtMachine and LibvirtRemediation reconcilers.
//!
//! Each reconcile runs four phases: **gather** (read the Kubernetes objects
//! into a snapshot), **decide** (a pure function of the snapshot returning the
//! next action and the conditions; see [`cluster_decision`] and
//! [`machine_decision`]), **act** (one host or API call per step, each
//! idempotent; after a step the snapshot is updated and decided again) and
//! **report** (conditions, status, events, requeue).
//!
//! This file wires the controllers ([`run`]) and sweeps what no object
//! refers to any more ([`forget_unused`]); the files below it import each
//! other, never this one: [`Context`] and [`Settings`] live in `context.rs`,
//! [`Error`] in `error.rs`, and what counts as a change of an object in
//! [`own_changes`].

pub mod addresses;
pub mod cluster;
pub mod cluster_decision;
pub mod condition_list;
mod context;
pub mod credentials;
pub mod domain_events;
mod error;
pub mod host_failure;
pub mod machine;
pub mod machine_decision;
pub mod metrics;
mod object_patch;
pub mod own_changes;
mod owners;
pub mod placement;
pub mod remediation;
pub mod reservations;
pub mod template;
mod watch_mapping;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{Controller, PredicateConfig, WatchStreamExt, controller::Action, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::capi::{Cluster, Machine};
use crate::api::{LibvirtCluster, LibvirtMachine, LibvirtMachineTemplate, LibvirtRemediation};
pub use capl_host::uri_policy::UriPolicy;
pub use context::{CONTROLLER_NAME, Context, DEFAULT_RESYNC_INTERVAL, DEFAULT_SWEEP_INTERVAL, InputCaches, Settings};
pub use error::Error;
use own_changes::not_status;

/// How often the host connections are checked for the domain events: a
/// connection that died is replaced (and its host's machines re-listed)
/// within this much of keepalive or the closed socket noticing it.
pub const CONNECTION_CHECK_INTERVAL: Duration = Duration::from_secs(5);
fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn error_policy<K: ResourceExt>(object: Arc<K>, error: &Error, ctx: Arc<Context>, controller: &'static str) -> Action {
    tracing::warn!(controller, object = %object.name_any(), %error, "reconcile failed; retrying");
    ctx.metrics.reconcile_error(controller, error.metric_label());
    Action::requeue(Duration::from_secs(15))
}

/// Runs the controllers until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static) {
    let shutdown_signal = shutdown.clone();
    let client = ctx.client.clone();
    let ns = ctx.settings.namespace.clone();
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);

    let capi_clusters: Api<Cluster> = api(&client, &ns);
    let (cluster_store, cluster_writer) = reflector::store::<LibvirtCluster>();
    let cluster_stream = own_objects(api::<LibvirtCluster>(&client, &ns), cluster_writer);
    let cluster_controller = Controller::for_stream(cluster_stream, cluster_store.clone()).with_config(config.clone());
    let libvirt_clusters = cluster_store.clone();
    let cluster_controller = cluster_controller
        // The owner Cluster, when what the reconcile reads of it changes: not on
        // CAPI's status writes, which follow every change of its machines.
        .watches_stream(
            watch_mapping::when_inputs_change(
                watch_lean(capi_clusters.clone()).default_backoff(),
                watch_mapping::spec_inputs::<Cluster>,
            ),
            watch_mapping::libvirt_cluster_of_cluster,
        )
        .watches(api::<LibvirtMachine>(&client, &ns), watcher::Config::default(), {
            let store = cluster_store.clone();
            move |lm| watch_mapping::deleting_libvirt_clusters_of_machine(&store, &lm)
        })
        // Credentials Secrets, metadata only (their content is read when used):
        // a new or changed Secret is checked at once.
        // The claim of an allocated control-plane endpoint that gets its address.
        .owns(api::<crate::api::ipam::IPAddressClaim>(&client, &ns), watcher::Config::default())
        .watches_stream(secret_metadata(&client, &ns), move |secret| {
            watch_mapping::libvirt_clusters_of_credentials(&cluster_store, &secret)
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(cluster::reconcile, |o, e, c| error_policy(o, e, c, "libvirtcluster"), ctx.clone())
        .for_each(|result| log_error(result, "libvirtcluster"));

    // The LibvirtMachine controller maps Machines, Clusters, LibvirtClusters and
    // bootstrap Secrets to the LibvirtMachines they concern. A reflector keeps
    // the Machines at hand for the Secret mapping.
    let (machine_reader, machine_writer) = reflector::store::<Machine>();
    let machine_stream = watch_mapping::when_inputs_change(
        reflector::reflector(machine_writer, watch_lean(api::<Machine>(&client, &ns))).default_backoff(),
        watch_mapping::machine_inputs,
    );
    let (capi_cluster_reader, capi_cluster_writer) = reflector::store::<Cluster>();
    let cluster_stream = watch_mapping::when_inputs_change(
        reflector::reflector(capi_cluster_writer, watch_lean(capi_clusters)).default_backoff(),
        watch_mapping::cluster_inputs,
    );
    let (libvirt_cluster_reader, libvirt_cluster_writer) = reflector::store::<LibvirtCluster>();
    let libvirt_cluster_stream = watch_mapping::when_inputs_change(
        reflector::reflector(libvirt_cluster_writer, watch_lean(api::<LibvirtCluster>(&client, &ns))).default_backoff(),
        watch_mapping::spec_inputs::<LibvirtCluster>,
    );
    let _ = ctx.inputs.set(InputCaches {
        machines: machine_reader.clone(),
        clusters: capi_cluster_reader,
        libvirt_clusters: libvirt_cluster_reader,
    });
    // LibvirtMachineTemplates: capacity and node info for scaling from zero.
    let (template_store, template_writer) = reflector::store::<LibvirtMachineTemplate>();
    let template_stream = own_objects(api::<LibvirtMachineTemplate>(&client, &ns), template_writer);
    let template_controller = Controller::for_stream(template_stream, template_store)
        .with_config(config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(template::reconcile, |o, e, c| error_policy(o, e, c, "libvirtmachinetemplate"), ctx.clone())
        .for_each(|result| log_error(result, "libvirtmachinetemplate"));
    // LibvirtRemediations: reboots for a MachineHealthCheck; a reconcile
    // requeues itself for the next step, so only their creation and spec
    // changes are watched.
    let (remediation_store, remediation_writer) = reflector::store::<LibvirtRemediation>();
    let remediation_stream = own_objects(api::<LibvirtRemediation>(&client, &ns), remediation_writer);
    let remediation_controller = Controller::for_stream(remediation_stream, remediation_store)
        .with_config(config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(remediation::reconcile, |o, e, c| error_policy(o, e, c, "libvirtremediation"), ctx.clone())
        .for_each(|result| log_error(result, "libvirtremediation"));
    let (libvirt_machines, machines_writer) = reflector::store::<LibvirtMachine>();
    // The reconciler's own writes (finalizer, providerID) are left out as well.
    let seen = ctx.seen_machines.clone();
    let machines_stream = reflector::reflector(machines_writer, watch_lean(api::<LibvirtMachine>(&client, &ns)))
        .default_backoff()
        .touched_objects()
        .try_filter(move |lm| std::future::ready(seen.pass(lm)));
    // Domain lifecycle events of every host connection -> the LibvirtMachines of their domains.
    let (sink, events) = domain_events::sink();
    ctx.connections.set_event_sink(sink);
    let event_reconciles = domain_events::reconciles(
        events,
        libvirt_machines.clone(),
        {
            let ctx = ctx.clone();
            move |opened| ctx.user_uri(opened)
        },
        ctx.metrics.clone(),
        domain_events::RELIST_MIN_GAP,
        ctx.expected_events.clone(),
    );
    let machine_controller = Controller::for_stream(machines_stream, libvirt_machines.clone())
        .with_config(config)
        .reconcile_on(event_reconciles);
    let for_sweep = libvirt_machines.clone();
    let for_cluster = libvirt_machines.clone();
    let for_libvirt_cluster = libvirt_machines.clone();
    let for_credentials = libvirt_machines.clone();
    let machine_controller = machine_controller
        .watches_stream(machine_stream, watch_mapping::libvirt_machine_of_machine)
        .watches_stream(cluster_stream, move |c| watch_mapping::libvirt_machines_of_cluster(&for_cluster, &c))
        .watches_stream(libvirt_cluster_stream, move |lc| {
            watch_mapping::libvirt_machines_of_libvirt_cluster(&for_libvirt_cluster, &lc)
        })
        .watches(
            api::<Secret>(&client, &ns),
            watcher::Config::default().fields(watch_mapping::BOOTSTRAP_SECRET_FIELDS),
            {
                let machines = machine_reader.clone();
                move |s| watch_mapping::libvirt_machines_of_secret(&machines, &s)
            },
        )
        .watches_stream(secret_metadata(&client, &ns), {
            let machines = for_credentials.clone();
            move |secret| watch_mapping::libvirt_machines_of_credentials(&machines, &secret)
        })
        // A claim of spec.addressesFromPools that gets its address.
        .owns(api::<crate::api::ipam::IPAddressClaim>(&client, &ns), watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(machine::reconcile, |o, e, c| error_policy(o, e, c, "libvirtmachine"), ctx.clone())
        .for_each(|result| log_error(result, "libvirtmachine"));
    let sweep = {
        let ctx = ctx.clone();
        let shutdown = shutdown_signal.clone();
        async move {
            let mut every = tokio::time::interval(ctx.settings.sweep_interval);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                tokio::select! {
                    _ = every.tick() => forget_unused(&ctx, &libvirt_clusters.state(), &for_sweep.state()),
                    _ = shutdown.clone() => break,
                }
            }
        }
    };
    let check_connections = {
        let ctx = ctx.clone();
        let shutdown = shutdown_signal.clone();
        async move {
            let mut every = tokio::time::interval(CONNECTION_CHECK_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        ctx.connections.check_connections().await;
                    }
                    _ = shutdown.clone() => break,
                }
            }
        }
    };
    tokio::join!(
        cluster_controller,
        machine_controller,
        template_controller,
        remediation_controller,
        sweep,
        check_connections
    );
}

/// Every object of `api`, watched, without `metadata.managedFields`: nothing
/// reads them, and on objects that several managers write (a Machine: CAPI
/// core, the bootstrap provider, the API server's defaulting) they are a large
/// part of each object kept in a reflector's store (about half of the manager's
/// memory with 1,000 machines; the book's performance page has the figures).
fn watch_lean<K>(api: Api<K>) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, watcher::Config::default()).modify(|object| object.meta_mut().managed_fields = None)
}

/// The objects a controller reconciles, kept in `writer`'s store, and passed on
/// only when something other than their status changed ([`not_status`]): a
/// status write of our own does not reconcile again.
fn own_objects<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    reflector::reflector(writer, watch_lean(api))
        .default_backoff()
        .touched_objects()
        .predicate_filter(not_status, PredicateConfig::default())
}

/// Every Secret's metadata in the watched namespaces: which ones exist and
/// when they change, without their content.
fn secret_metadata(
    client: &Client,
    namespace: &Option<String>,
) -> impl futures::Stream<Item = Result<kube::core::PartialObjectMeta<Secret>, watcher::Error>> + Send + 'static {
    watch_lean(api::<kube::core::PartialObjectMeta<Secret>>(client, namespace)).default_backoff().touched_objects()
}

/// Forgets what the process keeps per host and per machine once no object
/// names it any more: the cached connection (and call slots) of a host URI
/// that no LibvirtCluster and no LibvirtMachine's status names, and the
/// lease wait of a LibvirtMachine that is gone, the credential files of a
/// Secret no object names, and the connection opened with an older content
/// of a Secret. (The per-network DHCP locks
/// go by themselves when their last user lets go.) The manager runs it every
/// `Settings::sweep_interval`.
pub fn forget_unused(ctx: &Context, clusters: &[Arc<LibvirtCluster>], machines: &[Arc<LibvirtMachine>]) {
    let cluster_hosts: Vec<(Option<String>, crate::api::ClusterHost)> =
        clusters.iter().flat_map(|lc| lc.spec.hosts().into_iter().map(|h| (lc.namespace(), h))).collect();
    let uris: HashSet<&str> = cluster_hosts
        .iter()
        .map(|(_, h)| h.uri.as_str())
        .chain(machines.iter().filter_map(|lm| lm.status.as_ref()?.host_uri.as_deref()))
        .collect();
    // Credentials Secrets no LibvirtCluster and no LibvirtMachine's status names.
    let secrets: HashSet<(Option<String>, &str)> = cluster_hosts
        .iter()
        .filter_map(|(ns, h)| Some((ns.clone(), h.credentials.as_deref()?)))
        .chain(
            machines
                .iter()
                .filter_map(|lm| Some((lm.namespace(), lm.status.as_ref()?.credentials_ref.as_ref()?.name.as_str()))),
        )
        .collect();
    ctx.credentials.forget(|ns, name| secrets.contains(&(Some(ns.to_string()), name)));
    // A URI with credential files is kept while they are the Secret's current ones.
    let forgotten = ctx.connections.forget_hosts(|uri| uris.contains(uri) || ctx.credentials.is_current(uri));
    let held: HashSet<String> = ctx.connections.host_uris().into_iter().collect();
    ctx.opened_uris.lock().expect("opened URIs lock").retain(|opened, _| held.contains(opened));
    let uids: HashSet<String> = machines.iter().filter_map(|lm| lm.metadata.uid.clone()).collect();
    ctx.seen_machines.retain(|uid| uids.contains(uid));
    ctx.placements.retain(|uid| uids.contains(uid));
    ctx.expected_events.forget_old();
    let mut waits = ctx.lease_waits.lock().expect("lease backoff lock");
    waits.retain(|uid, _| uids.contains(uid));
    if forgotten > 0 {
        tracing::info!(hosts = forgotten, "closed the connections of hosts no object names any more");
    }
}

/// The end of a controller's stream: an error of one reconcile is logged at
/// debug level (the error policy has already put it on the object's
/// conditions and events).
async fn log_error<T, E: std::fmt::Display>(result: Result<T, E>, controller: &'static str) {
    if let Err(err) = result {
        tracing::debug!(%err, controller, "controller event");
    }
}
