//! Remediation by reboot through CAPI's own MachineHealthCheck and
//! MachineSet controllers (CAPI core with its webhooks, on an API server of
//! its own: CAPI's MachineSet controller cannot watch a provider's kind when
//! its cache is limited to one namespace), with a simulated host. The workload cluster is a second kube-apiserver whose
//! admin kubeconfig is the Cluster's `<cluster>-kubeconfig` Secret; the test
//! plays its kubelets: a Node with each machine's providerID, Ready or not.
//!
//! The MachineHealthCheck names a LibvirtRemediationTemplate. A worker whose
//! Node turns NotReady gets a LibvirtRemediation; the provider resets its
//! domain; the Node Ready again (the kubelet back after the reboot) makes the
//! MachineHealthCheck delete the LibvirtRemediation, and the Machine stays.
//! When its Node stays NotReady, the provider gives up after the reboot's
//! timeout and the MachineSet replaces the Machine.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::{
    BASE_IMAGE, Manager, call_delta, cloud_config, cluster_json, libvirt_cluster, libvirt_machine, machine_json,
    sim_connections,
};
use capl::api::{LibvirtMachine, LibvirtMachineSpec, LibvirtMachineTemplate, LibvirtRemediation};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// From a step to CAPI's reaction: its cluster cache may take 30 s to reach
/// the workload API server, its controllers requeue within seconds.
const CAPI_REACTS: Duration = Duration::from_secs(240);

fn capi(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind), plural)
}

/// The test's own control plane with CAPI core, a namespace and a simulated host.
struct Lab {
    /// Kept alive for the test: its API server and etcd stop when it is dropped.
    _env: testenv::TestEnv,
    client: Client,
    ns: String,
    host: libvirt_sim::Host,
    uri: String,
}

impl Lab {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn apply<K>(&self, object: impl serde::Serialize) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let object = serde_json::to_value(object).unwrap();
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        self.api::<K>()
            .patch(&name, &PatchParams::apply("mhc-test").force(), &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("applying {name}: {e}"))
    }

    /// The calls made on the simulated host so far, by operation.
    fn calls(&self) -> BTreeMap<String, u64> {
        self.host.counters().snapshot().into_iter().map(|(op, n)| (format!("{op:?}"), n)).collect()
    }
}

fn machines(w: &Lab) -> Api<DynamicObject> {
    Api::namespaced_with(w.client.clone(), &w.ns, &capi("Machine", "machines"))
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The kubelet of `name`, played: the Node with `provider_id`, Ready or not.
async fn play_node(workload: &Client, name: &str, provider_id: &str, ready: bool) {
    let nodes: Api<Node> = Api::all(workload.clone());
    if nodes.get_opt(name).await.unwrap().is_none() {
        let node: Node =
            serde_json::from_value(json!({ "metadata": { "name": name }, "spec": { "providerID": provider_id } }))
                .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
    }
    let (status, reason) = if ready { ("True", "KubeletReady") } else { ("False", "KubeletNotReady") };
    let condition = json!({ "status": { "conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": "played by the test",
        "lastHeartbeatTime": now(), "lastTransitionTime": now(),
    }] } });
    nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&condition)).await.unwrap();
}

