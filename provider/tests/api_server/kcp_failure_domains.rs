//! A KubeadmControlPlane of three over a LibvirtCluster of three hosts: KCP
//! chooses a failure domain for each control-plane Machine (the one with the
//! fewest of its machines, among those the Cluster marks `controlPlane`), and
//! the provider puts each machine on the host of that name. Real CAPI core,
//! kubeadm bootstrap (CABPK) and control plane (KCP) managers with their
//! webhooks; the hosts are simulated.
//!
//! KCP adds a control-plane machine only when every machine it has is healthy
//! in the workload cluster, so the test plays that cluster: a second
//! kube-apiserver (with its etcd) whose client CA is the cluster CA the test
//! gives CAPI (`<cluster>-ca`), so the kubeconfig KCP makes from it is
//! accepted there. For each machine that has its providerID, the test writes
//! there what `kubeadm` and the kubelet would have: the `kubeadm-config`
//! ConfigMap once (which makes KCP initialized), a Node with the machine's
//! providerID, Ready, and the static Pods of kube-apiserver,
//! kube-controller-manager and kube-scheduler, Running and Ready. etcd is
//! external (`clusterConfiguration.etcd.external`), so KCP asks no etcd member
//! about its health; nothing else of the workload cluster is faked.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::support::{BASE_IMAGE, BASE_POOL, DOMAIN_POOL, Manager, NETWORK, sim_connections};
use capl::api::capi::CLUSTER_NAME_LABEL;
use capl::api::{
    LibvirtCluster, LibvirtClusterSpec, LibvirtHost, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineTemplate,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

const CLUSTER: &str = "trio";
const HOSTS: [&str; 3] = ["kvm-a", "kvm-b", "kvm-c"];
/// From the Cluster's creation to three Machines with a nodeRef: KCP adds one
/// machine per reconcile once the previous one is healthy, and its cluster
/// cache may wait 30 s before it first reaches the workload API server.
const SCALED: Duration = Duration::from_secs(300);
const FIELD_MANAGER: &str = "kcp-failure-domains-test";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn capi(kind: &str, plural: &str) -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", kind, plural)
}

fn kcp_resource() -> ApiResource {
    resource("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane", "kubeadmcontrolplanes")
}

/// A typed object as the document [`apply`] sends.
fn document(object: &impl serde::Serialize) -> Value {
    serde_json::to_value(object).expect("an object serializes to JSON")
}

async fn apply(client: &Client, ns: &str, ar: &ApiResource, doc: Value) {
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&doc))
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", ar.kind));
}

/// A Secret of the cluster as CAPI's certificate code reads it (labelled with
/// the cluster's name: KCP's cache holds only such Secrets).
fn cluster_secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), CLUSTER.to_string())])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        string_data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

