//! The `workload` scenarios: real Kubernetes clusters on libvirt VMs, formed
//! as a user forms them ([`crate::workload`]) and checked from outside.
//!
//! `workload`: `clusterctl generate cluster --flavor allocated-endpoint` (the
//! default flavor with the control-plane endpoint allocated by the provider)
//! for one control-plane machine and no worker, with only the variables the
//! flavors page documents, then `kubectl apply` to the management cluster,
//! where CAPI core, the kubeadm bootstrap (CABPK) and control plane (KCP)
//! managers (with their webhooks) and this provider run. The machines boot the
//! Kubernetes node image (`cargo xtask node-image`) on the private libvirtd
//! under software emulation and run real `kubeadm init` / `kubeadm join`.
//! Checked, beside the steps of [`crate::workload::formation`] (which the demo
//! shares):
//! - the LibvirtCluster's endpoint is allocated from the test network (outside
//!   its DHCP range, a DNS host entry on the host that names the LibvirtCluster)
//!   and CAPI copies it into the Cluster;
//! - a Pod on the worker fetches a page from a Pod on the control-plane node;
//! - scaled back to 0, the worker's Node goes (drained, deleted) and its
//!   domain, disk, seed ISO and DHCP entry are removed;
//! - deleting the Cluster leaves nothing of the namespace's on the host, the
//!   endpoint's DNS host entry included.
//!
//! `workload-topology`: a cluster from the ClusterClass flavor, up to its
//! control plane Available; workers, pod traffic and scaling are the same node
//! image and machine code as in `workload`, not repeated (each emulated guest
//! costs CI minutes).
//!
//! At most two emulated guests run at once on the 2 host cores. A failure
//! prints what the workload cluster says, the tail of each guest's serial
//! console (kernel, cloud-init and kubeadm output), where the full logs are
//! kept, and keeps the CAPI managers' logs.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testenv::control_plane_versions::NODE_TEST_IMAGE;

use crate::harness::machines::clean_up;
use crate::harness::objects::{self, Kind};
use crate::harness::progress::say;
use crate::harness::stack::{Stack, TEST_DISK_POOL, TEST_NETWORK};
use crate::harness::wait::{Answered, Check, until};
use crate::workload::client::{is_control_plane, node_names, pod_state, wait_nodes_ready};
use crate::workload::cluster::{CLUSTER, domains};
use crate::workload::diagnose::{compact, keep_capi_logs, report_guests, report_workload};
use crate::workload::formation::{Bounds, Formation};
use crate::workload::render::Flavor;

const ID: &str = "workload";
const TOPOLOGY_ID: &str = "workload-topology";
/// For Nodes, Pods and conditions to settle once their machine runs.
const SETTLE: Duration = Duration::from_secs(600);

pub async fn workload(stack: &mut Stack) -> Result<String> {
    let ns = stack.namespace(ID).await?;
    let result = run(stack, &ns).await;
    report_failure(stack, &ns, result).await
}

/// The `workload-topology` scenario: a cluster from the ClusterClass flavor
/// (`clusterctl generate cluster --flavor topology --worker-machine-count 0`, which
/// adds the `libvirt` ClusterClass), checked up to what a user relies on: the
/// topology controller's KubeadmControlPlane Initialized and Available, its Machine
/// Running with a nodeRef and its Node Ready with the LibvirtMachine's providerID;
/// deleting the Cluster leaves nothing on the host.
pub async fn workload_topology(stack: &mut Stack) -> Result<String> {
    let ns = stack.namespace(TOPOLOGY_ID).await?;
    let result = run_topology(stack, &ns).await;
    report_failure(stack, &ns, result).await
}

/// On a workload scenario's failure: what the workload cluster says, each guest's console
/// tail and the CAPI managers' logs kept, then the error with its whole chain of causes.
async fn report_failure(stack: &Stack, ns: &str, result: Result<String>) -> Result<String> {
    if let Err(err) = &result {
        report_workload(&stack.client(), ns).await;
        report_guests(stack, ns);
        keep_capi_logs(stack, ns);
        return Err(anyhow::anyhow!("{err:#}"));
    }
    result
}

