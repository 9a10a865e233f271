//! The management cluster an e2e run uses: the local control plane built from
//! Go modules with the CAPI managers as local processes, or a kind cluster
//! made offline with every provider installed by `clusterctl init`
//! ([`crate::harness::kind_cluster`]).

use std::path::Path;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use testenv::{CapiManager, CapiOptions, TestEnv};

use crate::harness::kind_cluster::KindCluster;
use crate::repo_root;

/// Which management cluster to start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ManagementKind {
    /// etcd + kube-apiserver + the CAPI managers, as local processes.
    #[default]
    Local,
    /// A kind cluster with everything installed by `clusterctl init`, the
    /// provider included (`cargo xtask e2e --kind` builds what it needs).
    Kind,
}

impl ManagementKind {
    /// Its name in messages and summaries.
    pub fn name(self) -> &'static str {
        match self {
            ManagementKind::Local => "local",
            ManagementKind::Kind => "kind",
        }
    }
}

// One value per e2e run: the size of the Local variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Management {
    // Field order matters for Local: CAPI stops before the API server.
    Local { capi: CapiManager, env: TestEnv },
    Kind { cluster: KindCluster, client: Client },
}

impl Management {
    /// `from`: which release of this provider a kind cluster's `clusterctl init` installs.
    pub async fn start(
        kind: ManagementKind,
        from: crate::harness::kind_cluster::InstalledRelease,
        work_dir: &Path,
    ) -> Result<Self> {
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
                let dir = work_dir.join("kind");
                let cluster =
                    crate::blocking(|| KindCluster::create(&dir, from, |m| crate::harness::progress::say("kind", m)))?;
                let client = cluster.client().await?;
                Ok(Management::Kind { cluster, client })
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
            Management::Kind { cluster, .. } => &cluster.kubectl.kubeconfig,
        }
    }

    /// A one-line description for the demo's narration.
    pub fn describe(&self) -> String {
        match self {
            Management::Local { env, .. } => format!("control plane at {}", env.server_url()),
            Management::Kind { .. } => format!("kind cluster {}", crate::harness::kind_cluster::CLUSTER),
        }
    }

    /// Fails, with its log, when the local CAPI manager died; kind's runs in-cluster
    /// (its Deployment restarts it).
    pub fn ensure_capi_running(&self) -> Result<()> {
        match self {
            Management::Local { capi, .. } => capi.ensure_running(),
            Management::Kind { .. } => Ok(()),
        }
    }

    /// Copies the CAPI managers' logs into `dir` (they go with the control plane's
    /// scratch directory, or with the kind cluster, when the run ends).
    pub fn keep_capi_logs(&self, dir: &std::path::Path) -> bool {
        if std::fs::create_dir_all(dir).is_err() {
            return false;
        }
        match self {
            Management::Local { capi, .. } => {
                for log in capi.log_paths() {
                    if let Some(name) = log.file_name() {
                        let _ = std::fs::copy(log, dir.join(name));
                    }
                }
            }
            Management::Kind { cluster, .. } => {
                for (namespace, deployment) in CAPI_DEPLOYMENTS {
                    let log = cluster.kubectl.out(&["logs", "-n", namespace, &format!("deployment/{deployment}")]);
                    let _ =
                        std::fs::write(dir.join(format!("{deployment}.log")), log.unwrap_or_else(|e| format!("{e:#}")));
                }
            }
        }
        true
    }

    /// The end of the CAPI core manager's log.
    pub fn capi_log_tail(&self, lines: usize) -> String {
        match self {
            Management::Local { capi, .. } => capi.log_tail(lines),
            Management::Kind { cluster, .. } => {
                let (namespace, deployment) = CAPI_DEPLOYMENTS[0];
                cluster
                    .kubectl
                    .out(&["logs", "-n", namespace, &format!("deployment/{deployment}"), &format!("--tail={lines}")])
                    .unwrap_or_else(|e| format!("({e:#})"))
            }
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

/// The CAPI managers `clusterctl init` installs, core first (namespace, Deployment).
const CAPI_DEPLOYMENTS: [(&str, &str); 3] = [
    ("capi-system", "capi-controller-manager"),
    ("capi-kubeadm-bootstrap-system", "capi-kubeadm-bootstrap-controller-manager"),
    ("capi-kubeadm-control-plane-system", "capi-kubeadm-control-plane-controller-manager"),
];
