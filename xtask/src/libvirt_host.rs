//! `cargo xtask host ...`: the private libvirtd for tests and the demo.
//!
//! - `deps`: installs libvirt, QEMU (with OVMF and swtpm), dnsmasq and the guest-image tools from the
//!   distribution's packages (on Debian from `<codename>-backports`, which it
//!   adds as a deb822 source when missing). Nothing is run when every package
//!   is already installed.
//! - `up`: starts a libvirtd of our own that leaves a system libvirt alone,
//!   listening on its unix socket and for TLS on 127.0.0.1 (see below),
//!   defines and starts the NAT network `capl-test-net` and the dir pools
//!   `capl-test-base` and `capl-test-disks`, and prints the URI.
//! - `down`: destroys running domains and the network (so the bridge, dnsmasq
//!   and the firewall rules go away), stops the daemons and removes the
//!   private state.
//! - `status`: what is running.
//!
//! # How the daemon is kept private
//!
//! [`capl_testbed::private_libvirtd`] starts and stops it: `virtlogd` and
//! `libvirtd` in a private mount namespace in which directories under
//! [`STATE_DIR`] and [`RUN_DIR`] are bind-mounted over libvirt's system
//! directories, so the system's files are untouched and invisible to it, and
//! its sockets appear outside at [`RUN_DIR`]`/run/libvirt-sock`. Clients use
//! `qemu+unix:///system?socket=/run/capl-libvirt/run/libvirt-sock`.
//!
//! Its `qemu.conf` (the one of every private libvirtd) sets `user = "root"`
//! and `group = "root"`: on machines where `/dev/kvm` exists but cannot run
//! guests, the default `libvirt-qemu` user makes libvirtd re-probe QEMU on
//! every call (see `shared/libvirt-on-these-machines.md`), and every call
//! takes ~50 s.
//!
//! # The TLS listener
//!
//! For tests of `qemu+tls://` the daemon also listens for TLS on
//! `127.0.0.1:`[`TLS_PORT`] (`libvirtd --listen`, `listen_tls`, `listen_addr`;
//! `listen_tcp` stays off). `up` generates once, into [`PKI_DIR`], a test CA
//! ([`TLS_CA_CERT`], its key [`TLS_CA_KEY`] readable by root only), the
//! daemon's server certificate for `127.0.0.1` and `localhost`, and a client
//! certificate of its own (`pki/client/`) with which it checks the listener.
//! The daemon requires a client certificate signed by that CA. A running
//! daemon that does not answer TLS with the current CA (started by an older
//! `up`, or the PKI was regenerated) is restarted; networks and pools are
//! persistent and autostarted, and running domains survive a libvirtd restart.
//!
//! What the namespace does not isolate: the network namespace. The bridge
//! [`BRIDGE`], the subnet [`SUBNET_PREFIX`]`.0/24` and libvirt's iptables rules
//! are the host's; both were chosen not to clash with libvirt's `virbr0` /
//! 192.168.122.0/24.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

pub use capl_testbed::test_host::{
    BASE_POOL, BRIDGE, DISK_POOL, LIBVIRTD_ARGS, NETWORK, PKI_DIR, RUN_DIR, STATE_DIR, SUBNET_PREFIX, TLS_CA_CERT,
    TLS_CA_KEY, TLS_CA_NAME, TLS_PORT, URI_ENV, URI_FILE, network_xml, pool_xml, tls_uri,
};

use capl_testbed::certificates::Pki;
use capl_testbed::private_libvirtd::{self, Dirs, LIBVIRTD_CONF_BASE, live_pid};

/// A domain define slower than this means the daemon re-probes QEMU on every
/// call (the trap above): `up` fails instead of handing out a crawling host.
const SLOW_DEFINE: Duration = Duration::from_secs(10);

#[derive(clap::Subcommand)]
pub enum Command {
    /// Install libvirt, QEMU, dnsmasq and the guest-image tools (as root).
    Deps,
    /// Start (or reuse) the private libvirtd with its network and pools; print the URI.
    Up,
    /// Destroy domains and the network, stop the private libvirtd, remove its state.
    Down,
    /// Show whether the private libvirtd runs, and what it holds.
    Status,
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Deps => deps(),
        Command::Up => {
            let uri = up()?;
            println!("export {URI_ENV}='{uri}'");
            Ok(())
        }
        Command::Down => down(),
        Command::Status => status(),
    }
}