async fn run_topology(stack: &mut Stack, ns: &str) -> Result<String> {
    let formation =
        Formation::apply(stack, ns, Flavor::Topology, Bounds::DOCUMENTED, Box::new(|m| say(TOPOLOGY_ID, m)))?;
    let cp = formation.control_plane().await?;
    clean_up(stack, ns).await?;
    let left = domains(stack, ns)?;
    ensure!(left.is_empty(), "domains left after the Cluster was deleted: {left:?}");
    formation.mark("Cluster deleted, nothing left on the host");
    let table = formation.table();
    eprintln!("  [{TOPOLOGY_ID}] timing (seconds since kubectl apply):\n{table}");
    Ok(format!("KubeadmControlPlane {}, nodes {:?}\n{table}", cp.kcp, node_names(&cp.nodes)))
}

async fn run(stack: &mut Stack, ns: &str) -> Result<String> {
    // What a user does: render the template with clusterctl, apply it with kubectl.
    let formation =
        Formation::apply(stack, ns, Flavor::AllocatedEndpoint, Bounds::DOCUMENTED, Box::new(|m| say(ID, m)))?;
    let client = formation.client().clone();
    let (endpoint, endpoint_entry) = allocated_endpoint(stack, &client, ns).await?;
    say(ID, format!("control-plane endpoint {endpoint} allocated from network {TEST_NETWORK}"));

    // The control plane alone up to KCP Available, then the worker joins.
    let cp = formation.control_plane().await?;
    let grown = formation.add_worker(&cp).await?;
    say(ID, format!("Machines {:?}", grown.machines));
    let nodes_api: Api<Node> = Api::all(cp.workload.clone());

    // A Pod on the worker reaches a Pod on the control-plane node.
    let reply = pod_to_pod(&cp.workload, &grown.nodes).await?;
    formation.mark("Pod on the worker reached a Pod on the control-plane node");

    // Scaled back to 0: the worker is drained and its machine removed.
    let with_worker = domains(stack, ns)?;
    ensure!(with_worker.len() == 2, "two machines must be two domains, found {with_worker:?}");
    formation.scale_workers(0).await?;
    let removed = until("the worker's Machine, LibvirtMachine and domain to be removed", SETTLE, || async {
        let machines = objects::list(&client, ns, Kind::Machine).await?;
        let lms = objects::list(&client, ns, Kind::LibvirtMachine).await?;
        let now = domains(stack, ns)?;
        Ok(if machines.len() == 1 && lms.len() == 1 && now.len() == 1 {
            Check::Done(with_worker.iter().find(|d| !now.contains(d)).cloned())
        } else {
            Check::Pending(format!("{} Machines, {} LibvirtMachines, domains {now:?}", machines.len(), lms.len()))
        })
    })
    .await?
    .context("no domain disappeared")?;
    check_nothing_of(stack, &removed)?;
    wait_nodes_ready(&nodes_api, 1, SETTLE).await?;
    formation.mark("scaled back to 0 (worker's Node, VM, disk, ISO, reservation gone)");

    // Deleting the Cluster leaves nothing on the host.
    clean_up(stack, ns).await?;
    let left = domains(stack, ns)?;
    ensure!(left.is_empty(), "domains left after the Cluster was deleted: {left:?}");
    let entries = endpoint_dns_hosts(stack, &endpoint_entry)?;
    ensure!(
        entries.is_empty(),
        "the endpoint's DNS host entry {endpoint_entry} is left on network {TEST_NETWORK} after the Cluster was deleted: {entries:?}"
    );
    formation.mark("Cluster deleted, nothing left on the host (endpoint released)");

    let table = formation.table();
    eprintln!("  [{ID}] timing (seconds since kubectl apply):\n{table}");
    Ok(format!(
        "endpoint {endpoint} (allocated); nodes {:?}; pod-to-pod reply {reply:?}; removed on scale-down: {removed}\n{table}",
        node_names(&grown.nodes)
    ))
}

