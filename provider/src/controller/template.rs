//! The LibvirtMachineTemplate reconciler: keeps `status.capacity` and
//! `status.nodeInfo` current, which cluster-autoscaler's Cluster API provider
//! reads to scale a MachineDeployment up from zero replicas (it cannot look at
//! a Node that does not exist yet).
//!
//! - `capacity`: `cpu` (the template's vCPUs), `memory` (its MiB) and
//!   `ephemeral-storage` (its root disk), from the spec alone.
//! - `nodeInfo.operatingSystem`: `linux` (the provider seeds cloud-init and
//!   makes Kubernetes nodes); `nodeInfo.architecture`: the Go name of the
//!   architecture of the template's host (a domain runs the host's
//!   architecture), read from the host's capabilities. The host is the one of
//!   the template's Cluster (CAPI's cluster-name label, else its owner
//!   Cluster, which CAPI sets on the templates a MachineDeployment uses). A
//!   template of no Cluster yet, or whose host cannot be read, has no
//!   architecture (or keeps the one it had) until it can.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use super::context::{Context, get_optional};
use super::error::Error;
use super::owners::{owner_name, paused_reason};
use super::{credentials, object_patch};
use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster};
use crate::api::{LibvirtCluster, LibvirtMachineSpec, LibvirtMachineTemplate, LibvirtMachineTemplateStatus, NodeInfo};

/// How soon to look again while the architecture is not known (no Cluster,
/// no LibvirtCluster yet, or the host did not answer).
pub const RECHECK_ARCHITECTURE: Duration = Duration::from_secs(60);

pub async fn reconcile(object: Arc<LibvirtMachineTemplate>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&object, &ctx).await;
    ctx.metrics.reconciled("libvirtmachinetemplate", started.elapsed());
    result
}

async fn reconcile_inner(object: &LibvirtMachineTemplate, ctx: &Context) -> Result<Action, Error> {
    let ns = object.namespace().ok_or_else(|| Error::NoNamespace(object.name_any()))?;
    let cluster_name = object.labels().get(CLUSTER_NAME_LABEL).cloned().or_else(|| owner_name(object, "Cluster"));
    let cluster = match &cluster_name {
        Some(name) => get_optional(&Api::<Cluster>::namespaced(ctx.client.clone(), &ns), name).await?,
        None => None,
    };
    if let Some(why) = paused_reason(object, cluster.as_ref()) {
        tracing::debug!(template = %object.name_any(), %why, "paused: status left as it is");
        return Ok(Action::await_change());
    }
    let old = object.status.clone().unwrap_or_default();
    let (architecture, unknown_why) = match host_architecture(object, cluster.as_ref(), ctx, &ns).await? {
        Ok(arch) => (Some(arch), None),
        Err(why) => (None, Some(why)),
    };
    let known = architecture.is_some();
    let status = LibvirtMachineTemplateStatus {
        capacity: Some(capacity(&object.spec.template.spec)),
        node_info: Some(NodeInfo {
            architecture: architecture.or_else(|| old.node_info.as_ref().and_then(|n| n.architecture.clone())),
            operating_system: Some("linux".to_string()),
        }),
    };
    let changes = Some(&status) != object.status.as_ref();
    if let Some(why) = unknown_why {
        // Said once when the status is written, not on every recheck.
        if changes {
            tracing::info!(template = %object.name_any(), %why, "the architecture of the template's nodes is not known yet");
        } else {
            tracing::debug!(template = %object.name_any(), %why, "the architecture of the template's nodes is still not known");
        }
    }
    if changes {
        let api: Api<LibvirtMachineTemplate> = Api::namespaced(ctx.client.clone(), &ns);
        object_patch::patch_status(&api, &object.name_any(), &status).await?;
    }
    Ok(Action::requeue(if known { ctx.settings.resync_interval } else { RECHECK_ARCHITECTURE }))
}

/// What a machine from the template has: its vCPUs, memory and root disk.
pub fn capacity(spec: &LibvirtMachineSpec) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity(spec.vcpu.max(1).to_string())),
        ("memory".to_string(), Quantity(format!("{}Mi", spec.memory_mib.max(1)))),
        ("ephemeral-storage".to_string(), Quantity(format!("{}Gi", spec.disk_gib.max(1)))),
    ])
}

/// Kubernetes' (Go's) name for a libvirt architecture.
pub fn go_architecture(libvirt_arch: &str) -> String {
    match libvirt_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "i686" | "i386" => "386",
        "armv7l" | "armv6l" => "arm",
        other => other,
    }
    .to_string()
}

/// The architecture of the host of the template's Cluster, or why it is not known.
async fn host_architecture(
    object: &LibvirtMachineTemplate,
    cluster: Option<&Cluster>,
    ctx: &Context,
    ns: &str,
) -> Result<Result<String, String>, Error> {
    let name = object.name_any();
    let Some(cluster) = cluster else {
        return Ok(Err(format!(
            "LibvirtMachineTemplate {name} names no existing Cluster (label {CLUSTER_NAME_LABEL} or owner reference)"
        )));
    };
    let Some(lc_name) =
        cluster.spec.infrastructure_ref.as_ref().filter(|r| r.kind == "LibvirtCluster").map(|r| r.name.clone())
    else {
        return Ok(Err(format!("Cluster {} has no LibvirtCluster as its infrastructure", cluster.name_any())));
    };
    let Some(lc) = get_optional(&Api::<LibvirtCluster>::namespaced(ctx.client.clone(), ns), &lc_name).await? else {
        return Ok(Err(format!("LibvirtCluster {lc_name} does not exist yet")));
    };
    let owner = format!("LibvirtMachineTemplate {name}");
    // The first host that answers: the hosts of one cluster run one architecture
    // (a node group's nodes are alike).
    let mut why_not = Vec::new();
    for host in lc.spec.hosts() {
        let uri = &host.uri;
        let opened = match credentials::host_connection_uri(ctx, ns, &host, &owner, false).await? {
            Ok(opened) => opened,
            Err(unusable) => {
                why_not.push(unusable.message);
                continue;
            }
        };
        let started = Instant::now();
        let capabilities = ctx.connections.host(&opened).call(|h| h.capabilities_xml()).await;
        ctx.metrics.host_operation("capabilities", started.elapsed());
        match capabilities {
            Ok(xml) => match capl_host::domain_xml::host_kvm_support(&xml) {
                Ok((arch, _)) => return Ok(Ok(go_architecture(&arch))),
                Err(e) => why_not.push(format!("the capabilities of {uri} cannot be read: {e}")),
            },
            Err(err) => why_not.push(credentials::as_user_wrote_it(format!("{owner}: {uri}: {err}"), &opened, uri)),
        }
    }
    if why_not.is_empty() {
        why_not.push(format!("LibvirtCluster {lc_name} names no host"));
    }
    Ok(Err(why_not.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_the_spec_in_kubernetes_units() {
        let spec: LibvirtMachineSpec =
            serde_json::from_value(serde_json::json!({ "vcpu": 4, "memoryMiB": 8192, "diskGiB": 40, "image": "i" }))
                .unwrap();
        let c = capacity(&spec);
        assert_eq!(c["cpu"].0, "4");
        assert_eq!(c["memory"].0, "8192Mi");
        assert_eq!(c["ephemeral-storage"].0, "40Gi");
    }

    #[test]
    fn libvirt_architectures_get_their_kubernetes_names() {
        assert_eq!(go_architecture("x86_64"), "amd64");
        assert_eq!(go_architecture("aarch64"), "arm64");
        assert_eq!(go_architecture("s390x"), "s390x");
    }
}
