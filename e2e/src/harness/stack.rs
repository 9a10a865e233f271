//! The whole stack of an e2e run: a libvirt host (the private libvirtd of
//! `cargo xtask host up`, a containerized libvirtd reached over TLS, or the
//! provider's embedded simulator), a management cluster with CAPI's and our
//! CRDs and the CAPI managers (the local control plane, or a kind cluster made
//! offline with everything installed by `clusterctl init`), and the provider
//! (a local process, or the Deployment in the kind cluster).
//! [`Stack::shutdown`] takes it down again and removes whatever the run left
//! on the host; dropping a `Stack` without it (a panic) still kills the
//! processes and sweeps the host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use serde_json::json;
use testenv::container_libvirtd::{ContainerLibvirtd, TlsClient};

use crate::harness::host_view::HostView;
use crate::harness::management::{Management, ManagementKind};
use crate::harness::objects::{self, Kind, Placement};
use crate::harness::provider::Provider;
use crate::harness::provider_process::ProviderProcess;
use crate::harness::wait::{Check, until};
use crate::{blocking, built_binary, repo_root};

/// Environment variables the harness reads (all optional except the URI for libvirt).
pub use testenv::test_host::URI_ENV;
pub const GUEST_IMAGE_ENV: &str = capl_testbed::env::GUEST_IMAGE;
pub const PROVIDER_BIN_ENV: &str = capl_testbed::env::PROVIDER_BIN;

/// The names `cargo xtask host up` gives the private host's network and pools
/// (a containerized libvirtd gets the same).
pub use testenv::test_host::{BASE_POOL as TEST_BASE_POOL, DISK_POOL as TEST_DISK_POOL, NETWORK as TEST_NETWORK};
/// The endpoint's host number, outside the test network's DHCP range: never handed to a guest.
const TEST_ENDPOINT_HOST: u8 = 250;
/// The Secret with the containerized libvirtd's client certificate, made in
/// every namespace of the run and named by every LibvirtCluster's `credentialsRef`.
pub const CREDENTIALS_SECRET: &str = "capl-e2e-host-tls";
/// Where a containerized libvirtd keeps the pools' files.
const CONTAINER_POOLS_DIR: &str = "/var/lib/capl-e2e/pools";

/// Every namespace (and so every domain, volume and DHCP host, which start
/// with the namespace) an e2e run creates starts with this.
pub const NAME_PREFIX: &str = "capl-e2e-";

/// Which host the provider drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A real libvirtd at this URI with the test network and pools.
    Libvirt { uri: String },
    /// A libvirtd in a container (testcontainers, the image of `cargo xtask
    /// libvirtd-image`), given the test network and pools, reached by the
    /// provider over `qemu+tls://<container address>/system` with a credentials
    /// Secret; its guests are not routable from this machine.
    Container,
    /// The provider's embedded simulated host (`--hypervisor sim`).
    Sim,
}

impl Backend {
    /// The `--libvirt` name of the backend.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Libvirt { .. } => "private",
            Backend::Container => "container",
            Backend::Sim => "sim",
        }
    }
}

/// Everything needed to start a [`Stack`].
#[derive(Debug, Clone)]
pub struct StackConfig {
    pub backend: Backend,
    pub provider_binary: PathBuf,
    /// The guest base image (qcow2) to upload; libvirt only.
    pub guest_image: Option<PathBuf>,
    /// The local control plane (default) or a kind cluster.
    pub management: ManagementKind,
    /// Which release of this provider a kind cluster starts with (the suite
    /// sets it when the upgrade scenario runs).
    pub release: crate::harness::kind_cluster::InstalledRelease,
}

impl StackConfig {
    /// From the environment: the URI from `CAPL_TEST_LIBVIRT_URI` (libvirt
    /// only), the image from `CAPL_GUEST_IMAGE` or the built xtask's
    /// `guest-image`, the provider from `CAPL_PROVIDER_BIN` or the binary next
    /// to this one. Never runs cargo (a nested cargo deadlocks on the lock of
    /// a `cargo test` that runs us). Missing pieces are errors naming the
    /// command that provides them.
    pub fn from_env(sim: bool) -> Result<Self> {
        if sim { Self::with(Backend::Sim, ManagementKind::Local) } else { Self::private_libvirtd() }
    }

