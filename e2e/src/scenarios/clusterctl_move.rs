//! The `move` scenario: a Cluster with two provisioned machines is moved
//! from the stack's management cluster (the source) to a second one (the
//! target) with the real `clusterctl move --to-kubeconfig`, built from the
//! pinned CAPI module. Each management cluster runs its own CAPI core manager
//! and its own provider process against the same libvirt host.
//!
//! `clusterctl move` refuses to start unless every Machine has a Node
//! (`status.nodeRef`) and the control plane is initialized. The guests are
//! not Kubernetes nodes (they boot the tiny test image, no kubelet), so the Cluster
//! gets a workload API server of its own (a third local kube-apiserver, named
//! by the `<cluster>-kubeconfig` Secret as CAPI expects) and the test
//! registers there one Node per machine, with the machine's providerID, once
//! the machine is provisioned. CAPI core then sets each Machine's nodeRef,
//! and, the Cluster having no controlPlaneRef, ControlPlaneInitialized from
//! the control-plane Machine's nodeRef.
//!
//! Checked from outside, like a user: before the move the domains (name,
//! UUID, id), volumes (key, path, inode) and DHCP entries are recorded; after
//! it the source namespace is empty, the host holds exactly the same objects
//! (nothing deleted by the source provider), and the target's LibvirtMachines
//! become Ready within [`ADOPTION_BOUND`] with the same providerIDs, domains
//! and addresses, without a domain being restarted or a volume or DHCP entry
//! being made again. Deleting the Cluster on the target removes everything.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use testenv::TestEnv;

use crate::harness::clusterctl::LocalRepository;
use crate::harness::host_view::DhcpHost;
use crate::harness::inventory;
use crate::harness::machines::{MACHINE_READY, create_cluster, describe, host_objects, wait_host_objects};
use crate::harness::management::{Management, ManagementKind};
use crate::harness::objects::{self, CLUSTER_NAME_LABEL, Kind};
use crate::harness::progress::say;
use crate::harness::stack::{Stack, TEST_DISK_POOL, TEST_NETWORK};
use crate::harness::wait::{Check, until};

/// How long the target's provider may take to report the moved machines
/// Ready after `clusterctl move` returns: adoption is a few libvirt reads.
pub const ADOPTION_BOUND: Duration = Duration::from_secs(120);
/// The release the inventory is made from.
const RELEASE_VERSION: &str = "v0.1.0";
/// CAPI's label of control-plane Machines.
const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// What the API says about one provisioned machine.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MachineFacts {
    provider_id: String,
    domain: String,
    ip: String,
}

/// What the host holds for one machine, as virsh and the file system show it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OnHost {
    uuid: String,
    /// Changes whenever the domain is started again.
    domain_id: String,
    state: String,
    /// Volume name -> (key, path, inode): a volume made again gets a new inode.
    volumes: BTreeMap<String, (String, String, u64)>,
    dhcp: Vec<DhcpHost>,
}

/// Phase timings for the summary.
struct Timings {
    phases: Vec<(String, f64)>,
    lap: Instant,
}

impl Timings {
    fn new() -> Self {
        Self { phases: Vec::new(), lap: Instant::now() }
    }

    fn lap(&mut self, phase: &str) {
        self.phases.push((phase.to_string(), self.lap.elapsed().as_secs_f64()));
        self.lap = Instant::now();
    }

    fn table(&self) -> String {
        let width = self.phases.iter().map(|(p, _)| p.len()).max().unwrap_or(5);
        let mut out = format!("  {:<width$}  {:>7}\n", "phase", "seconds");
        for (phase, seconds) in &self.phases {
            out.push_str(&format!("  {phase:<width$}  {seconds:>7.1}\n"));
        }
        out
    }
}