// --- packages -----------------------------------------------------------------

/// One package to install, with why it is needed and its Ubuntu name when
/// that differs (`None`: same name).
struct Package {
    debian: &'static str,
    ubuntu: Option<&'static str>,
    why: &'static str,
}

const fn pkg(debian: &'static str, why: &'static str) -> Package {
    Package { debian, ubuntu: None, why }
}

/// Everything the host side of the project needs, in one place.
const PACKAGES: &[Package] = &[
    pkg("libvirt-daemon", "libvirtd"),
    pkg("libvirt-daemon-driver-qemu", "libvirtd's QEMU driver"),
    pkg("libvirt-daemon-driver-network", "libvirtd's network driver (NAT network, dnsmasq)"),
    pkg("libvirt-daemon-driver-storage", "libvirtd's storage driver (dir pools)"),
    pkg(
        "libvirt-daemon-driver-interface",
        "libvirtd's interface driver: whether a network's host bridge exists, checked before a machine is made",
    ),
    pkg("libvirt-daemon-driver-storage-scsi", "a pool type the provider refuses (scsi), for the test that it says so"),
    pkg("libvirt-clients", "virsh"),
    pkg("libvirt-dev", "libvirt's headers and libvirt.so for the virt crate"),
    pkg("qemu-system-x86", "QEMU"),
    pkg("qemu-utils", "qemu-img"),
    pkg("ipxe-qemu", "QEMU's NIC option ROMs (a virtio NIC does not start without them)"),
    pkg("ovmf", "UEFI firmware (and its Secure Boot images) for spec.firmware.type uefi"),
    pkg("swtpm", "the emulated TPM 2.0 of spec.firmware.tpm"),
    pkg("swtpm-tools", "swtpm_setup, which libvirt runs to make an emulated TPM's state"),
    pkg("dnsmasq-base", "DHCP and DNS on the NAT network"),
    pkg("iptables", "libvirt's NAT firewall rules"),
    pkg("pkg-config", "locating libvirt when building the virt crate"),
    pkg("xorriso", "reading cloud-init ISOs back in tests"),
    Package { debian: "linux-image-cloud-amd64", ubuntu: Some("linux-image-virtual"), why: "the test guest's kernel" },
    pkg("busybox-static", "the test guest's userland"),
    pkg("syslinux", "booting the test guest's disk"),
    pkg("systemd-boot-efi", "systemd's EFI stub: the test guest's unified kernel image for UEFI firmware"),
    pkg("binutils", "objcopy: assembling the test guest's unified kernel image"),
    pkg("mtools", "writing the test guest's FAT disk without loop devices"),
    pkg("dosfstools", "mkfs.vfat for the test guest's disk"),
    pkg("openssh-server", "the tests' private sshd for qemu+libssh:// and qemu+libssh2:// (and ssh-keygen)"),
    pkg("mmdebstrap", "the Kubernetes node image's Debian root, made in a directory"),
    pkg("syslinux-common", "the node image's MBR and boot loader modules"),
    pkg("e2fsprogs", "mkfs.ext4 -d: the node image's root file system without loop devices"),
    pkg("fdisk", "sfdisk: the node image's partition table"),
    pkg("netcat-openbsd", "nc -U, libvirt's proxy=netcat over ssh (proxy=auto uses virt-ssh-helper)"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Distro {
    /// Debian with its codename (`bookworm`).
    Debian(String),
    Ubuntu,
}

fn distro() -> Result<Distro> {
    let text = fs::read_to_string("/etc/os-release").context("reading /etc/os-release to find the distribution")?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default()
    };
    match field("ID").as_str() {
        "debian" => {
            let codename = field("VERSION_CODENAME");
            if codename.is_empty() {
                bail!("/etc/os-release has no VERSION_CODENAME: cannot name the Debian backports suite");
            }
            Ok(Distro::Debian(codename))
        }
        "ubuntu" => Ok(Distro::Ubuntu),
        other => bail!(
            "host deps supports Debian and Ubuntu (apt); /etc/os-release says ID={other:?}. \
             Install the equivalents of: {}",
            PACKAGES.iter().map(|p| p.debian).collect::<Vec<_>>().join(" ")
        ),
    }
}

fn package_names(distro: &Distro) -> Vec<&'static str> {
    PACKAGES
        .iter()
        .map(|p| match distro {
            Distro::Ubuntu => p.ubuntu.unwrap_or(p.debian),
            Distro::Debian(_) => p.debian,
        })
        .collect()
}

