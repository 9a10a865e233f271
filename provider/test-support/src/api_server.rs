//! The reconciler tests' world: the real kube-apiserver of `testenv` with
//! CAPI's and our CRDs, one namespace per test, one simulated libvirt host per
//! test (registered under a unique URI), and the real controllers running
//! in-process against both, scoped to the test's namespace.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use capl::api::builders::ObjectBuilder;
use capl::api::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtClusterSpec, LibvirtMachine, LibvirtMachineSpec};
use capl::controller::metrics::Metrics;
use capl::controller::{self, Context, Settings, UriPolicy};
use capl_host::DomainTypePreference;
use capl_host::hypervisor::connections::{Connections, DEFAULT_MAX_CALLS_PER_HOST};
use capl_host::hypervisor::sim::{SimConnector, SimHypervisor};
use capl_host::hypervisor::{HostAdmin, Hypervisor};
use capl_host::network_xml::parse_network;
use capl_testbed::wait::{self, Bound, Check, Stop};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use testenv::TestEnv;
use tokio::sync::OnceCell;

pub use capl_host::sim_host::{BASE_IMAGE, BASE_POOL, DOMAIN_POOL, NETWORK};

/// How long any wait may take on a loaded 2-core machine before the test fails.
pub const WAIT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(250);
const FIELD_MANAGER: &str = "reconcile-tests";
/// The control-plane endpoint the fixtures use.
pub const ENDPOINT_HOST: &str = "192.168.122.10";
pub const ENDPOINT_PORT: i32 = 6443;

/// A fresh connection cache over the simulator, for a manager outside a [`World`].
pub fn sim_connections() -> Arc<Connections> {
    Arc::new(Connections::new(Arc::new(SimConnector), DEFAULT_MAX_CALLS_PER_HOST))
}

/// One test's world.
pub struct World {
    pub env: &'static TestEnv,
    pub client: Client,
    pub ns: String,
    /// The simulated libvirt host of this test.
    pub host: libvirt_sim::Host,
    pub uri: String,
    /// The host's call counts once it was set up (network, pools, base image).
    pub setup_calls: BTreeMap<String, u64>,
}

static CRDS: OnceCell<()> = OnceCell::const_new();

impl World {
    /// A fresh namespace and simulated host. The CAPI and project CRDs are
    /// installed once per test process. Fails (never skips) when the local
    /// control plane is missing; testenv's error names the build command.
    pub async fn new(prefix: &str) -> Self {
        let env = TestEnv::shared()
            .await
            .unwrap_or_else(|e| panic!("the reconciler tests need the local kube-apiserver and etcd: {e:#}"));
        CRDS.get_or_init(|| async {
            env.install_capi_crds().await.unwrap_or_else(|e| panic!("installing CAPI's CRDs: {e:#}"));
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/crd/bases");
            env.install_crds_from_dir(&dir).await.unwrap_or_else(|e| {
                panic!("installing the project's CRDs from {}: {e:#} (run `cargo xtask manifests`)", dir.display())
            });
        })
        .await;
        let ns = env.unique_namespace(prefix).await.unwrap_or_else(|e| panic!("creating a namespace: {e:#}"));
        // The CRD admits qemu:// and test:// URIs only; the simulator answers any string.
        let uri = format!("qemu+tcp://sim-{ns}/system");
        let host =
            capl_host::sim_host::register(&uri).unwrap_or_else(|e| panic!("building the simulated host {uri}: {e}"));
        let mut world = Self { env, client: env.client(), ns, host, uri, setup_calls: BTreeMap::new() };
        world.setup_calls = world.calls();
        world
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A fresh connection cache over the simulator (what a new manager process would have).
    pub fn connections(&self) -> Arc<Connections> {
        sim_connections()
    }

    /// Starts the controllers for this namespace with a fresh connection cache.
    pub fn start_manager(&self) -> Manager {
        Manager::start(self.client.clone(), &self.ns, self.connections())
    }

    /// A connection to the simulated host for looking at it (it counts on the host's counters).
    pub fn inspect(&self) -> SimHypervisor {
        SimHypervisor::connect(&self.uri).unwrap_or_else(|e| panic!("connecting to {}: {e}", self.uri))
    }

    /// Server-side applies `object` (complete, with apiVersion and kind: a
    /// typed object or a JSON document) and returns it as stored.
    pub async fn apply<K>(&self, object: impl serde::Serialize) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let object = serde_json::to_value(object).expect("an object serializes to JSON");
        let name = object["metadata"]["name"].as_str().expect("object has metadata.name").to_string();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.api::<K>()
            .patch(&name, &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("applying {} {name}: {e}\n{object:#}", K::kind(&())))
    }

