//! What every reconcile shares: the [`Context`] (the API client, the host
//! connections, the event recorder, the manager's [`Settings`], metrics,
//! credentials and the reconcilers' memory between reconciles) and the watch
//! caches a LibvirtMachine's reconcile reads its inputs from.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use capl_host::credentials::CredentialStore;
use capl_host::domain_xml::DomainTypePreference;
use capl_host::hypervisor::connections::Connections;
use capl_host::uri_policy::UriPolicy;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};

use super::error::Error;
use super::reservations::Reservations;
use super::{machine_decision, metrics, own_changes};
use crate::api::LibvirtCluster;
use crate::api::capi::{Cluster, Machine};
use crate::image::{DownloadSettings, ImageDownloads};

/// How often [`super::forget_unused`] runs by default.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(300);
/// How often a running, healthy LibvirtMachine is looked at without a reason,
/// by default (`--resync-interval`). Its domain's lifecycle events bring it
/// back at once when the domain changes on the host, and a reconnect re-lists
/// the host's machines; the resync only covers events that were lost some
/// other way.
pub const DEFAULT_RESYNC_INTERVAL: Duration = Duration::from_secs(600);
/// Bounds of the interval between looks at a guest that has no lease yet.
const LEASE_LOOK_MIN: Duration = Duration::from_secs(2);
const LEASE_LOOK_MAX: Duration = Duration::from_secs(10);

/// Name the controller reports events and field managers under.
pub const CONTROLLER_NAME: &str = "cluster-api-provider-libvirt";

/// Knobs of the manager that reach the reconcilers.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Watch only this namespace; `None` watches all.
    pub namespace: Option<String>,
    /// kvm, qemu, or auto (kvm when the host offers it).
    pub domain_type: DomainTypePreference,
    /// When set, each domain's serial console is also logged to `<dir>/<domain>-console.log` on the host.
    pub console_log_dir: Option<String>,
    /// Reconciles running at once, per controller.
    pub concurrency: u16,
    /// Which libvirt URIs a LibvirtCluster may name.
    pub uri_policy: UriPolicy,
    /// How often per-host and per-machine state no object refers to any more
    /// is forgotten ([`super::forget_unused`]).
    pub sweep_interval: Duration,
    /// How often a running, healthy machine is looked at without an event
    /// ([`DEFAULT_RESYNC_INTERVAL`]).
    pub resync_interval: Duration,
    /// Where the credentials of `credentialsRef` Secrets are written
    /// (`--credentials-scratch-dir`); see [`capl_host::credentials`].
    pub credentials_scratch_dir: std::path::PathBuf,
    /// The bounds of base image downloads (spec.imageURL).
    pub image_downloads: DownloadSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: None,
            domain_type: DomainTypePreference::Auto,
            console_log_dir: None,
            concurrency: 10,
            uri_policy: UriPolicy::default(),
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            resync_interval: DEFAULT_RESYNC_INTERVAL,
            credentials_scratch_dir: capl_host::credentials::DEFAULT_SCRATCH_DIR.into(),
            image_downloads: DownloadSettings::default(),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub connections: Arc<Connections>,
    pub recorder: Recorder,
    pub settings: Settings,
    pub metrics: metrics::Metrics,
    /// The credentials of `credentialsRef` Secrets, written as files for libvirt.
    pub credentials: Arc<CredentialStore>,
    /// Since when a running domain has been waiting for its lease, per LibvirtMachine UID.
    pub(super) lease_waits: Mutex<HashMap<String, std::time::Instant>>,
    /// When a reservation on a network (URI, network) was last written again
    /// for a guest waiting for its lease.
    lease_refreshes: Mutex<HashMap<(String, String), std::time::Instant>>,
    /// The URI each opened URI stands for (they differ by the files of a
    /// credentials Secret), for re-listing a host's machines after a reconnect.
    pub(super) opened_uris: Mutex<HashMap<String, String>>,
    /// The watch caches the LibvirtMachine reconciler reads its inputs from
    /// (set by [`super::run`]; without them, as in tests that call a reconciler
    /// directly, every input is read from the API server).
    pub(super) inputs: OnceLock<InputCaches>,
    /// What the LibvirtMachine watch last passed on, and the reconciler's own writes.
    pub(crate) seen_machines: Arc<own_changes::SeenObjects>,
    /// The lifecycle events the LibvirtMachine reconciler's own host actions bring.
    pub(crate) expected_events: Arc<own_changes::ExpectedEvents>,
    /// Memory of machines placed on a host and not yet counted by it.
    pub placements: Reservations,
    /// The base images being downloaded (spec.imageURL), one download per host, pool and checksum.
    pub images: Arc<ImageDownloads>,
}

