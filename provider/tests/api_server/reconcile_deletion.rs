//! Deletion in any order, on the real kube-apiserver with a simulated host:
//! a whole cluster file deleted at once, a LibvirtMachine whose LibvirtCluster
//! is already gone, a foreign domain at the machine's name, and a host that
//! does not answer (retried, until the user gives up with the annotation).

use std::time::Duration;

use crate::support::*;
use capl::api::capi::{Cluster, Machine};
use capl::api::{CLUSTER_FINALIZER, LibvirtCluster, LibvirtMachine, SKIP_HOST_CLEANUP_ANNOTATION};
use capl_host::hypervisor::{HostAdmin, Hypervisor, UndefineFlags};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use libvirt_sim::Op;
use serde_json::json;

const EMPTY: HostObjects = HostObjects { domains: vec![], volumes: vec![], dhcp_hosts: vec![] };

/// Two Ready machines of Cluster `demo` on the test's host; their names.
async fn two_ready_machines(w: &World) -> [&'static str; 2] {
    provisioned_cluster(w, "demo").await;
    let names = ["cp-0", "worker-0"];
    for name in names {
        ready_machine_objects(w, "demo", name).await;
    }
    for name in names {
        let lm = w.wait_for::<LibvirtMachine>(name, "a Ready machine", machine_ready).await;
        // What deletion needs is in the machine's own status.
        let status = lm.status.unwrap();
        assert_eq!(
            (status.host_uri.as_deref(), status.network.as_deref(), status.domain_pool.as_deref()),
            (Some(w.uri.as_str()), Some(NETWORK), Some(DOMAIN_POOL))
        );
        assert_eq!(status.base_pool.as_deref(), Some(BASE_POOL));
    }
    let objects = w.host_objects();
    assert_eq!((objects.domains.len(), objects.volumes.len(), objects.dhcp_hosts.len()), (2, 4, 2), "{objects:?}");
    names
}

fn ready_message(lc: &LibvirtCluster) -> String {
    condition(cluster_conditions(lc), "Ready").map(|c| c.message.clone()).unwrap_or_default()
}

/// `kubectl delete -f cluster.yaml`: Cluster, LibvirtCluster, Machines and
/// LibvirtMachines get their deletion at once, in file order. The
/// LibvirtCluster waits (finalizer held, Ready says for what) until the
/// LibvirtMachines have removed their VMs; then nothing of ours is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_whole_cluster_file_at_once_leaves_nothing_on_the_host() {
    let w = World::new("rc-del-all").await;
    let _manager = w.start_manager();
    let machines = two_ready_machines(&w).await;
    // Destroying a domain takes a while, as on a real host (1-2 s).
    w.host.faults().set_latency(Op::DomainDestroy, Duration::from_secs(3));

    w.delete::<Cluster>("demo").await;
    w.delete::<LibvirtCluster>("demo-lc").await;
    for name in machines {
        w.delete::<Machine>(name).await;
    }
    for name in machines {
        w.delete::<LibvirtMachine>(name).await;
        w.delete::<Secret>(&format!("{name}-bootstrap")).await;
    }

    let lc = w
        .wait_for::<LibvirtCluster>("demo-lc", "Ready=False naming the LibvirtMachines it waits for", |lc| {
            has(cluster_conditions(lc), "Ready", "False", Some("Deleting")) && ready_message(lc).contains("cp-0")
        })
        .await;
    assert!(lc.metadata.deletion_timestamp.is_some());
    assert!(lc.finalizers().contains(&CLUSTER_FINALIZER.to_string()), "{:?}", lc.finalizers());
    assert!(ready_message(&lc).contains("worker-0"), "{}", ready_message(&lc));

    for name in machines {
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    w.wait_gone::<LibvirtCluster>("demo-lc").await;
    assert_eq!(w.host_objects(), EMPTY);
    assert_eq!(w.inspect().volume_list(BASE_POOL).unwrap(), vec![BASE_IMAGE.to_string()], "the base image stays");
}

/// A LibvirtMachine whose LibvirtCluster is already gone (its finalizer
/// removed by hand, or by a provider build that did not wait) cleans up
/// from the host, network and pool recorded in its own status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_libvirt_cluster_is_gone_cleans_up_from_its_status() {
    let w = World::new("rc-del-late").await;
    let _manager = w.start_manager();
    let machines = two_ready_machines(&w).await;

    w.delete::<Cluster>("demo").await;
    w.delete::<LibvirtCluster>("demo-lc").await;
    let _: LibvirtCluster = w.merge("demo-lc", json!({ "metadata": { "finalizers": null } })).await;
    w.wait_gone::<LibvirtCluster>("demo-lc").await;
    assert_eq!(w.host_objects().domains.len(), 2, "nothing is removed before the machines are deleted");

    for name in machines {
        w.delete::<LibvirtMachine>(name).await;
    }
    for name in machines {
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    assert_eq!(w.host_objects(), EMPTY);
    let deleted = w.events("worker-0").await;
    assert!(
        deleted.iter().any(|(t, r, n)| t == "Normal" && r == "DomainDeleted" && n.contains(&w.uri)),
        "{deleted:#?}"
    );
}