    /// Merge-patches the status subresource of `name`.
    pub async fn patch_status<K>(&self, name: &str, status: Value) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        self.api::<K>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .unwrap_or_else(|e| panic!("patching the status of {} {name}: {e}", K::kind(&())))
    }

    /// Merge-patches `name` (spec, metadata).
    pub async fn merge<K>(&self, name: &str, patch: Value) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        self.api::<K>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_or_else(|e| panic!("patching {} {name}: {e}", K::kind(&())))
    }

    pub async fn delete<K>(&self, name: &str)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        self.api::<K>()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {} {name}: {e}", K::kind(&())));
    }

    /// Polls `name` until `ready` holds; on timeout fails with `what` and the object last seen.
    pub async fn wait_for<K>(&self, name: &str, what: &str, ready: impl Fn(&K) -> bool) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + serde::Serialize,
    {
        self.wait_for_within(WAIT, name, what, ready).await
    }

    /// [`World::wait_for`] with its own deadline, for a step that must happen
    /// before some periodic fallback would make it happen anyway.
    pub async fn wait_for_within<K>(&self, deadline: Duration, name: &str, what: &str, ready: impl Fn(&K) -> bool) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + serde::Serialize,
    {
        let api = self.api::<K>();
        let outcome = wait::until(Bound::new(deadline, POLL), || async {
            Ok::<_, kube::Error>(match api.get_opt(name).await? {
                Some(object) if ready(&object) => Check::Done(object),
                Some(object) => Check::Pending(serde_json::to_string_pretty(&object).unwrap()),
                None => Check::Pending("(absent)".into()),
            })
        })
        .await;
        match outcome {
            Ok(object) => object,
            Err(Stop::Failed(e)) => panic!("reading {} {name}: {e}", K::kind(&())),
            Err(Stop::TimedOut(seen)) => {
                panic!("{} {}/{name}: timed out waiting for {what}; last seen:\n{seen}", K::kind(&()), self.ns)
            }
        }
    }

    /// Polls until `name` no longer exists.
    pub async fn wait_gone<K>(&self, name: &str)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + serde::Serialize,
    {
        let api = self.api::<K>();
        let outcome = wait::until(Bound::new(WAIT, POLL), || async {
            Ok::<_, kube::Error>(match api.get_opt(name).await? {
                Some(object) => Check::Pending(serde_json::to_string_pretty(&object).unwrap()),
                None => Check::Done(()),
            })
        })
        .await;
        match outcome {
            Ok(()) => {}
            Err(Stop::Failed(e)) => panic!("reading {name}: {e}"),
            Err(Stop::TimedOut(object)) => panic!("{} {}/{name} was not removed:\n{object}", K::kind(&()), self.ns),
        }
    }

    /// Polls the simulated host until `ready` holds.
    pub async fn wait_host(&self, what: &str, ready: impl Fn(&SimHypervisor) -> bool) {
        let hv = self.inspect();
        let outcome = wait::until(Bound::new(WAIT, POLL), || async { Ok::<_, Infallible>(ready(&hv).into()) }).await;
        if outcome.is_err() {
            panic!("host {}: timed out waiting for {what}; host holds {:?}", self.uri, self.host_objects());
        }
    }

    /// The events regarding object `name`: (type, reason, note).
    pub async fn events(&self, name: &str) -> Vec<(String, String, String)> {
        let events: Api<Event> = self.api();
        events
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing events in {}: {e}", self.ns))
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Polls until an event regarding `name` with `reason` and `note` exists.
    pub async fn wait_event(&self, name: &str, type_: &str, reason: &str, note: &str) {
        let outcome = wait::until(Bound::new(WAIT, POLL), || async {
            let events = self.events(name).await;
            Ok::<_, Infallible>(if events.iter().any(|(t, r, n)| t == type_ && r == reason && n == note) {
                Check::Done(())
            } else {
                Check::Pending(format!("{events:#?}"))
            })
        })
        .await;
        if let Err(Stop::TimedOut(events)) = outcome {
            panic!("no {type_} event {reason} {note:?} regarding {name}; events: {events}");
        }
    }

    /// What the host holds: domains, volumes of the domain pool, DHCP hosts of the network.
    pub fn host_objects(&self) -> HostObjects {
        let hv = self.inspect();
        let mut domains = hv.domain_list().expect("list domains");
        domains.sort();
        let mut volumes = hv.volume_list(DOMAIN_POOL).expect("list volumes");
        volumes.sort();
        let network = parse_network(&hv.network_xml(NETWORK).expect("network XML")).expect("parse network XML");
        let mut dhcp_hosts: Vec<String> = network
            .ipv4
            .map(|v4| {
                v4.hosts
                    .into_iter()
                    .map(|h| format!("{} {}", h.mac.unwrap_or_default(), h.name.unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        dhcp_hosts.sort();
        HostObjects { domains, volumes, dhcp_hosts }
    }

    /// The calls made on the simulated host so far, by operation (zero counts left out).
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.host
            .counters()
            .snapshot()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(op, n)| (format!("{op:?}"), n))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostObjects {
    pub domains: Vec<String>,
    pub volumes: Vec<String>,
    pub dhcp_hosts: Vec<String>,
}

impl World {
    /// The calls made on the simulated host since it was set up, by operation.
    pub fn calls_since_setup(&self) -> BTreeMap<String, u64> {
        call_delta(&self.setup_calls, &self.calls())
    }
}

/// `after - before`, per operation, zero differences left out.
pub fn call_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d))
        })
        .collect()
}

