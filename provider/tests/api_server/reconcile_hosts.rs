//! A LibvirtCluster over several (simulated) hosts: failure domains, placement
//! by available memory, control-plane hosts, a host that does not answer, and
//! the bad input the API server or the provider refuses.

use std::collections::BTreeMap;

use crate::support::*;
use capl::api::capi::{Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A second simulated host for the test, with `memory_mib` of memory.
fn extra_host(w: &World, name: &str, memory_mib: u64) -> (libvirt_sim::Host, String) {
    let uri = format!("qemu+tcp://sim-{}-{name}/system", w.ns);
    let host = capl_host::sim_host::register_with_memory(&uri, memory_mib)
        .unwrap_or_else(|e| panic!("building the simulated host {uri}: {e}"));
    (host, uri)
}

/// Cluster `cluster` (provisioned as CAPI would mark it) with a LibvirtCluster over `hosts`.
async fn cluster_over(w: &World, cluster: &str, hosts: Value) -> String {
    let lc_name = format!("{cluster}-lc");
    let c: Cluster = w.apply(cluster_json(cluster, &lc_name, true)).await;
    let uid = c.uid().expect("a stored Cluster has a UID");
    let mut lc = libvirt_cluster_json(&lc_name, "unused", Some((cluster, &uid)));
    lc["spec"].as_object_mut().unwrap().remove("uri");
    lc["spec"]["hosts"] = hosts;
    let _: LibvirtCluster = w.apply(lc).await;
    let _: Cluster = w.patch_status(cluster, json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    lc_name
}

/// A ready Machine + LibvirtMachine of `memory_mib`, optionally a control-plane
/// one or with a failure domain, as CAPI would write them.
async fn machine(w: &World, cluster: &str, name: &str, memory_mib: i32, control_plane: bool, fd: Option<&str>) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let mut m = machine_json(name, cluster, name, Some(&secret));
    if control_plane {
        m["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
    }
    if let Some(fd) = fd {
        m["spec"]["failureDomain"] = json!(fd);
    }
    let m: Machine = w.apply(m).await;
    let mut lm = libvirt_machine_json(name, cluster, Some((name, &m.uid().unwrap())));
    lm["spec"]["memoryMiB"] = json!(memory_mib);
    if control_plane {
        lm["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
    }
    let _: LibvirtMachine = w.apply(lm).await;
}

fn placed_on(lm: &LibvirtMachine) -> (Option<String>, Option<String>) {
    let s = lm.status.clone().unwrap_or_default();
    (s.failure_domain, s.host_uri)
}

fn domains_on(uri: &str) -> usize {
    libvirt_sim::connect(uri).unwrap().list_all_domains().unwrap().len()
}

fn failure_domains(lc: &LibvirtCluster) -> Vec<(String, Option<bool>)> {
    let fds = lc.status.as_ref().and_then(|s| s.failure_domains.clone()).unwrap_or_default();
    fds.into_iter().map(|f| (f.name, f.control_plane)).collect()
}

/// Five 2 GiB machines created at once over a 4 GiB and a 6 GiB host: each
/// goes where the most memory is left (machines placed at the same time
/// count), so the hosts fill up exactly; a sixth fits nowhere and says why,
/// naming both hosts, with nothing created; once a machine is deleted it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_go_where_memory_is_left_and_a_full_host_is_skipped() {
    let w = World::new("rc-hosts-mem").await;
    let (_a, uri_a) = extra_host(&w, "a", 4096);
    let (_b, uri_b) = extra_host(&w, "b", 6144);
    let _manager = w.start_manager();
    let lc_name = cluster_over(&w, "demo", json!([{ "name": "a", "uri": uri_a }, { "name": "b", "uri": uri_b }])).await;
    let lc: LibvirtCluster =
        w.wait_for(&lc_name, "failure domains", |lc: &LibvirtCluster| failure_domains(lc).len() == 2).await;
    assert_eq!(failure_domains(&lc), vec![("a".to_string(), Some(true)), ("b".to_string(), Some(true))]);
    assert!(has(cluster_conditions(&lc), "HostsReady", "True", Some("HostsAvailable")), "{:?}", lc.status);

    let names: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    futures::future::join_all(names.iter().map(|n| machine(&w, "demo", n, 2048, false, None))).await;
    let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
    for n in &names {
        let lm: LibvirtMachine = w.wait_for(n, "ready", machine_ready).await;
        let (fd, uri) = placed_on(&lm);
        let fd = fd.unwrap_or_else(|| panic!("{n} has no status.failureDomain: {:?}", lm.status));
        assert_eq!(uri.as_deref(), Some(if fd == "a" { uri_a.as_str() } else { uri_b.as_str() }), "{n}");
        *per_host.entry(fd).or_default() += 1;
    }
    assert_eq!(per_host, BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 3)]));
    assert_eq!((domains_on(&uri_a), domains_on(&uri_b)), (2, 3));

    machine(&w, "demo", "late", 2048, false, None).await;
    let lm: LibvirtMachine = w
        .wait_for("late", "NoHostFits", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("NoHostFits"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(message.contains("needs 2048 MiB"), "{message}");
    assert!(message.contains(&format!("host a ({uri_a}) has 0 MiB available")), "{message}");
    assert!(message.contains(&format!("host b ({uri_b}) has 0 MiB available")), "{message}");
    assert_eq!(placed_on(&lm), (None, None), "a machine that fits nowhere records no host");
    assert_eq!((domains_on(&uri_a), domains_on(&uri_b)), (2, 3));

    // One machine of b goes: the late one takes its place there.
    let mut on_b = None;
    for n in &names {
        let lm = w.api::<LibvirtMachine>().get(n).await.unwrap();
        if placed_on(&lm).0.as_deref() == Some("b") {
            on_b = Some(n.clone());
        }
    }
    let on_b = on_b.expect("a machine on host b");
    w.delete::<Machine>(&on_b).await;
    w.delete::<LibvirtMachine>(&on_b).await;
    w.wait_gone::<LibvirtMachine>(&on_b).await;
    let lm: LibvirtMachine = w.wait_for("late", "ready", machine_ready).await;
    assert_eq!(placed_on(&lm).0.as_deref(), Some("b"));
    assert_eq!((domains_on(&uri_a), domains_on(&uri_b)), (2, 3));
}

/// Control-plane machines go only to hosts with controlPlane: true, even
/// when another has more memory; workers go where the memory is; the failure
/// domains say which host takes control-plane machines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_machines_go_only_to_control_plane_hosts() {
    let w = World::new("rc-hosts-cp").await;
    let (_cp, uri_cp) = extra_host(&w, "cp", 4096);
    let (_workers, uri_workers) = extra_host(&w, "workers", 16384);
    let _manager = w.start_manager();
    let hosts = json!([
        { "name": "cp", "uri": uri_cp },
        { "name": "workers", "uri": uri_workers, "controlPlane": false },
    ]);
    let lc_name = cluster_over(&w, "demo", hosts).await;
    let lc: LibvirtCluster =
        w.wait_for(&lc_name, "failure domains", |lc: &LibvirtCluster| failure_domains(lc).len() == 2).await;
    assert_eq!(failure_domains(&lc), vec![("cp".to_string(), Some(true)), ("workers".to_string(), Some(false))]);

    machine(&w, "demo", "control-0", 1024, true, None).await;
    machine(&w, "demo", "worker-0", 1024, false, None).await;
    let cp: LibvirtMachine = w.wait_for("control-0", "ready", machine_ready).await;
    let worker: LibvirtMachine = w.wait_for("worker-0", "ready", machine_ready).await;
    assert_eq!(placed_on(&cp), (Some("cp".to_string()), Some(uri_cp.clone())));
    assert_eq!(placed_on(&worker), (Some("workers".to_string()), Some(uri_workers.clone())));

    // A control-plane machine sent by failure domain to a host that takes none is refused.
    machine(&w, "demo", "control-1", 1024, true, Some("workers")).await;
    let lm: LibvirtMachine = w
        .wait_for("control-1", "FailureDomainNotFound", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("FailureDomainNotFound"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(message.contains("controlPlane: false"), "{message}");
    assert_eq!((domains_on(&uri_cp), domains_on(&uri_workers)), (1, 1));
}

/// KubeadmControlPlane and MachineSets create the LibvirtMachine before the
/// Machine that owns it: until the owner is there, no host is chosen (the
/// Machine's failure domain decides, not the memory), then the machine goes
/// to the host its Machine names even though the other has more memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_is_placed_only_once_its_owner_machine_names_the_failure_domain() {
    let w = World::new("rc-hosts-owner").await;
    let (_big, uri_big) = extra_host(&w, "big", 16384);
    let (_small, uri_small) = extra_host(&w, "small", 4096);
    let manager = w.start_manager();
    let lc_name =
        cluster_over(&w, "demo", json!([{ "name": "big", "uri": uri_big }, { "name": "small", "uri": uri_small }]))
            .await;
    w.wait_for(&lc_name, "failure domains", |lc: &LibvirtCluster| failure_domains(lc).len() == 2).await;

    // As KCP makes it: labelled with the cluster, no owner Machine yet.
    let _: LibvirtMachine = w.apply(libvirt_machine_json("cp-0", "demo", None)).await;
    manager.settle().await;
    let lm = w.api::<LibvirtMachine>().get("cp-0").await.unwrap();
    assert_eq!(placed_on(&lm), (None, None), "no host is chosen before the owner Machine exists: {:?}", lm.status);
    assert_eq!((domains_on(&uri_big), domains_on(&uri_small)), (0, 0));

    create_bootstrap_secret(&w, "cp-0-bootstrap", cloud_config("cp-0")).await;
    let mut m = machine_json("cp-0", "demo", "cp-0", Some("cp-0-bootstrap"));
    m["spec"]["failureDomain"] = json!("small");
    let m: Machine = w.apply(m).await;
    let _: LibvirtMachine = w.apply(libvirt_machine_json("cp-0", "demo", Some(("cp-0", &m.uid().unwrap())))).await;
    let lm: LibvirtMachine = w.wait_for("cp-0", "ready", machine_ready).await;
    assert_eq!(placed_on(&lm), (Some("small".to_string()), Some(uri_small.clone())));
    assert_eq!((domains_on(&uri_big), domains_on(&uri_small)), (0, 1));
}

/// A host that does not answer is reported on the LibvirtCluster (HostsReady
/// False, naming it) and left out of the failure domains, while machines go
/// to the healthy host; a failure domain that names no host is reported on
/// the machine with the names there are, and nothing is created for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_host_does_not_block_the_healthy_one() {
    let w = World::new("rc-hosts-dead").await;
    let (_up, uri_up) = extra_host(&w, "up", 8192);
    // Never registered: connecting to it fails as to a host that is down.
    let uri_down = format!("qemu+tcp://sim-{}-down/system", w.ns);
    let _manager = w.start_manager();
    let lc_name =
        cluster_over(&w, "demo", json!([{ "name": "down", "uri": uri_down }, { "name": "up", "uri": uri_up }])).await;
    let lc: LibvirtCluster = w
        .wait_for(&lc_name, "HostsReady False", |lc: &LibvirtCluster| {
            has(cluster_conditions(lc), "HostsReady", "False", Some("HostsDegraded"))
        })
        .await;
    let message = &condition(cluster_conditions(&lc), "HostsReady").unwrap().message;
    assert!(message.contains(&format!("host down ({uri_down})")), "{message}");
    assert!(!message.contains("host up"), "{message}");
    assert!(has(cluster_conditions(&lc), "InfrastructureReady", "True", None), "{:?}", lc.status);
    assert!(has(cluster_conditions(&lc), "Ready", "True", None), "{:?}", lc.status);
    assert_eq!(failure_domains(&lc), vec![("up".to_string(), Some(true))]);

    machine(&w, "demo", "m0", 1024, false, None).await;
    let lm: LibvirtMachine = w.wait_for("m0", "ready", machine_ready).await;
    assert_eq!(placed_on(&lm), (Some("up".to_string()), Some(uri_up.clone())));

    machine(&w, "demo", "lost", 1024, false, Some("nowhere")).await;
    let lm: LibvirtMachine = w
        .wait_for("lost", "FailureDomainNotFound", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("FailureDomainNotFound"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(message.contains("\"nowhere\" names no host"), "{message}");
    assert!(message.contains("one of down, up"), "{message}");
    assert_eq!(placed_on(&lm), (None, None));
    assert_eq!(domains_on(&uri_up), 1);
}

/// What the API server refuses: uri and hosts together or neither, two hosts
/// of one name or one URI, and a host's URI changed; adding a host is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_host_lists_are_refused_with_the_fix() {
    let w = World::new("rc-hosts-bad").await;
    let api = w.api::<LibvirtCluster>();
    let lc = |name: &str, spec: Value| -> LibvirtCluster {
        let mut full = json!({ "network": NETWORK, "basePool": BASE_POOL, "domainPool": DOMAIN_POOL });
        full.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtCluster",
            "metadata": { "name": name }, "spec": full,
        }))
        .unwrap()
    };
    let refused = |spec: Value, name: &'static str| {
        let api = api.clone();
        let object = lc(name, spec);
        async move { api.create(&PostParams::default(), &object).await.unwrap_err().to_string() }
    };
    let one = json!({ "name": "a", "uri": "qemu+tcp://a/system" });
    let err = refused(json!({ "uri": "qemu+tcp://a/system", "hosts": [one.clone()] }), "both").await;
    assert!(err.contains("set either uri (one host) or hosts"), "{err}");
    let err = refused(json!({}), "neither").await;
    assert!(err.contains("set either uri (one host) or hosts"), "{err}");
    let err =
        refused(json!({ "hosts": [one.clone(), { "name": "b", "uri": "qemu+tcp://a/system" }] }), "same-uri").await;
    assert!(err.contains("two hosts have the same uri"), "{err}");
    let err =
        refused(json!({ "hosts": [one.clone(), { "name": "a", "uri": "qemu+tcp://b/system" }] }), "same-name").await;
    assert!(err.contains("Duplicate value"), "{err}");

    api.create(&PostParams::default(), &lc("ok", json!({ "hosts": [one.clone()] }))).await.unwrap();
    let two = json!({ "spec": { "hosts": [one.clone(), { "name": "b", "uri": "qemu+tcp://b/system" }] } });
    api.patch("ok", &PatchParams::default(), &Patch::Merge(&two)).await.expect("adding a host is allowed");
    let moved = json!({ "spec": { "hosts": [{ "name": "a", "uri": "qemu+tcp://elsewhere/system" }] } });
    let err = api.patch("ok", &PatchParams::default(), &Patch::Merge(&moved)).await.unwrap_err().to_string();
    assert!(err.contains("a host's uri is immutable"), "{err}");
}
