//! Faults of a real libvirt host under the controllers: on
//! the private libvirtd of `cargo xtask host up`, with the local kube-apiserver,
//! three machines boot the test guest (`cargo xtask guest-image`), which asks
//! for its address by DHCP.
//!
//! 1. libvirtd is killed (SIGKILL) as soon as the first machine's DHCP
//!    reservation is made, so the creates are cut short in flight; the
//!    machines report `HostUnreachable` until it is started again.
//! 2. The network's dnsmasq is killed as soon as the last reservation is made,
//!    before the guests ask for a lease. libvirt does not notice; the provider
//!    writes the reservation of a guest that waits long for its lease again,
//!    on which libvirt starts dnsmasq.
//!
//! Every machine becomes Ready with the address reserved for it, the host
//! holds each machine's objects once, and deleting the machines leaves no
//! domain, volume or DHCP host entry, live or in the network's persistent
//! config. The test has the daemon alone (the other tests on it wait), and a
//! guard starts libvirtd and dnsmasq again however the test ends.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capl::api::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl::controller::UriPolicy;
use capl::controller::machine_decision::LEASE_REFRESH_AFTER;
use capl_host::hypervisor::connections::{Connections, DEFAULT_MAX_CALLS_PER_HOST};
use capl_host::hypervisor::libvirt::LibvirtConnector;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::{HostAdmin, Hypervisor};
use capl_testbed::wait::{self, Bound};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::json;
use testenv::test_host;

use crate::api_support::{
    Manager, World, cloud_config, condition, create_bootstrap_secret, libvirt_machine_json, machine_conditions,
    machine_json, machine_ready,
};
use capl_host_test_support::host::{Fixture, dhcp_hosts};
use capl_host_test_support::real_host::{
    CleanUp, connect_checked, fixture, guest_image_volume, ours_on_host, persistent_dhcp_hosts,
};

use crate::real_support::demo_cluster;

const MACHINES: [&str; 3] = ["m0", "m1", "m2"];
/// Bound of each wait on the daemon's processes.
const PROCESS_WAIT: Duration = Duration::from_secs(30);

// --- the daemon's processes -----------------------------------------------------

/// Whether process `pid` exists and has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).is_some_and(|state| state != 'Z')
}

/// The live process named `name` whose pid is in `file`.
fn pid_from(file: &str, name: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == name && alive(pid)).then_some(pid)
}

fn libvirtd_pid() -> Option<u32> {
    pid_from(test_host::LIBVIRTD_PID_FILE, "libvirtd")
}

/// The live dnsmasq processes of the test network (libvirt runs it with
/// `--conf-file=/var/lib/libvirt/dnsmasq/<network>.conf`).
fn dnsmasq_pids() -> Vec<u32> {
    let conf = format!("/dnsmasq/{}.conf", test_host::NETWORK);
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let cmdline = String::from_utf8_lossy(&c);
                cmdline.contains("dnsmasq") && cmdline.contains(&conf)
            })
        })
        .filter(|pid| alive(*pid))
        .collect()
}

fn sigkill(pid: u32) {
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("run kill");
    assert!(status.success() || !alive(pid), "kill -KILL {pid} failed");
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let bound = Bound::new(PROCESS_WAIT, Duration::from_millis(50));
    let outcome = wait::blocking(bound, || Ok::<_, Infallible>(done().into()));
    assert!(outcome.is_ok(), "timed out after {PROCESS_WAIT:?} waiting for {what}");
}

/// Kills libvirtd with SIGKILL (no clean shutdown) and waits until it is gone.
fn kill_libvirtd() {
    let pid = libvirtd_pid().unwrap_or_else(|| {
        panic!("no live libvirtd in {}: run `{}`", test_host::LIBVIRTD_PID_FILE, test_host::UP_COMMAND)
    });
    sigkill(pid);
    wait_until("the killed libvirtd to exit", || !alive(pid));
}