/// `cargo xtask host deps`.
pub fn deps() -> Result<()> {
    let started = Instant::now();
    let distro = distro()?;
    let names = package_names(&distro);
    let sh = Shell::new()?;
    let missing = missing_packages(&sh, &names)?;
    if missing.is_empty() {
        eprintln!("host deps: all {} packages installed ({:.2?})", names.len(), started.elapsed());
        return Ok(());
    }
    require_root("host deps", "it installs packages with apt-get")?;
    for name in &missing {
        let why = PACKAGES.iter().find(|p| p.debian == *name || p.ubuntu == Some(name)).map_or("", |p| p.why);
        eprintln!("host deps: missing {name} ({why})");
    }
    sh.set_var("DEBIAN_FRONTEND", "noninteractive");
    let lock = ["-o", "DPkg::Lock::Timeout=600"];
    match &distro {
        Distro::Debian(codename) => {
            let suite = format!("{codename}-backports");
            ensure_backports_source(codename)?;
            let to_install = &missing;
            cmd!(sh, "apt-get {lock...} update").run().context("apt-get update failed")?;
            cmd!(sh, "apt-get {lock...} install -y --no-install-recommends -t {suite} {to_install...}")
                .run()
                .with_context(|| format!("installing {} from {suite} failed", missing.join(" ")))?;
        }
        Distro::Ubuntu => {
            cmd!(sh, "apt-get {lock...} update").run().context("apt-get update failed")?;
            // Ubuntu folds some of Debian's split libvirt packages into
            // libvirt-daemon: install what the archive has.
            let mut available = Vec::new();
            for name in &missing {
                let policy = cmd!(sh, "apt-cache policy {name}").quiet().read().unwrap_or_default();
                if policy.contains("Candidate:") && !policy.contains("Candidate: (none)") {
                    available.push(*name);
                } else {
                    eprintln!("host deps: {name} is not in this Ubuntu archive; assuming libvirt-daemon covers it");
                }
            }
            let to_install = &available;
            cmd!(sh, "apt-get {lock...} install -y --no-install-recommends {to_install...}")
                .run()
                .with_context(|| format!("installing {} failed", available.join(" ")))?;
        }
    }
    let still = missing_packages(&sh, &names)?;
    if matches!(distro, Distro::Debian(_)) && !still.is_empty() {
        bail!("after apt-get install these packages are still not installed: {}", still.join(" "));
    }
    eprintln!("host deps: done in {:.1?}", started.elapsed());
    Ok(())
}

/// The packages of `names` that dpkg does not report as installed.
fn missing_packages<'a>(sh: &Shell, names: &[&'a str]) -> Result<Vec<&'a str>> {
    // dpkg-query exits non-zero when some name is unknown; its stdout still
    // lists the known ones.
    let format = "-f=${Package}\t${Status}\n";
    let out = cmd!(sh, "dpkg-query -W {format} {names...}")
        .quiet()
        .ignore_status()
        .ignore_stderr()
        .read()
        .context("running dpkg-query (is this a Debian-based system?)")?;
    let installed: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, status)| status.ends_with(" installed") && status.starts_with("install "))
        .map(|(name, _)| name.split(':').next().unwrap_or(name))
        .collect();
    Ok(names.iter().copied().filter(|n| !installed.contains(n)).collect())
}

/// Adds `<codename>-backports` as a deb822 source with the mirror and keyring
/// of the main suite, unless some apt source already lists that suite.
fn ensure_backports_source(codename: &str) -> Result<()> {
    let suite = format!("{codename}-backports");
    if apt_sources_mention(&suite)? {
        return Ok(());
    }
    let (uris, signed_by) = main_suite_source(codename)?;
    let path = PathBuf::from(format!("/etc/apt/sources.list.d/{suite}.sources"));
    let body = format!(
        "# Added by `cargo xtask host deps` (cluster-api-provider-libvirt): newer libvirt and QEMU.\n\
         Types: deb\nURIs: {uris}\nSuites: {suite}\nComponents: main\nSigned-By: {signed_by}\n"
    );
    fs::write(&path, body).with_context(|| format!("writing the apt source {}", path.display()))?;
    eprintln!("host deps: added {suite} as {}", path.display());
    Ok(())
}

