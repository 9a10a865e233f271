//! The `upgrade` scenario, the first on a kind management cluster made with
//! the previous release of this provider (built from this repository's
//! history by `cargo xtask previous`):
//! 1. the installation is the previous release: clusterctl's inventory says
//!    [`PREVIOUS_VERSION`] and the manager's Pods run the previous image;
//! 2. a MachineDeployment of two machines runs, made by the previous manager;
//!    each domain's UUID and id (libvirt gives a domain a new id whenever it
//!    starts) and each LibvirtMachine's providerID and address are recorded;
//! 3. `clusterctl upgrade apply --infrastructure capl-system/libvirt:<current>`,
//!    as an operator runs it; the inventory then says [`CURRENT_VERSION`],
//!    and every manager Pod runs the current image;
//! 4. the new manager acts: the MachineDeployment scaled to three gets a
//!    third running machine;
//! 5. the two machines are untouched: same domains, same UUIDs and ids
//!    (never restarted), still running, their LibvirtMachines Ready with the
//!    same providerIDs and addresses, and the host holds exactly the three
//!    machines' domains, volumes and DHCP entries;
//! 6. deleting the Cluster, the new manager removes all three, the two it
//!    did not make included.
//!
//! The scenarios after it run on the upgraded installation.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::harness::clusterctl::INFRA_PROVIDER;
use crate::harness::kind_cluster::{
    CURRENT_VERSION, KindCluster, ManagerPods, NAMESPACE, PREVIOUS_PROVIDER_IMAGE_ENV, PREVIOUS_VERSION,
    PROVIDER_IMAGE_ENV,
};
use crate::harness::machines::{
    Running, check_on_host, clean_up, create_cluster, create_machine_deployment, wait_host_objects,
};
use crate::harness::management::Management;
use crate::harness::objects::{self, Kind};
use crate::harness::progress::say;
use crate::harness::stack::Stack;
use crate::harness::wait::{self, Check};
use crate::scenarios::machine::wait_all_running;

/// How long the manager's Pods of an old template may take to go.
const ROLLOUT_BOUND: Duration = Duration::from_secs(120);

/// What must not change across the upgrade, for one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Untouched {
    domain: String,
    uuid: String,
    /// libvirt's id of the running domain: a new one on every start.
    domain_id: String,
    provider_id: String,
    ip: String,
}

fn kind_cluster(stack: &Stack) -> Result<&KindCluster> {
    match &stack.management {
        Management::Kind { cluster, .. } => Ok(cluster),
        Management::Local { .. } => {
            bail!("the upgrade scenario needs the kind management cluster (`capl-e2e run --kind`)")
        }
    }
}

fn env(name: &str) -> Result<String> {
    std::env::var(name)
        .with_context(|| format!("{name} is not set: run the upgrade scenario with `cargo xtask e2e --kind`"))
}