/// An HTTP server Pod (busybox httpd) on the control-plane node and a client Pod
/// (busybox nc) on a worker; returns what the client fetched.
async fn pod_to_pod(workload: &Client, nodes: &[Node]) -> Result<String> {
    let cp = nodes.iter().find(|n| is_control_plane(n)).context("no control-plane Node")?;
    let worker = nodes.iter().find(|n| !is_control_plane(n)).context("no worker Node")?;
    let cp_name = cp.metadata.name.clone().unwrap_or_default();
    let worker_name = worker.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    let marker = format!("capl-e2e-pong-from-{cp_name}");
    let server: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "capl-e2e-server" },
        "spec": {
            "nodeName": cp_name,
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{
                "name": "httpd", "image": NODE_TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    format!("mkdir -p /tmp/www && echo {marker} > /tmp/www/index.html && exec busybox httpd -f -p 8080 -h /tmp/www")],
                "ports": [{ "containerPort": 8080 }]
            }]
        }
    }))?;
    create_pod(&pods, &server).await?;
    let server_ip = until("the server Pod to run with an IP", SETTLE, || async {
        let pod = pods.get("capl-e2e-server").await.answered("reading Pod capl-e2e-server")?;
        let status = pod.status.clone().unwrap_or_default();
        Ok(match (status.phase.as_deref(), status.pod_ip.clone()) {
            (Some("Running"), Some(ip)) => Check::Done(ip),
            _ => Check::Pending(pod_state(&pod)),
        })
    })
    .await?;
    say(ID, format!("server Pod on {cp_name} at {server_ip}"));
    let client_pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "capl-e2e-client" },
        "spec": {
            "nodeName": worker_name,
            "restartPolicy": "OnFailure",
            "containers": [{
                // busybox nc, not wget: Debian's static busybox crashes in wget (glibc's
                // NSS cannot load in a static binary when wget looks up the service).
                "name": "client", "image": NODE_TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 {server_ip} 8080")]
            }]
        }
    }))?;
    create_pod(&pods, &client_pod).await?;
    until("the client Pod on the worker to fetch the server's page", SETTLE, || async {
        let pod = pods.get("capl-e2e-client").await.answered("reading Pod capl-e2e-client")?;
        Ok(match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Check::Done(()),
            _ => Check::Pending(pod_state(&pod)),
        })
    })
    .await?;
    let reply = until("the client Pod's log", SETTLE, || async {
        let log = pods.logs("capl-e2e-client", &LogParams::default()).await.answered("reading the client Pod's log")?;
        Ok(Check::Done(log))
    })
    .await?;
    let reply = reply.lines().last().unwrap_or_default().to_string();
    ensure!(reply.contains(&marker), "the client Pod on {worker_name} printed {reply:?}, expected {marker:?}");
    for name in ["capl-e2e-client", "capl-e2e-server"] {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    say(ID, format!("Pod on {worker_name} fetched {:?} from {server_ip}", reply.trim()));
    Ok(reply.trim().to_string())
}

/// Creates `pod` in the workload cluster, repeating the request while the API server
/// does not answer; a Pod that a request without answer did create counts as created.
async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    until(&format!("Pod {name} to be created in the workload cluster"), SETTLE, || async {
        match pods.create(&PostParams::default(), pod).await {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Check::Done(())),
            result => result.answered(&format!("creating Pod {name} in the workload cluster")).map(|_| Check::Done(())),
        }
    })
    .await
}

/// Fails if `domain`, a volume of it or its DHCP entry is still on the host.
fn check_nothing_of(stack: &Stack, domain: &str) -> Result<()> {
    let host = stack.libvirt()?;
    let volumes: Vec<String> = host
        .volumes(TEST_DISK_POOL)?
        .into_iter()
        .filter(|v| v.starts_with(domain) || v.starts_with(&format!("cloudinit-{domain}")))
        .collect();
    let reservations: Vec<String> =
        host.dhcp_hosts(TEST_NETWORK)?.into_iter().filter(|h| h.name == domain).map(|h| h.ip).collect();
    ensure!(
        volumes.is_empty() && reservations.is_empty(),
        "the removed machine {domain} left volumes {volumes:?} and DHCP reservations {reservations:?}"
    );
    Ok(())
}

