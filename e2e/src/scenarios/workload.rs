//! The `workload` scenarios: real Kubernetes clusters on libvirt VMs, formed
//! as a user forms them ([`crate::workload`]) and checked from outside.
//!
//! `workload`: `clusterctl generate cluster` from the default flavor for one
//! control-plane machine and no worker, with only the variables the flavors
//! page documents, then `kubectl apply` to the management cluster, where CAPI
//! core, the kubeadm bootstrap (CABPK) and control plane (KCP) managers (with
//! their webhooks) and this provider run. The machines boot the Kubernetes node
//! image (`cargo xtask node-image`), which the provider downloads into the base
//! pool from a web server on 127.0.0.1 (named by URL and sha256, as a user
//! offers an image-builder qcow2), on the private libvirtd under software
//! emulation and run real `kubeadm init` / `kubeadm join`; kube-vip holds the
//! endpoint, kube-router (installed by the flavor's ClusterResourceSet) the pod
//! network. Checked, beside the steps of [`crate::workload::formation`] (which
//! the demo shares):
//! - the MachineDeployment scaled 0 -> 1 -> 2 -> 1, each Node Ready with the
//!   providerID of its own Machine's LibvirtMachine, and the
//!   KubeadmControlPlane Available at each step and in every state it passed
//!   through meanwhile (watched);
//! - a Deployment of 2 replicas that the scheduler spreads over the two
//!   workers, reached through its ClusterIP Service (kube-proxy) from a Pod on
//!   the control-plane node that resolves the Service's name and
//!   `kubernetes.default` (CoreDNS): both replicas answer;
//! - scaled back to 1, the removed worker's Node goes (drained, deleted) and
//!   its domain, disk, seed ISO and DHCP entry are removed;
//! - deleting the Cluster leaves nothing of the namespace's on the host, and
//!   the downloaded image stays in the base pool for the next cluster, having
//!   been downloaded once for all the machines.
//!
//! A cluster of the ClusterClass flavor is Cluster API's own quick-start spec
//! with flavor `topology` (`cargo xtask e2e capi`), not a scenario here.
//!
//! At most three emulated guests run at once on the 2 host cores. A failure
//! prints what the workload cluster says, the tail of each guest's serial
//! console (kernel, cloud-init and kubeadm output), where the full logs are
//! kept, and keeps the CAPI managers' logs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testenv::control_plane_versions::NODE_TEST_IMAGE;

use crate::harness::machines::clean_up;
use crate::harness::objects::{self, Kind};
use crate::harness::progress::say;
use crate::harness::stack::{Stack, TEST_DISK_POOL, TEST_NETWORK};
use crate::harness::wait::{Answered, Check, until};
use crate::workload::client::{check_provider_ids, is_control_plane, node_names, pod_state, wait_nodes_ready};
use crate::workload::cluster::domains;
use crate::workload::diagnose::{keep_capi_logs, report_guests, report_workload};
use crate::workload::formation::{Bounds, Formation, KcpWatch};
use crate::workload::render::Flavor;

const ID: &str = "workload";
/// For Nodes, Pods and conditions to settle once their machine runs.
const SETTLE: Duration = Duration::from_secs(600);

