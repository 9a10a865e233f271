//! The `deployed` scenario (`capl-e2e run --kind`): the provider as users
//! deploy it, from its container image, as a Pod of a kind management cluster
//! under a real kubelet and kube-controller-manager.
//!
//! What it needs comes from `cargo xtask e2e --kind` (all built offline, see
//! `xtask/src/kind.rs`): kind ([`KIND_BIN_ENV`]), its node image
//! ([`KIND_NODE_IMAGE_ENV`]), the directory whose `docker` is the wrapper kind
//! runs through ([`KIND_WRAPPER_DIR_ENV`], with the real client in
//! `CAPL_REAL_DOCKER`) and the manager image built offline
//! ([`PROVIDER_IMAGE_ENV`]).
//!
//! Steps, each checked from outside as an operator would:
//! 1. `kind create cluster` (one node, docker network `capl-kind`);
//! 2. `kind load docker-image` of the manager image;
//! 3. CAPI's CRDs (the manager watches Clusters and Machines), then the
//!    provider's `install.yaml` (`capl-manifests install-yaml --image`: CRDs,
//!    RBAC, admission policy, the Deployment, as `cargo xtask deploy` applies
//!    them);
//! 4. the Deployment rolls out: its Pod becomes Ready and its name is the
//!    holder of the leader Lease;
//! 5. the Pod runs as non-root with a read-only root filesystem (the kubelet
//!    enforces `runAsNonRoot` against the image's user), its log is JSON line by
//!    line, and no API call was denied (`forbidden` in the log would show a
//!    missing RBAC rule);
//! 6. `kubectl rollout restart`: a new Pod becomes Ready, the old one goes,
//!    and the Lease moves to the new Pod.
//!
//! The kind cluster is deleted afterwards, however the scenario ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::scenarios::say;

/// The scenario's id in the summary table.
pub const SCENARIO: &str = "deployed";
pub const KIND_BIN_ENV: &str = "CAPL_KIND_BIN";
pub const KIND_NODE_IMAGE_ENV: &str = "CAPL_KIND_NODE_IMAGE";
pub const KIND_WRAPPER_DIR_ENV: &str = "CAPL_KIND_WRAPPER_DIR";
pub const PROVIDER_IMAGE_ENV: &str = "CAPL_PROVIDER_IMAGE";
/// The kind cluster the scenario creates and deletes.
pub const CLUSTER: &str = "capl-e2e";
/// The docker network of its node.
const NETWORK: &str = "capl-kind";
/// The provider's namespace and Deployment (config/manager).
const NAMESPACE: &str = "capl-system";
const DEPLOYMENT: &str = "capl-controller-manager";
const POD_SELECTOR: &str = "control-plane=controller-manager";
/// Bounds of the waits.
const CREATE_LIMIT: &str = "240s";
const ROLLOUT_LIMIT: &str = "300s";
const LEASE_LIMIT: Duration = Duration::from_secs(120);
const GONE_LIMIT: Duration = Duration::from_secs(120);

fn env_path(name: &str) -> Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set: run the kind scenarios with `cargo xtask e2e --kind`"))
}

/// kind and kubectl, with what they need.
struct Tools {
    kind: PathBuf,
    kubectl: PathBuf,
    path: std::ffi::OsString,
    kubeconfig: PathBuf,
}

impl Tools {
    fn kind(&self) -> Command {
        let mut c = Command::new(&self.kind);
        c.env("PATH", &self.path).env("KIND_EXPERIMENTAL_DOCKER_NETWORK", NETWORK);
        c
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        c
    }

