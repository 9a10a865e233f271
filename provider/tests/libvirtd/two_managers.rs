//! Two manager processes (the manager binary, leader election off, each
//! watching its own namespace) create machines on the one network of the
//! private libvirtd at once, with the local kube-apiserver. Within a process
//! the choice of an address is serialized; between the two only libvirt
//! stands, which refuses a DHCP host entry whose address another entry has.
//! The manager that is refused chooses again: every machine is created
//! without a failure, each with its own reserved address, and deleting them
//! all leaves nothing on the host.
//!
//! The guests boot from an empty image, so they never ask for a lease: the
//! test needs the reservations, not running guests.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use capl::api::capi::{Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::json;
use testenv::test_host;

use crate::api_support::{
    ManagerProcess, WAIT, World, cloud_config, cluster_json, create_bootstrap_secret, has, libvirt_cluster_json,
    libvirt_machine_json, machine_conditions, machine_json,
};
use capl_host_test_support::host::{dhcp_hosts, ensure_base_image};
use capl_host_test_support::real_host::{CleanUp, connect_checked, fixture, ours_on_host, persistent_dhcp_hosts};

const IMAGE: &str = "capl-host-tests-base.qcow2";
/// Machines each manager creates.
const PER_MANAGER: usize = 8;
/// What a manager logs when libvirt refused the address it chose.
const REFUSED: &str = "DHCP reservation refused; choosing again";

/// The manager binary for namespace `w.ns`, without leader election, logging
/// the refused reservations.
fn start_manager(w: &World) -> ManagerProcess {
    let [health] = testenv::free_loopback_ports().unwrap();
    let log = w.env.scratch_dir().join(format!("manager-{}.log", w.ns));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"))
        .args(["--namespace", &w.ns, "--metrics-bind-address", "0", "--domain-type", "qemu"])
        .args(["--health-probe-bind-address", &format!("127.0.0.1:{health}")])
        // The private libvirtd is reached through socket=.
        .arg("--allow-unsafe-uris")
        .env("KUBECONFIG", w.env.kubeconfig_path())
        .env("RUST_LOG", "info,kube=warn,capl_host=debug")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("start the manager binary");
    ManagerProcess { child, log }
}

async fn cluster_on(w: &World, uri: &str) {
    let c: Cluster = w.apply(cluster_json("shared", "shared-lc", true)).await;
    let mut lc = libvirt_cluster_json("shared-lc", uri, Some(("shared", &c.uid().unwrap())));
    lc["spec"]["network"] = json!(test_host::NETWORK);
    lc["spec"]["basePool"] = json!(test_host::BASE_POOL);
    lc["spec"]["domainPool"] = json!(test_host::DISK_POOL);
    let _: LibvirtCluster = w.apply(lc).await;
    let _: Cluster = w.patch_status("shared", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
}

async fn machine_on(w: &World, name: &str) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let m: Machine = w.apply(machine_json(name, "shared", name, Some(&secret))).await;
    let mut lm = libvirt_machine_json(name, "shared", Some((name, &m.uid().unwrap())));
    lm["spec"]["image"] = json!(IMAGE);
    lm["spec"]["memoryMiB"] = json!(256);
    lm["spec"]["diskGiB"] = json!(1);
    let _: LibvirtMachine = w.apply(lm).await;
}

/// Created and running on the host (the image does not boot, so no address comes).
fn running(lm: &LibvirtMachine) -> bool {
    let c = machine_conditions(lm);
    lm.spec.provider_id.is_some() && has(c, "MachineCreated", "True", None) && has(c, "DomainRunning", "True", None)
}

