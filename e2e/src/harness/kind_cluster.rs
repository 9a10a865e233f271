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
//! 2. `kind load docker-image` of the manager image and of CAPI's (made
//!    offline from the managers of `cargo xtask control-plane build`, named as
//!    CAPI's release components name them);
//! 3. `clusterctl init --core cluster-api --bootstrap kubeadm --control-plane
//!    kubeadm --infrastructure libvirt` from local repositories (this
//!    provider's release with the manager image), cert-manager's CRDs applied
//!    first and cert-manager declared externally provisioned; cert-manager
//!    itself cannot be built offline, so a stand-in issues
//!    the Certificates' Secrets and injects the CA bundles; every provider's
//!    Deployment becomes Available.
//!
//! The cluster is deleted when the [`KindCluster`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use testenv::control_plane_versions::CAPI_VERSION;

pub const KIND_BIN_ENV: &str = capl_testbed::env::KIND_BIN;
pub const KIND_NODE_IMAGE_ENV: &str = capl_testbed::env::KIND_NODE_IMAGE;
pub const KIND_WRAPPER_DIR_ENV: &str = capl_testbed::env::KIND_WRAPPER_DIR;
pub const PROVIDER_IMAGE_ENV: &str = capl_testbed::env::PROVIDER_IMAGE;
/// CAPI's images made offline (`registry.k8s.io/cluster-api/...`), comma-separated.
pub const CAPI_IMAGES_ENV: &str = capl_testbed::env::CAPI_IMAGES;
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

    /// `kubectl apply --server-side` of these objects.
    pub fn apply(&self, documents: &[Value]) -> Result<()> {
        use std::io::Write as _;
        let mut child = self
            .command(&["apply", "--server-side", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running kubectl apply")?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        for d in documents {
            writeln!(stdin, "---\n{}", serde_json::to_string(d)?)?;
        }
        drop(stdin);
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
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
        let pods = self.manager_pods()?;
        let name = |p: &Value| p["metadata"]["name"].as_str().map(str::to_string);
        let ready = |p: &&Value| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        };
        Ok(ManagerPods {
            all: pods.iter().filter_map(name).collect(),
            ready: pods.iter().filter(ready).filter_map(name).collect(),
        })
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

/// A kind cluster with CAPI core, the kubeadm providers and this provider installed.
pub struct KindCluster {
    kind: PathBuf,
    path: std::ffi::OsString,
    pub kubectl: Kubectl,
}

impl KindCluster {
    fn kind(&self) -> Command {
        let mut c = Command::new(&self.kind);
        c.env("PATH", &self.path).env("KIND_EXPERIMENTAL_DOCKER_NETWORK", DOCKER_NETWORK);
        c
    }

    /// Steps 1 to 3 of the module's description, in `work_dir` (blocking: minutes).
    pub fn create(work_dir: &Path, say: impl Fn(String)) -> Result<Self> {
        let assets = testenv::Assets::locate()?;
        let kubectl = assets.kubectl().context("no kubectl: run `cargo xtask control-plane build`")?;
        let wrapper_dir = env_path(KIND_WRAPPER_DIR_ENV)?;
        let mut path = std::ffi::OsString::from(&wrapper_dir);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        std::fs::create_dir_all(work_dir)?;
        let cluster = KindCluster {
            kind: env_path(KIND_BIN_ENV)?,
            path,
            kubectl: Kubectl { binary: kubectl, kubeconfig: work_dir.join("kind.kubeconfig") },
        };
        let node_image =
            std::env::var(KIND_NODE_IMAGE_ENV).with_context(|| format!("{KIND_NODE_IMAGE_ENV} is not set"))?;
        let image = std::env::var(PROVIDER_IMAGE_ENV).with_context(|| format!("{PROVIDER_IMAGE_ENV} is not set"))?;

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

        // 2. The manager image and CAPI's, loaded into the node.
        let t = Instant::now();
        let capi_images = std::env::var(CAPI_IMAGES_ENV).with_context(|| format!("{CAPI_IMAGES_ENV} is not set"))?;
        let mut images: Vec<&str> = capi_images.split(',').filter(|i| !i.is_empty()).collect();
        images.push(&image);
        let mut load = cluster.kind();
        load.args(["load", "docker-image", "--name", CLUSTER]).args(&images);
        run("kind load docker-image", &mut load)?;
        say(format!("{} images loaded in {:.0?}: {}", images.len(), t.elapsed(), images.join(", ")));

        // 3. clusterctl init: CAPI core, the kubeadm providers and this provider.
        let t = Instant::now();
        clusterctl_init(&cluster.kubectl, work_dir, &image)?;
        say(format!("clusterctl init: every provider's Deployment Available in {:.0?}", t.elapsed()));
        Ok(cluster)
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
}

impl Drop for KindCluster {
    fn drop(&mut self) {
        self.delete();
    }
}

/// `clusterctl init` of CAPI core, the kubeadm providers and this provider
/// (release `v0.1.0` with the manager image `image`) from local repositories,
/// with cert-manager's CRDs applied first and cert-manager declared externally
/// provisioned ([`crate::harness::clusterctl::LocalRepository::with_capi_release`]);
/// then [`stand_in_for_cert_manager`].
fn clusterctl_init(kubectl: &Kubectl, work_dir: &Path, image: &str) -> Result<()> {
    let assets = testenv::Assets::locate()?;
    run(
        "applying cert-manager's CRDs",
        kubectl.command(&["apply", "--server-side", "-f"]).arg(assets.cert_manager_crds_dir()?),
    )?;
    let repository =
        crate::harness::clusterctl::LocalRepository::release_with_image(&work_dir.join("repository"), "v0.1.0", image)?
            .with_capi_release(&assets)?;
    let kubeconfig = kubectl.kubeconfig.display().to_string();
    let core = format!("cluster-api:{CAPI_VERSION}");
    let kubeadm = format!("kubeadm:{CAPI_VERSION}");
    repository.clusterctl(&[
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
        "libvirt:v0.1.0",
    ])?;
    stand_in_for_cert_manager(kubectl)?;
    let timeout = format!("--timeout={ROLLOUT_LIMIT}");
    kubectl.out(&["wait", "--for=condition=Available", "deployment", "--all", "-A", &timeout]).map(|_| ()).map_err(
        |e| {
            let pods = kubectl.out(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_default();
            e.context(format!("the providers' Deployments did not become Available; Pods:\n{pods}"))
        },
    )
}

/// What cert-manager would do for the providers' components: a Secret for
/// every Certificate (signed by one CA made here, with the Certificate's DNS
/// names), and that CA as the `caBundle` of every webhook configuration and
/// CRD conversion webhook annotated `cert-manager.io/inject-ca-from`.
/// (cert-manager itself cannot be built from the Go module proxy; see the book's
/// developing page, "On kind".)
fn stand_in_for_cert_manager(kubectl: &Kubectl) -> Result<()> {
    let ca = testenv::Pki::new_ca("capl-e2e-cert-manager-stand-in")?;
    let bundle = serde_json::to_value(k8s_openapi::ByteString(ca.ca_pem().as_bytes().to_vec()))?;
    let certificates = kubectl.json(&["get", "certificates.cert-manager.io", "-A"])?;
    let mut secrets = Vec::new();
    for c in certificates["items"].as_array().into_iter().flatten() {
        let names: Vec<String> = c["spec"]["dnsNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        let secret = c["spec"]["secretName"].as_str().context("a Certificate without secretName")?;
        let namespace = c["metadata"]["namespace"].as_str().unwrap_or_default();
        let (cert, key) = ca.serving_cert_for(names.first().map_or("webhook", String::as_str), &names)?;
        secrets.push(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace},
            "stringData": {"ca.crt": ca.ca_pem(), "tls.crt": cert, "tls.key": key},
        }));
    }
    ensure!(!secrets.is_empty(), "clusterctl installed no cert-manager Certificate: nothing to stand in for");
    kubectl.apply(&secrets)?;
    for kind in ["validatingwebhookconfigurations", "mutatingwebhookconfigurations", "customresourcedefinitions"] {
        let list = kubectl.json(&["get", kind])?;
        for object in list["items"].as_array().into_iter().flatten() {
            if object["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_null() {
                continue;
            }
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let patch: Vec<Value> = if kind == "customresourcedefinitions" {
                vec![json!({"op": "add", "path": "/spec/conversion/webhook/clientConfig/caBundle", "value": bundle})]
            } else {
                let webhooks = object["webhooks"].as_array().map_or(0, Vec::len);
                (0..webhooks)
                    .map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}))
                    .collect()
            };
            let patch = serde_json::to_string(&patch)?;
            kubectl.out(&["patch", kind, name, "--type=json", "-p", &patch])?;
        }
    }
    Ok(())
}

/// The manager's Pods by name.
#[derive(Debug, Clone, Default)]
pub struct ManagerPods {
    pub all: Vec<String>,
    /// Ready and not being deleted.
    pub ready: Vec<String>,
}
