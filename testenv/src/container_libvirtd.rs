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
//! The container is removed when the [`ContainerLibvirtd`] is dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use testcontainers::core::Mount;
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

/// The environment variable that names the image (`name:tag`); without it the
/// tests run `cargo xtask libvirtd-image`, which builds it when missing and
/// prints its name.
pub const IMAGE_ENV: &str = "CAPL_LIBVIRTD_IMAGE";
/// The command that builds the image and prints its name.
pub const IMAGE_COMMAND: &str = "cargo xtask libvirtd-image";
/// The command that starts a docker engine when none answers.
pub const ENGINE_COMMAND: &str = "cargo xtask docker-engine up";
/// How long the daemon may take to open its socket once the container runs.
const SOCKET_LIMIT: Duration = Duration::from_secs(60);

/// A running containerized libvirtd.
pub struct ContainerLibvirtd {
    container: Container<GenericImage>,
    run_dir: PathBuf,
    uri: String,
}

impl ContainerLibvirtd {
    /// Starts a container of the image and waits until libvirtd listens. The
    /// error names what is missing (the engine, the image) and the command
    /// that provides it.
    pub fn start() -> Result<Self, String> {
        let image = image()?;
        let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let run_dir = std::env::temp_dir().join(format!(
            "capl-libvirtd-container-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(&run_dir).map_err(|e| format!("creating {}: {e}", run_dir.display()))?;
        let request = GenericImage::new(name, tag)
            .with_cap_add("SYS_ADMIN")
            .with_cap_add("NET_ADMIN")
            .with_cap_add("NET_RAW")
            .with_security_opt("seccomp=unconfined")
            .with_security_opt("apparmor=unconfined")
            .with_mount(Mount::bind_mount(run_dir.display().to_string(), "/run/libvirt"))
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
        let container = request.start().map_err(|e| {
            format!(
                "starting a container of {image} failed: {e}. Is a docker engine running (`{ENGINE_COMMAND}`) and the \
                 image built (`{IMAGE_COMMAND}`)?"
            )
        })?;
        let socket = run_dir.join("libvirt-sock");
        wait_for_socket(&socket).map_err(|e| format!("{e}; container {}", container.id()))?;
        let uri = format!("qemu+unix:///system?socket={}", socket.display());
        Ok(ContainerLibvirtd { container, run_dir, uri })
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
    let deadline = Instant::now() + SOCKET_LIMIT;
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the containerized libvirtd did not listen on {} within {SOCKET_LIMIT:?}",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