/// The Warning events of the namespace: (object, reason, note).
async fn warnings(w: &World) -> Vec<(String, String, String)> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = w.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            let object = e.regarding.and_then(|r| r.name).unwrap_or_default();
            (object, e.reason.unwrap_or_default(), e.note.unwrap_or_default())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_on_one_network_never_reserve_an_address_twice() {
    let _daemon = crate::share_real_daemon().await;
    let (uri, hv) = connect_checked();
    let fx = fixture(IMAGE);
    ensure_base_image(&hv, &fx);
    let worlds = [World::new("two-mgr-a").await, World::new("two-mgr-b").await];
    let _cleanup = CleanUp { uri: uri.clone(), fx: fx.clone(), tags: worlds.iter().map(|w| w.ns.clone()).collect() };
    for w in &worlds {
        cluster_on(w, &uri).await;
    }
    let mut managers: Vec<ManagerProcess> = worlds.iter().map(start_manager).collect();
    let started = Instant::now();
    // Both namespaces' machines appear together, so both managers reserve at once.
    let names: Vec<String> = (0..PER_MANAGER).map(|i| format!("m{i}")).collect();
    for name in &names {
        for w in &worlds {
            machine_on(w, name).await;
        }
    }

    // Every machine is created and running, and none ever failed on the way.
    loop {
        let mut done = 0;
        let mut seen = Vec::new();
        for w in &worlds {
            let all = w.api::<LibvirtMachine>().list(&ListParams::default()).await.unwrap().items;
            done += all.iter().filter(|lm| running(lm)).count();
            seen.extend(all.iter().map(|lm| {
                let c = machine_conditions(lm);
                let provisioning = c
                    .as_ref()
                    .and_then(|c| c.iter().find(|c| c.type_ == "DomainProvisioningReady"))
                    .map(|c| format!("{} {}: {}", c.status, c.reason, c.message));
                format!("{}/{}: {provisioning:?}", w.ns, lm.name_any())
            }));
        }
        if done == 2 * PER_MANAGER {
            break;
        }
        for m in &mut managers {
            if let Ok(Some(status)) = m.child.try_wait() {
                panic!("a manager exited with {status}:\n{}", m.log_tail());
            }
        }
        assert!(
            started.elapsed() < WAIT,
            "{done} of {} machines running after {WAIT:?}:\n{}\nmanager logs:\n{}\n---\n{}",
            2 * PER_MANAGER,
            seen.join("\n"),
            managers[0].log_tail(),
            managers[1].log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let created_in = started.elapsed();
    // No machine failed on the way: any Warning event (an address conflict,
    // a call the host did not answer within the bound) fails the test.
    for w in &worlds {
        assert_eq!(warnings(w).await, Vec::<(String, String, String)>::new(), "Warning events in {}", w.ns);
    }

    // One reservation per machine, each with its own address, in the network's range.
    let entries = dhcp_hosts(&hv, &fx);
    let mut by_ip: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in &worlds {
        for lm in w.api::<LibvirtMachine>().list(&ListParams::default()).await.unwrap().items {
            let domain = lm.status.as_ref().and_then(|s| s.domain_name.clone()).expect("status.domainName");
            let mine: Vec<_> = entries.iter().filter(|(_, name, _)| *name == domain).collect();
            assert_eq!(mine.len(), 1, "DHCP entries of {domain}: {mine:?}");
            by_ip.entry(mine[0].2.clone()).or_default().push(domain);
        }
    }
    let shared: Vec<_> = by_ip.iter().filter(|(_, domains)| domains.len() > 1).collect();
    assert!(shared.is_empty(), "addresses reserved for more than one machine: {shared:?}");
    assert_eq!(by_ip.len(), 2 * PER_MANAGER, "{by_ip:?}");
    let prefix = format!("{}.", test_host::SUBNET_PREFIX);
    for ip in by_ip.keys() {
        let host: u8 = ip.strip_prefix(&prefix).and_then(|h| h.parse().ok()).unwrap_or_else(|| panic!("{ip}"));
        assert!((test_host::DHCP_FIRST..=test_host::DHCP_LAST).contains(&host), "{ip} is outside the DHCP range");
    }
    let refused: usize =
        managers.iter().map(|m| std::fs::read_to_string(&m.log).unwrap_or_default().matches(REFUSED).count()).sum();

    // Deleting everything leaves nothing, live or in the network's config.
    for w in &worlds {
        for name in &names {
            w.delete::<Machine>(name).await;
            w.delete::<LibvirtMachine>(name).await;
            w.delete::<Secret>(&format!("{name}-bootstrap")).await;
        }
    }
    for w in &worlds {
        for name in &names {
            w.wait_gone::<LibvirtMachine>(name).await;
        }
        assert_eq!(ours_on_host(&hv, &fx, &w.ns), Vec::<String>::new(), "left on the real libvirtd");
        assert_eq!(persistent_dhcp_hosts(&uri, &fx.network, &w.ns), Vec::<String>::new(), "left in the config");
        w.delete::<Cluster>("shared").await;
        w.delete::<LibvirtCluster>("shared-lc").await;
        w.wait_gone::<LibvirtCluster>("shared-lc").await;
    }
    crate::report(
        "two-managers",
        &format!(
            "two managers on one network: {} machines created in {created_in:.1?} with distinct addresses; \
             libvirt refused {refused} chosen address(es) as taken, and the refused manager chose again; \
             all deleted in {:.1?}, nothing left\n",
            2 * PER_MANAGER,
            started.elapsed() - created_in
        ),
    );
}
