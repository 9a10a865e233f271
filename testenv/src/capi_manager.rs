//! Cluster API's managers running against a [`TestEnv`]: the core manager (`capi-manager`,
//! package `sigs.k8s.io/cluster-api/core`) and, on request, the kubeadm bootstrap provider
//! (CABPK) and kubeadm control plane provider (KCP) managers, and CAPI's in-cluster IPAM
//! provider (`sigs.k8s.io/cluster-api-ipam-provider-in-cluster`).
//!
//! Each manager serves its webhooks on a free loopback port with a serving certificate signed
//! by the test control plane's own CA, and its webhook configurations (the provider's
//! `config/webhook/manifests.yaml`) are registered with the API server pointing at
//! `https://127.0.0.1:<port>/<path>`, as envtest does. So objects are defaulted and validated
//! by CAPI's webhooks as in a cluster installed with clusterctl: a KubeadmControlPlane comes
//! back with its defaults, an invalid KubeadmConfig is refused with the provider's message.
//! The core manager's webhooks can be left unregistered ([`CapiOptions::without_core_webhooks`]);
//! its webhook server runs anyway (its readiness check waits for it).
//!
//! The IPAM provider runs without webhooks (`--webhook-port=0`, which makes it register none
//! and start no webhook server): its pools are not defaulted or validated by it, so tests
//! must write valid pools. It allocates addresses for the IPAddressClaims that reference its
//! pools; CAPI core's webhooks validate the claims and the IPAddresses it creates.
//!
//! Conversion webhooks are not served: CAPI's CRDs are installed with conversion `None`
//! ([`TestEnv::install_capi_crds`]), so only the v1beta2 API versions are of use.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use capl_testbed::wait::{self, Bound, Check};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::free_port::free_loopback_ports;
use crate::supervised_process::SupervisedProcess;
use crate::webhooks::Registration;
use crate::{Assets, TestEnv};

impl TestEnv {
    /// Starts the CAPI core manager against this API server (after installing CAPI's CRDs),
    /// with its webhooks registered. The same as `start_capi(CapiOptions::new())`.
    pub async fn start_capi_manager(&self) -> Result<CapiManager> {
        self.start_capi(CapiOptions::new()).await
    }

    /// Installs CAPI's CRDs (core and kubeadm providers) and starts the managers `options`
    /// asks for, each with its webhooks served and registered with this API server; returns
    /// once every manager is ready and the API server calls its webhooks. See [`CapiManager`].
    ///
    /// With [`CapiOptions::with_kubeadm_providers`] the kubeadm bootstrap (CABPK) and control
    /// plane (KCP) managers run beside the core manager, so KubeadmControlPlane and
    /// KubeadmConfig objects are defaulted, validated and reconciled as in a real cluster.
    /// With [`CapiOptions::with_ipam_in_cluster`] the in-cluster IPAM provider's CRDs are
    /// installed too and its manager runs beside them (without webhooks), so IPAddressClaims
    /// on its pools get IPAddresses.
    pub async fn start_capi(&self, options: CapiOptions) -> Result<CapiManager> {
        self.install_capi_crds().await?;
        if options.ipam_in_cluster() {
            // Before the manager starts: it watches the pools from the start.
            self.install_ipam_crds().await?;
        }
        CapiManager::start(self, &options).await
    }
}

/// How long a manager may take to answer its readiness probe.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Which of CAPI's managers [`TestEnv::start_capi`] starts, and how.
///
/// ```no_run
/// # async fn demo(env: &testenv::TestEnv) -> anyhow::Result<()> {
/// use testenv::CapiOptions;
/// let capi = env.start_capi(CapiOptions::new().with_kubeadm_providers()).await?;
/// # drop(capi); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct CapiOptions {
    kubeadm_providers: bool,
    ipam_in_cluster: bool,
    core_webhooks: bool,
    feature_gates: Option<String>,
    namespace: Option<String>,
}