pub async fn clusterctl_move(stack: &mut Stack) -> Result<String> {
    let id = "move";
    let mut timings = Timings::new();
    let host = stack.libvirt()?.clone();

    // The release as a local clusterctl repository, the workload cluster's
    // API server, and the target management cluster with its own CAPI core
    // and provider process.
    let repository = LocalRepository::release(&stack.work_dir.join("clusterctl-repository"), RELEASE_VERSION)?;
    let workload = TestEnv::start().await.context("starting the workload cluster's API server")?;
    let target_dir = stack.work_dir.join("target");
    std::fs::create_dir_all(&target_dir)?;
    let target = Management::start(ManagementKind::Local, Default::default(), &target_dir)
        .await
        .context("starting the target management cluster (API server, CAPI core, CRDs)")?;
    let mut target_provider = stack
        .provider
        .process()?
        .start_like(target.kubeconfig_path(), &stack.work_dir.join("provider-target.log"))
        .await?;
    inventory::install_core_inventory(&stack.management).await?;
    timings.lap("workload API server, target management cluster and provider");

    // The Cluster on the source, with two machines (one control plane).
    let ns = stack.namespace(id).await?;
    let cluster = "c7";
    let source = stack.client();
    objects::create(&source, &ns, Kind::Secret, kubeconfig_secret(&ns, cluster, workload.kubeconfig_path())?).await?;
    create_cluster(stack, &ns, cluster).await?;
    own_bootstrap_secret(&source, &ns, cluster).await?;
    // A host credentials Secret as the templates make it (labelled for move);
    // this cluster's unix-socket URI takes none, but the Secret must travel.
    let credentials = format!("{cluster}-libvirt-tls");
    objects::create(&source, &ns, Kind::Secret, credentials_secret(&ns, &credentials)).await?;
    let names = ["c7-m0", "c7-m1"];
    for (index, name) in names.iter().enumerate() {
        create_machine(stack, &ns, cluster, name, index == 0).await?;
    }
    let mut before = BTreeMap::new();
    for name in names {
        before.insert(name.to_string(), wait_ready(&source, &ns, name, |_| true, MACHINE_READY).await?);
    }
    let domains: Vec<&str> = before.values().map(|f| f.domain.as_str()).collect();
    wait_host_objects(stack, &ns, &domains).await?;
    timings.lap("two machines provisioned on the source");

    register_nodes(&workload, &before).await?;
    // CAPI v1.14.2 watches a workload cluster's Nodes only once its control
    // plane is initialized, which for a Cluster without controlPlaneRef needs
    // a control-plane Machine with a nodeRef: the first nodeRef is found on
    // the Machine's next reconcile. Touch the Machines so that it comes now
    // rather than at CAPI's periodic resync (10 minutes).
    for name in names {
        let touch = json!({"metadata": {"annotations": {"capl-e2e/node-registered": "true"}}});
        objects::merge_patch(&source, &ns, Kind::Machine, name, touch).await?;
    }
    wait_move_preconditions(&source, &ns, cluster, &names).await?;
    timings.lap("Nodes registered, nodeRefs and ControlPlaneInitialized set");
    let host_before = record_host(&host, &before)?;
    say(id, format!("source ready: {before:?}"));

    // What clusterctl sees depends on the inventory: with CAPI core's alone it
    // would move the Cluster and Machines and leave the LibvirtCluster and
    // LibvirtMachines behind; the release's inventory adds them.
    let without = objects_clusterctl_would_move(&repository, stack, &ns, "without-provider")?;
    ensure!(
        without.iter().any(|f| f.starts_with("Machine_")) && !without.iter().any(|f| f.starts_with("Libvirt")),
        "with CAPI core's inventory alone clusterctl should see Machines but no Libvirt objects, it saw {without:?}"
    );
    inventory::install_provider_inventory(&stack.management, &repository).await?;
    let with = objects_clusterctl_would_move(&repository, stack, &ns, "with-provider")?;
    for expected in [
        format!("LibvirtCluster_{ns}_{cluster}"),
        format!("LibvirtMachine_{ns}_{}", names[0]),
        format!("LibvirtMachine_{ns}_{}", names[1]),
        format!("Secret_{ns}_{credentials}"),
    ] {
        ensure!(with.contains(&expected), "with the release's inventory clusterctl does not see {expected}: {with:?}");
    }

    // A target without the provider in its inventory is refused before anything happens.
    let source_kubeconfig = stack.management.kubeconfig_path().display().to_string();
    let target_kubeconfig = target.kubeconfig_path().display().to_string();
    let move_args =
        ["move", "--kubeconfig", &source_kubeconfig, "--to-kubeconfig", &target_kubeconfig, "--namespace", &ns];
    let refused = match repository.clusterctl(&move_args) {
        Ok(out) => bail!("clusterctl move to a target without the provider's inventory succeeded: {out}"),
        Err(err) => format!("{err:#}"),
    };
    ensure!(
        refused.contains("provider infrastructure-libvirt not found in the target cluster"),
        "clusterctl move refused the target for another reason: {refused}"
    );
    let cluster_object = objects::get(&source, &ns, Kind::Cluster, cluster).await?.context("the Cluster is gone")?;
    ensure!(cluster_object.data["spec"]["paused"] != true, "the refused move left the source Cluster paused");
    inventory::install_inventory(&target, &repository).await?;
    say(id, format!("target inventory: {:?}", inventory::providers(&target).await?));
    timings.lap("inventory checks (to-directory, refused move)");

    // The move.
    repository.clusterctl(&move_args)?;
    timings.lap("clusterctl move");
    for kind in [Kind::Cluster, Kind::LibvirtCluster, Kind::Machine, Kind::LibvirtMachine, Kind::Secret] {
        let left = objects::list(&source, &ns, kind).await?;
        ensure!(
            left.is_empty(),
            "after the move the source still holds {kind:?} {:?}",
            left.iter().map(objects::name).collect::<Vec<_>>()
        );
    }
    ensure!(
        record_host(&host, &before)? == host_before,
        "the host changed during the move (the source provider must delete nothing)"
    );
    let objects_after_move = host_objects(stack, &ns)?;

    // The target adopts the same domains.
    let target_client = target.client();
    objects::get(&target_client, &ns, Kind::Secret, &credentials)
        .await?
        .with_context(|| format!("clusterctl move did not take the labelled Secret {credentials} along"))?;
    let mut moved_uids = Vec::new();
    for (name, facts) in &before {
        let wanted = facts.clone();
        let after =
            wait_ready(&target_client, &ns, name, move |f| *f == wanted, ADOPTION_BOUND).await.with_context(|| {
                format!("the target provider did not adopt {name} (log {})", target_provider.log_path().display())
            })?;
        ensure!(after == *facts, "{name} on the target: {after:?}, before the move {facts:?}");
        let lm = objects::get(&target_client, &ns, Kind::LibvirtMachine, name).await?.context("gone")?;
        moved_uids.push(objects::uid(&lm));
    }
    timings.lap("target LibvirtMachines Ready");
    let host_after = record_host(&host, &before)?;
    ensure!(host_after == host_before, "adopting changed the host: before {host_before:?}, after {host_after:?}");
    ensure!(host_objects(stack, &ns)? == objects_after_move, "the host holds other objects after the adoption");
    for (name, uid) in names.iter().zip(&moved_uids) {
        let facts = &before[*name];
        ensure!(
            facts.provider_id != format!("libvirt://{uid}"),
            "{name} kept its UID across the move ({uid}): the move did not recreate the objects"
        );
    }
    wait_node_refs(&target_client, &ns, &names).await?;
    target.ensure_capi_running()?;
    target_provider.ensure_running()?;
    stack.provider.ensure_running()?;

    // Deleting the Cluster on the target removes everything.
    objects::delete(&target_client, &ns, Kind::Cluster, cluster).await?;
    until(
        &format!("everything of Cluster {ns}/{cluster} on the target to be deleted"),
        Duration::from_secs(300),
        || async {
            let mut left = Vec::new();
            for kind in [Kind::Cluster, Kind::LibvirtCluster, Kind::Machine, Kind::LibvirtMachine] {
                for o in objects::list(&target_client, &ns, kind).await? {
                    left.push(format!("{kind:?} {}", objects::name(&o)));
                }
            }
            Ok(if left.is_empty() { Check::Done(()) } else { Check::Pending(left.join(", ")) })
        },
    )
    .await?;
    wait_host_objects(stack, &ns, &[]).await?;
    timings.lap("Cluster deleted on the target, host clean");

    let table = timings.table();
    eprintln!("  [{id}] timings:\n{table}");
    drop(target_provider);
    drop(target);
    drop(workload);
    let adopted = timings.phases.iter().find(|(p, _)| p.starts_with("target")).map(|(_, s)| *s).unwrap_or_default();
    let moved = timings.phases.iter().find(|(p, _)| p == "clusterctl move").map(|(_, s)| *s).unwrap_or_default();
    Ok(format!(
        "moved {} machines in {moved:.0} s; the target adopted the same domains, UUIDs, IPs and volumes in {adopted:.0} s; \
         deleting on the target removed everything",
        before.len()
    ))
}

