//! A kind management cluster made offline, with the providers installed as
//! users install them: `cargo xtask e2e --kind` builds what it needs (see
//! `xtask/src/kind.rs`): kind ([`KIND_BIN_ENV`]), its node image
//! ([`KIND_NODE_IMAGE_ENV`]), the directory whose `docker` is the wrapper kind
//! runs through ([`KIND_WRAPPER_DIR_ENV`], with the real client in
//! `CAPL_REAL_DOCKER`), the manager image built offline
//! ([`PROVIDER_IMAGE_ENV`]) and CAPI's images ([`CAPI_IMAGES_ENV`]).
//!
//! [`KindCluster::create`]:
//! 1. `kind create cluster` (one node, docker network [`DOCKER_NETWORK`]);
//! 2. `kind load docker-image` of the manager image, of CAPI's (made
//!    offline from the managers of `cargo xtask control-plane build`, named as
//!    CAPI's release components name them) and of cert-manager's
//!    ([`CERT_MANAGER_IMAGES_ENV`], built from its Go module by `cargo xtask
//!    cert-manager`);
//! 3. cert-manager from its static manifest ([`CERT_MANAGER_MANIFEST_ENV`]),
//!    waited for until its webhook serves with the CA its cainjector injected;
//! 4. `clusterctl init --core cluster-api --bootstrap kubeadm --control-plane
//!    kubeadm --infrastructure libvirt` from local repositories (this
//!    provider's release [`CURRENT_VERSION`] with the manager image), with
//!    cert-manager declared externally provisioned, as for a cluster whose
//!    operator installed it, and `CLUSTER_TOPOLOGY=true` (CAPI core's
//!    ClusterClass feature); cert-manager issues the providers' serving
//!    certificates and injects their CA; every provider's Deployment becomes
//!    Available.
//!
//! [`InstalledRelease::Previous`] installs the previous release instead
//! ([`PREVIOUS_VERSION`], from [`PREVIOUS_RELEASE_DIR_ENV`] with its image
//! [`PREVIOUS_PROVIDER_IMAGE_ENV`], both made by `cargo xtask previous`); the
//! repository holds both releases, and [`KindCluster::upgrade_provider`]
//! moves the installation to the current one with `clusterctl upgrade apply`.
//!
//! The cluster is deleted when the [`KindCluster`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use testenv::control_plane_versions::CAPI_VERSION;

pub const KIND_BIN_ENV: &str = capl_testbed::env::KIND_BIN;
pub const KIND_NODE_IMAGE_ENV: &str = capl_testbed::env::KIND_NODE_IMAGE;
pub const KIND_WRAPPER_DIR_ENV: &str = capl_testbed::env::KIND_WRAPPER_DIR;
pub const PROVIDER_IMAGE_ENV: &str = capl_testbed::env::PROVIDER_IMAGE;
/// CAPI's images made offline (`registry.k8s.io/cluster-api/...`), comma-separated.
pub const CAPI_IMAGES_ENV: &str = capl_testbed::env::CAPI_IMAGES;
pub const CERT_MANAGER_MANIFEST_ENV: &str = capl_testbed::env::CERT_MANAGER_MANIFEST;
/// cert-manager's images, comma-separated.
pub const CERT_MANAGER_IMAGES_ENV: &str = capl_testbed::env::CERT_MANAGER_IMAGES;
pub const PREVIOUS_PROVIDER_IMAGE_ENV: &str = capl_testbed::env::PREVIOUS_PROVIDER_IMAGE;
pub const PREVIOUS_RELEASE_DIR_ENV: &str = capl_testbed::env::PREVIOUS_RELEASE_DIR;
/// This provider's releases in the cluster's clusterctl repository: the
/// previous one (built from this repository's history) and the current build.
pub const PREVIOUS_VERSION: &str = "v0.1.0";
pub const CURRENT_VERSION: &str = "v0.1.1";
/// The kind cluster (one per machine at a time: a leftover of an interrupted run is deleted first).
pub const CLUSTER: &str = "capl-e2e";
/// The docker network of its node; a containerized libvirtd joins it.
pub const DOCKER_NETWORK: &str = "capl-kind";
/// The provider's namespace and Deployment (config/manager).
pub const NAMESPACE: &str = "capl-system";
pub const DEPLOYMENT: &str = "capl-controller-manager";
pub const POD_SELECTOR: &str = "control-plane=controller-manager";
/// Bounds of the waits.
const CREATE_LIMIT: &str = "240s";
pub const ROLLOUT_LIMIT: &str = "300s";

fn env_path(name: &str) -> Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set: run the kind scenarios with `cargo xtask e2e --kind`"))
}