    /// The private libvirtd of `cargo xtask host up` and the local control plane.
    pub fn private_libvirtd() -> Result<Self> {
        let uri = testenv::test_host::uri().map_err(|message| anyhow::anyhow!("the e2e tests: {message}"))?;
        Self::with(Backend::Libvirt { uri }, ManagementKind::Local)
    }

    /// `backend` and `management`, the rest from the environment.
    pub fn with(backend: Backend, management: ManagementKind) -> Result<Self> {
        let guest_image = match (&backend, std::env::var_os(GUEST_IMAGE_ENV)) {
            (Backend::Sim, _) => None,
            (_, Some(path)) => Some(PathBuf::from(path)),
            (_, None) => Some(guest_image_from_xtask()?),
        };
        let provider_binary = match (management, std::env::var_os(PROVIDER_BIN_ENV)) {
            (_, Some(path)) => PathBuf::from(path),
            // In kind the provider is the image's binary; this one is not run.
            (ManagementKind::Kind, None) => PathBuf::new(),
            (ManagementKind::Local, None) => built_binary("cluster-api-provider-libvirt").with_context(|| {
                format!(
                    "the provider binary is not built: run `cargo build -p cluster-api-provider-libvirt --features sim \
                     --bin cluster-api-provider-libvirt` or set {PROVIDER_BIN_ENV}"
                )
            })?,
        };
        if management == ManagementKind::Kind && backend != Backend::Container {
            bail!("a kind management cluster reaches only the containerized libvirtd (--libvirt container)");
        }
        Ok(Self { backend, provider_binary, guest_image, management, release: Default::default() })
    }
}