/// Reflector stores of the objects a LibvirtMachine's reconcile reads: its
/// Machine, Cluster and LibvirtCluster. Each is kept current by a watch the
/// controller runs anyway to map changes to LibvirtMachines, so a reconcile
/// costs no GET for them (with 1,000 machines, three GETs per reconcile were
/// most of the manager's requests). An object not (yet) in its store is read
/// from the API server.
#[derive(Clone)]
pub struct InputCaches {
    pub machines: Store<Machine>,
    pub clusters: Store<Cluster>,
    pub libvirt_clusters: Store<LibvirtCluster>,
}

/// `name` from `api`; `None` when it does not exist.
pub(crate) async fn get_optional<K>(api: &Api<K>, name: &str) -> Result<Option<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?)
}

/// `name` in `ns` from `store` when it is there, else from the API server.
pub(crate) async fn cached_or_get<K>(
    store: Option<&Store<K>>,
    api: &Api<K>,
    ns: &str,
    name: &str,
) -> Result<Option<K>, Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(found) = store.and_then(|store| store.get(&ObjectRef::new(name).within(ns))) {
        return Ok(Some((*found).clone()));
    }
    get_optional(api, name).await
}

impl Context {
    pub fn new(client: Client, connections: Arc<Connections>, settings: Settings, metrics: metrics::Metrics) -> Self {
        let reporter = Reporter { controller: CONTROLLER_NAME.into(), instance: std::env::var("POD_NAME").ok() };
        let recorder = Recorder::new(client.clone(), reporter);
        let credentials = Arc::new(CredentialStore::new(&settings.credentials_scratch_dir));
        let images = Arc::new(ImageDownloads::new(settings.image_downloads.clone()));
        Self {
            client,
            connections,
            recorder,
            settings,
            metrics,
            credentials,
            lease_waits: Mutex::new(HashMap::new()),
            lease_refreshes: Mutex::new(HashMap::new()),
            opened_uris: Mutex::new(HashMap::new()),
            inputs: OnceLock::new(),
            seen_machines: Arc::default(),
            expected_events: Arc::default(),
            placements: Reservations::default(),
            images,
        }
    }

    /// The watch caches of the LibvirtMachine reconciler's inputs, once [`super::run`] set them.
    pub fn inputs(&self) -> Option<&InputCaches> {
        self.inputs.get()
    }

    /// Notes that `opened` was opened for the host the objects name `uri`.
    pub(super) fn note_opened_uri(&self, opened: &str, uri: &str) {
        if opened != uri {
            let mut uris = self.opened_uris.lock().expect("opened URIs lock");
            if uris.get(opened).is_none_or(|known| known != uri) {
                uris.insert(opened.to_string(), uri.to_string());
            }
        }
    }

    /// The URI the objects name for the host opened as `opened`.
    pub(super) fn user_uri(&self, opened: &str) -> String {
        self.opened_uris.lock().expect("opened URIs lock").get(opened).cloned().unwrap_or_else(|| opened.to_string())
    }

    /// When to look again while a guest has no lease yet: half the time it
    /// has waited so far, between 2 and 10 seconds. It depends on the time
    /// waited, not on the number of reconciles, so reconciles triggered by
    /// our own status writes do not stretch it.
    pub(super) fn lease_backoff(&self, uid: &str) -> Duration {
        let mut waits = self.lease_waits.lock().expect("lease backoff lock");
        let since = waits.entry(uid.to_string()).or_insert_with(std::time::Instant::now);
        (since.elapsed() / 2).clamp(LEASE_LOOK_MIN, LEASE_LOOK_MAX)
    }

    /// How long the machine's guest has been waiting for its lease (zero when it is not).
    pub(super) fn lease_waited(&self, uid: &str) -> Duration {
        self.lease_waits.lock().expect("lease backoff lock").get(uid).map(|since| since.elapsed()).unwrap_or_default()
    }

    /// Whether a reservation on `network` of `uri` may be written again now:
    /// true, and noted, when none was in the last
    /// [`machine_decision::LEASE_REFRESH_AFTER`]. One refresh serves every
    /// guest of the network (it restarts the network's dnsmasq), so however
    /// many wait, the network is refreshed at most that often.
    pub(super) fn claim_lease_refresh(&self, uri: &str, network: &str) -> bool {
        let every = machine_decision::LEASE_REFRESH_AFTER;
        let mut refreshes = self.lease_refreshes.lock().expect("lease refresh lock");
        refreshes.retain(|_, at| at.elapsed() < every);
        let key = (uri.to_string(), network.to_string());
        if refreshes.contains_key(&key) {
            return false;
        }
        refreshes.insert(key, std::time::Instant::now());
        true
    }

    pub(super) fn lease_found(&self, uid: &str) {
        self.lease_waits.lock().expect("lease backoff lock").remove(uid);
    }

    /// How many machines this process is waiting on for a lease (for tests and metrics).
    pub fn lease_waits(&self) -> usize {
        self.lease_waits.lock().expect("lease backoff lock").len()
    }

    /// Publishes an event on `object`; failures to publish are logged, not fatal.
    pub(super) async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: (!note.is_empty()).then(|| note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%err, object = %object.meta().name.clone().unwrap_or_default(), "cannot publish event");
        }
    }
}
