//! The e2e scenarios: real CAPI Machines become real VMs. Each runs in a
//! namespace of its own, on a running [`Stack`], and checks from the outside:
//! API objects, `virsh`, and the guest's serial console log. The machine
//! scenarios are in this file; the others have files of their own:
//! [`init`] (the offline `clusterctl init`), [`deployed`] (the provider's Pod
//! as an operator checks it), [`workload`] (real Kubernetes clusters),
//! [`multihost`] (one cluster over two hosts with IPAM), [`clusterctl_move`]
//! (`clusterctl move` of a running cluster). [`suite`] runs them.

pub mod clusterctl_move;
pub mod deployed;
pub mod init;
pub mod multihost;
pub mod suite;
pub mod workload;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::api::DynamicObject;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::harness::management::ManagementKind;
use crate::harness::objects::{self, CLUSTER_NAME_LABEL, Kind};
use crate::harness::stack::{Backend, Stack, StackConfig, TEST_DISK_POOL, TEST_NETWORK, delete_all_clusters};
use crate::harness::wait::{Check, until};

/// How long a machine may take from creation to a running guest with an
/// address (TCG on a loaded 2-core machine is slow; this is a ceiling, not
/// an expectation).
pub(crate) const MACHINE_READY: Duration = Duration::from_secs(480);
/// How long the guest may take to print its seed and lease after the domain runs.
const GUEST_BOOT: Duration = Duration::from_secs(300);

/// The future a scenario returns: a one-line observation on success.
pub type ScenarioFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<String>> + 'a>>;
/// A scenario's entry point.
pub type ScenarioFn = for<'a> fn(&'a mut Stack) -> ScenarioFuture<'a>;

/// A scenario: a name for the summary and the function that runs it.
pub struct Scenario {
    pub name: &'static str,
    /// Short id for `--only` and for namespace names.
    pub id: &'static str,
    pub run: ScenarioFn,
    /// What it needs of the stack.
    pub needs: Needs,
}

/// What a scenario needs of the stack beyond a libvirt host and a management cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Any stack.
    Any,
    /// The private libvirtd (`cargo xtask host up`), for the reason given: its
    /// guests are routable from this machine, and other hosts can share its bridge.
    PrivateLibvirtd(&'static str),
    /// The local control plane and the provider as a local process (the
    /// scenario starts a second one of each), and the private libvirtd (it
    /// checks the volumes' files, by inode, on this machine's disk).
    LocalProcessesAndPrivateLibvirtd,
    /// The kind management cluster, with the provider as its Pod.
    Kind,
    /// Not the kind management cluster: the scenario checks what that
    /// cluster's own setup already did (`clusterctl init`).
    NotKind,
}

impl Scenario {
    /// Why it cannot run on a stack of `config`, if it cannot.
    pub fn unmet(&self, config: &StackConfig) -> Option<String> {
        let kind = config.management == ManagementKind::Kind;
        match self.needs {
            Needs::Any => None,
            Needs::PrivateLibvirtd(why) => (!matches!(config.backend, Backend::Libvirt { .. }))
                .then(|| format!("needs the private libvirtd: {why}")),
            Needs::LocalProcessesAndPrivateLibvirtd => (kind || !matches!(config.backend, Backend::Libvirt { .. }))
                .then(|| {
                    "needs the local control plane, the provider as a local process and the private libvirtd \
                     (it starts a second manager and reads the volumes' inodes on this machine's disk)"
                        .to_string()
                }),
            Needs::Kind => (!kind).then(|| "needs the kind management cluster (--kind)".to_string()),
            Needs::NotKind => kind.then(|| "the kind management cluster was made by clusterctl init".to_string()),
        }
    }
}

