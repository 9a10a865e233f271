//! A local Kubernetes control plane for tests: a real `etcd` and `kube-apiserver` (and
//! optionally Cluster API's core manager and kubeadm bootstrap and control plane managers,
//! with their webhooks, and CAPI's in-cluster IPAM provider, see [`TestEnv::start_capi`]),
//! built from Go modules by
//! `cargo xtask control-plane build`. It plays the role envtest plays for Go
//! providers: CRDs are validated by the real API server, CEL rules run, the status
//! subresource and finalizers behave as in a real cluster, and watches are served.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let env = testenv::TestEnv::shared().await?;       // or TestEnv::start() for a private one
//! env.install_crds_from_dir("config/crd".as_ref()).await?;
//! let namespace = env.unique_namespace("reconcile").await?;
//! let client = env.client();
//! # let _ = (client, namespace); Ok(()) }
//! ```
//!
//! # Finding the binaries
//! `kube-apiserver` and `etcd` are taken from `$KUBEBUILDER_ASSETS` when it holds both (a
//! user who ran `setup-envtest`), otherwise from `$CAPL_CONTROL_PLANE_DIR`, otherwise from
//! `~/.cache/cluster-api-provider-libvirt/control-plane/<version-key>` (see
//! [`control_plane_versions`]). When they are missing, [`TestEnv::start`] fails with an
//! error naming the command that builds them: `cargo xtask control-plane build`.
//!
//! # Isolation of parallel tests
//! Starting etcd plus kube-apiserver takes 3 to 4 s on our 2-core machines (7 s when two
//! start at once), too much to pay for every test. So:
//! - **one API server per test binary**: [`TestEnv::shared`] starts it lazily on first use
//!   and every test of the binary (cargo runs them on parallel threads, each with its own
//!   tokio runtime) gets the same server; [`TestEnv::client`] builds a fresh client for the
//!   calling runtime;
//! - **one namespace per test**: [`TestEnv::unique_namespace`] creates a namespace whose name
//!   no other test of any binary uses; tests must put their namespaced objects there and
//!   must not assume a cluster-scoped object list contains only their objects;
//! - **CRDs are shared and installed idempotently** (server-side apply), so every test can
//!   install the CRDs it needs without coordination.
//!
//! A test that needs a server of its own (for example to observe cluster-scoped state, or
//! to kill it) uses [`TestEnv::start`]; the instance is torn down when dropped.
//!
//! # Teardown
//! Dropping a [`TestEnv`] (also during a panic) kills its processes and removes its
//! temporary directory. The shared instance is stopped by an `atexit` hook when the test
//! binary exits. If the test process is killed outright, the kernel kills the children
//! (`PR_SET_PDEATHSIG`) and the next start removes the left-over directory.

pub mod container_libvirtd;
pub mod lab;
pub mod remote_access;

mod assets;
mod capi_manager;
mod crd_install;
mod free_port;
mod scratch_dir;
mod supervised_process;
mod webhooks;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use capl_testbed::wait::{self, Bound, Check};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub use assets::{Assets, BUILD_COMMAND};
pub use capi_manager::{CapiManager, CapiOptions, KCP_ETCD_TIMEOUTS};
pub use crd_install::{Conversion, FIELD_MANAGER, parse_crds, read_crd_dir};

pub use capl_testbed::certificates::Pki;
/// The pinned versions and the private libvirtd's contract, shared with xtask.
pub use capl_testbed::{control_plane_versions, test_host};
pub use free_port::free_loopback_ports;
pub use scratch_dir::ScratchDir;
use supervised_process::SupervisedProcess;

/// How long kube-apiserver may take to report ready (it is slow on a loaded 2-core machine).
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long etcd may take to accept connections.
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The service CIDR given to kube-apiserver (nothing routes to it; it must just be valid).
const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/24";

/// The audit policy of every test API server: one line per request of a service
/// account (metadata only: no bodies), nothing for the admin user the tests use.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [\"system:serviceaccounts\"]
- level: None
";
/// The audit log's file name in the scratch directory.
const AUDIT_LOG: &str = "audit.log";

/// One request the API server audited (see [`TestEnv::audited_requests`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditedRequest {
    /// `get`, `list`, `watch`, `create`, `patch`, ...
    pub verb: String,
    /// The API group ("" for the core group).
    pub api_group: String,
    /// The resource, with `/subresource` when there is one (`libvirtmachines/status`).
    pub resource: String,
    pub namespace: String,
    /// The HTTP status of the response (0 when the log line has none).
    pub code: u16,
}

