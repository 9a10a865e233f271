//! The manager binary itself (`--hypervisor sim`, the quick demo's simulated host)
//! against the real kube-apiserver, as its ServiceAccount with nothing but the
//! shipped RBAC rules: flags, leader election, probes, metrics, a machine
//! provisioned and deleted end to end, a graceful stop on SIGTERM, and every
//! granted verb used (least privilege).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::builders::ObjectBuilder;
use capl::api::capi::{Cluster, Machine};
use capl::api::ipam::{IPAddress, IPAddressClaim};
use capl::api::{LibvirtCluster, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineTemplate, LibvirtRemediation};
use capl::manifests::{self, DeploymentSettings};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::{Value, json};

/// The manager's ServiceAccount name in the shipped manifests.
const SERVICE_ACCOUNT: &str = "capl-controller-manager";

/// Granted verbs the scenario cannot provoke, with the reason. kube's event
/// recorder patches an Event only when the same event repeats; each event of
/// this scenario happens once. A LibvirtMachine's reconcile reads its
/// LibvirtCluster from the watch cache and GETs it only when it is not (yet)
/// in the cache, which this scenario, creating it before the LibvirtMachine,
/// does not meet.
const NOT_EXERCISED: &[(&str, &str, &str)] =
    &[("events.k8s.io", "events", "patch"), ("infrastructure.cluster.x-k8s.io", "libvirtclusters", "get")];

/// The Roles of a namespaced install for `w.ns` (the manager's and the leader
/// election's, rules exactly as shipped), bound to a ServiceAccount in `w.ns`;
/// returns a kubeconfig file that authenticates as that ServiceAccount, and
/// the (group, resource, verb) triples the Roles grant.
async fn install_namespaced_rbac(w: &World) -> (std::path::PathBuf, BTreeSet<(String, String, String)>) {
    let components = manifests::release_components(&DeploymentSettings::default().for_one_namespace(&w.ns));
    assert!(
        !components.iter().any(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding"),
        "a namespaced install grants nothing cluster-wide"
    );
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": SERVICE_ACCOUNT } })).unwrap();
    w.api::<ServiceAccount>().create(&PostParams::default(), &sa).await.unwrap();
    let mut granted = BTreeSet::new();
    for doc in components.iter().filter(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding") {
        let mut doc = doc.clone();
        doc["metadata"]["namespace"] = json!(w.ns);
        if doc["kind"] == "Role" {
            for rule in doc["rules"].as_array().unwrap() {
                for group in rule["apiGroups"].as_array().unwrap() {
                    for resource in rule["resources"].as_array().unwrap() {
                        for verb in rule["verbs"].as_array().unwrap() {
                            let text = |v: &Value| v.as_str().unwrap().to_string();
                            granted.insert((text(group), text(resource), text(verb)));
                        }
                    }
                }
            }
            let role: Role = serde_json::from_value(doc).unwrap();
            w.api::<Role>().create(&PostParams::default(), &role).await.unwrap();
        } else {
            doc["subjects"] = json!([{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": w.ns }]);
            let binding: RoleBinding = serde_json::from_value(doc).unwrap();
            w.api::<RoleBinding>().create(&PostParams::default(), &binding).await.unwrap();
        }
    }
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    let token = w
        .api::<ServiceAccount>()
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .expect("a TokenRequest answer has a status")
        .token;
    let admin: Value = serde_json::from_slice(&std::fs::read(w.env.kubeconfig_path()).unwrap()).unwrap();
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{ "name": "manager", "user": { "token": token } }],
        "contexts": [{ "name": "manager", "context": { "cluster": "testenv", "user": "manager", "namespace": w.ns } }],
        "current-context": "manager",
    });
    let path = w.env.scratch_dir().join(format!("kubeconfig-{}", w.ns));
    std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig).unwrap()).unwrap();
    (path, granted)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port").local_addr().unwrap().port()
}