/// The Secret CAPI reads to reach the workload cluster: `<cluster>-kubeconfig`,
/// key `value`. The kubeconfig names certificate files of the workload API
/// server's scratch directory: both CAPI managers run on this machine.
fn kubeconfig_secret(ns: &str, cluster: &str, kubeconfig: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{cluster}-kubeconfig"), "namespace": ns, "labels": {CLUSTER_NAME_LABEL: cluster}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": text},
    }))
}

/// A TLS credentials Secret labelled `clusterctl.cluster.x-k8s.io/move`, as
/// the cluster templates make it (placeholder content).
fn credentials_secret(ns: &str, name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name, "namespace": ns, "labels": { "clusterctl.cluster.x-k8s.io/move": "" } },
        "stringData": { "ca.crt": "placeholder", "tls.crt": "placeholder", "tls.key": "placeholder" },
    })
}

/// Makes the Cluster own its bootstrap Secret, as a bootstrap provider's
/// Secret is owned by its config: clusterctl moves only Secrets it can tie to
/// a Cluster.
async fn own_bootstrap_secret(client: &Client, ns: &str, cluster: &str) -> Result<()> {
    let owner = objects::get(client, ns, Kind::Cluster, cluster).await?.context("the Cluster is gone")?;
    let patch = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": cluster, "uid": objects::uid(&owner),
    }]}});
    objects::merge_patch(client, ns, Kind::Secret, &format!("{cluster}-bootstrap"), patch).await
}

