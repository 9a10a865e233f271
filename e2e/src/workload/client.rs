//! The workload cluster as its users reach it: through the control-plane
//! endpoint with the kubeconfig CAPI writes, and the Machines behind its Nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::cluster::CLUSTER;
use crate::harness::objects::{self, Kind};
use crate::harness::wait::{Answered, Check, until};

/// A client of the workload cluster from the `<cluster>-kubeconfig` Secret CAPI
/// writes, waiting up to `within` for the Secret.
pub(crate) async fn workload_client(client: &Client, ns: &str, within: Duration) -> Result<Client> {
    let (kubeconfig, _) = workload_kubeconfig(client, ns, within).await?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    Ok(Client::try_from(config)?)
}

/// The workload cluster's kubeconfig (parsed and as text) from the `<cluster>-kubeconfig`
/// Secret, waiting up to `within` for CAPI to write it.
pub(crate) async fn workload_kubeconfig(client: &Client, ns: &str, within: Duration) -> Result<(Kubeconfig, String)> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = format!("{CLUSTER}-kubeconfig");
    let secret = until(&format!("Secret {ns}/{name}"), within, || async {
        Ok(match secrets.get_opt(&name).await? {
            Some(secret) => Check::Done(secret),
            None => Check::Pending("absent".into()),
        })
    })
    .await?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .with_context(|| format!("Secret {ns}/{name} has no key `value`"))?;
    let text = std::str::from_utf8(&value.0)?.to_string();
    Ok((Kubeconfig::from_yaml(&text)?, text))
}

/// Waits until exactly `count` Nodes exist and all are Ready; returns them.
pub(crate) async fn wait_nodes_ready(nodes: &Api<Node>, count: usize, timeout: Duration) -> Result<Vec<Node>> {
    until(&format!("exactly {count} Nodes, all Ready, in the workload cluster"), timeout, || async {
        let list = nodes.list(&ListParams::default()).await.answered("listing Nodes")?.items;
        let ready_count = list.iter().filter(|n| node_ready(n)).count();
        Ok(if ready_count >= count && list.len() == count {
            Check::Done(list)
        } else {
            let seen: Vec<String> = list
                .iter()
                .map(|n| format!("{} ready={}", n.metadata.name.clone().unwrap_or_default(), node_ready(n)))
                .collect();
            Check::Pending(format!("{seen:?}"))
        })
    })
    .await
}

/// Waits until the namespace has `count` Machines, all Running with a nodeRef; returns
/// `machine -> node`.
pub(crate) async fn wait_machines_running(
    client: &Client,
    ns: &str,
    count: usize,
    timeout: Duration,
) -> Result<BTreeMap<String, String>> {
    until(&format!("{count} Machines Running with a nodeRef"), timeout, || async {
        let machines = objects::list(client, ns, Kind::Machine).await?;
        let running: BTreeMap<String, String> = machines
            .iter()
            .filter(|m| m.data["status"]["phase"] == "Running")
            .filter_map(|m| Some((objects::name(m), objects::str_at(m, &["status", "nodeRef", "name"])?.to_string())))
            .collect();
        Ok(if machines.len() == count && running.len() == count {
            Check::Done(running)
        } else {
            let seen: Vec<String> = machines
                .iter()
                .map(|m| {
                    format!("{} {} node={}", objects::name(m), m.data["status"]["phase"], m.data["status"]["nodeRef"])
                })
                .collect();
            Check::Pending(format!("{seen:?}"))
        })
    })
    .await
}

/// Every Node's providerID is that of its own Machine's LibvirtMachine: the
/// Machine whose nodeRef names the Node, through its infrastructureRef, and the
/// Machine's spec.providerID is the same.
pub(crate) async fn check_provider_ids(client: &Client, ns: &str, nodes: &[Node]) -> Result<()> {
    let machines = objects::list(client, ns, Kind::Machine).await?;
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let id = node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        let machine = machines
            .iter()
            .find(|m| objects::str_at(m, &["status", "nodeRef", "name"]) == Some(name.as_str()))
            .with_context(|| format!("no Machine of {ns} has a nodeRef to Node {name}"))?;
        let machine_name = objects::name(machine);
        let infra = objects::str_at(machine, &["spec", "infrastructureRef", "name"])
            .with_context(|| format!("Machine {ns}/{machine_name} has no infrastructureRef"))?;
        let lm = objects::get(client, ns, Kind::LibvirtMachine, infra)
            .await?
            .with_context(|| format!("LibvirtMachine {ns}/{infra} of Machine {machine_name} does not exist"))?;
        let own = objects::str_at(&lm, &["spec", "providerID"]).unwrap_or_default();
        ensure!(
            !own.is_empty() && id == own,
            "Node {name} has providerID {id:?}, but its Machine {machine_name}'s LibvirtMachine {infra} has {own:?}"
        );
        let on_machine = objects::str_at(machine, &["spec", "providerID"]).unwrap_or_default();
        ensure!(
            on_machine == own,
            "Machine {machine_name} has spec.providerID {on_machine:?}, its LibvirtMachine {infra} {own:?}"
        );
    }
    Ok(())
}

/// Whether the Node's Ready condition is True.
pub(crate) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(crate) fn node_names(nodes: &[Node]) -> Vec<String> {
    nodes.iter().filter_map(|n| n.metadata.name.clone()).collect()
}

pub(crate) fn is_control_plane(node: &Node) -> bool {
    node.metadata.labels.as_ref().is_some_and(|l| l.contains_key("node-role.kubernetes.io/control-plane"))
}

/// A Pod's phase and its containers' restarts and states, for waits and reports.
pub(crate) fn pod_state(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<String> = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{} restarts={} state={:?}", c.name, c.restart_count, c.state))
        .collect();
    format!("phase {:?}, {containers:?}", status.phase)
}
