//! The controllers end to end against the private test libvirtd, with the
//! local kube-apiserver (`testenv`): a whole cluster file deleted the way
//! `kubectl delete -f` does it (every object in file order, without waiting)
//! leaves nothing of ours on the real daemon; a domain destroyed behind the
//! provider's back is started again because of libvirt's lifecycle event.
//!
//! Needs both `cargo xtask host up` and the local control plane
//! (`cargo xtask control-plane build`); without either it fails naming the
//! command. In the deletion test the guests boot from an empty base image,
//! so they never get an address: it needs their domains, disks, seeds and
//! reservations, not a running guest. The event test boots the test guest
//! (`cargo xtask guest-image`), since only a machine with an address is
//! healthy and left to its events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use capl::api::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl::controller::{Settings, UriPolicy};
use capl_host::hypervisor::connections::{Connections, DEFAULT_MAX_CALLS_PER_HOST};
use capl_host::hypervisor::libvirt::LibvirtConnector;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::{DomainState, HostAdmin, Hypervisor};
use capl_host::{InfraSpec, check_infrastructure};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::json;
use testenv::test_host;

use crate::api_support::{
    Manager, World, cloud_config, create_bootstrap_secret, domain_of, has, libvirt_machine_json, machine_conditions,
    machine_json, machine_ready, manager_settings,
};
use crate::real_support::demo_cluster;
use capl_host_test_support::host::{Fixture, IMAGE_BYTES, ensure_base_image};
use capl_host_test_support::real_host::{CleanUp, connect_checked, fixture, guest_image_volume, ours_on_host};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_file_deleted_at_once_leaves_nothing_on_the_real_libvirtd() {
    let _daemon = crate::share_real_daemon().await;
    let uri = test_host::uri_or_panic();
    let hv = LibvirtHypervisor::connect(&uri).unwrap_or_else(|e| {
        panic!("cannot connect to the test libvirtd at {uri}: {e}: is `{}` running?", test_host::UP_COMMAND)
    });
    let fx = Fixture {
        network: test_host::NETWORK.into(),
        base_pool: test_host::BASE_POOL.into(),
        domain_pool: test_host::DISK_POOL.into(),
        image: "capl-host-tests-base.qcow2".into(),
        image_bytes: IMAGE_BYTES,
    };
    let infra =
        InfraSpec { network: fx.network.clone(), base_pool: fx.base_pool.clone(), domain_pool: fx.domain_pool.clone() };
    if let Err(e) = check_infrastructure(&hv, &infra) {
        panic!("the test libvirtd at {uri} is not set up ({e}): run `{}`", test_host::UP_COMMAND);
    }
    ensure_base_image(&hv, &fx);

    // The API side; World's own simulated host is not used.
    let w = World::new("real-del").await;
    let _cleanup = CleanUp { uri: uri.clone(), fx: fx.clone(), tags: vec![w.ns.clone()] };
    let connections = Arc::new(Connections::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST));
    // The test daemon is reached through socket=, which only --allow-unsafe-uris admits.
    let _manager = Manager::start_with_policy(w.client.clone(), &w.ns, connections, UriPolicy::allow_all());

    demo_cluster(&w, &fx, &uri).await;
    let machines = ["cp-0", "worker-0"];
    for name in machines {
        let secret = format!("{name}-bootstrap");
        create_bootstrap_secret(&w, &secret, cloud_config(name)).await;
        let m: Machine = w.apply(machine_json(name, "demo", name, Some(&secret))).await;
        let mut lm = libvirt_machine_json(name, "demo", Some((name, &m.uid().unwrap())));
        lm["spec"]["image"] = json!(fx.image);
        lm["spec"]["memoryMiB"] = json!(256);
        lm["metadata"]["labels"] = json!({ CLUSTER_NAME_LABEL: "demo" });
        let _: LibvirtMachine = w.apply(lm).await;
    }
    for name in machines {
        w.wait_for::<LibvirtMachine>(name, "its domain created on the real libvirtd", |lm| {
            has(machine_conditions(lm), "MachineCreated", "True", None)
        })
        .await;
    }
    let made = ours_on_host(&hv, &fx, &w.ns);
    assert_eq!(made.len(), 2 * 4, "2 domains, 4 volumes, 2 DHCP entries: {made:?}");

    // kubectl delete -f, in file order. Between the cluster objects and the
    // machines a large file takes kubectl a moment: long enough for a
    // LibvirtCluster that does not wait for its machines to be gone.
    w.delete::<Cluster>("demo").await;
    w.delete::<LibvirtCluster>("demo-lc").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in machines {
        w.delete::<Machine>(name).await;
        w.delete::<LibvirtMachine>(name).await;
        w.delete::<Secret>(&format!("{name}-bootstrap")).await;
    }
    for name in machines {
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    w.wait_gone::<LibvirtCluster>("demo-lc").await;
    assert_eq!(ours_on_host(&hv, &fx, &w.ns), Vec::<String>::new(), "left on the real libvirtd");
    for name in machines {
        let events = w.events(name).await;
        assert!(
            events.iter().any(|(t, r, n)| t == "Normal" && r == "DomainDeleted" && n.contains(&uri)),
            "{name}: {events:#?}"
        );
    }
    assert!(hv.volume_list(&fx.base_pool).unwrap().contains(&fx.image), "the base image stays");
}