/// Runs the built xtask's `guest-image` (builds or reuses the cached image).
fn guest_image_from_xtask() -> Result<PathBuf> {
    let xtask = built_binary("xtask").with_context(|| {
        format!("no guest image: run `cargo xtask guest-image` and set {GUEST_IMAGE_ENV} to the path it prints")
    })?;
    let out = Command::new(&xtask)
        .arg("guest-image")
        .current_dir(repo_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} guest-image", xtask.display()))?;
    if !out.status.success() {
        bail!("`cargo xtask guest-image` failed ({}); see its output above", out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A running stack.
pub struct Stack {
    pub placement: Placement,
    /// Which host it drives.
    pub backend: Backend,
    /// The guest image file (libvirt only), for scenarios that upload it to hosts of their own.
    pub guest_image: Option<PathBuf>,
    /// The host through virsh; `None` on the simulator.
    pub host: Option<HostView>,
    /// Where the guests' serial consoles are logged, as this machine sees it (libvirt only).
    pub console_dir: Option<PathBuf>,
    /// Scratch directory of this run (provider log, console logs).
    pub work_dir: PathBuf,
    /// The client certificate for the containerized libvirtd, put in every
    /// namespace as [`CREDENTIALS_SECRET`].
    credentials: Option<TlsClient>,
    // Fields drop in order: the provider, the management cluster, then the
    // containerized libvirtd (taken out and dropped where blocking is allowed).
    pub provider: Provider,
    pub management: Management,
    container: Option<ContainerLibvirtd>,
    namespaces: Vec<String>,
    swept: bool,
}

impl Stack {
    pub async fn start(config: &StackConfig) -> Result<Self> {
        let work_dir = std::env::temp_dir().join(format!("capl-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
        // The management cluster first: a kind cluster makes the docker network
        // the containerized libvirtd joins.
        let management = Management::start(config.management, config.release, &work_dir).await?;
        let mut container = None;
        let mut credentials = None;
        let (placement, host, console_dir) = match &config.backend {
            Backend::Libvirt { uri } => {
                let host = HostView::new(uri);
                check_test_host(&host)?;
                let image = config.guest_image.as_deref().context("a guest image is needed for the libvirt backend")?;
                let volume = upload_guest_image(&host, image)?;
                let console_dir = work_dir.join("console");
                std::fs::create_dir_all(&console_dir)?;
                let placement = Placement {
                    uri: uri.clone(),
                    network: TEST_NETWORK.into(),
                    base_pool: TEST_BASE_POOL.into(),
                    domain_pool: TEST_DISK_POOL.into(),
                    image: volume,
                    endpoint_host: testenv::test_host::static_address(TEST_ENDPOINT_HOST),
                    credentials: None,
                };
                (placement, Some(host), Some(console_dir))
            }
            Backend::Container => {
                let image = config.guest_image.as_deref().context("a guest image is needed for the libvirt backend")?;
                let console_dir = work_dir.join("console");
                let network = matches!(management, Management::Kind { .. })
                    .then(|| crate::harness::kind_cluster::DOCKER_NETWORK.to_string());
                let options =
                    testenv::container_libvirtd::Options { network, tls: true, console_dir: Some(console_dir.clone()) };
                let daemon = blocking(|| ContainerLibvirtd::start_with(options)).map_err(anyhow::Error::msg)?;
                let host = HostView::new(daemon.uri());
                let tls = daemon.tls().context("the containerized libvirtd was started without TLS")?.clone();
                container = Some(daemon);
                define_test_host(&host, &work_dir)?;
                let volume = upload_guest_image(&host, image)?;
                let placement = Placement {
                    uri: tls.uri.clone(),
                    network: TEST_NETWORK.into(),
                    base_pool: TEST_BASE_POOL.into(),
                    domain_pool: TEST_DISK_POOL.into(),
                    image: volume,
                    endpoint_host: testenv::test_host::static_address(TEST_ENDPOINT_HOST),
                    credentials: Some(CREDENTIALS_SECRET.into()),
                };
                credentials = Some(tls);
                (placement, Some(host), Some(console_dir))
            }
            Backend::Sim => {
                let placement = Placement {
                    uri: "qemu:///system".into(),
                    network: capl_host::sim_host::NETWORK.into(),
                    base_pool: capl_host::sim_host::BASE_POOL.into(),
                    domain_pool: capl_host::sim_host::DOMAIN_POOL.into(),
                    image: capl_host::sim_host::BASE_IMAGE.into(),
                    endpoint_host: "192.168.122.10".into(),
                    credentials: None,
                };
                (placement, None, None)
            }
        };

        // The console log directory is a path on the libvirt host.
        let console_log_dir = match (&config.backend, &console_dir) {
            (Backend::Container, _) => Some(testenv::container_libvirtd::CONSOLE_DIR.to_string()),
            (_, dir) => dir.as_ref().map(|d| d.display().to_string()),
        };
        let provider = match &management {
            Management::Kind { cluster, .. } => {
                // The release does not set --console-log-dir; an operator who wants
                // the guests' consoles logged adds it like this.
                if let Some(dir) = &console_log_dir {
                    let args = [format!("--console-log-dir={dir}")];
                    blocking(|| cluster.add_manager_args(&args))?;
                }
                Provider::Pod { kubectl: cluster.kubectl.clone(), killed: Vec::new() }
            }
            Management::Local { .. } => {
                let mut args = Vec::new();
                match &config.backend {
                    Backend::Libvirt { .. } | Backend::Container => {
                        args.push("--domain-type=qemu".to_string());
                        // The private libvirtd is reached through socket=, which a manager
                        // refuses by default: this stack's user owns both sides.
                        if capl_host::uri_policy::UriPolicy::refused_by_default(&placement.uri) {
                            args.push("--allow-unsafe-uris".to_string());
                        }
                        if let Some(dir) = &console_log_dir {
                            args.push(format!("--console-log-dir={dir}"));
                        }
                    }
                    Backend::Sim => args.push("--hypervisor=sim".to_string()),
                }
                Provider::Process(
                    ProviderProcess::start(
                        &config.provider_binary,
                        args,
                        management.kubeconfig_path(),
                        &work_dir.join("provider.log"),
                    )
                    .await?,
                )
            }
        };
        Ok(Self {
            placement,
            backend: config.backend.clone(),
            guest_image: config.guest_image.clone(),
            host,
            console_dir,
            work_dir,
            credentials,
            provider,
            management,
            container,
            namespaces: Vec::new(),
            swept: false,
        })
    }

    pub fn client(&self) -> Client {
        self.management.client()
    }

    /// Creates a fresh namespace `capl-e2e-<short>-<pid>-<n>` (with the host's
    /// credentials Secret when the host needs one).
    pub async fn namespace(&mut self, short: &str) -> Result<String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name =
            format!("{NAME_PREFIX}{short}-{}{}", std::process::id() % 10_000, NEXT.fetch_add(1, Ordering::Relaxed));
        self.management.create_namespace(&name).await?;
        self.namespaces.push(name.clone());
        if let Some(tls) = &self.credentials {
            let secret = json!({
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": CREDENTIALS_SECRET, "namespace": name},
                "stringData": {"ca.crt": tls.ca_pem, "tls.crt": tls.cert_pem, "tls.key": tls.key_pem},
            });
            objects::create(&self.client(), &name, Kind::Secret, secret).await?;
        }
        Ok(name)
    }

    /// The namespace most recently made by [`Stack::namespace`].
    pub fn last_namespace(&self) -> Option<&str> {
        self.namespaces.last().map(String::as_str)
    }

    /// The libvirt host, or an error saying the scenario needs one.
    pub fn libvirt(&self) -> Result<&HostView> {
        self.host.as_ref().context("this check needs a real libvirt host (not --hypervisor sim)")
    }

    /// The serial console log of `domain` (empty when it does not exist yet):
    /// `<console dir>/<domain>-console.log`, as the provider names it.
    pub fn console_log(&self, domain: &str) -> String {
        self.console_dir
            .as_ref()
            .and_then(|dir| std::fs::read(dir.join(format!("{domain}-console.log"))).ok())
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// Deletes every Cluster of every namespace of this run and waits until
    /// their Machines and LibvirtMachines are gone, then stops the processes
    /// and removes what is left on the host. Returns what the sweep had to
    /// remove (empty when the provider cleaned up after itself).
    pub async fn shutdown(mut self) -> Result<Vec<String>> {
        let client = self.client();
        let mut problems = Vec::new();
        for ns in self.namespaces.clone() {
            if let Err(err) = delete_all_clusters(&client, &ns).await {
                problems.push(format!("{err:#}"));
            }
        }
        let leftovers = self.sweep_host();
        self.swept = true;
        if !problems.is_empty() {
            bail!("teardown: {}", problems.join("; "));
        }
        Ok(leftovers)
    }

    /// Removes every domain, volume and DHCP host whose name starts with one of this
    /// run's namespaces (never another run's: two runs may share the host); returns
    /// what it removed.
    fn sweep_host(&self) -> Vec<String> {
        let Some(host) = &self.host else {
            return Vec::new();
        };
        self.namespaces.iter().flat_map(|ns| sweep_prefix(host, &format!("{ns}-"))).collect()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // A Pod goes with its kind cluster.
        if let Provider::Process(process) = &mut self.provider {
            process.kill();
        }
        if !self.swept {
            let removed = self.sweep_host();
            if !removed.is_empty() {
                eprintln!("e2e teardown removed from the host: {}", removed.join(", "));
            }
        }
        // testcontainers stops it with a runtime of its own.
        if let Some(container) = self.container.take() {
            blocking(move || drop(container));
        }
    }
}

/// Defines and starts the test network and pools of `cargo xtask host up` on a
/// fresh (containerized) libvirtd.
fn define_test_host(host: &HostView, work_dir: &Path) -> Result<()> {
    let network = work_dir.join("network.xml");
    std::fs::write(&network, testenv::test_host::network_xml())?;
    host.virsh(&["net-define", &network.display().to_string()])?;
    host.virsh(&["net-start", TEST_NETWORK])?;
    define_container_pools(host, work_dir)?;
    check_test_host(host)
}

/// Defines, builds and starts the test pools of `cargo xtask host up` on a
/// fresh containerized libvirtd (their files under [`CONTAINER_POOLS_DIR`]).
pub fn define_container_pools(host: &HostView, work_dir: &Path) -> Result<()> {
    for pool in [TEST_BASE_POOL, TEST_DISK_POOL] {
        let file = work_dir.join(format!("{pool}.xml"));
        std::fs::write(&file, testenv::test_host::pool_xml(pool, &Path::new(CONTAINER_POOLS_DIR).join(pool)))?;
        host.virsh(&["pool-define", &file.display().to_string()])?;
        host.virsh(&["pool-build", pool])?;
        host.virsh(&["pool-start", pool])?;
    }
    Ok(())
}

/// Removes every domain, volume (and seed ISO) and DHCP host of the test pool and
/// network whose name starts with `prefix`; returns what it removed.
pub fn sweep_prefix(host: &HostView, prefix: &str) -> Vec<String> {
    let mut removed = Vec::new();
    for domain in host.domains_with_prefix(prefix).unwrap_or_default() {
        let _ = host.virsh(&["destroy", &domain]);
        if host.virsh(&["undefine", &domain]).is_ok() {
            removed.push(format!("domain {domain}"));
        }
    }
    for volume in host.volumes(TEST_DISK_POOL).unwrap_or_default() {
        if (volume.starts_with(prefix) || volume.starts_with(&format!("cloudinit-{prefix}")))
            && host.virsh(&["vol-delete", "--pool", TEST_DISK_POOL, &volume]).is_ok()
        {
            removed.push(format!("volume {volume}"));
        }
    }
    for entry in host.dhcp_hosts(TEST_NETWORK).unwrap_or_default() {
        if entry.name.starts_with(prefix) {
            let xml = format!("<host mac='{}' name='{}' ip='{}'/>", entry.mac, entry.name, entry.ip);
            let args = ["net-update", TEST_NETWORK, "delete", "ip-dhcp-host", xml.as_str(), "--live", "--config"];
            if host.virsh(&args).is_ok() {
                removed.push(format!("DHCP host {}", entry.name));
            }
        }
    }
    removed
}

/// Deletes the namespace's Clusters and waits until no Machine, LibvirtMachine
/// or Cluster is left in it.
pub async fn delete_all_clusters(client: &Client, ns: &str) -> Result<()> {
    for cluster in objects::list(client, ns, Kind::Cluster).await? {
        objects::delete(client, ns, Kind::Cluster, &objects::name(&cluster)).await?;
    }
    until(&format!("the Clusters of {ns} and their machines to be deleted"), Duration::from_secs(300), || async {
        let mut left = Vec::new();
        for kind in [Kind::Cluster, Kind::Machine, Kind::LibvirtMachine] {
            for object in objects::list(client, ns, kind).await? {
                left.push(format!("{kind:?} {}", objects::name(&object)));
            }
        }
        Ok(if left.is_empty() { Check::Done(()) } else { Check::Pending(left.join(", ")) })
    })
    .await
}

/// Fails unless the network and pools of `cargo xtask host up` are active.
fn check_test_host(host: &HostView) -> Result<()> {
    host.virsh(&["version"]).with_context(|| {
        format!("the libvirt host {} does not answer: start it with `cargo xtask host up` (as root)", host.uri)
    })?;
    if !host.network_active(TEST_NETWORK) {
        bail!("network {TEST_NETWORK} is not active on {}: run `cargo xtask host up`", host.uri);
    }
    for pool in [TEST_BASE_POOL, TEST_DISK_POOL] {
        if !host.pool_active(pool) {
            bail!("pool {pool} is not active on {}: run `cargo xtask host up`", host.uri);
        }
    }
    Ok(())
}

/// Uploads the guest image into the base pool as `capl-e2e-guest-<key>.qcow2`
/// (`<key>` is the image's cache directory name: kernel and script hash),
/// unless a volume of that name exists. Returns the volume name.
fn upload_guest_image(host: &HostView, image: &Path) -> Result<String> {
    upload_base_image(host, image, "guest", "cargo xtask guest-image")
}

/// Uploads `image` into the base pool as `capl-e2e-<kind>-<key>.qcow2` (`<key>`:
/// the name of the image's cache directory, which hashes its inputs) unless a
/// volume of that name exists; `builder` is the command that makes the image.
/// Returns the volume name.
pub fn upload_base_image(host: &HostView, image: &Path, kind: &str, builder: &str) -> Result<String> {
    upload_base_image_to(host, TEST_BASE_POOL, image, kind, builder)
}

/// [`upload_base_image`] into `pool`.
pub fn upload_base_image_to(host: &HostView, pool: &str, image: &Path, kind: &str, builder: &str) -> Result<String> {
    let key = image
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".into());
    let volume = format!("capl-e2e-{kind}-{key}.qcow2");
    if host.volume_exists(pool, &volume) {
        return Ok(volume);
    }
    let size = std::fs::metadata(image)
        .with_context(|| format!("the {kind} image {} is missing: run `{builder}`", image.display()))?
        .len();
    let image_path = image.display().to_string();
    host.virsh(&["vol-create-as", pool, &volume, &format!("{size}b"), "--format", "qcow2"])?;
    if let Err(err) = host.virsh(&["vol-upload", "--pool", pool, &volume, &image_path]) {
        let _ = host.virsh(&["vol-delete", "--pool", pool, &volume]);
        return Err(err);
    }
    host.virsh(&["pool-refresh", pool])?;
    Ok(volume)
}