/// The controllers of one "manager process", scoped to one namespace.
pub struct Manager {
    task: tokio::task::JoinHandle<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub connections: Arc<Connections>,
    pub metrics: Metrics,
    pub ctx: Arc<Context>,
}

/// The settings of a test manager for namespace `ns`.
pub fn manager_settings(ns: &str) -> Settings {
    Settings {
        namespace: Some(ns.to_string()),
        // The simulator offers no KVM, as on these machines.
        domain_type: DomainTypePreference::Qemu,
        console_log_dir: None,
        concurrency: 4,
        // Credentials of credentialsRef Secrets: a directory of this test's own.
        credentials_scratch_dir: std::env::temp_dir().join(format!("capl-credentials-{ns}")),
        ..Settings::default()
    }
}

impl Manager {
    pub fn start(client: Client, ns: &str, connections: Arc<Connections>) -> Self {
        Self::start_with_policy(client, ns, connections, UriPolicy::default())
    }

    /// [`Manager::start`] with the URI policy of `--allow-unsafe-uris`/`--credentials-dir`.
    pub fn start_with_policy(client: Client, ns: &str, connections: Arc<Connections>, uri_policy: UriPolicy) -> Self {
        Self::start_with_settings(client, connections, Settings { uri_policy, ..manager_settings(ns) })
    }

    pub fn start_with_settings(client: Client, connections: Arc<Connections>, settings: Settings) -> Self {
        let metrics = Metrics::default();
        let ctx = Arc::new(Context::new(client, connections.clone(), settings, metrics.clone()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = stopped.map(|_| ()).shared();
        let task = tokio::spawn(controller::run(ctx.clone(), shutdown));
        Self { task, stop: Some(stop), connections, metrics, ctx }
    }

    /// Reconciles run so far by `controller` ("libvirtcluster" or "libvirtmachine").
    pub fn reconciles(&self, controller: &str) -> u64 {
        let wanted = format!("capl_reconciles_total{{controller=\"{controller}\"}} ");
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&wanted).map(|n| n.trim().parse::<u64>().expect("a counter value")))
            .unwrap_or(0)
    }