/// Polls `check` until it returns Some, failing with `what` and the last state after `within`.
async fn until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(found) => return found,
            Err(state) if started.elapsed() > within => panic!("timed out waiting for {what}; last: {state}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The one Machine of the MachineSet `md-0`: (name, UID).
async fn worker_machine(w: &Lab) -> Result<(String, String), String> {
    let list = machines(w).list(&Default::default()).await.unwrap();
    let workers: Vec<&DynamicObject> = list
        .items
        .iter()
        .filter(|m| m.labels().get("pool").map(String::as_str) == Some("md-0"))
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    match workers.as_slice() {
        [one] => Ok((one.name_any(), one.uid().unwrap())),
        other => {
            Err(format!("{} live workers: {:?}", other.len(), other.iter().map(|m| m.name_any()).collect::<Vec<_>>()))
        }
    }
}

/// The providerID of the LibvirtMachine of Machine `machine`, once set.
async fn provider_id_of(w: &Lab, machine: &str) -> Result<String, String> {
    let m = machines(w).get(machine).await.map_err(|e| e.to_string())?;
    let lm_name = m.data["spec"]["infrastructureRef"]["name"].as_str().ok_or("no infrastructureRef yet")?.to_string();
    let lm: LibvirtMachine = w.api().get(&lm_name).await.map_err(|e| e.to_string())?;
    lm.spec.provider_id.ok_or_else(|| format!("LibvirtMachine {lm_name} has no providerID yet"))
}

async fn node_ref(w: &Lab, machine: &str) -> Result<String, String> {
    let m = machines(w).get(machine).await.map_err(|e| e.to_string())?;
    m.data["status"]["nodeRef"]["name"].as_str().map(str::to_string).ok_or_else(|| format!("{:#}", m.data["status"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_health_check_has_a_worker_rebooted_then_replaced_by_its_machine_set() {
    let env = testenv::TestEnv::start().await.expect("local control plane (run `cargo xtask control-plane build`)");
    let capi_manager = env.start_capi(testenv::CapiOptions::new()).await.unwrap_or_else(|e| panic!("CAPI core: {e:#}"));
    env.install_crds_from_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases"))
        .await
        .unwrap();
    let ns = env.unique_namespace("rr-mhc").await.unwrap();
    let uri = format!("qemu+tcp://sim-{ns}/system");
    let host = capl_host::sim_host::register(&uri).unwrap_or_else(|e| panic!("{uri}: {e}"));
    let w = Lab { client: env.client(), _env: env, ns, host, uri };
    let workload_env = testenv::TestEnv::start().await.expect("a second kube-apiserver, the workload cluster");
    let workload = workload_env.client();
    let _manager = Manager::start(w.client.clone(), &w.ns, sim_connections());

    // The Cluster (no control plane object: its first control-plane Machine
    // with a Node initializes it), its kubeconfig, one control-plane machine.
    let lc = "demo-lc";
    let cluster: capl::api::capi::Cluster = w.apply(cluster_json("demo", lc, true)).await;
    let _: capl::api::LibvirtCluster =
        w.apply(libvirt_cluster(lc, &w.uri, Some(("demo", &cluster.uid().unwrap())))).await;
    let kubeconfig = std::fs::read_to_string(workload_env.kubeconfig_path()).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "demo-kubeconfig", "labels": { "cluster.x-k8s.io/cluster-name": "demo" } },
        "type": "cluster.x-k8s.io/secret",
        "stringData": { "value": kubeconfig },
    }))
    .unwrap();
    w.api::<Secret>().create(&PostParams::default(), &secret).await.unwrap();
    let bootstrap: Secret = serde_json::from_value(json!({
        "metadata": { "name": "bootstrap" }, "type": "cluster.x-k8s.io/secret", "stringData": cloud_config("node"),
    }))
    .unwrap();
    w.api::<Secret>().create(&PostParams::default(), &bootstrap).await.unwrap();
    let mut cp = machine_json("cp-0", "demo", "cp-0", Some("bootstrap"));
    cp["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
    let cp: capl::api::capi::Machine = w.apply(cp).await;
    let _: LibvirtMachine = w.apply(libvirt_machine("cp-0", "demo", Some(("cp-0", &cp.uid().unwrap())))).await;
    let cp_id = until(CAPI_REACTS, "cp-0's providerID", || provider_id_of(&w, "cp-0")).await;
    play_node(&workload, "cp-0", &cp_id, true).await;
    until(CAPI_REACTS, "cp-0's nodeRef", || node_ref(&w, "cp-0")).await;

    // A MachineSet of one worker, its MachineHealthCheck, the remediation template.
    let _: LibvirtMachineTemplate =
        w.apply(LibvirtMachineTemplate::stamping("workers", LibvirtMachineSpec::sized(BASE_IMAGE, 1, 512, 10))).await;
    let template_ref =
        json!({ "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtMachineTemplate", "name": "workers" });
    let machine_set = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
        "metadata": { "name": "md-0", "labels": { "cluster.x-k8s.io/cluster-name": "demo" } },
        "spec": {
            "clusterName": "demo",
            "replicas": 1,
            "selector": { "matchLabels": { "pool": "md-0" } },
            "template": {
                "metadata": { "labels": { "pool": "md-0", "cluster.x-k8s.io/cluster-name": "demo" } },
                "spec": {
                    "clusterName": "demo",
                    "bootstrap": { "dataSecretName": "bootstrap" },
                    "infrastructureRef": template_ref,
                },
            },
        },
    });
    let sets: Api<DynamicObject> = Api::namespaced_with(w.client.clone(), &w.ns, &capi("MachineSet", "machinesets"));
    sets.patch("md-0", &PatchParams::apply("mhc-test").force(), &Patch::Apply(&machine_set)).await.unwrap();
    // A reboot's timeout long enough for the MachineHealthCheck to see the
    // Node Ready again through its cluster cache (it watches the Nodes).
    let _: Value = serde_json::to_value(
        w.apply::<capl::api::LibvirtRemediationTemplate>(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtRemediationTemplate",
            "metadata": { "name": "reboot-once" },
            "spec": { "template": { "spec": { "retryLimit": 1, "timeoutSeconds": 60 } } },
        }))
        .await,
    )
    .unwrap();
    let mhc = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
        "metadata": { "name": "workers" },
        "spec": {
            "clusterName": "demo",
            "selector": { "matchLabels": { "pool": "md-0" } },
            "checks": { "unhealthyNodeConditions": [{ "type": "Ready", "status": "False", "timeoutSeconds": 1 }] },
            "remediation": {
                "triggerIf": { "unhealthyLessThanOrEqualTo": "100%" },
                "templateRef": {
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                    "kind": "LibvirtRemediationTemplate",
                    "name": "reboot-once",
                },
            },
        },
    });
    let mhcs: Api<DynamicObject> =
        Api::namespaced_with(w.client.clone(), &w.ns, &capi("MachineHealthCheck", "machinehealthchecks"));
    mhcs.patch("workers", &PatchParams::apply("mhc-test").force(), &Patch::Apply(&mhc)).await.unwrap();

    let (worker, worker_uid) = until(CAPI_REACTS, "the MachineSet's worker", || worker_machine(&w)).await;
    let worker_id = until(CAPI_REACTS, "the worker's providerID", || provider_id_of(&w, &worker)).await;
    play_node(&workload, &worker, &worker_id, true).await;
    until(CAPI_REACTS, "the worker's nodeRef", || node_ref(&w, &worker)).await;

    // 1. The worker's kubelet stops reporting Ready: rebooted, Ready again, kept.
    let before = w.calls();
    play_node(&workload, &worker, &worker_id, false).await;
    let remediations: Api<LibvirtRemediation> = w.api();
    let first = until(CAPI_REACTS, "a LibvirtRemediation rebooting the worker", || async {
        match remediations.get_opt(&worker).await.unwrap() {
            Some(r) if r.status.as_ref().and_then(|s| s.retry_count) == Some(1) => Ok(r),
            other => Err(format!("{:?}; CAPI log:\n{}", other.map(|r| r.status), capi_manager.log_tail(20))),
        }
    })
    .await;
    let owner = &first.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Machine", worker.as_str()));
    let resets = |calls: &BTreeMap<String, u64>| call_delta(&before, calls).get("DomainReset").copied();
    assert_eq!(resets(&w.calls()), Some(1));
    // The guest is back: its kubelet reports Ready, and the MachineHealthCheck ends the remediation.
    play_node(&workload, &worker, &worker_id, true).await;
    until(CAPI_REACTS, "the LibvirtRemediation deleted by the MachineHealthCheck", || async {
        match remediations.get_opt(&worker).await.unwrap() {
            None => Ok(()),
            Some(r) => Err(format!("{:?}", r.status)),
        }
    })
    .await;
    assert_eq!(worker_machine(&w).await, Ok((worker.clone(), worker_uid.clone())), "the worker was kept");
    assert_eq!(resets(&w.calls()), Some(1), "one reboot");

    // 2. NotReady again and it stays so: one reboot, then the MachineSet replaces the Machine.
    play_node(&workload, &worker, &worker_id, false).await;
    let (replacement, _) = until(CAPI_REACTS, "a new worker Machine", || async {
        match worker_machine(&w).await {
            Ok((name, uid)) if uid != worker_uid => Ok((name, uid)),
            Ok(same) => Err(format!(
                "still {same:?}; its conditions: {:#}; LibvirtRemediation: {:?}; CAPI log:\n{}",
                machines(&w).get(&worker).await.map(|m| m.data["status"]["conditions"].clone()).unwrap_or_default(),
                remediations.get_opt(&worker).await.unwrap().map(|r| r.status),
                capi_manager.log_tail(30)
            )),
            Err(e) => Err(e),
        }
    })
    .await;
    assert_ne!(replacement, worker);
    assert_eq!(resets(&w.calls()), Some(2), "one more reboot before giving up");
    let gone = machines(&w).get_opt(&worker).await.unwrap();
    assert!(gone.is_none() || gone.unwrap().metadata.deletion_timestamp.is_some(), "the old worker is deleted");
}