pub async fn workload(stack: &mut Stack) -> Result<String> {
    let ns = stack.namespace(ID).await?;
    let result = run(stack, &ns).await;
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

async fn run(stack: &mut Stack, ns: &str) -> Result<String> {
    // What a user does: render the default flavor with clusterctl, apply it with kubectl.
    let formation = Formation::apply(stack, ns, Flavor::Default, Bounds::DOCUMENTED, Box::new(|m| say(ID, m)))?;
    let client = formation.client().clone();

    // The control plane alone up to KCP Available; then the workers join and leave
    // (1 -> 2 -> 1) while KCP stays Available throughout.
    let cp = formation.control_plane().await?;
    let nodes_api: Api<Node> = Api::all(cp.workload.clone());
    let watch = KcpWatch::start(&formation, &cp.kcp);
    let one = formation.add_worker(&cp).await?;
    formation.kcp_available_now(&cp.kcp).await?;
    let with_one = domains(stack, ns)?;
    let two = formation.scale_to(&cp, 2).await?;
    formation.kcp_available_now(&cp.kcp).await?;
    say(ID, format!("Machines {:?}", two.machines));

    // A Deployment the scheduler spreads over the two workers, reached through its
    // ClusterIP Service, by name, from a Pod on the control-plane node.
    let reached = service_from_third_node(&cp.workload, &two.nodes).await?;
    formation.mark("Service reached by name from the control-plane node, both backends answered");

    // Back to one worker: the one removed is drained and its machine leaves nothing.
    let with_two = domains(stack, ns)?;
    ensure!(with_two.len() == 3, "three machines must be three domains, found {with_two:?}");
    formation.scale_workers(1).await?;
    let removed = until("one worker's Machine, LibvirtMachine and domain to be removed", SETTLE, || async {
        let machines = objects::list(&client, ns, Kind::Machine).await?;
        let lms = objects::list(&client, ns, Kind::LibvirtMachine).await?;
        let now = domains(stack, ns)?;
        Ok(if machines.len() == 2 && lms.len() == 2 && now.len() == 2 {
            Check::Done(with_two.iter().find(|d| !now.contains(d)).cloned())
        } else {
            Check::Pending(format!("{} Machines, {} LibvirtMachines, domains {now:?}", machines.len(), lms.len()))
        })
    })
    .await?
    .context("no domain disappeared")?;
    check_nothing_of(stack, &removed)?;
    let after = wait_nodes_ready(&nodes_api, 2, SETTLE).await?;
    check_provider_ids(&client, ns, &after).await?;
    formation.kcp_available_now(&cp.kcp).await?;
    watch.finish("the workers went 0 -> 1 -> 2 -> 1")?;
    formation
        .mark("scaled back to 1 worker (Node, VM, disk, ISO, reservation of the other gone), KCP Available throughout");

    // Deleting the Cluster leaves nothing on the host.
    clean_up(stack, ns).await?;
    let left = domains(stack, ns)?;
    ensure!(left.is_empty(), "domains left after the Cluster was deleted: {left:?}");
    let kept = formation.image().check_kept(stack)?;
    say(ID, kept);
    formation.mark("Cluster deleted, nothing left on the host but the downloaded image");

    let table = formation.table();
    eprintln!("  [{ID}] timing (seconds since kubectl apply):\n{table}");
    Ok(format!(
        "nodes {:?} -> {:?}; domains with one worker {with_one:?}; {reached}; removed on scale-down: {removed}\n{table}",
        node_names(&one.nodes),
        node_names(&two.nodes)
    ))
}

/// The name of the Deployment and Service of [`service_from_third_node`].
const WEB: &str = "capl-e2e-web";

/// A Deployment of 2 busybox httpd replicas that the scheduler places (required
/// anti-affinity on the host name, no nodeName) on the two workers, a ClusterIP
/// Service in front of them, and a Pod on the control-plane node that resolves the
/// Service's name and `kubernetes.default` through CoreDNS and fetches the page 16
/// times through the Service (kube-proxy's rules): both backends must answer.
async fn service_from_third_node(workload: &Client, nodes: &[Node]) -> Result<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    let cp = nodes.iter().find(|n| is_control_plane(n)).context("no control-plane Node")?;
    let cp_name = cp.metadata.name.clone().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "default");
    let services: Api<Service> = Api::namespaced(workload.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": WEB },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": WEB } },
            "template": {
                "metadata": { "labels": { "app": WEB } },
                "spec": {
                    "affinity": { "podAntiAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": { "matchLabels": { "app": WEB } },
                        "topologyKey": "kubernetes.io/hostname"
                    }]}},
                    "containers": [{
                        "name": "httpd", "image": NODE_TEST_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c",
                            "mkdir -p /tmp/www && echo \"capl-e2e-web-from-$(hostname)\" > /tmp/www/index.html && exec busybox httpd -f -p 8080 -h /tmp/www"],
                        "ports": [{ "containerPort": 8080 }]
                    }]
                }
            }
        }
    }))?;
    create_in_workload(&deployments, &deployment).await?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": WEB },
        "spec": { "type": "ClusterIP", "selector": { "app": WEB }, "ports": [{ "port": 80, "targetPort": 8080 }] }
    }))?;
    create_in_workload(&services, &service).await?;
    let backends = until("the Deployment's 2 Pods to run on two different Nodes", SETTLE, || async {
        let list =
            pods.list(&ListParams::default().labels(&format!("app={WEB}"))).await.answered("listing Pods")?.items;
        let running: BTreeMap<String, String> = list
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| Some((p.name_any(), p.spec.as_ref()?.node_name.clone()?)))
            .collect();
        let on: BTreeSet<&String> = running.values().collect();
        Ok(if running.len() == 2 && on.len() == 2 && !on.contains(&cp_name) {
            Check::Done(running)
        } else {
            Check::Pending(
                list.iter().map(|p| format!("{} {}", p.name_any(), pod_state(p))).collect::<Vec<_>>().join("; "),
            )
        })
    })
    .await?;
    let cluster_ip = services
        .get(WEB)
        .await
        .answered("reading the Service")?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the Service has no clusterIP")?;
    let kubernetes_ip = Api::<Service>::namespaced(workload.clone(), "default")
        .get("kubernetes")
        .await
        .answered("reading Service default/kubernetes")?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("Service default/kubernetes has no clusterIP")?;
    say(ID, format!("Pods {backends:?} behind Service {WEB} at {cluster_ip}"));
    // CoreDNS answers once it has listed the Services through the API server's
    // Service address, which needs kube-proxy's rules on its node: a Pod asks only
    // when the CoreDNS Deployment is Available, as kubeadm's own checks do.
    let dns: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    until("CoreDNS (Deployment kube-system/coredns) to be Available", SETTLE, || async {
        let coredns = dns.get("coredns").await.answered("reading Deployment kube-system/coredns")?;
        let status = coredns.status.unwrap_or_default();
        let available =
            status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Available" && c.status == "True");
        Ok(if available && status.available_replicas.unwrap_or(0) > 0 {
            Check::Done(())
        } else {
            let pods: Api<Pod> = Api::namespaced(workload.clone(), "kube-system");
            let list =
                pods.list(&ListParams::default().labels("k8s-app=kube-dns")).await.answered("listing CoreDNS Pods")?;
            Check::Pending(
                list.items.iter().map(|p| format!("{} {}", p.name_any(), pod_state(p))).collect::<Vec<_>>().join("; "),
            )
        })
    })
    .await?;
    // busybox's own resolver (nslookup), not glibc's: the image's busybox is static
    // and glibc's NSS cannot load in it. busybox completes only names without a dot
    // with the search path of the Pod's resolv.conf, so `lookup` walks that path the
    // way glibc does for a dotted name such as `kubernetes.default`: as given, then
    // with each search domain, until one resolves.
    let script = format!(
        "set -e; \
         first_address() {{ busybox awk '/^Name:/ {{named=1}} named && /^Address/ {{print $NF; exit}}'; }}; \
         lookup() {{ for d in '' $(busybox awk '/^search/ {{$1=\"\"; print}}' /etc/resolv.conf); do \
           a=$(busybox nslookup \"$1${{d:+.$d}}\" 2>/dev/null | first_address); \
           if [ -n \"$a\" ]; then echo \"$a\"; return; fi; done; }}; \
         web=$(lookup {WEB}); api=$(lookup kubernetes.default); \
         echo \"resolved {WEB}=$web kubernetes.default=$api\"; \
         i=0; while [ $i -lt 16 ]; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 \"$web\" 80 | busybox tail -n 1; i=$((i+1)); done"
    );
    let client_pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "capl-e2e-client" },
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": { "node-role.kubernetes.io/control-plane": "" },
            "tolerations": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule" }],
            "containers": [{
                "name": "client", "image": NODE_TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script]
            }]
        }
    }))?;
    create_in_workload(&pods, &client_pod).await?;
    let phase = until("the client Pod on the control-plane node to finish", SETTLE, || async {
        let pod = pods.get("capl-e2e-client").await.answered("reading Pod capl-e2e-client")?;
        Ok(match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some(phase @ ("Succeeded" | "Failed")) => Check::Done(phase.to_string()),
            _ => Check::Pending(pod_state(&pod)),
        })
    })
    .await?;
    let log = until("the client Pod's log", SETTLE, || async {
        Ok(Check::Done(
            pods.logs("capl-e2e-client", &LogParams::default()).await.answered("reading the client Pod's log")?,
        ))
    })
    .await?;
    ensure!(phase == "Succeeded", "the client Pod on {cp_name} failed; its log:\n{log}");
    let expected = format!("resolved {WEB}={cluster_ip} kubernetes.default={kubernetes_ip}");
    ensure!(
        log.lines().any(|l| l.trim() == expected),
        "the client Pod on {cp_name} must resolve both names to their Services' addresses ({expected}); its log:\n{log}"
    );
    let answered: BTreeSet<&str> = log.lines().filter_map(|l| l.trim().strip_prefix("capl-e2e-web-from-")).collect();
    let names: BTreeSet<&str> = backends.keys().map(String::as_str).collect();
    ensure!(
        answered == names,
        "16 requests through Service {WEB} ({cluster_ip}) must reach both Pods {names:?}; answered: {answered:?}; log:\n{log}"
    );
    let _ = pods.delete("capl-e2e-client", &DeleteParams::default()).await;
    let _ = services.delete(WEB, &DeleteParams::default()).await;
    let _ = deployments.delete(WEB, &DeleteParams::default()).await;
    Ok(format!("Service {WEB} at {cluster_ip} answered from {answered:?}"))
}

/// Creates `object` in the workload cluster, repeating the request while the API
/// server does not answer; one that a request without answer did create counts.
async fn create_in_workload<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    until(&format!("{name} to be created in the workload cluster"), SETTLE, || async {
        match api.create(&PostParams::default(), object).await {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Check::Done(())),
            result => result.answered(&format!("creating {name} in the workload cluster")).map(|_| Check::Done(())),
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
