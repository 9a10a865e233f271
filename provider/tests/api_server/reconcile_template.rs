//! LibvirtMachineTemplate status for cluster-autoscaler's scale from zero:
//! capacity from the spec, node info from the host of the template's Cluster.

use crate::support::*;
use capl::api::builders::ObjectBuilder;
use capl::api::{LibvirtMachineSpec, LibvirtMachineTemplate};

/// A template of 2 vCPUs, 3 GiB and a 25 GiB disk, of `cluster` when given
/// (without a cluster its labels are empty, not absent).
fn template(name: &str, cluster: Option<&str>) -> LibvirtMachineTemplate {
    let mut t = LibvirtMachineTemplate::stamping(name, LibvirtMachineSpec::sized(BASE_IMAGE, 2, 3072, 25));
    t.metadata.labels = Some(Default::default());
    match cluster {
        Some(c) => t.of_cluster(c),
        None => t,
    }
}

fn quantity(t: &LibvirtMachineTemplate, resource: &str) -> Option<String> {
    t.status.as_ref()?.capacity.as_ref()?.get(resource).map(|q| q.0.clone())
}

fn node_info(t: &LibvirtMachineTemplate) -> (Option<String>, Option<String>) {
    let info = t.status.as_ref().and_then(|s| s.node_info.clone()).unwrap_or_default();
    (info.architecture, info.operating_system)
}

/// What the autoscaler reads: cpu, memory and disk of a machine from the
/// template, and the architecture of the Cluster's host (the simulated host
/// is x86_64: amd64) with the OS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_reports_capacity_and_the_architecture_of_its_clusters_host() {
    let w = World::new("rc-template").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    let _: LibvirtMachineTemplate = w.apply(template("workers", Some("demo"))).await;
    let t: LibvirtMachineTemplate =
        w.wait_for("workers", "capacity and node info", |t: &LibvirtMachineTemplate| node_info(t).0.is_some()).await;
    assert_eq!(quantity(&t, "cpu").as_deref(), Some("2"));
    assert_eq!(quantity(&t, "memory").as_deref(), Some("3072Mi"));
    assert_eq!(quantity(&t, "ephemeral-storage").as_deref(), Some("25Gi"));
    assert_eq!(node_info(&t), (Some("amd64".to_string()), Some("linux".to_string())));

    // A template of no Cluster: capacity, and no architecture to guess.
    let _: LibvirtMachineTemplate = w.apply(template("loose", None)).await;
    let t: LibvirtMachineTemplate =
        w.wait_for("loose", "capacity", |t: &LibvirtMachineTemplate| quantity(t, "cpu").is_some()).await;
    assert_eq!(quantity(&t, "memory").as_deref(), Some("3072Mi"));
    assert_eq!(node_info(&t), (None, Some("linux".to_string())));
}
