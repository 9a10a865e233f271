//! A host that accepts requests and never answers, on the real kube-apiserver
//! with simulated hosts: its machines report HostUnreachable "no answer from
//! <uri> within N s" in bounded time, machines on another host keep
//! reconciling meanwhile, and once the host answers again its machines
//! converge. (The same with the manager binary, a real TCP listener and the
//! real libvirtd: `libvirtd/hung_host_manager.rs`.)

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use capl::api::capi::Cluster;
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl_host::hypervisor::connections::Connections;
use capl_host::hypervisor::sim::SimConnector;
use kube::ResourceExt;
use libvirt_sim::Op;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(1);

fn no_answer(uri: &str) -> String {
    format!("no answer from {uri} within 1 s")
}

/// What the user sees: DomainProvisioningReady False with reason
/// HostUnreachable, and Ready False, both saying the host does not answer.
fn reports_no_answer(lm: &LibvirtMachine, uri: &str) -> bool {
    let conditions = machine_conditions(lm);
    condition(conditions, "DomainProvisioningReady")
        .is_some_and(|c| c.status == "False" && c.reason == "HostUnreachable" && c.message.contains(&no_answer(uri)))
        && condition(conditions, "Ready").is_some_and(|c| c.status == "False" && c.message.contains(&no_answer(uri)))
}

/// Ends every hang when dropped, also when the test fails: the runtime waits
/// for the blocking threads of hung calls before it shuts down.
struct ReleaseOnDrop(libvirt_sim::Host);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.faults().clear();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_host_stalls_only_its_own_machines() {
    let w = World::new("rb-hung").await;
    let hung_uri = format!("qemu+tcp://sim-hung-{}/system", w.ns);
    let hung = capl_host::sim_host::register(&hung_uri).unwrap_or_else(|e| panic!("building {hung_uri}: {e}"));
    let _release = ReleaseOnDrop(hung.clone());
    let connections = Arc::new(Connections::new(Arc::new(SimConnector), 5).with_timeouts(TIMEOUT, TIMEOUT));
    let _manager = Manager::start(w.client.clone(), &w.ns, connections);

    provisioned_cluster(&w, "good").await;
    let c: Cluster = w.apply(cluster_json("hung", "hung-lc", true)).await;
    let _: LibvirtCluster =
        w.apply(libvirt_cluster_json("hung-lc", &hung_uri, Some(("hung", &c.uid().unwrap())))).await;
    let _: Cluster = w.patch_status("hung", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    // The provider has a connection to the host, then the host stops answering
    // every call (new connects still succeed, as with a libvirtd whose workers hang).
    w.wait_for::<LibvirtCluster>("hung-lc", "the hung host's infrastructure checked", |lc| {
        has(cluster_conditions(lc), "InfrastructureReady", "True", None)
    })
    .await;
    for op in Op::ALL.iter().filter(|op| **op != Op::Connect) {
        hung.faults().hang(*op, None);
    }

    ready_machine_objects(&w, "hung", "h0").await;
    ready_machine_objects(&w, "good", "g0").await;
    w.wait_for::<LibvirtMachine>("h0", "HostUnreachable with the no-answer message", |lm| {
        reports_no_answer(lm, &hung_uri)
    })
    .await;
    w.wait_for::<LibvirtMachine>("g0", "the machine on the healthy host ready", machine_ready).await;

    // Later machines on the healthy host go through too, while the hung host
    // still does not answer (its calls are stuck, and every slot with them).
    ready_machine_objects(&w, "good", "g1").await;
    w.wait_for::<LibvirtMachine>("g1", "a second machine on the healthy host ready", machine_ready).await;
    let lm: LibvirtMachine = w.api().get("h0").await.unwrap();
    assert!(reports_no_answer(&lm, &hung_uri), "{lm:#?}");
    assert!(hung.domain_count() == 0, "nothing was created on the hung host");

    // The host answers again: its machine converges (the retry after a
    // transient failure is 20 s) and its stuck calls return.
    hung.faults().clear();
    let lm = w.wait_for::<LibvirtMachine>("h0", "the hung host's machine ready once it answers", machine_ready).await;
    assert!(has(machine_conditions(&lm), "DomainProvisioningReady", "True", None), "{lm:#?}");
    assert_eq!(hung.domain_count(), 1);
    hung.unregister();
}