impl Default for CapiOptions {
    fn default() -> Self {
        Self {
            kubeadm_providers: false,
            ipam_in_cluster: false,
            core_webhooks: true,
            feature_gates: None,
            namespace: None,
        }
    }
}

impl CapiOptions {
    /// The core manager with its webhooks registered (what [`TestEnv::start_capi_manager`] starts).
    pub fn new() -> Self {
        Self::default()
    }

    /// Also start the kubeadm bootstrap (CABPK) and control plane (KCP) managers, with their
    /// webhooks registered.
    pub fn with_kubeadm_providers(mut self) -> Self {
        self.kubeadm_providers = true;
        self
    }

    /// Also start CAPI's in-cluster IPAM provider manager (its pool CRDs are installed first,
    /// see [`TestEnv::install_ipam_crds`]): IPAddressClaims referencing an InClusterIPPool or
    /// GlobalInClusterIPPool get an IPAddress. It serves no webhooks.
    pub fn with_ipam_in_cluster(mut self) -> Self {
        self.ipam_in_cluster = true;
        self
    }

    pub(crate) fn ipam_in_cluster(&self) -> bool {
        self.ipam_in_cluster
    }

    /// Do not register the core manager's webhooks with the API server: Cluster, Machine,
    /// MachineDeployment, ... are then neither defaulted nor validated by CAPI, and tests
    /// must write complete objects.
    pub fn without_core_webhooks(mut self) -> Self {
        self.core_webhooks = false;
        self
    }

    /// `--feature-gates` for every CAPI manager, e.g. `"ClusterTopology=true"` (not for the
    /// IPAM provider, which has no such flag).
    pub fn feature_gates(mut self, gates: &str) -> Self {
        self.feature_gates = Some(gates.to_owned());
        self
    }

    /// Every manager watches only `namespace` (`--namespace`), not the whole API server: for
    /// tests that share one API server, where a manager of one test must not act on another
    /// test's objects (the IPAM provider, for one, puts its finalizer on every claim it sees,
    /// and a claim it saw is not deleted once that manager has stopped).
    pub fn watch_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }
}

/// One of CAPI's managers.
struct Provider {
    /// Name of its log file, scratch sub-directory and webhook configurations.
    name: &'static str,
    binary: fn(&Assets) -> Result<PathBuf>,
    /// Its webhook manifest in the control-plane directory's `capi-webhooks/`; `None` for a
    /// manager started without webhooks.
    webhook_manifest: Option<&'static str>,
    flags: Flags,
    /// Flags of this manager alone.
    extra_args: &'static [&'static str],
}

/// The command-line conventions of a manager.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flags {
    /// CAPI's managers: `--health-addr`, `--feature-gates`, a webhook server.
    Capi,
    /// The in-cluster IPAM provider: `--health-probe-bind-address`, no `--feature-gates`,
    /// and `--webhook-port=0` (no webhooks, no webhook server).
    IpamInCluster,
}

const CORE: Provider = Provider {
    name: "capi-manager",
    binary: Assets::capi_manager,
    webhook_manifest: Some("core.yaml"),
    flags: Flags::Capi,
    extra_args: &[],
};
const KUBEADM_BOOTSTRAP: Provider = Provider {
    name: "capi-kubeadm-bootstrap-manager",
    binary: Assets::capi_kubeadm_bootstrap_manager,
    webhook_manifest: Some("kubeadm-bootstrap.yaml"),
    flags: Flags::Capi,
    extra_args: &[],
};
const KUBEADM_CONTROL_PLANE: Provider = Provider {
    name: "capi-kubeadm-control-plane-manager",
    binary: Assets::capi_kubeadm_control_plane_manager,
    webhook_manifest: Some("kubeadm-control-plane.yaml"),
    flags: Flags::Capi,
    extra_args: KCP_ETCD_TIMEOUTS,
};
/// KubeadmControlPlane's manager flags for guests under software emulation.
/// KCP reads the workload cluster's etcd members through a port-forward of the
/// workload API server to the etcd Pod, within a 10 s dial and a 15 s call by
/// default; one failed read makes the control plane `Available=Unknown`
/// (InspectionFailed, "Failed to get etcd members"). A control-plane guest whose
/// CPUs QEMU emulates, sharing 2 host cores with its workers, answers slower than
/// that for minutes at a time; a minute for each is what such a lab needs. The
/// local manager gets them here; KCP on a kind management cluster gets them
/// through the e2e config of Cluster API's specs.
pub const KCP_ETCD_TIMEOUTS: &[&str] = &["--etcd-dial-timeout-duration=60s", "--etcd-call-timeout-duration=60s"];
const IPAM_IN_CLUSTER: Provider = Provider {
    name: "capi-ipam-in-cluster-manager",
    binary: Assets::ipam_in_cluster_manager,
    webhook_manifest: None,
    flags: Flags::IpamInCluster,
    extra_args: &[],
};