    /// Runs kubectl and returns its stdout; an error carries its stderr.
    fn kubectl_out(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args).output().with_context(|| format!("running kubectl {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn kubectl_json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl_out(&all)?)?)
    }
}

fn run(what: &str, command: &mut Command) -> Result<()> {
    let out = command.output().with_context(|| format!("{what}: cannot start {:?}", command.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Deletes the kind cluster when dropped.
struct ClusterGuard<'a>(&'a Tools);

impl Drop for ClusterGuard<'_> {
    fn drop(&mut self) {
        let _ = self.0.kind().args(["delete", "cluster", "--name", CLUSTER]).output();
    }
}

/// Runs the scenario in `work_dir`.
pub fn run_scenario(work_dir: &Path) -> Result<()> {
    let assets = testenv::Assets::locate()?;
    let kubectl = assets.kubectl().context("no kubectl: run `cargo xtask control-plane build`")?;
    let wrapper_dir = env_path(KIND_WRAPPER_DIR_ENV)?;
    let mut path = std::ffi::OsString::from(&wrapper_dir);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    std::fs::create_dir_all(work_dir)?;
    let tools = Tools { kind: env_path(KIND_BIN_ENV)?, kubectl, path, kubeconfig: work_dir.join("kubeconfig") };
    let node_image = std::env::var(KIND_NODE_IMAGE_ENV).with_context(|| format!("{KIND_NODE_IMAGE_ENV} is not set"))?;
    let image = std::env::var(PROVIDER_IMAGE_ENV).with_context(|| format!("{PROVIDER_IMAGE_ENV} is not set"))?;
    let manifests = crate::stack::built_binary("capl-manifests")
        .or_else(|| std::env::var_os("CAPL_MANIFESTS_BIN").map(PathBuf::from))
        .context("capl-manifests is not built")?;

    // 1. The cluster (a leftover of an interrupted run first goes).
    let _ = tools.kind().args(["delete", "cluster", "--name", CLUSTER]).output();
    let t = Instant::now();
    let config = crate::repo_root().join("hack/kind/cluster.yaml");
    run(
        "kind create cluster",
        tools
            .kind()
            .args(["create", "cluster", "--name", CLUSTER, "--image", &node_image, "--wait", CREATE_LIMIT])
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&tools.kubeconfig),
    )?;
    let _guard = ClusterGuard(&tools);
    say(SCENARIO, format!("kind cluster {CLUSTER} ({node_image}) Ready in {:.0?}", t.elapsed()));

    // 2. The manager image, loaded into the node.
    let t = Instant::now();
    run("kind load docker-image", tools.kind().args(["load", "docker-image", &image, "--name", CLUSTER]))?;
    say(SCENARIO, format!("{image} loaded in {:.0?}", t.elapsed()));

    // 3. CAPI's CRDs and the provider's install.yaml.
    let capi_crds = assets.capi_crds_dir()?;
    run("applying CAPI's CRDs", tools.kubectl(&["apply", "--server-side", "-f"]).arg(&capi_crds))?;
    let install = work_dir.join("install.yaml");
    run(
        "rendering install.yaml",
        Command::new(&manifests).args(["install-yaml", "--image", &image, "--out"]).arg(&install),
    )?;
    run("applying install.yaml", tools.kubectl(&["apply", "--server-side", "-f"]).arg(&install))?;

    // 4. Rolled out, Ready, leading.
    let t = Instant::now();
    rollout_status(&tools)?;
    let first = ready_pods(&tools)?;
    ensure!(first.len() == 1, "one Ready manager Pod expected, found {first:?}");
    let first = first[0].clone();
    let holder = wait_for_lease_holder(&tools, &first)?;
    say(SCENARIO, format!("Pod {first} Ready and leading (Lease holder {holder}) {:.0?} after install", t.elapsed()));

    // 5. How it runs and what it logs.
    check_pod_security(&tools, &first)?;
    check_logs(&tools, &first)?;
    say(SCENARIO, "runs as non-root on a read-only root filesystem; JSON log, no denied API call");

    // 6. A rolling restart hands the Lease over.
    let t = Instant::now();
    run(
        "kubectl rollout restart",
        &mut tools.kubectl(&["rollout", "restart", "-n", NAMESPACE, &format!("deployment/{DEPLOYMENT}")]),
    )?;
    rollout_status(&tools)?;
    let deadline = Instant::now() + GONE_LIMIT;
    let second = loop {
        let pods = all_pods(&tools)?;
        let ready = ready_pods(&tools)?;
        if !pods.contains(&first) && ready.len() == 1 {
            break ready[0].clone();
        }
        if Instant::now() > deadline {
            bail!(
                "after the rollout restart the old Pod {first} is still there or no single new Pod is Ready: {pods:?}"
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    ensure!(second != first, "the rollout restart kept Pod {first}");
    let holder = wait_for_lease_holder(&tools, &second)?;
    check_logs(&tools, &second)?;
    say(SCENARIO, format!("rollout restart: {first} -> {second}, Lease holder {holder}, in {:.0?}", t.elapsed()));
    Ok(())
}

fn rollout_status(tools: &Tools) -> Result<()> {
    let timeout = format!("--timeout={ROLLOUT_LIMIT}");
    let deployment = format!("deployment/{DEPLOYMENT}");
    tools.kubectl_out(&["rollout", "status", "-n", NAMESPACE, &deployment, &timeout]).map(|_| ()).map_err(|e| {
        let describe =
            tools.kubectl_out(&["describe", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR]).unwrap_or_default();
        e.context(format!("the manager Deployment did not roll out; its Pods:\n{describe}"))
    })
}

fn pods_json(tools: &Tools) -> Result<Vec<Value>> {
    let list = tools.kubectl_json(&["get", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn all_pods(tools: &Tools) -> Result<Vec<String>> {
    Ok(pods_json(tools)?.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string)).collect())
}

fn ready_pods(tools: &Tools) -> Result<Vec<String>> {
    Ok(pods_json(tools)?
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

/// Waits until a Lease in the provider's namespace is held by `pod`; returns the holder.
fn wait_for_lease_holder(tools: &Tools, pod: &str) -> Result<String> {
    let deadline = Instant::now() + LEASE_LIMIT;
    loop {
        let leases = tools.kubectl_json(&["get", "leases", "-n", NAMESPACE])?;
        let holders: Vec<String> = leases["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .collect();
        if let Some(h) = holders.iter().find(|h| h.starts_with(&format!("{pod}_"))) {
            return Ok(h.clone());
        }
        if Instant::now() > deadline {
            bail!("no Lease in {NAMESPACE} held by Pod {pod} within {LEASE_LIMIT:?}; holders: {holders:?}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn check_pod_security(tools: &Tools, pod: &str) -> Result<()> {
    let p = tools.kubectl_json(&["get", "pod", "-n", NAMESPACE, pod])?;
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
fn check_logs(tools: &Tools, pod: &str) -> Result<()> {
    let logs = tools.kubectl_out(&["logs", "-n", NAMESPACE, pod])?;
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
    Ok(())
}
