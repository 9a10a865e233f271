//! Memory that does not grow with the hosts and machines a manager has seen
//! after machines on 50 distinct host URIs are created and
//! deleted, the manager holds no connection, call slots, DHCP lock or lease
//! wait for any of them.

use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::capi::{Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl::controller::Settings;
use capl_host::hypervisor::Hypervisor;
use capl_host::hypervisor::sim::SimHypervisor;

const HOSTS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_manager_keeps_per_host_and_machine_goes_with_the_objects() {
    let w = World::new("rc-bounded").await;
    let prefix = format!("qemu+tcp://sim-{}-", w.ns);
    let hosts: Vec<(String, libvirt_sim::Host)> = (0..HOSTS)
        .map(|i| {
            let uri = format!("{prefix}{i}/system");
            let host = capl_host::sim_host::register(&uri).unwrap_or_else(|e| panic!("simulated host {uri}: {e}"));
            (uri, host)
        })
        .collect();
    let manager = Manager::start_with_settings(
        w.client.clone(),
        w.connections(),
        Settings { sweep_interval: Duration::from_secs(1), ..manager_settings(&w.ns) },
    );
    for (i, (uri, _)) in hosts.iter().enumerate() {
        provisioned_cluster_on(&w, &format!("c{i}"), uri).await;
        ready_machine_objects(&w, &format!("c{i}"), &format!("m{i}")).await;
    }
    for i in 0..HOSTS {
        w.wait_for::<LibvirtMachine>(&format!("m{i}"), "Ready", machine_ready).await;
    }
    let ours = |uris: Vec<String>| uris.into_iter().filter(|u| u.starts_with(&prefix)).count();
    assert_eq!(ours(manager.connections.host_uris()), HOSTS, "one connection slot per host while machines live");

    for i in 0..HOSTS {
        w.delete::<LibvirtMachine>(&format!("m{i}")).await;
        w.delete::<Machine>(&format!("m{i}")).await;
    }
    for i in 0..HOSTS {
        w.wait_gone::<LibvirtMachine>(&format!("m{i}")).await;
        w.delete::<LibvirtCluster>(&format!("c{i}-lc")).await;
        w.delete::<Cluster>(&format!("c{i}")).await;
    }
    for i in 0..HOSTS {
        w.wait_gone::<LibvirtCluster>(&format!("c{i}-lc")).await;
    }

    let started = Instant::now();
    loop {
        let slots = ours(manager.connections.host_uris());
        let locks = capl_host::dhcp::network_locks_in_use().into_iter().filter(|(u, _)| u.starts_with(&prefix)).count();
        let waits = manager.ctx.lease_waits();
        if (slots, locks, waits) == (0, 0, 0) {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "after every object is gone the manager still holds {slots} host slots, {locks} DHCP locks and \
             {waits} lease waits"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (uri, host) in hosts {
        let hv = SimHypervisor::connect(&uri).unwrap();
        assert_eq!(hv.domain_list().unwrap(), Vec::<String>::new(), "{uri} still has domains");
        host.unregister();
    }
}