/// Starts libvirtd in the private mount namespace, which virtlogd keeps, and
/// waits until it answers.
fn start_libvirtd(uri: &str) {
    let virtlogd = pid_from(test_host::VIRTLOGD_PID_FILE, "virtlogd").unwrap_or_else(|| {
        panic!(
            "virtlogd of the private libvirtd is not running, so its mount namespace is gone: run `{}`",
            test_host::UP_COMMAND
        )
    });
    let status = Command::new("nsenter")
        .arg(format!("--mount=/proc/{virtlogd}/ns/mnt"))
        .arg("libvirtd")
        .args(test_host::LIBVIRTD_ARGS)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("run nsenter libvirtd");
    assert!(status.success(), "starting libvirtd in virtlogd's mount namespace failed: {status}");
    wait_until("the restarted libvirtd to answer", || {
        LibvirtHypervisor::connect(uri).is_ok_and(|hv| hv.network_is_active(test_host::NETWORK).is_ok())
    });
}

/// Kills the network's dnsmasq processes and waits until they are gone.
fn kill_dnsmasq() {
    let pids = dnsmasq_pids();
    assert!(!pids.is_empty(), "no dnsmasq of network {} is running", test_host::NETWORK);
    for pid in &pids {
        sigkill(*pid);
    }
    wait_until("the killed dnsmasq to exit", || pids.iter().all(|pid| !alive(*pid)));
}

/// Leaves a working daemon behind, however the test ends: libvirtd running,
/// and dnsmasq too (a libvirtd that starts finds a dead dnsmasq and starts it).
struct DaemonGuard {
    uri: String,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        if libvirtd_pid().is_some() && !dnsmasq_pids().is_empty() {
            return;
        }
        eprintln!("daemon_faults: restoring the private libvirtd and its dnsmasq");
        let restore = std::panic::catch_unwind(|| {
            if libvirtd_pid().is_some() {
                kill_libvirtd();
            }
            start_libvirtd(&self.uri);
            wait_until("dnsmasq started by the new libvirtd", || !dnsmasq_pids().is_empty());
        });
        if restore.is_err() {
            eprintln!("daemon_faults: could not restore the daemon: run `{}`", test_host::UP_COMMAND);
        }
    }
}

// --- what the test looks at -------------------------------------------------------

/// The test's DHCP host entries on the network, by name (domain name): (MAC, IP).
fn reservations(hv: &dyn HostAdmin, fx: &Fixture, ns: &str) -> Vec<(String, String, String)> {
    dhcp_hosts(hv, fx).into_iter().filter(|(_, name, _)| name.contains(ns)).collect()
}

/// Polls the host (a fresh connection each time, so a restarted daemon is
/// found) until `ready` holds for the test's reservations.
fn wait_reservations(uri: &str, fx: &Fixture, ns: &str, what: &str, ready: impl Fn(usize) -> bool) {
    let started = Instant::now();
    let mut hv = LibvirtHypervisor::connect(uri).ok();
    loop {
        if let Some(h) = &hv {
            match h.network_xml(&fx.network) {
                Ok(_) if ready(reservations(h, fx, ns).len()) => return,
                Ok(_) => {}
                Err(_) => hv = None,
            }
        } else {
            hv = LibvirtHypervisor::connect(uri).ok();
        }
        assert!(started.elapsed() < Duration::from_secs(90), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(40));
    }
}

async fn machines(w: &World) -> Vec<LibvirtMachine> {
    w.api::<LibvirtMachine>().list(&ListParams::default()).await.expect("list LibvirtMachines").items
}