/// The `upgrade` scenario.
pub async fn upgrade(stack: &mut Stack) -> Result<String> {
    let id = "upgrade";
    let previous_image = env(PREVIOUS_PROVIDER_IMAGE_ENV)?;
    let current_image = env(PROVIDER_IMAGE_ENV)?;
    ensure!(previous_image != current_image, "the previous and the current manager image are both {current_image}");

    // 1. The previous release is installed.
    {
        let cluster = kind_cluster(stack)?;
        crate::blocking(|| check_installed(cluster, PREVIOUS_VERSION, &previous_image))?;
    }
    say(id, format!("installed: {INFRA_PROVIDER} {PREVIOUS_VERSION}, manager image {previous_image}"));

    // 2. Two machines made by the previous manager.
    let ns = stack.namespace(id).await?;
    let (cluster, md) = ("c-up", "c-up-md");
    create_cluster(stack, &ns, cluster).await?;
    create_machine_deployment(stack, &ns, cluster, md, 2).await?;
    let client = stack.client();
    let before = wait_all_running(stack, &ns, 2).await?;
    for run in &before {
        check_on_host(stack, run).await?;
    }
    let recorded = record(stack, &before)?;
    say(id, format!("2 machines running under {PREVIOUS_VERSION}: {:?}", recorded.values().collect::<Vec<_>>()));

    // 3. clusterctl upgrade apply.
    let out = {
        let cluster = kind_cluster(stack)?;
        crate::blocking(|| {
            let out = cluster.upgrade_provider(CURRENT_VERSION)?;
            check_installed(cluster, CURRENT_VERSION, &current_image)?;
            anyhow::Ok(out)
        })?
    };
    say(id, format!("clusterctl upgrade apply: {}", out.trim().lines().last().unwrap_or_default()));
    say(id, format!("installed: {INFRA_PROVIDER} {CURRENT_VERSION}, every manager Pod on {current_image}"));

    // 4. The new manager makes a machine.
    objects::merge_patch(&client, &ns, Kind::MachineDeployment, md, json!({"spec": {"replicas": 3}})).await?;
    let after = wait_all_running(stack, &ns, 3).await?;
    let added: Vec<&Running> = after.iter().filter(|r| !recorded.contains_key(&r.name)).collect();
    ensure!(added.len() == 1, "scaling to 3 should add one machine to {:?}; running now: {after:?}", recorded.keys());
    check_on_host(stack, added[0]).await?;
    say(id, format!("the new manager made {} ({})", added[0].domain, added[0].ip));

    // 5. The first two are untouched.
    let kept: Vec<Running> = after.iter().filter(|r| recorded.contains_key(&r.name)).cloned().collect();
    ensure!(kept.len() == 2, "the two machines made before the upgrade are not both running: {after:?}");
    let now = record(stack, &kept)?;
    ensure!(now == recorded, "the machines changed across the upgrade:\nbefore {recorded:#?}\nafter {now:#?}");
    let domains: Vec<&str> = after.iter().map(|r| r.domain.as_str()).collect();
    wait_host_objects(stack, &ns, &domains).await?;
    say(id, "the two machines kept their domains, UUIDs, ids (not restarted), providerIDs and addresses");

    // 6. The new manager deletes them all.
    clean_up(stack, &ns).await?;
    Ok(format!(
        "{PREVIOUS_VERSION} -> {CURRENT_VERSION}: 2 machines untouched (same UUIDs and domain ids), a third made and \
         all three deleted by the new manager"
    ))
}

/// The facts that must not change, per machine name, from the host and the LibvirtMachines.
fn record(stack: &Stack, machines: &[Running]) -> Result<BTreeMap<String, Untouched>> {
    let host = stack.libvirt()?;
    let mut out = BTreeMap::new();
    for run in machines {
        let state = host.domain_state(&run.domain)?;
        ensure!(state == "running", "domain {} is {state:?}, expected running", run.domain);
        out.insert(
            run.name.clone(),
            Untouched {
                domain: run.domain.clone(),
                uuid: host.domain_uuid(&run.domain)?,
                domain_id: host.domain_id(&run.domain)?,
                provider_id: format!("libvirt://{}", run.uid),
                ip: run.ip.clone(),
            },
        );
    }
    Ok(out)
}

/// clusterctl's inventory names `version` of this provider, and the
/// manager's Pods, once a rollout is over, are all Ready and on `image`.
fn check_installed(cluster: &KindCluster, version: &str, image: &str) -> Result<()> {
    let tools = &cluster.kubectl;
    let inventory = tools.json(&["get", "providers.clusterctl.cluster.x-k8s.io", "-n", NAMESPACE, INFRA_PROVIDER])?;
    let installed = inventory["version"].as_str().unwrap_or_default();
    ensure!(installed == version, "clusterctl's inventory says {INFRA_PROVIDER} {installed:?}, expected {version}");
    tools.manager_rollout()?;
    // A Pod of the Deployment's previous template may still be terminating.
    wait::until_blocking(&format!("every manager Pod Ready on {image}"), ROLLOUT_BOUND, || {
        let pods = tools.manager_pods()?;
        let ready = ManagerPods::of(&pods).ready;
        let images: Vec<(String, String)> = pods
            .iter()
            .map(|p| {
                let name = p["metadata"]["name"].as_str().unwrap_or_default().to_string();
                (name, p["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string())
            })
            .collect();
        Ok(if !pods.is_empty() && ready.len() == pods.len() && images.iter().all(|(_, i)| i == image) {
            Check::Done(())
        } else {
            Check::Pending(format!("Pods and images {images:?}, Ready {ready:?}"))
        })
    })
}