async fn create_machine(stack: &Stack, ns: &str, cluster: &str, name: &str, control_plane: bool) -> Result<()> {
    let client = stack.client();
    objects::create(
        &client,
        ns,
        Kind::LibvirtMachine,
        objects::libvirt_machine(ns, name, cluster, &stack.placement.image, None),
    )
    .await?;
    let mut machine = objects::machine(ns, name, cluster, &format!("{cluster}-bootstrap"));
    if control_plane {
        machine["metadata"]["labels"][CONTROL_PLANE_LABEL] = json!("");
    }
    objects::create(&client, ns, Kind::Machine, machine).await?;
    Ok(())
}

/// Waits until LibvirtMachine `name` is Ready with a providerID, a domain and
/// an InternalIP that `accept` takes.
async fn wait_ready(
    client: &Client,
    ns: &str,
    name: &str,
    accept: impl Fn(&MachineFacts) -> bool,
    timeout: Duration,
) -> Result<MachineFacts> {
    until(&format!("LibvirtMachine {ns}/{name} to be Ready"), timeout, || async {
        let Some(lm) = objects::get(client, ns, Kind::LibvirtMachine, name).await? else {
            return Ok(Check::Pending("no LibvirtMachine".into()));
        };
        let ready = objects::condition(&lm, "Ready").map(|c| c.0) == Some("True");
        let facts = (|| {
            Some(MachineFacts {
                provider_id: lm.data["spec"]["providerID"].as_str()?.to_string(),
                domain: objects::str_at(&lm, &["status", "domainName"])?.to_string(),
                ip: objects::internal_ip(&lm)?,
            })
        })();
        Ok(match facts {
            Some(f) if ready && accept(&f) => Check::Done(f),
            _ => Check::Pending(describe(&lm)),
        })
    })
    .await
}

/// One Node per machine in the workload cluster, carrying its providerID (as
/// the kubelet would register it).
async fn register_nodes(workload: &TestEnv, machines: &BTreeMap<String, MachineFacts>) -> Result<()> {
    let nodes: Api<Node> = Api::all(workload.client());
    for (name, facts) in machines {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"providerID": facts.provider_id}}))?;
        nodes.create(&PostParams::default(), &node).await.with_context(|| format!("registering Node {name}"))?;
    }
    Ok(())
}