/// The DNS host entries of the test network that carry the host name `name`
/// (the provider names an endpoint's entry `capl-endpoint-<LibvirtCluster UID>`).
/// Only this cluster's entry is looked at: the network may be shared with other
/// clusters, whose entries are theirs.
fn endpoint_dns_hosts(stack: &Stack, name: &str) -> Result<Vec<(String, Vec<String>)>> {
    Ok(stack
        .libvirt()?
        .dns_hosts(TEST_NETWORK)?
        .into_iter()
        .filter(|(_, names)| names.iter().any(|n| n == name))
        .collect())
}

/// Waits for the provider to allocate the control-plane endpoint of the
/// allocated-endpoint flavor and checks it as an admin would: an address of the
/// test network outside its DHCP range, in the LibvirtCluster and copied by CAPI
/// into the Cluster, and on the host a DNS host entry for it named after the
/// LibvirtCluster's UID, and no other entry of the network holding the same address.
/// Returns the address and the entry's host name.
async fn allocated_endpoint(stack: &Stack, client: &Client, ns: &str) -> Result<(String, String)> {
    use testenv::test_host::{DHCP_LAST, SUBNET_PREFIX};
    let (host, uid) = until(
        &format!("LibvirtCluster {ns}/{CLUSTER} to be given an endpoint"),
        Bounds::DOCUMENTED.vm_started,
        || async {
            let lc = objects::get(client, ns, Kind::LibvirtCluster, CLUSTER).await?;
            Ok(match lc {
                Some(lc) => match lc.data["spec"]["controlPlaneEndpoint"]["host"].as_str() {
                    Some(host) => Check::Done((host.to_string(), lc.uid().unwrap_or_default())),
                    None => Check::Pending(format!("status {}", compact(&lc.data["status"]))),
                },
                None => Check::Pending("no LibvirtCluster".into()),
            })
        },
    )
    .await?;
    let host_number: Option<u8> = host.strip_prefix(&format!("{SUBNET_PREFIX}.")).and_then(|n| n.parse().ok());
    ensure!(
        host_number.is_some_and(|n| n > DHCP_LAST && n < 255),
        "the allocated endpoint {host} is not an address of {SUBNET_PREFIX}.0/24 outside the DHCP range (.2-.{DHCP_LAST})"
    );
    until(&format!("Cluster {ns}/{CLUSTER} to take the endpoint {host}"), SETTLE, || async {
        let cluster = objects::get(client, ns, Kind::Cluster, CLUSTER).await?.context("the Cluster is gone")?;
        let seen = &cluster.data["spec"]["controlPlaneEndpoint"];
        Ok(if seen["host"] == host.as_str() && seen["port"] == 6443 {
            Check::Done(())
        } else {
            Check::Pending(format!("spec.controlPlaneEndpoint {}", compact(seen)))
        })
    })
    .await?;
    let name = format!("capl-endpoint-{uid}");
    let entries = endpoint_dns_hosts(stack, &name)?;
    let expected = (host.clone(), vec![name.clone()]);
    ensure!(
        entries == [expected.clone()],
        "network {TEST_NETWORK} must hold exactly one DNS host entry for this cluster's endpoint, {expected:?}; found {entries:?}"
    );
    let sharing: Vec<_> = stack
        .libvirt()?
        .dns_hosts(TEST_NETWORK)?
        .into_iter()
        .filter(|(ip, names)| *ip == host && *names != expected.1)
        .collect();
    ensure!(sharing.is_empty(), "the allocated endpoint {host} is also held by other DNS host entries: {sharing:?}");
    Ok((host, name))
}
