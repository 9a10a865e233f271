//! Faults at scale, on the simulator with a real
//! kube-apiserver and CAPI core: a MachineDeployment of 60 machines is
//! created while 5% of libvirt calls fail as if the connection dropped, and
//! the simulated daemon restarts halfway. Every machine converges with its
//! own address; deleting the Cluster (CAPI cascades it) leaves nothing on the
//! host. This test starts its own API server and CAPI core, so CAPI's
//! controllers do not touch the other tests' objects.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::capi::Cluster;
use capl::api::{LibvirtCluster, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineTemplate};
use capl::controller::Settings;
use capl_host::hypervisor::Hypervisor;
use capl_host::hypervisor::sim::SimHypervisor;
use kube::ResourceExt;
use kube::api::ListParams;
use libvirt_sim::{Error, ErrorCode};
use serde_json::json;
use testenv::TestEnv;

/// The issue asks for 200. At 5% failed calls a create (about 20 calls)
/// succeeds on a given try only about a third of the time, and tries are 20 s
/// apart. 200 machines took 156 s and 184 s on a busy 2-core machine: CAPI
/// made the 200 machines in 58-68 s, all were provisioned after 82-100 s and
/// deleted 50-89 s later: the 200 the issue asks for, which CI can afford.
/// (Before the reconciler ignored status-only changes of Clusters and
/// Machines, every change of a machine reconciled all of them: 200 did not
/// converge, 55 machines were never reconciled in 5 minutes.)
const MACHINES: usize = 200;
/// Generous: every machine's create is retried a few times, 20 s apart.
const CONVERGE: Duration = Duration::from_secs(600);

async fn count_ready(w: &World) -> (usize, usize, Vec<LibvirtMachine>) {
    let all = w.api::<LibvirtMachine>().list(&ListParams::default()).await.unwrap().items;
    let provisioned = all.iter().filter(|lm| lm.spec.provider_id.is_some()).count();
    let ready = all.iter().filter(|lm| machine_ready(lm)).count();
    (provisioned, ready, all)
}