    /// The value of the counter `metric` (its exposition name with labels,
    /// e.g. `capl_domain_events_total{outcome="reconcile"}`); 0 before its first count.
    pub fn counter(&self, metric: &str) -> u64 {
        let wanted = format!("{metric} ");
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&wanted).map(|n| n.trim().parse::<u64>().expect("a counter value")))
            .unwrap_or(0)
    }

    /// Domain events that reconciled a LibvirtMachine (`ours`) or were ignored.
    pub fn domain_events(&self, ours: bool) -> u64 {
        let outcome = if ours { "reconcile" } else { "ignored" };
        self.counter(&format!("capl_domain_events_total{{outcome=\"{outcome}\"}}"))
    }

    /// Domain events of a LibvirtMachine's domain that its reconciler's own
    /// create or start caused (they reconcile nothing).
    pub fn own_domain_events(&self) -> u64 {
        self.counter("capl_domain_events_total{outcome=\"own\"}")
    }

    /// Waits until no LibvirtMachine reconcile has run for 5 s; returns the count.
    pub async fn settle(&self) -> u64 {
        let mut reconciles = self.reconciles("libvirtmachine");
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let now = self.reconciles("libvirtmachine");
            if now == reconciles {
                return now;
            }
            reconciles = now;
        }
    }

    /// Kills the manager the hard way: the task is dropped wherever it is.
    pub async fn kill(mut self) {
        self.stop.take();
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The named condition of a condition list.
pub fn condition<'a>(conditions: &'a Option<Vec<Condition>>, type_: &str) -> Option<&'a Condition> {
    conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

pub fn cluster_conditions(lc: &LibvirtCluster) -> &Option<Vec<Condition>> {
    static NONE: Option<Vec<Condition>> = None;
    lc.status.as_ref().map(|s| &s.conditions).unwrap_or(&NONE)
}

pub fn machine_conditions(lm: &LibvirtMachine) -> &Option<Vec<Condition>> {
    static NONE: Option<Vec<Condition>> = None;
    lm.status.as_ref().map(|s| &s.conditions).unwrap_or(&NONE)
}

/// Whether condition `type_` has `status` (and `reason`, when given).
pub fn has(conditions: &Option<Vec<Condition>>, type_: &str, status: &str, reason: Option<&str>) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == status && reason.is_none_or(|r| c.reason == r))
}

// --- the objects, complete as CAPI would write them (its webhooks are not installed) ---

/// A v1beta2 Cluster whose infrastructure is LibvirtCluster `lc`.
pub fn cluster_json(name: &str, lc: &str, endpoint: bool) -> Value {
    let mut cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": name },
        "spec": {
            "clusterNetwork": { "pods": { "cidrBlocks": ["10.244.0.0/16"] }, "services": { "cidrBlocks": ["10.96.0.0/12"] } },
            "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtCluster", "name": lc },
        },
    });
    if endpoint {
        cluster["spec"]["controlPlaneEndpoint"] = json!({ "host": ENDPOINT_HOST, "port": ENDPOINT_PORT });
    }
    cluster
}

/// A LibvirtCluster on host `uri` with the simulated host's network and
/// pools, owned by Cluster `cluster` (name, uid) as CAPI would set it.
pub fn libvirt_cluster(name: &str, uri: &str, cluster: Option<(&str, &str)>) -> LibvirtCluster {
    let lc = LibvirtCluster::from_spec(name, LibvirtClusterSpec::one_host(uri, NETWORK, BASE_POOL, DOMAIN_POOL));
    match cluster {
        Some((cluster, uid)) => lc.controlled_by::<Cluster>(cluster, uid).of_cluster(cluster),
        None => lc,
    }
}

/// [`libvirt_cluster`] as a JSON document, for a test that changes it
/// (into shapes the types may not allow) before applying it.
pub fn libvirt_cluster_json(name: &str, uri: &str, cluster: Option<(&str, &str)>) -> Value {
    document(&libvirt_cluster(name, uri, cluster))
}

/// A Machine of `cluster` whose infrastructure is LibvirtMachine `lm`.
pub fn machine_json(name: &str, cluster: &str, lm: &str, data_secret: Option<&str>) -> Value {
    let mut bootstrap =
        json!({ "configRef": { "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": name } });
    if let Some(secret) = data_secret {
        bootstrap["dataSecretName"] = json!(secret);
    }
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": { "name": name, "labels": { CLUSTER_NAME_LABEL: cluster } },
        "spec": {
            "clusterName": cluster,
            "bootstrap": bootstrap,
            "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtMachine", "name": lm },
            "version": "v1.33.0",
        },
    })
}

/// A LibvirtMachine of `cluster` (1 vCPU, 512 MiB, a 10 GiB disk over the
/// simulated host's base image), owned by Machine `machine` (name, uid) as
/// CAPI would set it.
pub fn libvirt_machine(name: &str, cluster: &str, machine: Option<(&str, &str)>) -> LibvirtMachine {
    let lm = LibvirtMachine::from_spec(name, LibvirtMachineSpec::sized(BASE_IMAGE, 1, 512, 10)).of_cluster(cluster);
    match machine {
        Some((machine, uid)) => lm.controlled_by::<Machine>(machine, uid),
        None => lm,
    }
}