/// `GET path` on 127.0.0.1:`port`: (status code, body), or None while nothing listens.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_binary_with_the_simulated_host_provisions_a_machine() {
    let w = World::new("rb-binary").await;
    let (kubeconfig, granted) = install_namespaced_rbac(&w).await;
    let (metrics, health) = (free_port(), free_port());
    let log = w.env.scratch_dir().join(format!("manager-{}.log", w.ns));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"))
        .args(["--hypervisor", "sim", "--log-format", "json", "--leader-elect"])
        .args(["--namespace", &w.ns, "--leader-election-namespace", &w.ns])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{metrics}")])
        .args(["--health-probe-bind-address", &format!("127.0.0.1:{health}")])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("start the manager binary");
    let mut manager = ManagerProcess { child, log };

    // The binary's simulated host answers on its default URI, qemu:///system.
    let c: Cluster = w.apply(cluster_json("demo", "demo", true)).await;
    let lc = libvirt_cluster_json("demo", "qemu:///system", Some(("demo", &c.uid().unwrap())));
    let _: LibvirtCluster = w.apply(lc).await;
    let _: Cluster = w.patch_status("demo", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let _: LibvirtMachine = w.apply(libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())))).await;
    // A template of the cluster: the manager writes its capacity and node info.
    let _: LibvirtMachineTemplate = w
        .apply(
            LibvirtMachineTemplate::stamping("workers", LibvirtMachineSpec::sized(BASE_IMAGE, 1, 512, 10))
                .of_cluster("demo"),
        )
        .await;

    let started = Instant::now();
    loop {
        if let Some(lm) = w.api::<LibvirtMachine>().get_opt("m0").await.unwrap()
            && machine_ready(&lm)
        {
            break;
        }
        if let Ok(Some(status)) = manager.child.try_wait() {
            panic!("the manager exited with {status}:\n{}", manager.log_tail());
        }
        assert!(started.elapsed() < WAIT, "the machine did not become Ready; manager log:\n{}", manager.log_tail());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let template: LibvirtMachineTemplate = w
        .wait_for("workers", "the template's node info", |t: &LibvirtMachineTemplate| {
            t.status.as_ref().and_then(|s| s.node_info.as_ref()).and_then(|n| n.architecture.as_ref()).is_some()
        })
        .await;
    assert_eq!(template.status.unwrap().capacity.unwrap()["memory"].0, "512Mi");

    // A machine with its address from an IPAM pool: the manager claims it, says
    // the pool does not exist, and takes the address the IPAM provider (played
    // here) binds; deleting the machine deletes its claim.
    create_bootstrap_secret(&w, "m1-bootstrap", cloud_config("m1")).await;
    let m1: Machine = w.apply(machine_json("m1", "demo", "m1", Some("m1-bootstrap"))).await;
    let mut lm1 = libvirt_machine_json("m1", "demo", Some(("m1", &m1.uid().unwrap())));
    let pool = json!({ "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "lab-pool" });
    lm1["spec"]["addressesFromPools"] = json!([pool]);
    let _: LibvirtMachine = w.apply(lm1).await;
    let _: LibvirtMachine = w
        .wait_for("m1", "IPAddressPoolNotFound", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("IPAddressPoolNotFound"))
        })
        .await;
    let _: IPAddress = w
        .apply(json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
            "metadata": { "name": "m1-0" },
            "spec": { "address": "192.168.122.250", "prefix": 24, "gateway": "192.168.122.1",
                      "claimRef": { "name": "m1-0" }, "poolRef": pool },
        }))
        .await;
    let _: IPAddressClaim = w.patch_status("m1-0", json!({ "addressRef": { "name": "m1-0" } })).await;
    let _: LibvirtMachine = w.wait_for("m1", "ready", machine_ready).await;
    w.delete::<LibvirtMachine>("m1").await;
    w.delete::<Machine>("m1").await;
    w.wait_gone::<LibvirtMachine>("m1").await;
    w.wait_gone::<IPAddressClaim>("m1-0").await;

    // Leader election held a Lease in the given namespace.
    let lease: Lease = w
        .api()
        .get("cluster-api-provider-libvirt-leader")
        .await
        .unwrap_or_else(|e| panic!("no leader Lease in {}: {e}; manager log:\n{}", w.ns, manager.log_tail()));
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some_and(|h| !h.is_empty()));

    assert_eq!(http_get(health, "/healthz").map(|r| r.0), Some(200), "{}", manager.log_tail());
    assert_eq!(http_get(health, "/readyz").map(|r| r.0), Some(200), "{}", manager.log_tail());
    let (code, body) = http_get(metrics, "/metrics").expect("the metrics endpoint answers");
    assert_eq!(code, 200);
    assert!(body.contains("capl_reconciles_total{controller=\"libvirtmachine\"}"), "{body}");
    assert!(body.contains("capl_libvirt_operation_duration_seconds"), "{body}");

    // A MachineHealthCheck's remediation of m0 by reboot: rebooted once, then
    // handed to its owner (the Machine's OwnerRemediated condition).
    let _: Machine = w
        .patch_status(
            "m0",
            json!({ "conditions": [{
                "type": "HealthCheckSucceeded", "status": "False", "reason": "UnhealthyNode", "message": "test",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }] }),
        )
        .await;
    let _: LibvirtRemediation = w
        .apply(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtRemediation",
            "metadata": { "name": "m0", "ownerReferences": [{
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m0", "uid": m.uid().unwrap(),
            }] },
            "spec": { "retryLimit": 1, "timeoutSeconds": 1 },
        }))
        .await;
    let remediated: LibvirtRemediation = w
        .wait_for("m0", "the remediation given up", |r: &LibvirtRemediation| {
            r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
        })
        .await;
    assert_eq!(remediated.status.unwrap().retry_count, Some(1), "{}", manager.log_tail());

    // Deleted through the manager: the finalizers go, nothing is left.
    w.delete::<LibvirtMachine>("m0").await;
    w.delete::<Machine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    w.delete::<LibvirtCluster>("demo").await;
    w.wait_gone::<LibvirtCluster>("demo").await;

    // Graceful shutdown on SIGTERM.
    let pid = manager.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = manager.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < WAIT, "the manager did not stop on SIGTERM:\n{}", manager.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status.success(), "the manager exited with {status} on SIGTERM:\n{}", manager.log_tail());
    let log = std::fs::read_to_string(&manager.log).unwrap();
    assert!(
        log.lines().all(|l| l.trim().is_empty() || l.starts_with('{')),
        "--log-format json wrote a non-JSON line:\n{log}"
    );

    // Least privilege: nothing the manager asked for was refused, and every
    // verb the shipped rules grant was used.
    let user = format!("system:serviceaccount:{}:{SERVICE_ACCOUNT}", w.ns);
    let requests = w.env.audited_requests(&user).unwrap();
    let refused: Vec<_> = requests.iter().filter(|r| r.code == 403).collect();
    assert!(refused.is_empty(), "the shipped RBAC refused requests of the manager: {refused:#?}");
    let used: BTreeSet<(String, String, String)> =
        requests.iter().map(|r| (r.api_group.clone(), r.resource.clone(), r.verb.clone())).collect();
    let unused: Vec<_> = granted
        .difference(&used)
        .filter(|(g, r, v)| !NOT_EXERCISED.contains(&(g.as_str(), r.as_str(), v.as_str())))
        .collect();
    assert!(unused.is_empty(), "the shipped RBAC grants what the manager never used: {unused:?}\nused: {used:#?}");
}