/// CAPI's running managers (the core manager, and the kubeadm and IPAM providers if asked for) and
/// their registered webhooks. Dropping it removes the webhook configurations and kills the
/// managers. Drop it before its [`TestEnv`].
pub struct CapiManager {
    // Fields drop in order: the API server stops calling the webhooks before their servers stop.
    webhooks: Vec<Registration>,
    managers: Vec<ManagerProcess>,
}

impl CapiManager {
    pub(crate) async fn start(env: &TestEnv, options: &CapiOptions) -> Result<Self> {
        let mut providers = vec![(&CORE, options.core_webhooks)];
        if options.kubeadm_providers {
            providers.extend([(&KUBEADM_BOOTSTRAP, true), (&KUBEADM_CONTROL_PLANE, true)]);
        }
        if options.ipam_in_cluster {
            providers.push((&IPAM_IN_CLUSTER, false));
        }
        // Every binary is looked up before anything starts, so a missing one fails at once.
        for (provider, _) in &providers {
            (provider.binary)(env.assets())?;
        }
        let mut started = Self { webhooks: Vec::new(), managers: Vec::new() };
        // Started together: each takes seconds to become ready on a loaded 2-core machine.
        for (provider, _) in &providers {
            started.managers.push(ManagerProcess::start(env, provider, options)?);
        }
        for manager in &started.managers {
            manager.wait_ready().await?;
        }
        for (manager, (provider, register)) in started.managers.iter().zip(&providers) {
            let (true, Some(manifest), Some(port)) = (register, provider.webhook_manifest, manager.webhook_port) else {
                continue;
            };
            let manifest = env.assets().capi_webhook_manifest(manifest)?;
            let registration = Registration::register(env.config(), &manifest, provider.name, port, env.ca.ca_pem())
                .await
                .with_context(|| {
                    format!(
                        "registering the webhooks of {} (last lines of its log:\n{})",
                        provider.name,
                        manager.process.log_tail(20)
                    )
                })?;
            started.webhooks.push(registration);
        }
        Ok(started)
    }

    /// The last lines of each manager's log, each under a header naming the manager when
    /// more than one runs; for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        match self.managers.as_slice() {
            [only] => only.process.log_tail(lines),
            managers => managers
                .iter()
                .map(|m| format!("--- {} ({}):\n{}", m.name, m.process.log_path().display(), m.process.log_tail(lines)))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The log files of the managers.
    pub fn log_paths(&self) -> Vec<&Path> {
        self.managers.iter().map(|m| m.process.log_path()).collect()
    }

    /// Each manager's name and process id.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.managers.iter().map(|m| (m.name, m.process.pid())).collect()
    }

    /// Fails, with the end of its log, if a manager has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.managers.iter().try_for_each(|m| m.process.ensure_running())
    }

    /// Whether the kubeadm bootstrap and control plane managers run.
    pub fn has_kubeadm_providers(&self) -> bool {
        self.managers.iter().any(|m| m.name == KUBEADM_CONTROL_PLANE.name)
    }

    /// Whether the in-cluster IPAM provider's manager runs.
    pub fn has_ipam_in_cluster(&self) -> bool {
        self.managers.iter().any(|m| m.name == IPAM_IN_CLUSTER.name)
    }

    /// The names of the Mutating/ValidatingWebhookConfigurations registered for the managers.
    pub fn webhook_configurations(&self) -> Vec<&str> {
        self.webhooks.iter().flat_map(Registration::names).collect()
    }
}