/// [`libvirt_machine`] as a JSON document, for a test that changes it
/// (into shapes the types may not allow) before applying it.
pub fn libvirt_machine_json(name: &str, cluster: &str, machine: Option<(&str, &str)>) -> Value {
    document(&libvirt_machine(name, cluster, machine))
}

/// A typed object as the JSON document it is sent as.
fn document(object: &impl serde::Serialize) -> Value {
    serde_json::to_value(object).expect("an object serializes to JSON")
}

/// A bootstrap data Secret as CAPI's bootstrap providers write it.
pub async fn create_bootstrap_secret(w: &World, name: &str, data: BTreeMap<String, String>) -> Secret {
    let secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        type_: Some("cluster.x-k8s.io/secret".into()),
        string_data: Some(data),
        ..Default::default()
    };
    w.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating Secret {name}: {e}"))
}

pub fn cloud_config(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("value".to_string(), format!("#cloud-config\nhostname: {name}\n")),
        ("format".to_string(), "cloud-config".to_string()),
    ])
}

/// The objects of a cluster as CAPI leaves them once its infrastructure is
/// provisioned: Cluster (infrastructureProvisioned through /status) and
/// LibvirtCluster. Returns the Cluster's UID.
pub async fn provisioned_cluster(w: &World, cluster: &str) -> String {
    provisioned_cluster_on(w, cluster, &w.uri).await
}

/// [`provisioned_cluster`] on the host `uri`.
pub async fn provisioned_cluster_on(w: &World, cluster: &str, uri: &str) -> String {
    let lc_name = format!("{cluster}-lc");
    let c: Cluster = w.apply(cluster_json(cluster, &lc_name, true)).await;
    let uid = c.uid().expect("a stored Cluster has a UID");
    let _: LibvirtCluster = w.apply(libvirt_cluster(&lc_name, uri, Some((cluster, &uid)))).await;
    let _: Cluster = w.patch_status(cluster, json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    uid
}

/// Machine + LibvirtMachine (owned by it) of `cluster`, with bootstrap Secret
/// `<name>-bootstrap` when `data_secret` says so (it is not created here).
pub async fn machine_pair(
    w: &World,
    cluster: &str,
    name: &str,
    data_secret: Option<&str>,
) -> (Machine, LibvirtMachine) {
    let m: Machine = w.apply(machine_json(name, cluster, name, data_secret)).await;
    let uid = m.uid().expect("a stored Machine has a UID");
    let lm: LibvirtMachine = w.apply(libvirt_machine(name, cluster, Some((name, &uid)))).await;
    (m, lm)
}

/// Everything CAPI would have written for one machine, Secret included.
pub async fn ready_machine_objects(w: &World, cluster: &str, name: &str) -> LibvirtMachine {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    machine_pair(w, cluster, name, Some(&secret)).await.1
}

/// The domain name the provider gives LibvirtMachine `name` (which must
/// exist) in the test's namespace: it derives from the machine's identity.
pub async fn domain_of(w: &World, name: &str) -> String {
    let lm: LibvirtMachine = w.api().get(name).await.unwrap_or_else(|e| panic!("LibvirtMachine {name}: {e}"));
    let identity = capl::controller::machine::machine_identity(&lm).expect("a valid identity");
    capl_host::naming::domain_name(&w.ns, name, &identity)
}

/// Whether `domain` is a domain name the provider could give LibvirtMachine
/// `name` in the test's namespace, whatever its identity.
pub fn is_domain_of(w: &World, name: &str, domain: &str) -> bool {
    domain.strip_prefix(&format!("{}-{name}-", w.ns)).is_some_and(|hash| hash.len() == capl_host::naming::HASH_LEN)
}

/// Whether a LibvirtMachine is fully provisioned as a user would check it.
pub fn machine_ready(lm: &LibvirtMachine) -> bool {
    let c = machine_conditions(lm);
    let addressed = lm
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"));
    addressed
        && lm.spec.provider_id.is_some()
        && lm.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.provisioned) == Some(true)
        && has(c, "Ready", "True", None)
}

/// The manager binary started by a test, with its output in `log`; killed
/// when dropped.
pub struct ManagerProcess {
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
}

impl ManagerProcess {
    /// The last 40 lines of the manager's output, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