/// For the machines that are not Ready: their Ready condition's reason and
/// message, counted.
fn not_ready_reasons(all: &[LibvirtMachine]) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    for lm in all.iter().filter(|lm| !machine_ready(lm)) {
        let why = condition(machine_conditions(lm), "Ready")
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_else(|| "no Ready condition".into());
        *reasons.entry(why).or_insert(0) += 1;
    }
    reasons
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_machines_converge_through_random_faults_and_a_daemon_restart() {
    // A private API server with CAPI core: leaked, it lives as long as the
    // test process (whose exit stops it).
    let env: &'static TestEnv = Box::leak(Box::new(
        TestEnv::start().await.unwrap_or_else(|e| panic!("starting a private control plane: {e:#}")),
    ));
    let _capi = env.start_capi_manager().await.unwrap_or_else(|e| panic!("starting CAPI core: {e:#}"));
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases");
    env.install_crds_from_dir(&crds).await.unwrap_or_else(|e| panic!("installing our CRDs: {e:#}"));
    let ns = env.unique_namespace("faults").await.unwrap();
    let uri = format!("qemu+tcp://sim-{ns}/system");
    // The default simulated network has 100 addresses; this one has 1,009.
    let host = capl_host::sim_host::register_large(&uri).unwrap();
    let w = World { env, client: env.client(), ns, host, uri, setup_calls: BTreeMap::new() };
    let manager = Manager::start_with_settings(
        w.client.clone(),
        w.connections(),
        Settings { concurrency: 10, ..manager_settings(&w.ns) },
    );

    // Faults from the first call on: 5% of calls find the connection gone.
    w.host.faults().fail_randomly(0.05, 42, Error::new(ErrorCode::NoConnect, "client socket is closed"));
    let started = Instant::now();
    let c: Cluster = w.apply(cluster_json("big", "big", true)).await;
    let _: LibvirtCluster = w.apply(libvirt_cluster_json("big", &w.uri, Some(("big", &c.uid().unwrap())))).await;
    create_bootstrap_secret(&w, "big-bootstrap", cloud_config("big")).await;
    let _: serde_json::Value = apply_json(
        &w,
        "LibvirtMachineTemplate",
        serde_json::to_value(LibvirtMachineTemplate::stamping(
            "big-workers",
            LibvirtMachineSpec::sized(BASE_IMAGE, 1, 256, 2),
        ))
        .unwrap(),
    )
    .await;
    let labels = json!({ "cluster.x-k8s.io/cluster-name": "big", "cluster.x-k8s.io/deployment-name": "big-workers" });
    let _: serde_json::Value = apply_json(
        &w,
        "MachineDeployment",
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineDeployment",
            "metadata": { "name": "big-workers", "labels": { "cluster.x-k8s.io/cluster-name": "big" } },
            "spec": {
                "clusterName": "big",
                "replicas": MACHINES,
                "selector": { "matchLabels": labels },
                "rollout": { "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } } },
                "deletion": { "order": "Random" },
                "template": {
                    "metadata": { "labels": labels },
                    "spec": {
                        "clusterName": "big",
                        "bootstrap": { "dataSecretName": "big-bootstrap" },
                        "infrastructureRef": {
                            "apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "LibvirtMachineTemplate",
                            "name": "big-workers",
                        },
                    },
                },
            },
        }),
    )
    .await;

    // The daemon restarts once half the machines are provisioned. While the
    // faults go on, a running machine's look at the host can fail too (Ready
    // turns False until the next look), so the storm is over once every
    // machine is provisioned with an address; then all must be Ready.
    let mut restarted = None;
    let mut all_exist = None;
    let has_address = |lm: &LibvirtMachine| {
        lm.spec.provider_id.is_some()
            && lm
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"))
    };
    loop {
        let (provisioned, ready, all) = count_ready(&w).await;
        if all_exist.is_none() && all.len() == MACHINES {
            all_exist = Some(started.elapsed());
        }
        if restarted.is_none() && provisioned >= MACHINES / 2 {
            w.host.restart_daemon();
            restarted = Some(started.elapsed());
        }
        if all.len() == MACHINES && all.iter().all(has_address) {
            break;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "after {:?}: {} LibvirtMachines, {provisioned} provisioned, {ready} Ready (of {MACHINES}); \
             why the others are not (reason, message: count): {:#?}",
            started.elapsed(),
            all.len(),
            not_ready_reasons(&all)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let provisioned_at = started.elapsed();
    assert!(restarted.is_some(), "the daemon restart happened");
    let calls = w.host.counters().total_calls();
    w.host.faults().clear();
    let all = loop {
        let (_, ready, all) = count_ready(&w).await;
        if ready == MACHINES {
            break all;
        }
        assert!(
            started.elapsed() < provisioned_at + Duration::from_secs(120),
            "{ready} of {MACHINES} Ready 120 s after the faults stopped: {:#?}",
            not_ready_reasons(&all)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let converged = started.elapsed();

    // Every machine has its own address, on the API and on the host.
    let addresses: BTreeSet<String> = all
        .iter()
        .flat_map(|lm| lm.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default())
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert_eq!(addresses.len(), MACHINES, "duplicate or missing InternalIP addresses");
    let hv = SimHypervisor::connect(&w.uri).unwrap();
    assert_eq!(hv.domain_list().unwrap().len(), MACHINES);
    let entries = w.host_objects().dhcp_hosts;
    assert_eq!(entries.len(), MACHINES, "one DHCP entry per machine: {entries:?}");

    // Deleting the Cluster: CAPI deletes the MachineDeployment, Machines and
    // LibvirtMachines, then the LibvirtCluster; with the faults again.
    w.host.faults().fail_randomly(0.05, 43, Error::new(ErrorCode::NoConnect, "client socket is closed"));
    let deleting = Instant::now();
    w.delete::<Cluster>("big").await;
    loop {
        let machines = w.api::<LibvirtMachine>().list(&ListParams::default()).await.unwrap().items.len();
        let clusters = w.api::<LibvirtCluster>().list(&ListParams::default()).await.unwrap().items.len();
        if machines == 0 && clusters == 0 {
            break;
        }
        assert!(
            deleting.elapsed() < CONVERGE,
            "{machines} LibvirtMachines and {clusters} LibvirtClusters left {:?} after deleting the Cluster",
            deleting.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let deleted = deleting.elapsed();
    w.host.faults().clear();
    let left = w.host_objects();
    assert_eq!(
        (left.domains.len(), left.volumes.len(), left.dhcp_hosts.len()),
        (0, 0, 0),
        "left on the host: {left:?}"
    );
    eprintln!(
        "faults at scale: CAPI made all {MACHINES} LibvirtMachines in {:?}; all provisioned in {provisioned_at:?} \
         through faults (daemon restarted at {:?}, {calls} simulator calls), all Ready {:?} later; all deleted \
         through faults in {deleted:?}; {} libvirtmachine reconciles",
        all_exist.unwrap_or_default(),
        restarted.unwrap(),
        converged - provisioned_at,
        manager.reconciles("libvirtmachine")
    );
    manager.kill().await;
    w.host.unregister();
}

/// Creates a namespaced object of `kind` (CAPI's or ours) from JSON.
async fn apply_json(w: &World, kind: &str, object: serde_json::Value) -> serde_json::Value {
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::discovery::ApiResource;
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), object["apiVersion"].as_str().unwrap().to_string()),
    };
    let resource = ApiResource {
        group: group.clone(),
        version: version.clone(),
        api_version: object["apiVersion"].as_str().unwrap().to_string(),
        kind: kind.to_string(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(w.client.clone(), &w.ns, &resource);
    let dynamic: DynamicObject = serde_json::from_value(object).unwrap();
    let created = api.create(&PostParams::default(), &dynamic).await.unwrap_or_else(|e| panic!("creating {kind}: {e}"));
    serde_json::to_value(created).unwrap()
}
