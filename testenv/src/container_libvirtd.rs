//! A libvirtd in a container, started by the tests with testcontainers: the
//! image `cargo xtask libvirtd-image` builds from Debian packages (libvirtd,
//! QEMU in software emulation, dnsmasq; the same libvirt version as the
//! private host daemon's), reached through its unix socket, which the
//! container creates in a host directory bind-mounted at `/run/libvirt`.
//!
//! The container is not privileged (`--privileged` fails on machines whose
//! capability bounding set lacks `CAP_SYS_RESOURCE`); it gets what libvirtd
//! needs one by one: `SYS_ADMIN` (mounts of its own), `NET_ADMIN` and
//! `NET_RAW` (bridges, taps, iptables, dnsmasq's DHCP), `/dev/net/tun`, no
//! seccomp or AppArmor profile, and `systempaths=unconfined`, because libvirt
//! writes the sysctls of the bridges it creates under `/proc/sys/net` (per
//! network namespace: the host's are not touched). Its guests, bridges and
//! NAT rules live in the container's network namespace.
//!
//! With [`Options::tls`] it also listens for TLS on port 16514, with a server
//! certificate for its address on [`Options::network`] signed by a CA made
//! for it, and requires client certificates of that CA ([`TlsClient`] has
//! one): a manager in a kind cluster on that docker network reaches it as it
//! would reach a remote host, with `qemu+tls://` and a credentials Secret.
//!
//! The container is removed when the [`ContainerLibvirtd`] is dropped.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use capl_testbed::wait::{self, Bound};
use testcontainers::core::Mount;
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

/// The environment variable that names the image (`name:tag`); without it the
/// tests run `cargo xtask libvirtd-image`, which builds it when missing and
/// prints its name.
pub const IMAGE_ENV: &str = capl_testbed::env::LIBVIRTD_IMAGE;
/// The command that builds the image and prints its name.
pub const IMAGE_COMMAND: &str = "cargo xtask libvirtd-image";
/// The command that starts a docker engine when none answers.
pub const ENGINE_COMMAND: &str = "cargo xtask docker-engine up";
/// How long the daemon may take to open its socket once the container runs.
const SOCKET_LIMIT: Duration = Duration::from_secs(60);

/// How to start it.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A docker network to attach it to (default: docker's bridge).
    pub network: Option<String>,
    /// Listen for TLS too, with certificates made for its address.
    pub tls: bool,
    /// A directory of this machine mounted at [`CONSOLE_DIR`] in the container:
    /// the guests' serial console logs a manager writes there (its
    /// `--console-log-dir`, a path on the libvirt host) can be read here.
    pub console_dir: Option<PathBuf>,
}

/// Where [`Options::console_dir`] appears inside the container.
pub const CONSOLE_DIR: &str = "/var/log/capl-console";

/// What a client needs to reach the daemon over TLS.
#[derive(Debug, Clone)]
pub struct TlsClient {
    /// The daemon's address on the network.
    pub address: String,
    /// `qemu+tls://<address>/system`.
    pub uri: String,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A running containerized libvirtd.
pub struct ContainerLibvirtd {
    container: Container<GenericImage>,
    run_dir: PathBuf,
    uri: String,
    tls: Option<TlsClient>,
}

impl ContainerLibvirtd {
    /// Starts a container of the image and waits until libvirtd listens. The
    /// error names what is missing (the engine, the image) and the command
    /// that provides it.
    pub fn start() -> Result<Self, String> {
        Self::start_with(Options::default())
    }