/// The workload cluster's view of one control-plane machine: its Node (with the
/// machine's providerID, Ready) and its static Pods, Running and Ready, as the
/// kubelet reports them.
async fn play_kubelet(workload: &Client, node_name: &str, provider_id: &str) {
    let nodes: Api<Node> = Api::all(workload.clone());
    if nodes.get_opt(node_name).await.unwrap().is_none() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": node_name,
                "labels": { "node-role.kubernetes.io/control-plane": "" },
            },
            "spec": {
                "providerID": provider_id,
                "taints": [{ "key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule" }],
            },
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap_or_else(|e| panic!("creating Node {node_name}: {e}"));
        let ready = json!({ "status": { "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "played by the test",
            "lastHeartbeatTime": now(), "lastTransitionTime": now(),
        }] } });
        nodes.patch_status(node_name, &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "kube-system");
    for component in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
        let name = format!("{component}-{node_name}");
        if pods.get_opt(&name).await.unwrap().is_some() {
            continue;
        }
        let pod: Pod = serde_json::from_value(json!({
            // A mirror Pod, as the kubelet makes for a static Pod: CAPI's drain leaves it alone.
            "metadata": {
                "name": name,
                "labels": { "tier": "control-plane", "component": component },
                "annotations": { "kubernetes.io/config.mirror": "played-by-the-test" },
            },
            "spec": { "nodeName": node_name, "containers": [{ "name": component, "image": "registry.k8s.io/pause:3.10" }] },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("creating Pod {name}: {e}"));
        let running = json!({ "status": {
            "phase": "Running",
            "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": now() }],
        } });
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&running)).await.unwrap();
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_control_plane_of_three_puts_one_machine_on_each_host() {
    let env = testenv::TestEnv::start().await.expect("local control plane (run `cargo xtask control-plane build`)");
    let capi_managers = env
        .start_capi(testenv::CapiOptions::new().with_kubeadm_providers())
        .await
        .expect("CAPI core and the kubeadm managers (run `cargo xtask control-plane build`)");
    env.install_crds_from_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases"))
        .await
        .unwrap();
    let workload_env = testenv::TestEnv::start().await.expect("a second kube-apiserver, the workload cluster");
    let workload = workload_env.client();
    let ns = env.unique_namespace("kcp-fd").await.unwrap();
    let client = env.client();

    // Three hosts, each its own failure domain, room for every machine on each.
    let mut hosts = Vec::new();
    let mut host_list = Vec::new();
    for name in HOSTS {
        let uri = format!("qemu+tcp://sim-{ns}-{name}/system");
        hosts.push((
            capl_host::sim_host::register_with_memory(&uri, 8192).unwrap_or_else(|e| panic!("{uri}: {e}")),
            uri.clone(),
        ));
        host_list.push(LibvirtHost::at(name, &uri));
    }
    let _manager = Manager::start(client.clone(), &ns, sim_connections());

    // The cluster CA is the workload API server's; etcd is external, with its CA
    // and the API server's client certificate as kubeadm would be given them.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let ca = workload_env.ca();
    let etcd_ca = testenv::Pki::new_ca("trio-etcd-ca").unwrap();
    let (etcd_client_cert, etcd_client_key) = etcd_ca.client_cert("kube-apiserver-etcd-client", "").unwrap();
    for secret in [
        cluster_secret(&format!("{CLUSTER}-ca"), &[("tls.crt", ca.ca_pem()), ("tls.key", &ca.ca_key_pem())]),
        cluster_secret(&format!("{CLUSTER}-etcd"), &[("tls.crt", etcd_ca.ca_pem())]),
        cluster_secret(
            &format!("{CLUSTER}-apiserver-etcd-client"),
            &[("tls.crt", &etcd_client_cert), ("tls.key", &etcd_client_key)],
        ),
    ] {
        secrets.create(&PostParams::default(), &secret).await.unwrap();
    }

    let endpoint_port: i32 = workload_env.server_url().rsplit(':').next().unwrap().parse().unwrap();
    let infra = |kind: &str, plural: &str| resource("infrastructure.cluster.x-k8s.io", "v1alpha1", kind, plural);
    apply(
        &client,
        &ns,
        &infra("LibvirtMachineTemplate", "libvirtmachinetemplates"),
        document(&LibvirtMachineTemplate::stamping(
            "trio-control-plane",
            LibvirtMachineSpec::sized(BASE_IMAGE, 1, 1024, 10),
        )),
    )
    .await;
    apply(
        &client,
        &ns,
        &infra("LibvirtCluster", "libvirtclusters"),
        document(&LibvirtCluster::from_spec(
            CLUSTER,
            LibvirtClusterSpec::several_hosts(host_list, NETWORK, BASE_POOL, DOMAIN_POOL)
                .with_endpoint("127.0.0.1", endpoint_port),
        )),
    )
    .await;
    apply(&client, &ns, &kcp_resource(), json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {
            "name": "trio-control-plane",
            // No kube-proxy or CoreDNS to keep current in a workload cluster without workloads.
            "annotations": {
                "controlplane.cluster.x-k8s.io/skip-kube-proxy": "",
                "controlplane.cluster.x-k8s.io/skip-coredns": "",
            },
        },
        "spec": {
            "replicas": 3,
            "version": "v1.36.3",
            "machineTemplate": { "spec": { "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtMachineTemplate", "name": "trio-control-plane",
            } } },
            "kubeadmConfigSpec": { "clusterConfiguration": { "etcd": { "external": {
                "endpoints": ["https://etcd.lab.example:2379"],
                "caFile": "/etc/kubernetes/pki/etcd/ca.crt",
                "certFile": "/etc/kubernetes/pki/apiserver-etcd-client.crt",
                "keyFile": "/etc/kubernetes/pki/apiserver-etcd-client.key",
            } } } },
        },
    }))
    .await;
    apply(&client, &ns, &capi("Cluster", "clusters"), json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": { "name": CLUSTER },
        "spec": {
            "clusterNetwork": { "pods": { "cidrBlocks": ["10.244.0.0/16"] } },
            "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtCluster", "name": CLUSTER },
            "controlPlaneRef": { "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "trio-control-plane" },
        },
    }))
    .await;

    // Play the workload cluster until KCP has three machines, each with its Node.
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &capi("Machine", "machines"));
    let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kcp_resource());
    let config_maps: Api<ConfigMap> = Api::namespaced(workload.clone(), "kube-system");
    let started = Instant::now();
    let done = loop {
        let list = machines.list(&ListParams::default()).await.unwrap().items;
        for machine in &list {
            if let Some(provider_id) = machine.data["spec"]["providerID"].as_str() {
                // kubeadm init's mark of an initialized control plane, once a machine runs.
                if config_maps.get_opt("kubeadm-config").await.unwrap().is_none() {
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": { "name": "kubeadm-config" },
                        "data": { "ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n" },
                    }))
                    .unwrap();
                    config_maps.create(&PostParams::default(), &cm).await.unwrap();
                }
                play_kubelet(&workload, &machine.name_any(), provider_id).await;
            }
        }
        let with_node = list.iter().filter(|m| m.data["status"]["nodeRef"]["name"].is_string()).count();
        if list.len() == 3 && with_node == 3 {
            break list;
        }
        if started.elapsed() > SCALED {
            let kcp = kcps.get_opt("trio-control-plane").await.unwrap();
            let summary: Vec<String> = list
                .iter()
                .map(|m| {
                    format!(
                        "{} fd={} providerID={} nodeRef={}",
                        m.name_any(),
                        m.data["spec"]["failureDomain"],
                        m.data["spec"]["providerID"],
                        m.data["status"]["nodeRef"]
                    )
                })
                .collect();
            panic!(
                "KCP did not reach 3 machines with Nodes within {SCALED:?}: {summary:?}\nKCP status {}\n{}",
                kcp.map(|k| k.data["status"].to_string()).unwrap_or_default(),
                capi_managers.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    // One machine per failure domain, each on the host of that name, and each
    // LibvirtMachine says where it went.
    let domains: BTreeSet<String> =
        done.iter().map(|m| m.data["spec"]["failureDomain"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(domains, HOSTS.iter().map(|h| h.to_string()).collect(), "KCP spreads its machines over the hosts");
    let lms: Api<LibvirtMachine> = Api::namespaced(client.clone(), &ns);
    for machine in &done {
        let fd = machine.data["spec"]["failureDomain"].as_str().unwrap();
        let lm_name = machine.data["spec"]["infrastructureRef"]["name"].as_str().unwrap();
        let lm = lms.get(lm_name).await.unwrap();
        let status = lm.status.clone().unwrap_or_default();
        let uri = &hosts[HOSTS.iter().position(|h| *h == fd).unwrap()].1;
        assert_eq!(status.failure_domain.as_deref(), Some(fd), "LibvirtMachine {lm_name}");
        assert_eq!(status.host_uri.as_deref(), Some(uri.as_str()), "LibvirtMachine {lm_name}");
    }
    let on_hosts = || -> Vec<usize> {
        hosts.iter().map(|(_, uri)| libvirt_sim::connect(uri).unwrap().list_all_domains().unwrap().len()).collect()
    };
    assert_eq!(on_hosts(), vec![1, 1, 1], "each host runs exactly one control-plane machine");

    // Deleting the Cluster removes each machine from the host it was placed on.
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &capi("Cluster", "clusters"));
    clusters.delete(CLUSTER, &Default::default()).await.unwrap();
    let deleting = Instant::now();
    loop {
        let left = machines.list(&ListParams::default()).await.unwrap().items.len();
        let gone = clusters.get_opt(CLUSTER).await.unwrap().is_none();
        if gone && left == 0 && on_hosts() == vec![0, 0, 0] {
            break;
        }
        assert!(
            deleting.elapsed() < SCALED,
            "the Cluster was not deleted within {SCALED:?}: Cluster gone {gone}, {left} Machines left, domains per host {:?}\n{}",
            on_hosts(),
            capi_managers.log_tail(40)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
