//! The management cluster an e2e run uses: the local control plane built from
//! Go modules (what CI runs), or a kind cluster with CAPI core installed by
//! clusterctl (machines with a docker engine and internet access).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use testenv::{CapiManager, CapiOptions, TestEnv};

use crate::repo_root;

/// Which management cluster to start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ManagementKind {
    /// etcd + kube-apiserver + the CAPI core manager, as local processes.
    #[default]
    Local,
    /// `kind create cluster` + `clusterctl init`; needs docker, kind, clusterctl, kubectl and internet.
    Kind,
}

/// Name of the kind cluster an e2e run creates (and deletes).
pub const KIND_CLUSTER: &str = "capl-e2e";

// One value per e2e run: the size of the Local variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Management {
    // Field order matters for Local: CAPI stops before the API server.
    Local { capi: CapiManager, env: TestEnv },
    Kind { kubeconfig: PathBuf, client: Client },
}

fn run(what: &str, command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("{what}: cannot start {:?}", command.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// The tools a kind run needs, each with how to get it.
pub fn kind_prerequisites() -> Result<()> {
    let checks: [(&str, &[&str], &str); 4] = [
        ("docker", &["info"], "a running docker engine (`docker info` fails)"),
        ("kind", &["version"], "kind (`go install sigs.k8s.io/kind@latest`)"),
        ("clusterctl", &["version"], "clusterctl (from the cluster-api releases)"),
        ("kubectl", &["version", "--client"], "kubectl"),
    ];
    let missing: Vec<&str> = checks
        .iter()
        .filter(|(tool, args, _)| !Command::new(tool).args(*args).output().map(|o| o.status.success()).unwrap_or(false))
        .map(|(_, _, hint)| *hint)
        .collect();
    if !missing.is_empty() {
        bail!(
            "a kind management cluster needs {}; without them run the e2e suite on the local control plane \
             (`cargo xtask e2e` without --kind)",
            missing.join(", ")
        );
    }
    Ok(())
}

impl Management {
    pub async fn start(kind: ManagementKind, work_dir: &Path) -> Result<Self> {
        match kind {
            ManagementKind::Local => {
                let env = TestEnv::start().await.context("starting the local control plane")?;
                // With the kubeadm bootstrap and control plane providers (and their
                // webhooks): the workload scenarios' clusters are kubeadm ones; with
                // ClusterTopology for the one from the ClusterClass flavor; and the
                // in-cluster IPAM provider for the multihost scenario's pools.
                let capi = env
                    .start_capi(
                        CapiOptions::new()
                            .with_kubeadm_providers()
                            .with_ipam_in_cluster()
                            .feature_gates("ClusterTopology=true"),
                    )
                    .await
                    .context("starting the CAPI core, kubeadm bootstrap, kubeadm control plane and IPAM managers")?;
                env.install_crds_from_dir(&repo_root().join("config/crd/bases"))
                    .await
                    .context("installing the provider's CRDs from config/crd/bases")?;
                Ok(Management::Local { capi, env })
            }
            ManagementKind::Kind => {
                kind_prerequisites()?;
                let kubeconfig = work_dir.join("kind.kubeconfig");
                run(
                    "kind create cluster",
                    Command::new("kind")
                        .args(["create", "cluster", "--name", KIND_CLUSTER, "--wait", "180s", "--kubeconfig"])
                        .arg(&kubeconfig),
                )?;
                // From here on, Drop deletes the kind cluster again.
                let config = kube::Config::from_custom_kubeconfig(
                    kube::config::Kubeconfig::read_from(&kubeconfig)?,
                    &Default::default(),
                )
                .await?;
                let management = Management::Kind { kubeconfig: kubeconfig.clone(), client: Client::try_from(config)? };
                run(
                    "clusterctl init (CAPI core, the in-cluster IPAM provider and cert-manager)",
                    Command::new("clusterctl")
                        .args(["init", "--ipam", "in-cluster", "--wait-providers", "--kubeconfig"])
                        .arg(&kubeconfig),
                )?;
                run(
                    "installing the provider's CRDs",
                    Command::new("kubectl")
                        .args(["apply", "--server-side", "-f"])
                        .arg(repo_root().join("config/crd/bases"))
                        .arg("--kubeconfig")
                        .arg(&kubeconfig),
                )?;
                Ok(management)
            }
        }
    }

    pub fn client(&self) -> Client {
        match self {
            Management::Local { env, .. } => env.client(),
            Management::Kind { client, .. } => client.clone(),
        }
    }

    pub fn kubeconfig_path(&self) -> &Path {
        match self {
            Management::Local { env, .. } => env.kubeconfig_path(),
            Management::Kind { kubeconfig, .. } => kubeconfig,
        }
    }

    /// A one-line description for the demo's narration.
    pub fn describe(&self) -> String {
        match self {
            Management::Local { env, .. } => format!("control plane at {}", env.server_url()),
            Management::Kind { .. } => format!("kind cluster {KIND_CLUSTER}"),
        }
    }

    /// Fails, with its log, when the local CAPI manager died; kind's runs in-cluster.
    pub fn ensure_capi_running(&self) -> Result<()> {
        match self {
            Management::Local { capi, .. } => capi.ensure_running(),
            Management::Kind { .. } => Ok(()),
        }
    }

    /// Copies the local CAPI managers' logs into `dir` (they go with the control plane's
    /// scratch directory when the run ends); false on kind, which keeps them in its Pods.
    pub fn keep_capi_logs(&self, dir: &std::path::Path) -> bool {
        let Management::Local { capi, .. } = self else { return false };
        if std::fs::create_dir_all(dir).is_err() {
            return false;
        }
        for log in capi.log_paths() {
            if let Some(name) = log.file_name() {
                let _ = std::fs::copy(log, dir.join(name));
            }
        }
        true
    }

    /// The end of the CAPI core manager's log.
    pub fn capi_log_tail(&self, lines: usize) -> String {
        match self {
            Management::Local { capi, .. } => capi.log_tail(lines),
            Management::Kind { kubeconfig, .. } => Command::new("kubectl")
                .args(["logs", "-n", "capi-system", "deploy/capi-controller-manager", &format!("--tail={lines}")])
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default(),
        }
    }

    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        match self {
            Management::Local { env, .. } => env.create_namespace(name).await,
            Management::Kind { client, .. } => {
                let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
                Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
                Ok(())
            }
        }
    }
}

impl Drop for Management {
    fn drop(&mut self) {
        if let Management::Kind { .. } = self {
            let _ = Command::new("kind").args(["delete", "cluster", "--name", KIND_CLUSTER]).status();
        }
    }
}
