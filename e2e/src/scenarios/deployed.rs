//! The provider as users deploy it, checked as an operator would (`capl-e2e
//! run --kind`, on the stack of a kind management cluster made by
//! [`crate::harness::kind_cluster`]: the manager image as the Deployment `clusterctl
//! init` installed, under a real kubelet and kube-controller-manager).
//!
//! `deployed`, the first scenario on that stack:
//! 1. the provider's Pod is Ready and its name is the holder of the leader Lease;
//! 2. the Pod runs as non-root with a read-only root filesystem (the kubelet
//!    enforces `runAsNonRoot` against the image's user), its log is JSON line by
//!    line, and no API call was denied (`forbidden` in the log would show a
//!    missing RBAC rule);
//! 3. `kubectl rollout restart`: a new Pod becomes Ready, the old one goes,
//!    and the Lease moves to the new Pod.
//!
//! Then the suite's machine scenarios run on the same stack (the provider Pod
//! drives a containerized libvirtd over `qemu+tls://` with a credentials
//! Secret), and `pod-logs`, the last one, reads the log of every manager Pod
//! after them: JSON, no denied call, no bootstrap data.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::harness::kind_cluster::{DEPLOYMENT, Kubectl, NAMESPACE};
use crate::harness::management::Management;
use crate::harness::progress::say;
use crate::harness::stack::Stack;
use crate::harness::wait::{self, Check};

const LEASE_LIMIT: Duration = Duration::from_secs(120);
const GONE_LIMIT: Duration = Duration::from_secs(120);

fn kubectl(stack: &Stack) -> Result<Kubectl> {
    match &stack.management {
        Management::Kind { cluster, .. } => Ok(cluster.kubectl.clone()),
        Management::Local { .. } => bail!("this scenario needs the kind management cluster (`capl-e2e run --kind`)"),
    }
}

/// The `deployed` scenario.
pub async fn deployed(stack: &mut Stack) -> Result<String> {
    let tools = kubectl(stack)?;
    crate::blocking(|| check_deployment(&tools))
}

/// The `pod-logs` scenario.
pub async fn pod_logs(stack: &mut Stack) -> Result<String> {
    let tools = kubectl(stack)?;
    crate::blocking(|| {
        let pods = tools.manager_pod_names()?.all;
        ensure!(!pods.is_empty(), "no manager Pod");
        let mut lines = 0;
        for pod in &pods {
            let logs = check_logs(&tools, pod)?;
            lines += logs.lines().filter(|l| !l.trim().is_empty()).count();
            // What every scenario's bootstrap data says (objects::user_data).
            ensure!(!logs.contains("hello from"), "Pod {pod} logged a machine's bootstrap data");
        }
        Ok(format!("{lines} log lines of {pods:?}: JSON, no denied API call, no bootstrap data"))
    })
}

fn check_deployment(tools: &Kubectl) -> Result<String> {
    let id = "deployed";
    // 1. Rolled out, Ready, leading.
    let t = Instant::now();
    tools.manager_rollout()?;
    let first = tools.manager_pod_names()?.ready;
    ensure!(first.len() == 1, "one Ready manager Pod expected, found {first:?}");
    let first = first[0].clone();
    let holder = wait_for_lease_holder(tools, &first)?;
    say(id, format!("Pod {first} Ready and leading (Lease holder {holder}) in {:.0?}", t.elapsed()));

    // 2. How it runs and what it logs.
    check_pod_security(tools, &first)?;
    check_logs(tools, &first)?;
    say(id, "runs as non-root on a read-only root filesystem; JSON log, no denied API call");

    // 3. A rolling restart hands the Lease over.
    let t = Instant::now();
    tools.out(&["rollout", "restart", "-n", NAMESPACE, &format!("deployment/{DEPLOYMENT}")])?;
    tools.manager_rollout()?;
    let second = wait::until_blocking("the old Pod gone and one new Pod Ready", GONE_LIMIT, || {
        let pods = tools.manager_pod_names()?;
        Ok(if !pods.all.contains(&first) && pods.ready.len() == 1 {
            Check::Done(pods.ready[0].clone())
        } else {
            Check::Pending(format!("Pods {:?}, Ready {:?} (old Pod {first})", pods.all, pods.ready))
        })
    })?;
    ensure!(second != first, "the rollout restart kept Pod {first}");
    let holder = wait_for_lease_holder(tools, &second)?;
    check_logs(tools, &second)?;
    let moved = format!("rollout restart: {first} -> {second}, Lease holder {holder}, in {:.0?}", t.elapsed());
    say(id, &moved);
    Ok(format!("Pod Ready and leading, nonroot, read-only, JSON log; {moved}"))
}

/// Waits until a Lease in the provider's namespace is held by `pod`; returns the holder.
fn wait_for_lease_holder(tools: &Kubectl, pod: &str) -> Result<String> {
    wait::until_blocking(&format!("a Lease in {NAMESPACE} held by Pod {pod}"), LEASE_LIMIT, || {
        let leases = tools.json(&["get", "leases", "-n", NAMESPACE])?;
        let holders: Vec<String> = leases["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .collect();
        Ok(match holders.iter().find(|h| h.starts_with(&format!("{pod}_"))) {
            Some(h) => Check::Done(h.clone()),
            None => Check::Pending(format!("holders {holders:?}")),
        })
    })
}

fn check_pod_security(tools: &Kubectl, pod: &str) -> Result<()> {
    let p = tools.json(&["get", "pod", "-n", NAMESPACE, pod])?;
    let container = &p["spec"]["containers"][0];
    let pod_sc = &p["spec"]["securityContext"];
    let sc = &container["securityContext"];
    ensure!(sc["readOnlyRootFilesystem"] == true, "Pod {pod}: the manager's root filesystem is not read-only: {sc}");
    ensure!(
        sc["runAsNonRoot"] == true || pod_sc["runAsNonRoot"] == true,
        "Pod {pod}: runAsNonRoot is not set ({pod_sc}, {sc})"
    );
    ensure!(sc["allowPrivilegeEscalation"] == false, "Pod {pod}: privilege escalation allowed: {sc}");
    let ready = p["status"]["containerStatuses"][0]["ready"] == true;
    ensure!(ready, "Pod {pod}: the manager container is not ready");
    Ok(())
}

/// Every line is a JSON object with a level; nothing was forbidden; no cloud-config.
/// Returns the log.
fn check_logs(tools: &Kubectl, pod: &str) -> Result<String> {
    let logs = tools.out(&["logs", "-n", NAMESPACE, pod])?;
    let mut lines = 0;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("Pod {pod} logged a line that is not JSON: {line}"))?;
        ensure!(v.get("level").is_some(), "Pod {pod}: a log line without a level: {line}");
        ensure!(!line.contains("forbidden"), "Pod {pod}: an API call was denied (missing RBAC?): {line}");
        ensure!(!line.contains("#cloud-config"), "Pod {pod}: bootstrap data in the log: {line}");
    }
    ensure!(lines > 0, "Pod {pod} logged nothing");
    Ok(logs)
}