/// A running, healthy machine on the real libvirtd whose domain is destroyed
/// behind the provider's back (`virsh destroy`): libvirt's lifecycle event
/// reconciles it and the domain is started again. The resync is hours away
/// and nothing touches the Kubernetes objects, so only the event can cause
/// that reconcile; the events are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_destroyed_on_the_real_libvirtd_is_started_again_because_of_its_event() {
    let _daemon = crate::share_real_daemon().await;
    let (uri, hv) = connect_checked();
    let image = guest_image_volume(&hv);
    let fx = fixture(&image);
    let w = World::new("real-events").await;
    let _cleanup = CleanUp { uri: uri.clone(), fx: fx.clone(), tags: vec![w.ns.clone()] };
    let connections = Arc::new(Connections::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST));
    // The test daemon is reached through socket=, which only --allow-unsafe-uris admits.
    let settings = Settings {
        uri_policy: UriPolicy::allow_all(),
        resync_interval: Duration::from_secs(6 * 3600),
        ..manager_settings(&w.ns)
    };
    let manager = Manager::start_with_settings(w.client.clone(), connections, settings);

    demo_cluster(&w, &fx, &uri).await;
    let name = "worker-0";
    create_bootstrap_secret(&w, "worker-0-bootstrap", cloud_config(name)).await;
    let m: Machine = w.apply(machine_json(name, "demo", name, Some("worker-0-bootstrap"))).await;
    let mut lm = libvirt_machine_json(name, "demo", Some((name, &m.uid().unwrap())));
    lm["spec"]["image"] = json!(image);
    lm["spec"]["memoryMiB"] = json!(256);
    lm["spec"]["diskGiB"] = json!(1);
    let _: LibvirtMachine = w.apply(lm).await;
    // The guest boots under TCG and asks for its lease: slower than the simulator.
    let boot = Duration::from_secs(240);
    w.wait_for_within::<LibvirtMachine>(boot, name, "a Ready machine with an address", machine_ready).await;
    let domain = domain_of(&w, name).await;
    let reconciles = manager.settle().await;
    let events = manager.domain_events(true);
    let own = manager.own_domain_events();

    hv.domain_destroy(&domain).unwrap();
    let destroyed = Instant::now();
    let note = format!("started domain {domain} on {uri}");
    w.wait_event(name, "Normal", "DomainStarted", &note).await;
    println!("the destroyed domain was started again {:.1} s after the destroy", destroyed.elapsed().as_secs_f64());
    w.wait_for_within::<LibvirtMachine>(boot, name, "Ready again", machine_ready).await;
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);
    let runs = manager.settle().await - reconciles;
    let received = manager.domain_events(true) - events;
    println!("destroy on the real libvirtd: {received} domain events, {runs} reconciles");
    // Stopped (destroyed), at least, reconciled the machine; the start's
    // Resumed and Started were the reconciler's own.
    assert!(received >= 1, "{received} events of the machine's domain");
    assert_eq!(manager.own_domain_events() - own, 2, "events of the provider's own start");
    assert!((1..=10).contains(&runs), "{runs} reconciles for one destroy");
    // (Other tests' domains on the shared daemon send events too; the manager ignores them.)
    assert_eq!(manager.connections.connections_opened(), 1, "one connection for the whole test");

    w.delete::<LibvirtMachine>(name).await;
    w.wait_gone::<LibvirtMachine>(name).await;
    assert_eq!(ours_on_host(&hv, &fx, &w.ns), Vec::<String>::new(), "left on the real libvirtd");
}