fn apt_sources_mention(suite: &str) -> Result<bool> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        for entry in dir.flatten() {
            let path = entry.path();
            if matches!(path.extension().and_then(|e| e.to_str()), Some("list" | "sources")) {
                files.push(path);
            }
        }
    }
    Ok(files.iter().filter_map(|f| fs::read_to_string(f).ok()).any(|text| {
        text.lines().map(|l| l.split('#').next().unwrap_or("")).any(|l| l.split_whitespace().any(|word| word == suite))
    }))
}

const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The `URIs` and `Signed-By` of the deb822 stanza that carries the main
/// suite (`Suites: bookworm ...`), falling back to Debian's defaults.
fn main_suite_source(codename: &str) -> Result<(String, String)> {
    let mut found = None;
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        for entry in dir.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("sources") {
                continue;
            }
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            if let Some(source) = deb822_main_stanza(&text, codename) {
                found = Some(source);
                break;
            }
        }
    }
    Ok(found.unwrap_or_else(|| (DEBIAN_MIRROR.to_string(), DEBIAN_KEYRING.to_string())))
}

/// In one deb822 file, the stanza whose `Suites` include `codename`:
/// its `URIs` and its `Signed-By` when that is a keyring path.
fn deb822_main_stanza(text: &str, codename: &str) -> Option<(String, String)> {
    for stanza in text.split("\n\n") {
        let field = |key: &str| {
            stanza.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(':'))).map(str::trim)
        };
        let suites = field("Suites").unwrap_or("");
        if !suites.split_whitespace().any(|s| s == codename) {
            continue;
        }
        let uris = field("URIs")?.split_whitespace().next()?.to_string();
        let signed_by = field("Signed-By")
            .filter(|v| v.starts_with('/'))
            .map(str::to_string)
            .unwrap_or_else(|| DEBIAN_KEYRING.to_string());
        return Some((uris, signed_by));
    }
    None
}

// --- the private daemon -------------------------------------------------------

/// The private daemon's directories, outside the namespace: those the
/// launcher bind-mounts, the pools and the PKI.
struct Layout {
    daemon: Dirs,
    pools: PathBuf,
    pki: PathBuf,
}

fn layout() -> Layout {
    let state = Path::new(STATE_DIR);
    Layout {
        daemon: Dirs {
            etc: state.join("etc"),
            run: Path::new(RUN_DIR).join("run"),
            lib: state.join("lib"),
            cache: state.join("cache"),
            log: state.join("log"),
        },
        pools: state.join("pools"),
        pki: PathBuf::from(PKI_DIR),
    }
}

impl Layout {
    /// The `pkipath` directory of `up`'s own client certificate.
    fn client_pki(&self) -> PathBuf {
        self.pki.join("client")
    }
}

/// The URI of the private daemon.
pub fn uri() -> String {
    layout().daemon.uri()
}

/// The launcher's [`LIBVIRTD_CONF_BASE`] (root-only unix sockets, the log)
/// and the TLS listener.
fn libvirtd_conf(lay: &Layout) -> String {
    let pki = &lay.pki;
    format!(
        r#"# Private libvirtd of cluster-api-provider-libvirt's tests (cargo xtask host up).
# Only root may use the sockets; no polkit.
{LIBVIRTD_CONF_BASE}# TLS on 127.0.0.1 only (libvirtd runs with --listen), for tests of qemu+tls://:
# a client needs a certificate signed by the test CA; plain TCP stays off.
listen_tls = 1
listen_tcp = 0
listen_addr = "127.0.0.1"
tls_port = "{TLS_PORT}"
auth_tls = "none"
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"
"#,
        ca = TLS_CA_CERT,
        cert = pki.join(SERVER_CERT_FILE).display(),
        key = pki.join(SERVER_KEY_FILE).display(),
    )
}

/// The probe domain `up` defines and undefines to prove calls are fast.
const PROBE_DOMAIN: &str = "capl-host-probe";

fn probe_domain_xml() -> String {
    format!(
        "<domain type='qemu'><name>{PROBE_DOMAIN}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os></domain>\n"
    )
}

/// Whether the private libvirtd answers now.
pub fn is_up() -> bool {
    daemon_responds()
}