/// Waits for what `clusterctl move` checks first: every Machine has a
/// nodeRef, the Cluster's infrastructure is provisioned and its control
/// plane initialized.
async fn wait_move_preconditions(client: &Client, ns: &str, cluster: &str, machines: &[&str]) -> Result<()> {
    wait_node_refs(client, ns, machines).await?;
    until(&format!("Cluster {ns}/{cluster} to have ControlPlaneInitialized"), Duration::from_secs(120), || async {
        let c = objects::get(client, ns, Kind::Cluster, cluster).await?.context("the Cluster is gone")?;
        let infra = c.data["status"]["initialization"]["infrastructureProvisioned"] == true;
        let cp = objects::condition(&c, "ControlPlaneInitialized");
        Ok(if infra && cp.map(|c| c.0) == Some("True") {
            Check::Done(())
        } else {
            Check::Pending(format!("infrastructureProvisioned={infra} ControlPlaneInitialized={cp:?}"))
        })
    })
    .await
}

async fn wait_node_refs(client: &Client, ns: &str, machines: &[&str]) -> Result<()> {
    until(&format!("the Machines of {ns} to have a nodeRef"), Duration::from_secs(180), || async {
        let mut missing = Vec::new();
        for name in machines {
            let m = objects::get(client, ns, Kind::Machine, name).await?.context("a Machine is gone")?;
            if m.data["status"]["nodeRef"]["name"].as_str() != Some(name) {
                missing.push(format!(
                    "{name}: nodeRef={} phase={}",
                    m.data["status"]["nodeRef"], m.data["status"]["phase"]
                ));
            }
        }
        Ok(if missing.is_empty() { Check::Done(()) } else { Check::Pending(missing.join("; ")) })
    })
    .await
}

/// What the host holds for the machines: per domain its UUID, id and state,
/// its two volumes' keys, paths and inodes, and its DHCP entries.
fn record_host(
    host: &crate::harness::host_view::HostView,
    machines: &BTreeMap<String, MachineFacts>,
) -> Result<BTreeMap<String, OnHost>> {
    let dhcp = host.dhcp_hosts(TEST_NETWORK)?;
    let mut out = BTreeMap::new();
    for facts in machines.values() {
        let domain = &facts.domain;
        let mut volumes = BTreeMap::new();
        for volume in [format!("{domain}.qcow2"), format!("cloudinit-{domain}.iso")] {
            let (key, path) = host.volume_key_and_path(TEST_DISK_POOL, &volume)?;
            let inode = std::fs::metadata(&path).with_context(|| format!("stat {path}"))?.ino();
            volumes.insert(volume, (key, path, inode));
        }
        out.insert(
            domain.clone(),
            OnHost {
                uuid: host.domain_uuid(domain)?,
                domain_id: host.domain_id(domain)?,
                state: host.domain_state(domain)?,
                volumes,
                dhcp: dhcp.iter().filter(|h| h.name == *domain).cloned().collect(),
            },
        );
    }
    for (domain, on_host) in &out {
        let facts = machines.values().find(|f| f.domain == *domain).context("a recorded domain")?;
        ensure!(on_host.state == "running", "domain {domain} is {:?}", on_host.state);
        ensure!(
            facts.provider_id == format!("libvirt://{}", on_host.uuid),
            "domain {domain} has UUID {}, the providerID is {}",
            on_host.uuid,
            facts.provider_id
        );
        ensure!(
            on_host.dhcp.len() == 1 && on_host.dhcp[0].ip == facts.ip,
            "domain {domain}: DHCP entries {:?}, InternalIP {}",
            on_host.dhcp,
            facts.ip
        );
    }
    Ok(out)
}

/// The files `clusterctl move --to-directory` writes for the namespace: one
/// per object clusterctl would move (`<Kind>_<namespace>_<name>.yaml`), without `.yaml`. It
/// pauses the Cluster while it reads and resumes it afterwards.
fn objects_clusterctl_would_move(
    repository: &LocalRepository,
    stack: &Stack,
    ns: &str,
    label: &str,
) -> Result<Vec<String>> {
    let dir = stack.work_dir.join(format!("move-to-directory-{label}"));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = stack.management.kubeconfig_path().display().to_string();
    let dir_arg = dir.display().to_string();
    repository.clusterctl(&["move", "--kubeconfig", &kubeconfig, "--namespace", ns, "--to-directory", &dir_arg])?;
    let mut files: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().trim_end_matches(".yaml").to_string()))
        .collect::<std::io::Result<_>>()?;
    files.sort();
    Ok(files)
}