/// kubectl against one cluster.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.binary);
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        c
    }

    /// Runs kubectl and returns its stdout; an error carries its stderr.
    pub fn out(&self, args: &[&str]) -> Result<String> {
        let out = self.command(args).output().with_context(|| format!("running kubectl {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.out(&all)?)?)
    }

    /// Waits (bounded) for the manager's Deployment to be rolled out; the error shows its Pods.
    pub fn manager_rollout(&self) -> Result<()> {
        let timeout = format!("--timeout={ROLLOUT_LIMIT}");
        let deployment = format!("deployment/{DEPLOYMENT}");
        self.out(&["rollout", "status", "-n", NAMESPACE, &deployment, &timeout]).map(|_| ()).map_err(|e| {
            let describe = self.out(&["describe", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR]).unwrap_or_default();
            e.context(format!("the manager Deployment did not roll out; its Pods:\n{describe}"))
        })
    }

    /// The manager's Pods (JSON).
    pub fn manager_pods(&self) -> Result<Vec<Value>> {
        let list = self.json(&["get", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR])?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The names of the manager's Pods, all of them and the Ready ones, from one listing.
    pub fn manager_pod_names(&self) -> Result<ManagerPods> {
        Ok(ManagerPods::of(&self.manager_pods()?))
    }
}

impl ManagerPods {
    /// The names in a listing of the manager's Pods (JSON).
    pub fn of(pods: &[Value]) -> Self {
        let name = |p: &Value| p["metadata"]["name"].as_str().map(str::to_string);
        let ready = |p: &&Value| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        };
        ManagerPods {
            all: pods.iter().filter_map(name).collect(),
            ready: pods.iter().filter(ready).filter_map(name).collect(),
        }
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

/// Which release of this provider `clusterctl init` installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InstalledRelease {
    /// The current build ([`CURRENT_VERSION`]).
    #[default]
    Current,
    /// The previous release ([`PREVIOUS_VERSION`]), to be upgraded.
    Previous,
}

/// A kind cluster with CAPI core, the kubeadm providers and this provider installed.
pub struct KindCluster {
    kind: PathBuf,
    path: std::ffi::OsString,
    pub kubectl: Kubectl,
    /// The clusterctl repository it was initialised from (both releases when
    /// it started from the previous one).
    repository: Option<crate::harness::clusterctl::LocalRepository>,
}

impl KindCluster {
    fn kind(&self) -> Command {
        let mut c = Command::new(&self.kind);
        c.env("PATH", &self.path).env("KIND_EXPERIMENTAL_DOCKER_NETWORK", DOCKER_NETWORK);
        c
    }

    /// Steps 1 to 4 of the module's description, in `work_dir` (blocking: minutes).
    pub fn create(work_dir: &Path, from: InstalledRelease, say: impl Fn(String)) -> Result<Self> {
        Self::create_with(work_dir, from, &[], &[], say)
    }

    /// [`Self::create`] with `variables` (name, value) also set for
    /// `clusterctl init`, e.g. a feature gate of CAPI's providers
    /// (`EXP_...`) that a spec needs, and `kcp_args` added to the arguments
    /// of KubeadmControlPlane's manager.
    pub fn create_with(
        work_dir: &Path,
        from: InstalledRelease,
        variables: &[(&str, &str)],
        kcp_args: &[&str],
        say: impl Fn(String),
    ) -> Result<Self> {
        let assets = testenv::Assets::locate()?;
        let kubectl = assets.kubectl().context("no kubectl: run `cargo xtask control-plane build`")?;
        let wrapper_dir = env_path(KIND_WRAPPER_DIR_ENV)?;
        let mut path = std::ffi::OsString::from(&wrapper_dir);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        std::fs::create_dir_all(work_dir)?;
        let mut cluster = KindCluster {
            kind: env_path(KIND_BIN_ENV)?,
            path,
            kubectl: Kubectl { binary: kubectl, kubeconfig: work_dir.join("kind.kubeconfig") },
            repository: None,
        };
        let node_image =
            std::env::var(KIND_NODE_IMAGE_ENV).with_context(|| format!("{KIND_NODE_IMAGE_ENV} is not set"))?;
        let image = std::env::var(PROVIDER_IMAGE_ENV).with_context(|| format!("{PROVIDER_IMAGE_ENV} is not set"))?;
        let previous = match from {
            InstalledRelease::Current => None,
            InstalledRelease::Previous => Some((
                std::env::var(PREVIOUS_PROVIDER_IMAGE_ENV).with_context(|| {
                    format!("{PREVIOUS_PROVIDER_IMAGE_ENV} is not set: run the upgrade scenario with `cargo xtask e2e --kind`")
                })?,
                env_path(PREVIOUS_RELEASE_DIR_ENV)?,
            )),
        };

        // 1. The cluster (a leftover of an interrupted run first goes).
        cluster.delete();
        let t = Instant::now();
        let config = crate::repo_root().join("hack/kind/cluster.yaml");
        run(
            "kind create cluster",
            cluster
                .kind()
                .args(["create", "cluster", "--name", CLUSTER, "--image", &node_image, "--wait", CREATE_LIMIT])
                .arg("--config")
                .arg(&config)
                .arg("--kubeconfig")
                .arg(&cluster.kubectl.kubeconfig),
        )?;
        // From here on, dropping `cluster` deletes it again.
        say(format!("kind cluster {CLUSTER} ({node_image}) Ready in {:.0?}", t.elapsed()));

        // 2. The manager image, CAPI's and cert-manager's, loaded into the node.
        let t = Instant::now();
        let capi_images = std::env::var(CAPI_IMAGES_ENV).with_context(|| format!("{CAPI_IMAGES_ENV} is not set"))?;
        let cert_manager_images =
            std::env::var(CERT_MANAGER_IMAGES_ENV).with_context(|| format!("{CERT_MANAGER_IMAGES_ENV} is not set"))?;
        let mut images: Vec<&str> =
            capi_images.split(',').chain(cert_manager_images.split(',')).filter(|i| !i.is_empty()).collect();
        images.push(&image);
        if let Some((previous_image, _)) = &previous {
            images.push(previous_image);
        }
        let mut load = cluster.kind();
        load.args(["load", "docker-image", "--name", CLUSTER]).args(&images);
        run("kind load docker-image", &mut load)?;
        say(format!("{} images loaded in {:.0?}: {}", images.len(), t.elapsed(), images.join(", ")));

        // 3. cert-manager.
        let t = Instant::now();
        cluster.install_cert_manager()?;
        say(format!("cert-manager serving in {:.0?}", t.elapsed()));

        // 4. clusterctl init: CAPI core, the kubeadm providers and this provider.
        let t = Instant::now();
        let assets = testenv::Assets::locate()?;
        let repository = crate::harness::clusterctl::LocalRepository::release_with_image(
            &work_dir.join("repository"),
            CURRENT_VERSION,
            &image,
        )?
        .with_capi_release_args(&assets, kcp_args)?;
        let version = match &previous {
            None => CURRENT_VERSION,
            Some((_, dir)) => {
                let from = dir.join(crate::harness::clusterctl::INFRA_PROVIDER).join(PREVIOUS_VERSION);
                copy_files(&from, &repository.releases().join(PREVIOUS_VERSION))?;
                PREVIOUS_VERSION
            }
        };
        let kubeconfig = cluster.kubectl.kubeconfig.display().to_string();
        let core = format!("cluster-api:{CAPI_VERSION}");
        let kubeadm = format!("kubeadm:{CAPI_VERSION}");
        let infrastructure = format!("libvirt:{version}");
        let init = [
            "init",
            "--kubeconfig",
            &kubeconfig,
            "--core",
            &core,
            "--bootstrap",
            &kubeadm,
            "--control-plane",
            &kubeadm,
            "--infrastructure",
            &infrastructure,
        ];
        // ClusterClass needs CAPI core's ClusterTopology feature, which a user
        // turns on the same way before `clusterctl init`.
        let mut env = vec![("CLUSTER_TOPOLOGY", "true")];
        env.extend_from_slice(variables);
        repository.clusterctl_env(&init, &env)?;
        cluster.repository = Some(repository);
        cluster.wait_providers_available()?;
        say(format!(
            "clusterctl init ({version} of this provider): every provider's Deployment Available in {:.0?}",
            t.elapsed()
        ));
        Ok(cluster)
    }

    /// `clusterctl upgrade apply` of this provider to `version`, as an operator
    /// runs it; then what the operator does around it: the flags added to
    /// the Deployment by hand carried over, and the wait for every provider
    /// to be Available and the manager rolled out. Returns clusterctl's log.
    pub fn upgrade_provider(&self, version: &str) -> Result<String> {
        let repository = self.repository.as_ref().context("the cluster was not made by clusterctl init")?;
        let before = self.manager_args()?;
        let kubeconfig = self.kubectl.kubeconfig.display().to_string();
        let target = format!("{NAMESPACE}/libvirt:{version}");
        let out = repository
            .clusterctl_output(&["upgrade", "apply", "--kubeconfig", &kubeconfig, "--infrastructure", &target])?
            .stderr;
        let after = self.manager_args()?;
        let lost: Vec<String> = before.into_iter().filter(|a| !after.contains(a)).collect();
        if !lost.is_empty() {
            self.add_manager_args(&lost)?;
        }
        self.wait_providers_available()?;
        self.kubectl.manager_rollout()?;
        Ok(out)
    }

    /// The manager container's arguments.
    fn manager_args(&self) -> Result<Vec<String>> {
        let deployment = self.kubectl.json(&["get", "deployment", "-n", NAMESPACE, DEPLOYMENT])?;
        Ok(deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect())
    }

    /// Waits until cert-manager has issued every provider's serving
    /// certificate and every Deployment is Available.
    fn wait_providers_available(&self) -> Result<()> {
        let timeout = format!("--timeout={ROLLOUT_LIMIT}");
        let kubectl = &self.kubectl;
        kubectl
            .out(&["wait", "--for=condition=Ready", "certificates.cert-manager.io", "--all", "-A", &timeout])
            .map_err(|e| {
                let certificates = kubectl.out(&["get", "certificates.cert-manager.io", "-A"]).unwrap_or_default();
                e.context(format!("cert-manager did not issue every provider's certificate:\n{certificates}"))
            })?;
        kubectl.out(&["wait", "--for=condition=Available", "deployment", "--all", "-A", &timeout]).map(|_| ()).map_err(
            |e| {
                let pods = kubectl.out(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_default();
                e.context(format!("the providers' Deployments did not become Available; Pods:\n{pods}"))
            },
        )
    }

    /// A client of the cluster's API server.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubectl.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Appends `args` to the manager container's arguments (what an operator
    /// does with `kubectl edit` for a flag the release does not set) and waits
    /// for the rollout.
    pub fn add_manager_args(&self, args: &[String]) -> Result<()> {
        let patch: Vec<Value> = args
            .iter()
            .map(|a| json!({"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a}))
            .collect();
        let patch = serde_json::to_string(&patch)?;
        self.kubectl.out(&["patch", "-n", NAMESPACE, "deployment", DEPLOYMENT, "--type=json", "-p", &patch])?;
        self.kubectl.manager_rollout()
    }

    fn delete(&self) {
        let _ = self.kind().args(["delete", "cluster", "--name", CLUSTER]).output();
    }

    /// Applies cert-manager's static manifest and waits until its three
    /// Deployments are Available and its webhooks carry the CA its cainjector
    /// injects (before that, the API server cannot call the webhook, and
    /// clusterctl's check of the cert-manager API fails).
    fn install_cert_manager(&self) -> Result<()> {
        let manifest = env_path(CERT_MANAGER_MANIFEST_ENV)?;
        run(
            "applying cert-manager's manifest",
            self.kubectl.command(&["apply", "--server-side", "-f"]).arg(&manifest),
        )?;
        let timeout = format!("--timeout={ROLLOUT_LIMIT}");
        self.kubectl
            .out(&["wait", "--for=condition=Available", "deployment", "--all", "-n", "cert-manager", &timeout])
            .map_err(|e| {
                let pods = self.kubectl.out(&["get", "pods", "-n", "cert-manager", "-o", "wide"]).unwrap_or_default();
                e.context(format!("cert-manager's Deployments did not become Available; Pods:\n{pods}"))
            })?;
        let webhooks = ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"];
        crate::harness::wait::until_blocking(
            "cert-manager's webhooks to carry their CA",
            std::time::Duration::from_secs(120),
            || {
                let mut missing = Vec::new();
                for kind in webhooks {
                    let config = self.kubectl.json(&["get", kind, "cert-manager-webhook"])?;
                    let injected = config["webhooks"]
                        .as_array()
                        .is_some_and(|w| !w.is_empty() && w.iter().all(|w| w["clientConfig"]["caBundle"].is_string()));
                    if !injected {
                        missing.push(kind);
                    }
                }
                Ok(if missing.is_empty() {
                    crate::harness::wait::Check::Done(())
                } else {
                    crate::harness::wait::Check::Pending(format!("no caBundle yet in {missing:?}"))
                })
            },
        )
    }
}

/// Copies the files of directory `from` into `to` (made when missing).
fn copy_files(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let name = path.file_name().context("a file without a name")?;
            std::fs::copy(&path, to.join(name)).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

impl Drop for KindCluster {
    fn drop(&mut self) {
        self.delete();
    }
}

/// The manager's Pods by name.
#[derive(Debug, Clone, Default)]
pub struct ManagerPods {
    pub all: Vec<String>,
    /// Ready and not being deleted.
    pub ready: Vec<String>,
}