/// Polls the test's LibvirtMachines until `done` holds for them.
async fn wait_machines(w: &World, within: Duration, what: &str, done: impl Fn(&[LibvirtMachine]) -> bool) {
    let started = Instant::now();
    loop {
        let all = machines(w).await;
        if done(&all) {
            return;
        }
        if started.elapsed() > within {
            let state: Vec<String> = all
                .iter()
                .map(|lm| {
                    let c = machine_conditions(lm);
                    let show =
                        |t: &str| condition(c, t).map(|c| format!("{t}={} {}: {}", c.status, c.reason, c.message));
                    format!(
                        "{}: {:?} {:?} {:?} addresses {:?}",
                        lm.name_any(),
                        show("Ready"),
                        show("DomainProvisioningReady"),
                        show("DomainRunning"),
                        lm.status.as_ref().and_then(|s| s.addresses.clone())
                    )
                })
                .collect();
            panic!("timed out after {within:?} waiting for {what}:\n{}", state.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn internal_ip(lm: &LibvirtMachine) -> Option<String> {
    lm.status.as_ref()?.addresses.as_ref()?.iter().find(|a| a.type_ == "InternalIP").map(|a| a.address.clone())
}

fn reports_unreachable(lm: &LibvirtMachine) -> bool {
    condition(machine_conditions(lm), "DomainProvisioningReady")
        .is_some_and(|c| c.status == "False" && c.reason == "HostUnreachable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_converge_through_a_killed_libvirtd_and_a_killed_dnsmasq() {
    let _alone = crate::own_real_daemon().await;
    let (uri, hv) = connect_checked();
    let _daemon = DaemonGuard { uri: uri.clone() };
    let image = guest_image_volume(&hv);
    let fx = fixture(&image);
    let w = World::new("lv-faults").await;
    let _cleanup = CleanUp { uri: uri.clone(), fx: fx.clone(), tags: vec![w.ns.clone()] };
    let connections = Arc::new(Connections::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST));
    // The test daemon is reached through socket=, which only --allow-unsafe-uris admits.
    let manager = Manager::start_with_policy(w.client.clone(), &w.ns, connections, UriPolicy::allow_all());
    let started = Instant::now();

    demo_cluster(&w, &fx, &uri).await;
    for name in MACHINES {
        let secret = format!("{name}-bootstrap");
        create_bootstrap_secret(&w, &secret, cloud_config(name)).await;
        let m: Machine = w.apply(machine_json(name, "demo", name, Some(&secret))).await;
        let mut lm = libvirt_machine_json(name, "demo", Some((name, &m.uid().unwrap())));
        lm["spec"]["image"] = json!(image);
        lm["spec"]["memoryMiB"] = json!(256);
        lm["spec"]["diskGiB"] = json!(1);
        lm["metadata"]["labels"] = json!({ CLUSTER_NAME_LABEL: "demo" });
        let _: LibvirtMachine = w.apply(lm).await;
    }

    // 1. libvirtd dies as the first reservation is made: the creates are in flight.
    let (u, f, ns) = (uri.clone(), fx.clone(), w.ns.clone());
    let made_before_kill = tokio::task::spawn_blocking(move || {
        wait_reservations(&u, &f, &ns, "the first DHCP reservation", |n| n >= 1);
        let made = LibvirtHypervisor::connect(&u).map(|hv| ours_on_host(&hv, &f, &ns)).unwrap_or_default();
        kill_libvirtd();
        made
    })
    .await
    .unwrap();
    let killed_at = started.elapsed();
    let domains_before_kill = made_before_kill.iter().filter(|o| o.starts_with("domain ")).count();
    assert!(
        domains_before_kill < MACHINES.len(),
        "libvirtd was killed after every machine was created, not while they were: {made_before_kill:?}"
    );
    wait_machines(&w, Duration::from_secs(60), "a machine to report HostUnreachable", |all| {
        all.iter().any(reports_unreachable)
    })
    .await;
    let (down_for, unreachable) = {
        let all = machines(&w).await;
        (started.elapsed() - killed_at, all.iter().filter(|lm| reports_unreachable(lm)).count())
    };
    let u = uri.clone();
    tokio::task::spawn_blocking(move || start_libvirtd(&u)).await.unwrap();
    let restarted_at = started.elapsed();
    let hv = LibvirtHypervisor::connect(&uri).expect("connect to the restarted libvirtd");

    // 2. dnsmasq dies as the last reservation is made, before the guests ask for a lease.
    let (u, f, ns) = (uri.clone(), fx.clone(), w.ns.clone());
    tokio::task::spawn_blocking(move || {
        wait_reservations(&u, &f, &ns, "every machine's DHCP reservation", |n| n == MACHINES.len());
        kill_dnsmasq();
    })
    .await
    .unwrap();
    let dnsmasq_killed_at = started.elapsed();
    let leased_at_kill: Vec<String> = {
        let ours: BTreeSet<String> = reservations(&hv, &fx, &w.ns).into_iter().map(|(mac, _, _)| mac).collect();
        hv.network_dhcp_leases(&fx.network)
            .expect("read the leases")
            .into_iter()
            .filter(|l| ours.contains(&l.mac.to_ascii_lowercase()))
            .map(|l| l.mac)
            .collect()
    };
    assert!(
        leased_at_kill.len() < MACHINES.len(),
        "every guest had its lease before dnsmasq was killed: {leased_at_kill:?}"
    );

    // Every machine becomes Ready with the address reserved for it: the
    // provider writes the reservation of a guest waiting for LEASE_REFRESH_AFTER
    // again, and libvirt starts dnsmasq on that.
    wait_machines(
        &w,
        LEASE_REFRESH_AFTER + Duration::from_secs(180),
        "every machine Ready with an InternalIP",
        |all| all.len() == MACHINES.len() && all.iter().all(machine_ready),
    )
    .await;
    let ready_at = started.elapsed();
    assert!(!dnsmasq_pids().is_empty(), "the machines got leases, so a dnsmasq must be running again");
    let reserved = reservations(&hv, &fx, &w.ns);
    let mut addresses = BTreeSet::new();
    for lm in machines(&w).await {
        let mac = lm.status.as_ref().and_then(|s| s.mac_address.clone()).expect("status.macAddress");
        let ip = internal_ip(&lm).expect("an InternalIP");
        let entry = reserved.iter().find(|(m, _, _)| m.eq_ignore_ascii_case(&mac));
        assert_eq!(
            entry.map(|(_, _, ip)| ip.clone()),
            Some(ip.clone()),
            "{}: reservations {reserved:?}",
            lm.name_any()
        );
        addresses.insert(ip);
    }
    assert_eq!(addresses.len(), MACHINES.len(), "each machine has its own address: {addresses:?}");
    // Nothing was made twice by the creates that were cut short and retried.
    let held = ours_on_host(&hv, &fx, &w.ns);
    assert_eq!(held.len(), MACHINES.len() * 4, "a domain, two volumes and a DHCP entry per machine: {held:?}");

    // Deleting the machines leaves nothing, live or in the persistent config.
    for name in MACHINES {
        w.delete::<Machine>(name).await;
        w.delete::<LibvirtMachine>(name).await;
        w.delete::<Secret>(&format!("{name}-bootstrap")).await;
    }
    for name in MACHINES {
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    let deleted_at = started.elapsed();
    // A volume file the killed daemon was writing is listed only after a refresh.
    hv.pool_refresh(&fx.domain_pool).expect("refresh the disk pool");
    assert_eq!(ours_on_host(&hv, &fx, &w.ns), Vec::<String>::new(), "left on the real libvirtd");
    assert_eq!(persistent_dhcp_hosts(&uri, &fx.network, &w.ns), Vec::<String>::new(), "left in the network's config");
    w.delete::<Cluster>("demo").await;
    w.delete::<LibvirtCluster>("demo-lc").await;
    w.wait_gone::<LibvirtCluster>("demo-lc").await;
    manager.kill().await;

    crate::report(
        "daemon-faults",
        &format!(
            "daemon faults on the real libvirtd ({} machines booting the test guest): libvirtd killed at {killed_at:.1?} \
             with {domains_before_kill} domain(s) defined, {unreachable} machine(s) reported HostUnreachable within \
             {down_for:.1?}, restarted at {restarted_at:.1?}; dnsmasq killed at {dnsmasq_killed_at:.1?} with \
             {} of {} guests leased; all Ready at {ready_at:.1?}; all deleted at {deleted_at:.1?}, nothing left\n",
            MACHINES.len(),
            leased_at_kill.len(),
            MACHINES.len()
        ),
    );
}