/// `cargo xtask host up`: returns the URI.
pub fn up() -> Result<String> {
    require_root("host up", "it starts a root libvirtd in a private mount namespace")?;
    require_binaries()?;
    let started = Instant::now();
    let sh = Shell::new()?;
    let lay = layout();
    let uri = uri();
    ensure_pki(&lay)?;
    let start = if !daemon_responds() {
        true
    } else if tls_responds(&sh, &lay) {
        eprintln!(
            "host up: reusing the private libvirtd at {} (TLS on 127.0.0.1:{TLS_PORT})",
            lay.daemon.socket().display()
        );
        false
    } else {
        eprintln!(
            "host up: the running private libvirtd does not answer TLS on 127.0.0.1:{TLS_PORT} with the \
             certificates in {PKI_DIR} (an older `host up` started it, or they were regenerated): restarting it"
        );
        true
    };
    if start {
        start_daemon(&lay)?;
        wait_until_responding(&lay)?;
        if !tls_responds(&sh, &lay) {
            bail!(
                "the private libvirtd answers on {} but not for TLS on 127.0.0.1:{TLS_PORT} (`virsh -c {}`); \
                 see {}/libvirtd.log",
                lay.daemon.socket().display(),
                tls_uri(&lay.client_pki().display().to_string()),
                lay.daemon.log.display()
            );
        }
        eprintln!("host up: private libvirtd started, TLS on 127.0.0.1:{TLS_PORT} ({:.1?})", started.elapsed());
    }
    ensure_network(&sh, &uri, &lay)?;
    ensure_pool(&sh, &uri, &lay, BASE_POOL)?;
    ensure_pool(&sh, &uri, &lay, DISK_POOL)?;
    check_latency(&sh, &uri, &lay)?;
    fs::write(URI_FILE, format!("{uri}\n")).with_context(|| format!("writing {URI_FILE}"))?;
    eprintln!("host up: ready in {:.1?}; the URI is also in {URI_FILE}", started.elapsed());
    Ok(uri)
}

// --- the TLS listener's PKI -------------------------------------------------------

const SERVER_CERT_FILE: &str = "servercert.pem";
const SERVER_KEY_FILE: &str = "serverkey.pem";

/// Generates the test CA, the daemon's server certificate and `up`'s own
/// client certificate into [`PKI_DIR`], unless they are all there already.
fn ensure_pki(lay: &Layout) -> Result<()> {
    let client = lay.client_pki();
    let files = [
        PathBuf::from(TLS_CA_CERT),
        PathBuf::from(TLS_CA_KEY),
        lay.pki.join(SERVER_CERT_FILE),
        lay.pki.join(SERVER_KEY_FILE),
        client.join("cacert.pem"),
        client.join("clientcert.pem"),
        client.join("clientkey.pem"),
    ];
    if files.iter().all(|f| f.is_file()) {
        return Ok(());
    }
    let ca = Pki::new_ca(TLS_CA_NAME).context("generating the test libvirtd's CA")?;
    let (server_cert, server_key) = ca.serving_cert("capl-test-libvirtd")?;
    let (client_cert, client_key) = ca.client_cert("capl-xtask-host-up", "capl-test")?;
    for dir in [&lay.pki, &client] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    set_mode(&client, 0o700)?;
    let ca_key = ca.ca_key_pem();
    for (path, text, mode) in [
        (&files[0], ca.ca_pem(), 0o644),
        (&files[1], ca_key.as_str(), 0o600),
        (&files[2], server_cert.as_str(), 0o644),
        (&files[3], server_key.as_str(), 0o600),
        (&files[4], ca.ca_pem(), 0o600),
        (&files[5], client_cert.as_str(), 0o600),
        (&files[6], client_key.as_str(), 0o600),
    ] {
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        set_mode(path, mode)?;
    }
    eprintln!("host up: generated the test CA and TLS certificates in {}", lay.pki.display());
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting mode {mode:o} on {}", path.display()))
}

