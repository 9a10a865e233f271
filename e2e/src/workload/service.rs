//! What a user checks first on a new cluster: a workload is served across its
//! nodes. A Deployment of 2 busybox httpd replicas that the scheduler spreads
//! over the cluster's two nodes (required anti-affinity on the host name, the
//! control-plane taint tolerated, no nodeName), a ClusterIP Service in front of
//! them, and a client Pod on the control-plane node that resolves the Service's
//! name and `kubernetes.default` through CoreDNS and fetches the page 16 times
//! through the Service: both replicas must answer, so kube-proxy's rules hold
//! and the pod network carries traffic from one node to a Pod on the other.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testenv::control_plane_versions::NODE_TEST_IMAGE;

use super::client::{is_control_plane, pod_state};
use crate::harness::wait::{Answered, Check, until};

/// The name of the Deployment and Service of [`across_nodes`].
const WEB: &str = "capl-e2e-web";

/// The check of this module's header on the workload cluster of `workload`,
/// whose Nodes are `nodes` (a control-plane node and one worker), within
/// `within` in all; `say` reports where the replicas run. Removes what it
/// created once both replicas answered.
pub(crate) async fn across_nodes(
    workload: &Client,
    nodes: &[Node],
    within: Duration,
    say: &(dyn Fn(String) + Sync),
) -> Result<String> {
    let deadline = Instant::now() + within;
    let left = || deadline.saturating_duration_since(Instant::now());
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
                    "tolerations": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule" }],
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
    create_in_workload(&deployments, &deployment, left()).await?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": WEB },
        "spec": { "type": "ClusterIP", "selector": { "app": WEB }, "ports": [{ "port": 80, "targetPort": 8080 }] }
    }))?;
    create_in_workload(&services, &service, left()).await?;
    let backends = until("the Deployment's 2 Pods to run on two different Nodes", left(), || async {
        let list =
            pods.list(&ListParams::default().labels(&format!("app={WEB}"))).await.answered("listing Pods")?.items;
        let running: BTreeMap<String, String> = list
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| Some((p.name_any(), p.spec.as_ref()?.node_name.clone()?)))
            .collect();
        let on: BTreeSet<&String> = running.values().collect();
        Ok(if running.len() == 2 && on.len() == 2 {
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
    say(format!("Pods {backends:?} behind Service {WEB} at {cluster_ip}"));
    // CoreDNS answers once it has listed the Services through the API server's
    // Service address, which needs kube-proxy's rules on its node: a Pod asks only
    // when the CoreDNS Deployment is Available, as kubeadm's own checks do.
    let dns: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    until("CoreDNS (Deployment kube-system/coredns) to be Available", left(), || async {
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
    create_in_workload(&pods, &client_pod, left()).await?;
    let phase = until("the client Pod on the control-plane node to finish", left(), || async {
        let pod = pods.get("capl-e2e-client").await.answered("reading Pod capl-e2e-client")?;
        Ok(match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some(phase @ ("Succeeded" | "Failed")) => Check::Done(phase.to_string()),
            _ => Check::Pending(pod_state(&pod)),
        })
    })
    .await?;
    let log = until("the client Pod's log", left(), || async {
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
    // The user's cluster is left as it was; a removal that fails is harmless.
    let removal = async {
        let _ = pods.delete("capl-e2e-client", &DeleteParams::default()).await;
        let _ = services.delete(WEB, &DeleteParams::default()).await;
        let _ = deployments.delete(WEB, &DeleteParams::default()).await;
    };
    let _ = tokio::time::timeout(REMOVAL_WITHIN, removal).await;
    Ok(format!("Service {WEB} at {cluster_ip} answered from {answered:?}"))
}

/// How long the removal of what the check created may take.
const REMOVAL_WITHIN: Duration = Duration::from_secs(30);

/// Creates `object` in the workload cluster, repeating the request while the API
/// server does not answer; one that a request without answer did create counts.
async fn create_in_workload<K>(api: &Api<K>, object: &K, within: Duration) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    until(&format!("{name} to be created in the workload cluster"), within, || async {
        match api.create(&PostParams::default(), object).await {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Check::Done(())),
            result => result.answered(&format!("creating {name} in the workload cluster")).map(|_| Check::Done(())),
        }
    })
    .await
}