/// A running etcd + kube-apiserver pair with an admin kubeconfig.
pub struct TestEnv {
    assets: Assets,
    apiserver: SupervisedProcess,
    etcd: SupervisedProcess,
    kubeconfig_path: PathBuf,
    config: Config,
    server_url: String,
    startup_time: Duration,
    scratch: ScratchDir,
    /// The CA the API server trusts; signs webhook servers' certificates.
    ca: Pki,
}

static SHARED: tokio::sync::OnceCell<Result<TestEnv, String>> = tokio::sync::OnceCell::const_new();

extern "C" fn stop_shared_at_exit() {
    if let Some(Ok(env)) = SHARED.get() {
        env.stop();
    }
}

impl TestEnv {
    /// The API server shared by every test of this process, started on first use.
    /// A start failure is reported to every caller.
    pub async fn shared() -> Result<&'static TestEnv> {
        let env = SHARED
            .get_or_init(|| async {
                let env = TestEnv::start().await.map_err(|err| format!("{err:#}"));
                if env.is_ok() {
                    // SAFETY: registers a plain function without captured state.
                    unsafe { libc::atexit(stop_shared_at_exit) };
                }
                env
            })
            .await;
        env.as_ref().map_err(|err| anyhow!("the shared test control plane did not start: {err}"))
    }

    /// Starts a private etcd and kube-apiserver on free loopback ports and waits until the
    /// API server is ready. Everything is torn down when the value is dropped.
    pub async fn start() -> Result<Self> {
        let started = Instant::now();
        let assets = Assets::locate()?;
        let scratch = ScratchDir::create()?;
        let dir = scratch.path().to_owned();
        let (ca, pki) = Pki::generate(&dir).context("generating the test control plane's certificates")?;
        let [etcd_client_port, etcd_peer_port, apiserver_port] = free_loopback_ports()?;

        let etcd_client_url = format!("http://127.0.0.1:{etcd_client_port}");
        let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd_args = vec![
            "--name=testenv".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_client_url}"),
            format!("--advertise-client-urls={etcd_client_url}"),
            format!("--listen-peer-urls={etcd_peer_url}"),
            format!("--initial-advertise-peer-urls={etcd_peer_url}"),
            format!("--initial-cluster=testenv={etcd_peer_url}"),
            // Test data need not survive a power cut; fsync dominates etcd's latency otherwise.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let etcd = SupervisedProcess::start("etcd", &assets.etcd, &etcd_args, &[], &dir.join("etcd.log"))?;
        wait_for_tcp(&etcd, etcd_client_port, ETCD_READY_TIMEOUT).await?;

        let server_url = format!("https://127.0.0.1:{apiserver_port}");
        let path = |p: &Path| p.display().to_string();
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY).with_context(|| format!("writing {}", audit_policy.display()))?;
        let apiserver_args = vec![
            format!("--etcd-servers={etcd_client_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", path(&pki.serving_cert)),
            format!("--tls-private-key-file={}", path(&pki.serving_key)),
            format!("--client-ca-file={}", path(&pki.ca_cert)),
            format!("--service-account-issuer={server_url}"),
            format!("--service-account-key-file={}", path(&pki.service_account_public_key)),
            format!("--service-account-signing-key-file={}", path(&pki.service_account_key)),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            "--authorization-mode=RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            // As envtest: no token controller runs, so this plugin would reject every pod.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            // No endpoints for the kubernetes service: nothing listens on a routable address.
            "--endpoint-reconciler-type=none".to_owned(),
            // Priority and fairness only adds background work for a one-client server.
            "--enable-priority-and-fairness=false".to_owned(),
            // Requests of service accounts only (see AUDIT_POLICY): what a controller
            // running with its shipped RBAC asked for, read by `audited_requests`.
            format!("--audit-policy-file={}", path(&audit_policy)),
            format!("--audit-log-path={}", path(&dir.join(AUDIT_LOG))),
            "--audit-log-format=json".to_owned(),
            "--audit-log-mode=blocking".to_owned(),
        ];
        let apiserver = SupervisedProcess::start(
            "kube-apiserver",
            &assets.kube_apiserver,
            &apiserver_args,
            &[],
            &dir.join("kube-apiserver.log"),
        )?;

        let kubeconfig_path = dir.join("kubeconfig");
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testenv", "cluster": {
                "server": server_url,
                "certificate-authority": path(&pki.ca_cert),
            }}],
            "users": [{"name": "admin", "user": {
                "client-certificate": path(&pki.admin_cert),
                "client-key": path(&pki.admin_key),
            }}],
            "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "admin", "namespace": "default"}}],
            "current-context": "testenv",
        });
        // JSON is YAML: kubectl, client-go and kube-rs all read this file.
        std::fs::write(&kubeconfig_path, serde_json::to_vec_pretty(&kubeconfig)?)
            .with_context(|| format!("writing {}", kubeconfig_path.display()))?;
        let config =
            Config::from_custom_kubeconfig(Kubeconfig::read_from(&kubeconfig_path)?, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading the generated kubeconfig {}", kubeconfig_path.display()))?;
        wait_for_readyz(&config, &apiserver, &etcd, APISERVER_READY_TIMEOUT).await?;

        let startup_time = started.elapsed();
        tracing::info!(?startup_time, %server_url, dir = %dir.display(), "test control plane ready");
        Ok(Self { assets, apiserver, etcd, kubeconfig_path, config, server_url, startup_time, scratch, ca })
    }

    /// The process ids of kube-apiserver and etcd, named.
    pub fn pids(&self) -> [(&'static str, u32); 2] {
        [("kube-apiserver", self.apiserver.pid()), ("etcd", self.etcd.pid())]
    }

    /// A client with cluster-admin rights (group `system:masters`), bound to the calling
    /// tokio runtime. Call it in each test rather than sharing one client between tests.
    pub fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect(
            "building a kube client from a config that already connected once; \
             call TestEnv::client inside a tokio runtime",
        )
    }

    /// The CA the API server trusts for client certificates and that signed its
    /// serving certificate (for `localhost` and `127.0.0.1`). A test that plays a
    /// workload cluster gives it to CAPI as the cluster CA (`<cluster>-ca`), so the
    /// kubeconfig KCP makes from it is accepted here.
    pub fn ca(&self) -> &Pki {
        &self.ca
    }

    /// The kube client configuration (admin).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The admin kubeconfig file (for kubectl or a controller started as a process).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The time from [`TestEnv::start`] to a ready API server.
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    pub fn assets(&self) -> &Assets {
        &self.assets
    }

    /// The temporary directory of this instance (certificates, logs, kubeconfig, etcd data).
    pub fn scratch_dir(&self) -> &Path {
        self.scratch.path()
    }

    /// Every request the API server audited for `username` (e.g.
    /// `system:serviceaccount:<namespace>:<name>`), in log order; only service
    /// accounts are audited. A watch appears once per stage it reached.
    pub fn audited_requests(&self, username: &str) -> Result<Vec<AuditedRequest>> {
        let log = self.scratch.path().join(AUDIT_LOG);
        let text = std::fs::read_to_string(&log).with_context(|| format!("reading the audit log {}", log.display()))?;
        let mut requests = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let event: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("an audit log line is not JSON: {line}"))?;
            if event["user"]["username"] != username {
                continue;
            }
            let object = &event["objectRef"];
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let mut resource = text(&object["resource"]);
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            requests.push(AuditedRequest {
                verb: text(&event["verb"]),
                api_group: text(&object["apiGroup"]),
                resource,
                namespace: text(&object["namespace"]),
                code: event["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            });
        }
        Ok(requests)
    }

    /// The last lines of the kube-apiserver log, for failure messages.
    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        self.apiserver.log_tail(lines)
    }

    /// Installs every CRD of a YAML text (several documents allowed) as written, and waits
    /// until each is Established. Returns the CRD names.
    pub async fn install_crd_yaml(&self, yaml: &str) -> Result<Vec<String>> {
        crd_install::install(&self.client(), parse_crds(yaml, "the given CRD YAML")?, Conversion::AsWritten).await
    }

    /// Installs every CRD of every `*.yaml`/`*.yml` file in `dir` as written (for the
    /// project's own CRDs: `config/crd` at the repository root).
    pub async fn install_crds_from_dir(&self, dir: &Path) -> Result<Vec<String>> {
        crd_install::install(&self.client(), read_crd_dir(dir)?, Conversion::AsWritten).await
    }

    /// Installs Cluster API's CRDs, core and kubeadm providers (copied by `cargo xtask
    /// control-plane build`), with conversion webhooks replaced by `strategy: None`: only
    /// v1beta2 is used here.
    pub async fn install_capi_crds(&self) -> Result<Vec<String>> {
        let dir = self.assets.capi_crds_dir()?;
        let mut crds = read_crd_dir(&dir)?;
        for crd in &mut crds {
            add_kubeadm_contract_labels(crd);
        }
        crd_install::install(&self.client(), crds, Conversion::StripWebhook).await
    }

    /// Installs the in-cluster IPAM provider's CRDs (InClusterIPPool, GlobalInClusterIPPool,
    /// InClusterPrefixPool, GlobalInClusterPrefixPool; copied by `cargo xtask control-plane
    /// build`), with any conversion webhook replaced by `strategy: None` (the published bases
    /// have none; the provider runs without webhooks here), so only v1alpha2 is of use.
    /// The IPAddressClaim and IPAddress CRDs are CAPI core's ([`TestEnv::install_capi_crds`]).
    pub async fn install_ipam_crds(&self) -> Result<Vec<String>> {
        let dir = self.assets.ipam_crds_dir()?;
        crd_install::install(&self.client(), read_crd_dir(&dir)?, Conversion::StripWebhook).await
    }

    /// Creates namespace `name`; fails if it exists.
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let namespace = Namespace {
            metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(())
    }

    /// Creates and returns a namespace `<prefix>-<pid>-<n>` that no other test uses.
    pub async fn unique_namespace(&self, prefix: &str) -> Result<String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        if name.len() > 63 {
            bail!("namespace name {name:?} is longer than 63 characters: use a shorter prefix than {prefix:?}");
        }
        self.create_namespace(&name).await?;
        Ok(name)
    }

    /// Kills kube-apiserver and etcd and removes the temporary directory. Idempotent.
    fn stop(&self) {
        self.apiserver.kill();
        self.etcd.kill();
        self.scratch.remove();
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `process` accepts TCP connections on 127.0.0.1:`port`.
async fn wait_for_tcp(process: &SupervisedProcess, port: u16, timeout: Duration) -> Result<()> {
    let bound = Bound::new(timeout, Duration::from_millis(100));
    let outcome = wait::until(bound, || async {
        process.ensure_running()?;
        Ok::<_, anyhow::Error>(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok().into())
    })
    .await;
    outcome.map_err(|stop| {
        stop.into_error(|_| {
            anyhow!(
                "{} did not listen on 127.0.0.1:{port} within {timeout:?}; last lines of its log:\n{}",
                process.log_path().display(),
                process.log_tail(40)
            )
        })
    })
}

/// Polls `GET /readyz` until it answers `ok`.
async fn wait_for_readyz(
    config: &Config,
    apiserver: &SupervisedProcess,
    etcd: &SupervisedProcess,
    timeout: Duration,
) -> Result<()> {
    let client = Client::try_from(config.clone()).context("building a kube client from the generated kubeconfig")?;
    let bound = Bound::new(timeout, Duration::from_millis(250));
    let outcome = wait::until(bound, || async {
        etcd.ensure_running()?;
        apiserver.ensure_running()?;
        let request = http::Request::get("/readyz").body(Vec::new())?;
        Ok::<_, anyhow::Error>(match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => Check::Done(()),
            Ok(body) => Check::Pending(format!("/readyz answered {body:?}")),
            Err(err) => Check::Pending(err.to_string()),
        })
    })
    .await;
    outcome.map_err(|stop| {
        stop.into_error(|last_error| {
            anyhow!(
                "kube-apiserver was not ready within {timeout:?} (last: {last_error}); last lines of {}:\n{}",
                apiserver.log_path().display(),
                apiserver.log_tail(40)
            )
        })
    })
}

/// The contract labels CAPI's kustomize configuration puts on the kubeadm bootstrap and
/// control plane providers' CRDs (`cluster.x-k8s.io/v1beta1: v1beta1`,
/// `cluster.x-k8s.io/v1beta2: v1beta2`, as in their release components), which the
/// module's `config/crd/bases` files lack. CAPI core resolves an `apiGroup`/`kind`
/// reference (a Machine's bootstrap `configRef`, a ClusterClass's templates) to a
/// version through these labels; without them it refuses the reference.
fn add_kubeadm_contract_labels(
    crd: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    let group = crd.spec.group.as_str();
    if group != "bootstrap.cluster.x-k8s.io" && group != "controlplane.cluster.x-k8s.io" {
        return;
    }
    let labels = crd.metadata.labels.get_or_insert_with(Default::default);
    for contract in ["v1beta1", "v1beta2"] {
        if crd.spec.versions.iter().any(|v| v.name == contract) {
            labels.insert(format!("cluster.x-k8s.io/{contract}"), contract.to_string());
        }
    }
}