/// Behind the provider's back the machine's domain is replaced by one that
/// is not ours under the same name. Deleting the machine removes its disk,
/// seed ISO and DHCP reservation, leaves the foreign domain as it was,
/// removes the finalizer and says in a Warning event what was left and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_domain_at_our_name_is_left_and_the_rest_removed() {
    let w = World::new("rc-del-foreign").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "worker-0").await;
    w.wait_for::<LibvirtMachine>("worker-0", "a Ready machine", machine_ready).await;
    let domain = domain_of(&w, "worker-0").await;

    let hv = w.inspect();
    // Undefined first: the domain's events never show the provider a stopped domain it would start.
    hv.domain_undefine(&domain, UndefineFlags::all()).unwrap();
    hv.domain_destroy(&domain).unwrap();
    hv.domain_define(&format!(
        "<domain type='qemu'><name>{domain}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os></domain>"
    ))
    .unwrap();
    let foreign = hv.domain_xml(&domain).unwrap();

    w.delete::<LibvirtMachine>("worker-0").await;
    w.wait_gone::<LibvirtMachine>("worker-0").await;
    assert_eq!(w.host_objects(), HostObjects { domains: vec![domain.clone()], volumes: vec![], dhcp_hosts: vec![] });
    assert_eq!(hv.domain_xml(&domain).unwrap(), foreign, "the foreign domain was changed");
    let events = w.events("worker-0").await;
    let left = events.iter().find(|(t, r, _)| t == "Warning" && r == "ForeignObjectsLeft");
    let note = &left.unwrap_or_else(|| panic!("no ForeignObjectsLeft event: {events:#?}")).2;
    for needle in [domain.as_str(), "no cluster-api-provider-libvirt metadata", w.uri.as_str()] {
        assert!(note.contains(needle), "the event does not say {needle:?}: {note}");
    }
}

/// The host does not answer: deletion keeps the finalizer, retries, and says
/// so in Ready (reason DeletionRetrying, with the annotation that gives up).
/// The annotation then releases the object without touching the host, with
/// a Warning event listing what may remain there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_host_is_retried_until_the_annotation_gives_up() {
    let w = World::new("rc-del-unreach").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "worker-0").await;
    let lm = w.wait_for::<LibvirtMachine>("worker-0", "a Ready machine", machine_ready).await;
    let domain = domain_of(&w, "worker-0").await;
    let mac = lm.status.as_ref().and_then(|s| s.mac_address.clone()).expect("status.macAddress");
    let on_host = w.host_objects();

    w.host.unregister();
    w.delete::<LibvirtMachine>("worker-0").await;
    let lm = w
        .wait_for::<LibvirtMachine>("worker-0", "Ready=False with reason DeletionRetrying", |lm| {
            has(machine_conditions(lm), "Ready", "False", Some("DeletionRetrying"))
        })
        .await;
    assert!(lm.finalizers().contains(&capl::api::MACHINE_FINALIZER.to_string()));
    let message = condition(machine_conditions(&lm), "Ready").unwrap().message.clone();
    for needle in [w.uri.as_str(), "unreachable", "retrying", SKIP_HOST_CLEANUP_ANNOTATION] {
        assert!(message.contains(needle), "the Ready message does not say {needle:?}: {message}");
    }
    assert!(has(machine_conditions(&lm), "DomainProvisioningReady", "False", Some("HostUnreachable")));
    // It is retried, not given up: more reconciles, the object stays.
    let reconciles = manager.reconciles("libvirtmachine");
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(manager.reconciles("libvirtmachine") > reconciles, "deletion is not retried");
    let still: LibvirtMachine = w.api().get("worker-0").await.expect("the machine waits for its host");
    assert!(has(machine_conditions(&still), "Ready", "False", Some("DeletionRetrying")));

    let _: LibvirtMachine =
        w.merge("worker-0", json!({ "metadata": { "annotations": { SKIP_HOST_CLEANUP_ANNOTATION: "true" } } })).await;
    w.wait_gone::<LibvirtMachine>("worker-0").await;
    let events = w.events("worker-0").await;
    let skipped = events.iter().find(|(t, r, _)| t == "Warning" && r == "HostCleanupSkipped");
    let note = &skipped.unwrap_or_else(|| panic!("no HostCleanupSkipped event: {events:#?}")).2;
    for needle in [
        domain.clone(),
        format!("{DOMAIN_POOL}/{domain}.qcow2"),
        format!("{DOMAIN_POOL}/cloudinit-{domain}.iso"),
        mac,
        NETWORK.to_string(),
        w.uri.clone(),
    ] {
        assert!(note.contains(&needle), "the event does not list {needle:?}: {note}");
    }
    // The host was not touched: when it answers again, everything is still there.
    w.host.register();
    assert_eq!(w.host_objects(), on_host);
}