    /// [`ContainerLibvirtd::start`] with options.
    pub fn start_with(options: Options) -> Result<Self, String> {
        let image = image()?;
        let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let run_dir = std::env::temp_dir().join(format!(
            "capl-libvirtd-container-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&run_dir);
        let pki_dir = run_dir.join("pki");
        std::fs::create_dir_all(&pki_dir).map_err(|e| format!("creating {}: {e}", pki_dir.display()))?;
        let mut request = GenericImage::new(name, tag)
            .with_cap_add("SYS_ADMIN")
            .with_cap_add("NET_ADMIN")
            .with_cap_add("NET_RAW")
            .with_security_opt("seccomp=unconfined")
            .with_security_opt("apparmor=unconfined")
            .with_label("io.capl.test", "containerized-libvirtd")
            .with_host_config_modifier(|config| {
                // `docker run --security-opt systempaths=unconfined`: nothing masked, nothing read-only.
                config.masked_paths = Some(Vec::new());
                config.readonly_paths = Some(Vec::new());
                config.devices = Some(vec![testcontainers::bollard::models::DeviceMapping {
                    path_on_host: Some("/dev/net/tun".into()),
                    path_in_container: Some("/dev/net/tun".into()),
                    cgroup_permissions: Some("rwm".into()),
                }]);
            })
            .with_startup_timeout(Duration::from_secs(120));
        let libvirt_dir = run_dir.join("run");
        std::fs::create_dir_all(&libvirt_dir).map_err(|e| format!("creating {}: {e}", libvirt_dir.display()))?;
        request = request.with_mount(Mount::bind_mount(libvirt_dir.display().to_string(), "/run/libvirt"));
        if options.tls {
            request = request
                .with_env_var(capl_testbed::env::LIBVIRTD_TLS_DIR, "/capl-pki")
                .with_mount(Mount::bind_mount(pki_dir.display().to_string(), "/capl-pki"));
        }
        if let Some(dir) = &options.console_dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            request = request.with_mount(Mount::bind_mount(dir.display().to_string(), CONSOLE_DIR));
        }
        if let Some(network) = &options.network {
            request = request.with_network(network.clone());
        }
        let container = request.start().map_err(|e| {
            format!(
                "starting a container of {image} failed: {e}. Is a docker engine running (`{ENGINE_COMMAND}`) and the \
                 image built (`{IMAGE_COMMAND}`)?"
            )
        })?;
        // With TLS the daemon starts once its certificates are there: they name
        // its address, known only now.
        let tls = if options.tls {
            let address = address_on(container.id(), options.network.as_deref().unwrap_or("bridge"))?;
            Some(write_pki(&pki_dir, &address).map_err(|e| format!("the containerized libvirtd's PKI: {e}"))?)
        } else {
            None
        };
        let socket = libvirt_dir.join("libvirt-sock");
        wait_for_socket(&socket).map_err(|e| format!("{e}; container {}", container.id()))?;
        let uri = format!("qemu+unix:///system?socket={}", socket.display());
        Ok(ContainerLibvirtd { container, run_dir, uri, tls })
    }

    /// The TLS client's view of the daemon (with [`Options::tls`]).
    pub fn tls(&self) -> Option<&TlsClient> {
        self.tls.as_ref()
    }

    /// The URI that reaches the daemon from this machine.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The container's id (for `docker logs`).
    pub fn id(&self) -> &str {
        self.container.id()
    }
}

impl Drop for ContainerLibvirtd {
    fn drop(&mut self) {
        // The container itself is removed by testcontainers' own Drop, after this.
        let _ = self.container.stop_with_timeout(Some(10));
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// The container's IP address on `network`.
fn address_on(id: &str, network: &str) -> Result<String, String> {
    let format = format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}");
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", &format, id])
        .output()
        .map_err(|e| format!("docker inspect {id}: {e}"))?;
    let address = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || address.is_empty() {
        return Err(format!(
            "container {id} has no address on docker network {network}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(address)
}

/// A CA, the daemon's certificate for `address` (written for the daemon into
/// `dir`, key last: the start script waits for it) and a client certificate.
fn write_pki(dir: &Path, address: &str) -> anyhow::Result<TlsClient> {
    let ca = crate::Pki::new_ca("capl-containerized-libvirtd-ca")?;
    let (server_cert, server_key) = ca.serving_cert_for(address, &[address.to_string()])?;
    let (cert_pem, key_pem) = ca.client_cert("capl-manager", "capl")?;
    std::fs::write(dir.join("cacert.pem"), ca.ca_pem())?;
    std::fs::write(dir.join("servercert.pem"), &server_cert)?;
    // Renamed into place: the start script must not read half a key.
    std::fs::write(dir.join("serverkey.pem.partial"), &server_key)?;
    std::fs::rename(dir.join("serverkey.pem.partial"), dir.join("serverkey.pem"))?;
    Ok(TlsClient {
        address: address.to_string(),
        uri: format!("qemu+tls://{address}/system"),
        ca_pem: ca.ca_pem().to_string(),
        cert_pem,
        key_pem,
    })
}

/// The image: [`IMAGE_ENV`], else what [`IMAGE_COMMAND`] prints.
fn image() -> Result<String, String> {
    if let Ok(image) = std::env::var(IMAGE_ENV)
        && !image.is_empty()
    {
        return Ok(image);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testenv lives in the repository");
    let out = std::process::Command::new("cargo")
        .args(["xtask", "libvirtd-image"])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running `{IMAGE_COMMAND}` (or set {IMAGE_ENV}): {e}"))?;
    if !out.status.success() {
        return Err(format!("`{IMAGE_COMMAND}` failed ({}); set {IMAGE_ENV} to an image built by it", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn wait_for_socket(socket: &Path) -> Result<(), String> {
    let bound = Bound::new(SOCKET_LIMIT, Duration::from_millis(200));
    let outcome =
        wait::blocking(bound, || Ok::<_, Infallible>(std::os::unix::net::UnixStream::connect(socket).is_ok().into()));
    outcome.map_err(|_| {
        format!("the containerized libvirtd did not listen on {} within {SOCKET_LIMIT:?}", socket.display())
    })
}