/// All scenarios, in the order they run.
pub fn all() -> Vec<Scenario> {
    const GUESTS: &str = "the workload cluster's API server and Pods are reached at guest addresses";
    vec![
        // First: it needs nothing of the stack (a fresh API server of its own) and takes seconds.
        Scenario {
            name: "clusterctl init into a fresh management cluster",
            id: "init",
            run: |s| Box::pin(crate::scenarios::init::clusterctl_init(s)),
            needs: Needs::NotKind,
        },
        Scenario {
            name: "the provider's Pod: Ready, leading, nonroot, read-only; rollout restart",
            id: "deployed",
            run: |s| Box::pin(crate::scenarios::deployed::deployed(s)),
            needs: Needs::Kind,
        },
        Scenario {
            name: "single machine, bootstrap Secret by name",
            id: "single",
            run: |s| Box::pin(single_machine(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "MachineDeployment scaled 1 -> 3 -> 1",
            id: "md",
            run: |s| Box::pin(machine_deployment(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "paused Cluster creates nothing; unpaused it does",
            id: "pause",
            run: |s| Box::pin(pause(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "provider killed mid-create and restarted",
            id: "restart",
            run: |s| Box::pin(restart(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "domain stopped behind the provider's back",
            id: "stopped",
            run: |s| Box::pin(stopped_domain(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "Cluster deletion removes everything it made",
            id: "delete",
            run: |s| Box::pin(cluster_deletion(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "workload cluster: kubeadm control plane and workers from the template",
            id: "workload",
            run: |s| Box::pin(crate::scenarios::workload::workload(s)),
            needs: Needs::PrivateLibvirtd(GUESTS),
        },
        Scenario {
            name: "workload cluster from the ClusterClass flavor",
            id: "workload-topology",
            run: |s| Box::pin(crate::scenarios::workload::workload_topology(s)),
            needs: Needs::PrivateLibvirtd(GUESTS),
        },
        Scenario {
            name: "one Cluster over two hosts on one bridge, addresses and endpoint from IPAM",
            id: "multihost",
            run: |s| Box::pin(crate::scenarios::multihost::multihost(s)),
            needs: Needs::PrivateLibvirtd("a second libvirtd shares its bridge"),
        },
        // Last: it adds clusterctl's inventory to the stack's management cluster.
        Scenario {
            name: "clusterctl move to a second management cluster",
            id: "move",
            run: |s| Box::pin(crate::scenarios::clusterctl_move::clusterctl_move(s)),
            // Also the private libvirtd: it reads the volumes' inodes on this machine's disk.
            needs: Needs::LocalProcessesAndPrivateLibvirtd,
        },
        // Last on kind: the log of every scenario's reconciles.
        Scenario {
            name: "the provider Pods' logs after every scenario",
            id: "pod-logs",
            run: |s| Box::pin(crate::scenarios::deployed::pod_logs(s)),
            needs: Needs::Kind,
        },
    ]
}

pub(crate) fn say(scenario: &str, message: impl AsRef<str>) {
    eprintln!("  [{scenario}] {}", message.as_ref());
}

/// Creates Cluster, LibvirtCluster and the bootstrap Secret `<cluster>-bootstrap`,
/// and waits until the LibvirtCluster is provisioned.
pub(crate) async fn create_cluster(stack: &Stack, ns: &str, cluster: &str) -> Result<()> {
    let client = stack.client();
    objects::create(&client, ns, Kind::LibvirtCluster, objects::libvirt_cluster(ns, cluster, &stack.placement)).await?;
    objects::create(&client, ns, Kind::Cluster, objects::cluster(ns, cluster, false)).await?;
    let secret = format!("{cluster}-bootstrap");
    objects::create(
        &client,
        ns,
        Kind::Secret,
        objects::bootstrap_secret(ns, &secret, cluster, &objects::user_data(cluster)),
    )
    .await?;
    until(&format!("LibvirtCluster {ns}/{cluster} to be provisioned"), Duration::from_secs(180), || async {
        let lc = objects::get(&client, ns, Kind::LibvirtCluster, cluster).await?;
        Ok(match lc {
            Some(lc) if lc.data["status"]["initialization"]["provisioned"] == true => Check::Done(()),
            Some(lc) => Check::Pending(format!("conditions {}", lc.data["status"]["conditions"])),
            None => Check::Pending("no LibvirtCluster".into()),
        })
    })
    .await
}

/// Creates Machine `name` with LibvirtMachine `name` (CAPI sets the owner reference).
async fn create_machine(stack: &Stack, ns: &str, cluster: &str, name: &str) -> Result<()> {
    let client = stack.client();
    let secret = format!("{cluster}-bootstrap");
    objects::create(
        &client,
        ns,
        Kind::LibvirtMachine,
        objects::libvirt_machine(ns, name, cluster, &stack.placement.image, None),
    )
    .await?;
    objects::create(&client, ns, Kind::Machine, objects::machine(ns, name, cluster, &secret)).await?;
    Ok(())
}

/// What a running machine looks like from its LibvirtMachine.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) domain: String,
    pub(crate) ip: String,
    pub(crate) mac: String,
}

pub(crate) fn running_facts(lm: &DynamicObject) -> Option<Running> {
    let ready = objects::condition(lm, "Ready").map(|c| c.0) == Some("True");
    let provider_id = lm.data["spec"]["providerID"].as_str()?;
    let uid = objects::uid(lm);
    if !ready || provider_id != format!("libvirt://{uid}") {
        return None;
    }
    Some(Running {
        name: objects::name(lm),
        uid,
        domain: objects::str_at(lm, &["status", "domainName"])?.to_string(),
        ip: objects::internal_ip(lm)?,
        mac: objects::str_at(lm, &["status", "macAddress"]).unwrap_or_default().to_ascii_lowercase(),
    })
}

pub(crate) fn describe(lm: &DynamicObject) -> String {
    format!(
        "{}: state={} ip={} providerID={} conditions={}",
        objects::name(lm),
        lm.data["status"]["state"],
        objects::internal_ip(lm).unwrap_or_default(),
        lm.data["spec"]["providerID"],
        lm.data["status"]["conditions"]
            .as_array()
            .map(|cs| cs
                .iter()
                .map(|c| format!(
                    "{}={}({})",
                    c["type"].as_str().unwrap_or(""),
                    c["status"].as_str().unwrap_or(""),
                    c["reason"].as_str().unwrap_or("")
                ))
                .collect::<Vec<_>>()
                .join(","))
            .unwrap_or_default()
    )
}

/// Waits until LibvirtMachine `name` is Ready with a provider ID and an InternalIP.
async fn wait_running(stack: &Stack, ns: &str, name: &str) -> Result<Running> {
    let client = stack.client();
    until(&format!("LibvirtMachine {ns}/{name} to run with an address"), MACHINE_READY, || async {
        stack.management.ensure_capi_running()?;
        Ok(match objects::get(&client, ns, Kind::LibvirtMachine, name).await? {
            Some(lm) => match running_facts(&lm) {
                Some(r) => Check::Done(r),
                None => Check::Pending(describe(&lm)),
            },
            None => Check::Pending("no LibvirtMachine".into()),
        })
    })
    .await
}

/// The guest's console line with its seed, and its DHCP line.
async fn wait_guest_console(stack: &Stack, run: &Running, user_data: &str) -> Result<()> {
    let sha = hex(&Sha256::digest(user_data.as_bytes()));
    let seed_line = format!("CAPL-GUEST instance-id={} local-hostname={} user-data-sha256={sha}", run.uid, run.name);
    let dhcp_line = format!("CAPL-GUEST dhcp bound ip={}", run.ip);
    until(&format!("the serial console of {} to show the seed and the lease", run.domain), GUEST_BOOT, || async {
        let log = stack.console_log(&run.domain);
        let has_seed = log.lines().any(|l| l.trim_end() == seed_line);
        let has_dhcp = log.lines().any(|l| l.trim_end() == dhcp_line);
        Ok(if has_seed && has_dhcp {
            Check::Done(())
        } else {
            let ours: Vec<&str> = log.lines().filter(|l| l.contains("CAPL-GUEST")).collect();
            Check::Pending(format!("expected {seed_line:?} and {dhcp_line:?}; console has {ours:?}"))
        })
    })
    .await
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Host checks of a running machine: domain running with UUID = UID, one
/// DHCP host reserving the address, the lease holding it.
pub(crate) async fn check_on_host(stack: &Stack, run: &Running) -> Result<()> {
    let host = stack.libvirt()?;
    let state = host.domain_state(&run.domain)?;
    ensure!(state == "running", "domain {} is {state:?}, expected running", run.domain);
    let uuid = host.domain_uuid(&run.domain)?;
    ensure!(uuid == run.uid, "domain {} has UUID {uuid}, the LibvirtMachine UID is {}", run.domain, run.uid);
    let reserved: Vec<_> = host.dhcp_hosts(TEST_NETWORK)?.into_iter().filter(|h| h.name == run.domain).collect();
    ensure!(reserved.len() == 1, "expected one DHCP host named {} on {TEST_NETWORK}, found {reserved:?}", run.domain);
    ensure!(
        reserved[0].ip == run.ip,
        "reserved IP {} differs from the LibvirtMachine's InternalIP {}",
        reserved[0].ip,
        run.ip
    );
    ensure!(reserved[0].mac == run.mac, "reserved MAC {} differs from status.macAddress {}", reserved[0].mac, run.mac);
    let lease = until(&format!("a lease for {} on {TEST_NETWORK}", run.mac), Duration::from_secs(60), || async {
        let leases = host.leases(TEST_NETWORK)?;
        Ok(match leases.iter().find(|l| l.mac == run.mac) {
            Some(l) => Check::Done(l.clone()),
            None => Check::Pending(format!("{leases:?}")),
        })
    })
    .await?;
    ensure!(lease.ip == run.ip, "the lease of {} is {}, the reserved IP is {}", run.mac, lease.ip, run.ip);
    Ok(())
}

/// Domains, volumes and DHCP hosts on the host that belong to namespace `ns`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct HostObjects {
    pub(crate) domains: BTreeSet<String>,
    pub(crate) volumes: BTreeSet<String>,
    pub(crate) dhcp_hosts: BTreeSet<String>,
}

pub(crate) fn host_objects(stack: &Stack, ns: &str) -> Result<HostObjects> {
    let host = stack.libvirt()?;
    let prefix = format!("{ns}-");
    let iso_prefix = format!("cloudinit-{ns}-");
    Ok(HostObjects {
        domains: host.domains_with_prefix(&prefix)?.into_iter().collect(),
        volumes: host
            .volumes(TEST_DISK_POOL)?
            .into_iter()
            .filter(|v| v.starts_with(&prefix) || v.starts_with(&iso_prefix))
            .collect(),
        dhcp_hosts: host
            .dhcp_hosts(TEST_NETWORK)?
            .into_iter()
            .filter(|h| h.name.starts_with(&prefix))
            .map(|h| h.name)
            .collect(),
    })
}

/// What the host must hold for exactly these domains.
fn expected_objects(domains: &[&str]) -> HostObjects {
    HostObjects {
        domains: domains.iter().map(|d| d.to_string()).collect(),
        volumes: domains.iter().flat_map(|d| [format!("{d}.qcow2"), format!("cloudinit-{d}.iso")]).collect(),
        dhcp_hosts: domains.iter().map(|d| d.to_string()).collect(),
    }
}

pub(crate) async fn wait_host_objects(stack: &Stack, ns: &str, domains: &[&str]) -> Result<()> {
    let expected = expected_objects(domains);
    until(&format!("the host to hold exactly {expected:?}"), Duration::from_secs(120), || async {
        let found = host_objects(stack, ns)?;
        Ok(if found == expected { Check::Done(()) } else { Check::Pending(format!("{found:?}")) })
    })
    .await
}

/// Deletes the scenario's Clusters and waits for the provider to clean up.
pub(crate) async fn clean_up(stack: &Stack, ns: &str) -> Result<()> {
    delete_all_clusters(&stack.client(), ns).await?;
    if stack.host.is_some() {
        wait_host_objects(stack, ns, &[]).await?;
    }
    Ok(())
}

// --- scenarios --------------------------------------------------------------

async fn single_machine(stack: &mut Stack) -> Result<String> {
    let id = "single";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c1", "c1-m0");
    create_cluster(stack, &ns, cluster).await?;
    say(id, format!("LibvirtCluster {ns}/{cluster} provisioned; creating Machine {name}"));
    create_machine(stack, &ns, cluster, name).await?;
    let run = wait_running(stack, &ns, name).await?;
    say(id, format!("domain {} running, InternalIP {}", run.domain, run.ip));
    check_on_host(stack, &run).await?;
    wait_guest_console(stack, &run, &objects::user_data(cluster)).await?;
    say(id, "serial console: instance-id = UID, hostname, user-data hash and the reserved IP");

    let client = stack.client();
    let machine =
        until(&format!("Machine {ns}/{name} to carry providerID and InternalIP"), Duration::from_secs(120), || async {
            let m = objects::get(&client, &ns, Kind::Machine, name).await?.context("the Machine is gone")?;
            let provisioned = m.data["status"]["initialization"]["infrastructureProvisioned"] == true;
            let pid = m.data["spec"]["providerID"].as_str().unwrap_or_default().to_string();
            let ip = objects::internal_ip(&m);
            Ok(if provisioned && pid == format!("libvirt://{}", run.uid) && ip.as_deref() == Some(run.ip.as_str()) {
                Check::Done(m)
            } else {
                Check::Pending(format!("provisioned={provisioned} providerID={pid:?} InternalIP={ip:?}"))
            })
        })
        .await?;
    let lm = objects::get(&client, &ns, Kind::LibvirtMachine, name).await?.context("the LibvirtMachine is gone")?;
    for condition in ["InfrastructureReady", "MachineCreated", "DomainRunning", "Ready"] {
        let status = objects::condition(&lm, condition);
        ensure!(
            status.map(|c| c.0) == Some("True"),
            "LibvirtMachine condition {condition} is {status:?}, expected True"
        );
    }
    ensure!(
        lm.data["status"]["initialization"]["provisioned"] == true,
        "LibvirtMachine status.initialization.provisioned is not true"
    );
    ensure!(
        lm.metadata.labels.as_ref().and_then(|l| l.get(CLUSTER_NAME_LABEL)).map(String::as_str) == Some(cluster),
        "LibvirtMachine lacks the cluster-name label"
    );
    let phase = machine.data["status"]["phase"].as_str().unwrap_or_default().to_string();
    clean_up(stack, &ns).await?;
    Ok(format!("{} at {}, Machine phase {phase}", run.domain, run.ip))
}

async fn machine_deployment(stack: &mut Stack) -> Result<String> {
    let id = "md";
    let ns = stack.namespace(id).await?;
    let (cluster, md, template) = ("c2", "c2-md", "c2-tmpl");
    create_cluster(stack, &ns, cluster).await?;
    let client = stack.client();
    objects::create(
        &client,
        &ns,
        Kind::LibvirtMachineTemplate,
        objects::libvirt_machine_template(&ns, template, cluster, &stack.placement.image),
    )
    .await?;
    objects::create(
        &client,
        &ns,
        Kind::MachineDeployment,
        objects::machine_deployment(&ns, md, cluster, 1, template, &format!("{cluster}-bootstrap")),
    )
    .await?;
    say(id, "MachineDeployment with 1 replica created");
    let one = wait_all_running(stack, &ns, 1).await?;
    say(id, format!("1 machine: {} {}", one[0].name, one[0].ip));
    objects::merge_patch(&client, &ns, Kind::MachineDeployment, md, json!({"spec": {"replicas": 3}})).await?;
    say(id, "scaled to 3");
    let three = wait_all_running(stack, &ns, 3).await?;
    let ips: BTreeSet<&str> = three.iter().map(|r| r.ip.as_str()).collect();
    ensure!(ips.len() == 3, "three machines must have three distinct IPs, got {ips:?}");
    for run in &three {
        check_on_host(stack, run).await?;
    }
    let domains: Vec<&str> = three.iter().map(|r| r.domain.as_str()).collect();
    wait_host_objects(stack, &ns, &domains).await?;
    say(id, format!("3 machines running at {ips:?}"));
    objects::merge_patch(&client, &ns, Kind::MachineDeployment, md, json!({"spec": {"replicas": 1}})).await?;
    say(id, "scaled to 1");
    let left = until(
        "the MachineDeployment to shrink to one Machine and one LibvirtMachine",
        Duration::from_secs(300),
        || async {
            let machines = objects::list(&client, &ns, Kind::Machine).await?;
            let lms = objects::list(&client, &ns, Kind::LibvirtMachine).await?;
            Ok(if machines.len() == 1 && lms.len() == 1 {
                Check::Done(lms.into_iter().next())
            } else {
                Check::Pending(format!("{} Machines, {} LibvirtMachines", machines.len(), lms.len()))
            })
        },
    )
    .await?
    .context("no LibvirtMachine left")?;
    let remaining =
        running_facts(&left).with_context(|| format!("the remaining machine is not running: {}", describe(&left)))?;
    wait_host_objects(stack, &ns, &[remaining.domain.as_str()]).await?;
    check_on_host(stack, &remaining).await?;
    clean_up(stack, &ns).await?;
    Ok(format!("IPs {ips:?}; after scale-down only {} is left on the host", remaining.domain))
}

/// Waits until the namespace has exactly `count` LibvirtMachines, all running.
async fn wait_all_running(stack: &Stack, ns: &str, count: usize) -> Result<Vec<Running>> {
    let client = stack.client();
    until(&format!("{count} running LibvirtMachines in {ns}"), MACHINE_READY, || async {
        stack.management.ensure_capi_running()?;
        let lms = objects::list(&client, ns, Kind::LibvirtMachine).await?;
        let running: Vec<Running> = lms.iter().filter_map(running_facts).collect();
        Ok(if lms.len() == count && running.len() == count {
            Check::Done(running)
        } else {
            Check::Pending(lms.iter().map(describe).collect::<Vec<_>>().join("; "))
        })
    })
    .await
}

async fn pause(stack: &mut Stack) -> Result<String> {
    let id = "pause";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c3", "c3-m0");
    create_cluster(stack, &ns, cluster).await?;
    let client = stack.client();
    objects::merge_patch(&client, &ns, Kind::Cluster, cluster, json!({"spec": {"paused": true}})).await?;
    say(id, "Cluster paused; creating a Machine and a LibvirtMachine owned by it");
    // The owner reference is set here, as CAPI would: CAPI itself does not
    // touch a paused cluster's Machines, and the provider must hold back
    // because of the pause, not because it lacks an owner.
    let machine = objects::create(
        &client,
        &ns,
        Kind::Machine,
        objects::machine(&ns, name, cluster, &format!("{cluster}-bootstrap")),
    )
    .await?;
    let uid = objects::uid(&machine);
    objects::create(
        &client,
        &ns,
        Kind::LibvirtMachine,
        objects::libvirt_machine(&ns, name, cluster, &stack.placement.image, Some((name, &uid))),
    )
    .await?;
    until(&format!("LibvirtMachine {ns}/{name} to report Paused=True"), Duration::from_secs(120), || async {
        let lm = objects::get(&client, &ns, Kind::LibvirtMachine, name).await?.context("the LibvirtMachine is gone")?;
        Ok(match objects::condition(&lm, "Paused") {
            Some(("True", _)) => Check::Done(()),
            _ => Check::Pending(describe(&lm)),
        })
    })
    .await?;
    // Give a provider that ignored the pause time to act on the machine.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let found = host_objects(stack, &ns)?;
    ensure!(found == HostObjects::default(), "a paused cluster's machine was created on the host: {found:?}");
    let lm = objects::get(&client, &ns, Kind::LibvirtMachine, name).await?.context("the LibvirtMachine is gone")?;
    ensure!(lm.data["spec"]["providerID"].is_null(), "a paused machine got a providerID: {}", describe(&lm));
    say(id, "nothing on the host after 20 s paused; unpausing");
    objects::merge_patch(&client, &ns, Kind::Cluster, cluster, json!({"spec": {"paused": false}})).await?;
    let run = wait_running(stack, &ns, name).await?;
    check_on_host(stack, &run).await?;
    clean_up(stack, &ns).await?;
    Ok(format!("created only after unpause: {} at {}", run.domain, run.ip))
}

async fn restart(stack: &mut Stack) -> Result<String> {
    let id = "restart";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c4", "c4-m0");
    create_cluster(stack, &ns, cluster).await?;
    create_machine(stack, &ns, cluster, name).await?;
    // Kill the provider at the first trace of the machine on the host.
    let deadline = Instant::now() + MACHINE_READY;
    let seen = loop {
        let found = host_objects(stack, &ns)?;
        if found != HostObjects::default() {
            break found;
        }
        ensure!(Instant::now() < deadline, "the machine never appeared on the host within {MACHINE_READY:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stack.provider.kill();
    let at_kill = host_objects(stack, &ns)?;
    let state =
        at_kill.domains.iter().next().map(|d| stack.libvirt().and_then(|h| h.domain_state(d)).unwrap_or_default());
    say(id, format!("provider killed; host had {seen:?}, right after the kill {at_kill:?}, domain state {state:?}"));
    stack.provider.restart().await?;
    say(id, "provider restarted");
    let run = wait_running(stack, &ns, name).await?;
    check_on_host(stack, &run).await?;
    wait_host_objects(stack, &ns, &[run.domain.as_str()]).await?;
    wait_guest_console(stack, &run, &objects::user_data(cluster)).await?;
    clean_up(stack, &ns).await?;
    let stage = if at_kill.domains.is_empty() {
        "before the domain was defined".to_string()
    } else {
        format!("with the domain {}", state.unwrap_or_default())
    };
    Ok(format!("killed {stage}; converged to one domain, two volumes, one DHCP host"))
}

async fn stopped_domain(stack: &mut Stack) -> Result<String> {
    let id = "stopped";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c5", "c5-m0");
    create_cluster(stack, &ns, cluster).await?;
    create_machine(stack, &ns, cluster, name).await?;
    let run = wait_running(stack, &ns, name).await?;
    let host = stack.libvirt()?.clone();
    host.destroy(&run.domain)?;
    say(id, format!("virsh destroy {}", run.domain));
    let started = Instant::now();
    until(&format!("domain {} to be started again by the provider", run.domain), Duration::from_secs(300), || async {
        let state = host.domain_state(&run.domain)?;
        Ok(if state == "running" { Check::Done(()) } else { Check::Pending(state) })
    })
    .await?;
    let again = wait_running(stack, &ns, name).await?;
    ensure!(
        again.uid == run.uid && again.domain == run.domain,
        "the machine was replaced instead of restarted: {again:?} vs {run:?}"
    );
    check_on_host(stack, &again).await?;
    wait_host_objects(stack, &ns, &[run.domain.as_str()]).await?;
    clean_up(stack, &ns).await?;
    Ok(format!("{} running again {:.0} s after the destroy", run.domain, started.elapsed().as_secs_f64()))
}

async fn cluster_deletion(stack: &mut Stack) -> Result<String> {
    let id = "delete";
    let ns = stack.namespace(id).await?;
    let cluster = "c6";
    create_cluster(stack, &ns, cluster).await?;
    for name in ["c6-m0", "c6-m1"] {
        create_machine(stack, &ns, cluster, name).await?;
    }
    let mut domains = Vec::new();
    for name in ["c6-m0", "c6-m1"] {
        domains.push(wait_running(stack, &ns, name).await?.domain);
    }
    let domain_refs: Vec<&str> = domains.iter().map(String::as_str).collect();
    wait_host_objects(stack, &ns, &domain_refs).await?;
    say(id, format!("two machines running ({domains:?}); deleting Cluster {cluster}"));
    let client = stack.client();
    objects::delete(&client, &ns, Kind::Cluster, cluster).await?;
    until(&format!("everything of Cluster {ns}/{cluster} to be deleted"), Duration::from_secs(300), || async {
        let mut left = Vec::new();
        for kind in [Kind::Cluster, Kind::LibvirtCluster, Kind::Machine, Kind::LibvirtMachine] {
            for o in objects::list(&client, &ns, kind).await? {
                left.push(format!("{kind:?} {}", objects::name(&o)));
            }
        }
        Ok(if left.is_empty() { Check::Done(()) } else { Check::Pending(left.join(", ")) })
    })
    .await?;
    let found = host_objects(stack, &ns)?;
    ensure!(found == HostObjects::default(), "after the Cluster was deleted the host still holds {found:?}");
    let host = stack.libvirt()?;
    ensure!(host.network_active(TEST_NETWORK), "network {TEST_NETWORK} is no longer active");
    for pool in [&stack.placement.base_pool, &stack.placement.domain_pool] {
        ensure!(host.pool_active(pool), "pool {pool} is no longer active");
    }
    if !host.volume_exists(&stack.placement.base_pool, &stack.placement.image) {
        bail!("the base image {} was removed from {}", stack.placement.image, stack.placement.base_pool);
    }
    Ok("domains, volumes, ISOs and DHCP hosts gone; network, pools and base image kept".into())
}