/// Whether the daemon answers `qemu+tls://127.0.0.1:<TLS_PORT>` with `up`'s
/// client certificate (so its server certificate is of the current CA).
fn tls_responds(sh: &Shell, lay: &Layout) -> bool {
    let uri = tls_uri(&lay.client_pki().display().to_string());
    // A port held by something that does not speak TLS must not hang `up`.
    cmd!(sh, "timeout 20 virsh -q -c {uri} version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// Fails, naming the holder's lookup, when something else listens on the TLS port.
fn require_tls_port_free() -> Result<()> {
    match std::net::TcpListener::bind(("127.0.0.1", TLS_PORT)) {
        Ok(_) => Ok(()),
        Err(e) => bail!(
            "127.0.0.1:{TLS_PORT}, the private libvirtd's TLS port, is taken ({e}); \
             see `ss -ltnp 'sport = :{TLS_PORT}'` and stop that program"
        ),
    }
}

pub(crate) fn require_root(what: &str, why: &str) -> Result<()> {
    let uid = fs::metadata("/proc/self").context("reading /proc/self to find the user id")?.uid();
    if uid != 0 {
        bail!("`cargo xtask {what}` must run as root ({why}); run it as root or with sudo -E");
    }
    Ok(())
}

fn require_binaries() -> Result<()> {
    let needed = ["libvirtd", "virtlogd", "virsh", "unshare", "mount", "dnsmasq", "qemu-system-x86_64", "qemu-img"];
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs: Vec<&str> = path.split(':').chain(["/usr/sbin", "/sbin"]).collect();
    let missing: Vec<&str> =
        needed.iter().copied().filter(|b| !dirs.iter().any(|d| Path::new(d).join(b).is_file())).collect();
    if !missing.is_empty() {
        bail!("{} not found: run `cargo xtask host deps` (as root) first", missing.join(", "));
    }
    Ok(())
}

fn daemon_responds() -> bool {
    private_libvirtd::answers(&layout().daemon)
}

fn wait_until_responding(lay: &Layout) -> Result<()> {
    private_libvirtd::wait_until_answering(&lay.daemon, "the private libvirtd", Duration::from_secs(60))
}

/// Starts virtlogd and libvirtd (listening for TLS, see [`libvirtd_conf`])
/// with the launcher. Leftovers of a crashed daemon are stopped first.
fn start_daemon(lay: &Layout) -> Result<()> {
    private_libvirtd::stop(&lay.daemon)?;
    ensure_pki(lay)?;
    fs::create_dir_all(&lay.pools).with_context(|| format!("creating {}", lay.pools.display()))?;
    require_tls_port_free()?;
    // --listen (in LIBVIRTD_ARGS): without systemd socket activation, libvirtd
    // opens its TCP listeners (here only TLS, see libvirtd.conf) only when told to.
    private_libvirtd::start(&lay.daemon, &libvirtd_conf(lay), &LIBVIRTD_ARGS)
}

fn virsh(sh: &Shell, uri: &str, args: &[&str]) -> Result<String> {
    cmd!(sh, "virsh -q -c {uri} {args...}")
        .quiet()
        .read()
        .with_context(|| format!("virsh -c {uri} {} failed", args.join(" ")))
}

fn virsh_ok(sh: &Shell, uri: &str, args: &[&str]) -> bool {
    cmd!(sh, "virsh -q -c {uri} {args...}").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// `virsh <kind>-info <name>`: `None` when the object does not exist, else
/// whether it is active.
fn object_active(sh: &Shell, uri: &str, info: &str, name: &str) -> Option<bool> {
    let out = cmd!(sh, "virsh -q -c {uri} {info} {name}").quiet().ignore_stderr().read().ok()?;
    let line = out.lines().find(|l| l.starts_with("Active:") || l.starts_with("State:"))?;
    Some(line.contains("yes") || line.contains("running"))
}

fn ensure_network(sh: &Shell, uri: &str, lay: &Layout) -> Result<()> {
    if object_active(sh, uri, "net-info", NETWORK).is_none() {
        let file = lay.daemon.etc.join(format!("{NETWORK}.xml"));
        fs::write(&file, network_xml()).with_context(|| format!("writing {}", file.display()))?;
        let file = file.display().to_string();
        virsh(sh, uri, &["net-define", &file])?;
        virsh(sh, uri, &["net-autostart", NETWORK])?;
    }
    if object_active(sh, uri, "net-info", NETWORK) != Some(true) {
        virsh(sh, uri, &["net-start", NETWORK]).with_context(|| {
            format!(
                "network {NETWORK} (bridge {BRIDGE}, {SUBNET_PREFIX}.0/24) did not start: \
                 is the bridge name or subnet used by something else? (ip addr)"
            )
        })?;
    }
    eprintln!("host up: network {NETWORK} active (bridge {BRIDGE}, {SUBNET_PREFIX}.0/24, DHCP .2-.99)");
    Ok(())
}

fn ensure_pool(sh: &Shell, uri: &str, lay: &Layout, name: &str) -> Result<()> {
    let dir = lay.pools.join(name.trim_start_matches("capl-test-"));
    if object_active(sh, uri, "pool-info", name).is_none() {
        let file = lay.daemon.etc.join(format!("{name}.xml"));
        fs::write(&file, pool_xml(name, &dir)).with_context(|| format!("writing {}", file.display()))?;
        let file = file.display().to_string();
        virsh(sh, uri, &["pool-define", &file])?;
        virsh(sh, uri, &["pool-build", name])?;
        virsh(sh, uri, &["pool-autostart", name])?;
    }
    if object_active(sh, uri, "pool-info", name) != Some(true) {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        virsh(sh, uri, &["pool-start", name])?;
    }
    eprintln!("host up: pool {name} active at {}", dir.display());
    Ok(())
}

/// Times a trivial call and a define/undefine; fails when the daemon shows
/// the re-probing trap.
fn check_latency(sh: &Shell, uri: &str, lay: &Layout) -> Result<()> {
    let t = Instant::now();
    virsh(sh, uri, &["version"])?;
    let version = t.elapsed();
    if virsh_ok(sh, uri, &["dominfo", PROBE_DOMAIN]) {
        virsh(sh, uri, &["undefine", PROBE_DOMAIN])?;
    }
    let file = lay.daemon.etc.join(format!("{PROBE_DOMAIN}.xml"));
    fs::write(&file, probe_domain_xml()).with_context(|| format!("writing {}", file.display()))?;
    let file = file.display().to_string();
    let t = Instant::now();
    virsh(sh, uri, &["define", &file])?;
    let define = t.elapsed();
    virsh(sh, uri, &["undefine", PROBE_DOMAIN])?;
    eprintln!("host up: virsh version {version:.0?}, define {define:.0?} (each includes connecting)");
    if define > SLOW_DEFINE {
        bail!(
            "a domain define took {define:.1?}: libvirtd is re-probing QEMU on every call. \
             Check that {}/qemu.conf has user = \"root\" and group = \"root\", then \
             `cargo xtask host down && cargo xtask host up`",
            lay.daemon.etc.display()
        );
    }
    Ok(())
}

// --- stop and status ------------------------------------------------------------

/// `cargo xtask host down`.
pub fn down() -> Result<()> {
    require_root("host down", "it stops a root libvirtd")?;
    let lay = layout();
    if !Path::new(STATE_DIR).exists() && !Path::new(RUN_DIR).exists() {
        eprintln!("host down: nothing to do ({STATE_DIR} and {RUN_DIR} do not exist)");
        return Ok(());
    }
    let sh = Shell::new()?;
    let uri = uri();
    if !daemon_responds() && lay.daemon.etc.join("libvirtd.conf").exists() {
        // A crashed daemon may have left the bridge, dnsmasq and firewall
        // rules behind: a restarted one picks them up and can remove them.
        eprintln!("host down: restarting the private libvirtd to clean up after it");
        start_daemon(&lay)?;
        wait_until_responding(&lay)?;
    }
    let mut failures = Vec::new();
    if daemon_responds() {
        let running = virsh(&sh, &uri, &["list", "--name", "--state-running", "--state-paused"])?;
        for dom in running.lines().map(str::trim).filter(|d| !d.is_empty()) {
            // A test may stop its domain at the same moment: only a domain
            // that is still running afterwards is a failure.
            match virsh(&sh, &uri, &["destroy", dom]) {
                Ok(_) => eprintln!("host down: destroyed domain {dom}"),
                Err(e) if domain_running(&sh, &uri, dom) => failures.push(format!("{e:#}")),
                Err(_) => {}
            }
        }
        for net in virsh(&sh, &uri, &["net-list", "--name"])?.lines().map(str::trim).filter(|n| !n.is_empty()) {
            match virsh(&sh, &uri, &["net-destroy", net]) {
                Ok(_) => eprintln!("host down: destroyed network {net}"),
                Err(e) if object_active(&sh, &uri, "net-info", net) == Some(true) => failures.push(format!("{e:#}")),
                Err(_) => {}
            }
        }
    }
    private_libvirtd::stop(&lay.daemon)?;
    if !failures.is_empty() {
        bail!(
            "host down: the daemon is stopped but its state is kept in {STATE_DIR} and {RUN_DIR} \
             because these failed:\n{}\nrun `cargo xtask host down` again",
            failures.join("\n")
        );
    }
    for dir in [RUN_DIR, STATE_DIR] {
        if Path::new(dir).exists() {
            fs::remove_dir_all(dir).with_context(|| format!("removing {dir}"))?;
        }
    }
    eprintln!("host down: private libvirtd stopped, {RUN_DIR} and {STATE_DIR} removed");
    Ok(())
}

fn domain_running(sh: &Shell, uri: &str, dom: &str) -> bool {
    virsh(sh, uri, &["domstate", dom]).is_ok_and(|state| state.trim() == "running" || state.trim() == "paused")
}

/// `cargo xtask host status`.
pub fn status() -> Result<()> {
    let lay = layout();
    let sh = Shell::new()?;
    let uri = uri();
    for (file, name) in [(lay.daemon.libvirtd_pid_file(), "libvirtd"), (lay.daemon.virtlogd_pid_file(), "virtlogd")] {
        match live_pid(&file, name) {
            Some(pid) => println!("{name}: running (pid {pid})"),
            None => println!("{name}: not running"),
        }
    }
    if !daemon_responds() {
        println!("uri: {uri} (not answering; run `cargo xtask host up`)");
        return Ok(());
    }
    println!("uri: {uri}");
    println!("export {URI_ENV}='{uri}'");
    let tls = tls_uri(&lay.client_pki().display().to_string());
    println!("tls: {tls} ({})", if tls_responds(&sh, &lay) { "answering" } else { "NOT answering" });
    for (what, args) in [
        ("networks", &["net-list", "--all"][..]),
        ("pools", &["pool-list", "--all"][..]),
        ("domains", &["list", "--all"][..]),
    ] {
        println!("{what}:\n{}", virsh(&sh, &uri, args)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capl_testbed::test_host;

    #[test]
    fn main_stanza_of_debian_sources() {
        let text = "Types: deb\n# snapshot\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
                    Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                    Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\
                    Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";
        assert_eq!(
            deb822_main_stanza(text, "bookworm"),
            Some(("http://mirror.example/debian".into(), "/usr/share/keyrings/debian-archive-keyring.gpg".into()))
        );
        assert_eq!(deb822_main_stanza(text, "trixie"), None);
    }

    #[test]
    fn inline_keys_fall_back_to_the_archive_keyring() {
        let text = "Types: deb\nURIs: http://m/debian\nSuites: bookworm\nSigned-By:\n -----BEGIN PGP\n";
        assert_eq!(deb822_main_stanza(text, "bookworm").unwrap().1, DEBIAN_KEYRING);
    }

    #[test]
    fn ubuntu_names_replace_debian_only_packages() {
        let ubuntu = package_names(&Distro::Ubuntu);
        assert!(ubuntu.contains(&"linux-image-virtual") && !ubuntu.contains(&"linux-image-cloud-amd64"));
        let debian = package_names(&Distro::Debian("bookworm".into()));
        assert!(debian.contains(&"linux-image-cloud-amd64"));
        assert_eq!(ubuntu.len(), debian.len());
    }

    #[test]
    fn network_and_uri_use_the_private_names() {
        let xml = network_xml();
        assert!(
            xml.contains("<bridge name='capltest0'") && xml.contains("<range start='10.251.0.2' end='10.251.0.99'/>")
        );
        assert_eq!(uri(), "qemu+unix:///system?socket=/run/capl-libvirt/run/libvirt-sock");
        let lay = layout().daemon;
        assert_eq!(lay.socket(), Path::new(test_host::SOCKET));
        assert_eq!(
            (lay.libvirtd_pid_file(), lay.virtlogd_pid_file()),
            (PathBuf::from(test_host::LIBVIRTD_PID_FILE), PathBuf::from(test_host::VIRTLOGD_PID_FILE))
        );
    }

    #[test]
    fn libvirtd_listens_for_tls_on_loopback_with_the_test_pki() {
        let lay = layout();
        let conf = libvirtd_conf(&lay);
        for line in [
            "listen_tls = 1",
            "listen_tcp = 0",
            "listen_addr = \"127.0.0.1\"",
            "tls_port = \"16614\"",
            "ca_file = \"/var/lib/capl-libvirt/pki/cacert.pem\"",
            "cert_file = \"/var/lib/capl-libvirt/pki/servercert.pem\"",
            "key_file = \"/var/lib/capl-libvirt/pki/serverkey.pem\"",
        ] {
            assert!(conf.lines().any(|l| l == line), "libvirtd.conf lacks {line}:\n{conf}");
        }
        assert_eq!(lay.pki, Path::new(TLS_CA_CERT).parent().unwrap());
    }
}