/// One manager process with its probe and webhook ports.
struct ManagerProcess {
    name: &'static str,
    process: SupervisedProcess,
    health_port: u16,
    /// `None` for a manager without webhook server.
    webhook_port: Option<u16>,
}

impl ManagerProcess {
    fn start(env: &TestEnv, provider: &Provider, options: &CapiOptions) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let binary = (provider.binary)(env.assets())?;
        let dir = env.scratch_dir().join(format!("{}-{}", provider.name, NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let [webhook_port, health_port, diagnostics_port] = free_loopback_ports()?;
        let common = [
            format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
            "--insecure-diagnostics=true".to_owned(),
            "--leader-elect=false".to_owned(),
        ];
        let (mut args, webhook_port) = match provider.flags {
            Flags::Capi => {
                let cert_dir = dir.join("webhook-certs");
                std::fs::create_dir_all(&cert_dir).with_context(|| format!("creating {}", cert_dir.display()))?;
                // Signed by the CA the API server trusts: the API server calls these webhooks.
                let (cert, key) = env.ca.serving_cert(provider.name)?;
                std::fs::write(cert_dir.join("tls.crt"), cert)?;
                std::fs::write(cert_dir.join("tls.key"), key)?;
                let mut args = vec![
                    format!("--webhook-port={webhook_port}"),
                    format!("--webhook-cert-dir={}", cert_dir.display()),
                    format!("--health-addr=127.0.0.1:{health_port}"),
                ];
                args.extend(common);
                if let Some(gates) = &options.feature_gates {
                    args.push(format!("--feature-gates={gates}"));
                }
                (args, Some(webhook_port))
            }
            // Port 0 is the provider's switch for "no webhooks": it then sets up none and
            // never starts the webhook server (main.go: `if webhookPort != 0`).
            Flags::IpamInCluster => {
                let mut args =
                    vec!["--webhook-port=0".to_owned(), format!("--health-probe-bind-address=127.0.0.1:{health_port}")];
                args.extend(common);
                (args, None)
            }
        };
        if let Some(namespace) = &options.namespace {
            args.push(format!("--namespace={namespace}"));
        }
        args.extend(provider.extra_args.iter().map(|a| (*a).to_owned()));
        let process = SupervisedProcess::start(
            provider.name,
            &binary,
            &args,
            &[("KUBECONFIG", env.kubeconfig_path())],
            &dir.join(format!("{}.log", provider.name)),
        )?;
        Ok(Self { name: provider.name, process, health_port, webhook_port })
    }

    async fn wait_ready(&self) -> Result<()> {
        let bound = Bound::new(READY_TIMEOUT, Duration::from_millis(250));
        let outcome = wait::until(bound, || async {
            self.process.ensure_running()?;
            Ok::<_, anyhow::Error>(match http_get_status(self.health_port, "/readyz").await {
                Ok(200) => Check::Done(()),
                Ok(status) => Check::Pending(format!("HTTP {status}")),
                Err(err) => Check::Pending(format!("{err:#}")),
            })
        })
        .await;
        outcome.map_err(|stop| {
            stop.into_error(|last| {
                anyhow!(
                    "{} was not ready on 127.0.0.1:{}/readyz within {READY_TIMEOUT:?} (last: {last}); \
                     last lines of {}:\n{}",
                    self.name,
                    self.health_port,
                    self.process.log_path().display(),
                    self.process.log_tail(40)
                )
            })
        })
    }
}

/// The status code of a plain-HTTP `GET` on 127.0.0.1 (the manager's probe endpoint).
async fn http_get_status(port: u16, path: &str) -> Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let status_line = response.lines().next().unwrap_or_default();
    status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP response: {status_line:?}"))
}
