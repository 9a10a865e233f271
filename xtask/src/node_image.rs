//! `cargo xtask node-image`: the Kubernetes node image (qcow2) that workload
//! cluster machines boot, built from Debian packages and Go modules only, from
//! the definition in `images/node` (its README says what the image holds and
//! how it matches an image-builder image).
//!
//! What goes into it and where it comes from:
//! - Debian bookworm with systemd, cloud-init (NoCloud), the cloud kernel and the
//!   tools kubeadm and the kubelet call: `images/node/packages`, installed by
//!   `mmdebstrap` into a directory (`images/node/rootfs.sh`).
//! - `kubeadm`, `kubelet`, `kubectl` from `k8s.io/kubernetes` at the control plane's
//!   pinned [`versions::KUBERNETES_VERSION`], or at the release `--kubernetes-version`
//!   names (the upgrade tests need the previous minor as well).
//! - `containerd`, its runc shim and `ctr` from `github.com/containerd/containerd/v2`
//!   at [`CONTAINERD_VERSION`]: bookworm's containerd is 1.6, and Kubernetes 1.36 needs
//!   containerd 2.x (1.35 was the last release supporting containerd 1.x).
//!   `runc` (1.1.5, cgroup v2 capable, with seccomp) is Debian's package.
//! - The container images `kubeadm config images list` names, each a docker archive
//!   written here (one layer: the binary, the shared libraries it loads taken from the
//!   Debian root, a passwd and nsswitch.conf): kube-apiserver, kube-controller-manager,
//!   kube-scheduler and kube-proxy from `k8s.io/kubernetes` (kube-proxy's layer adds
//!   iptables, nft and conntrack from Debian), etcd from `go.etcd.io/etcd/server/v3` at
//!   the version kubeadm asks for, coredns from `github.com/coredns/coredns` with the
//!   plugins kubeadm's Corefile uses (`images/node/coredns`), and a pause written
//!   here (`images/node/pause`). They are imported, unpacked, into the node's
//!   `/var/lib/containerd` (namespace `k8s.io`, overlayfs snapshotter) at build time by
//!   the same containerd running on the build host ([`preload_images`]), so nothing is
//!   pulled and a guest does not spend minutes of emulated CPU importing them at boot:
//!   containerd's CRI plugin finds them when it starts.
//! - The add-on images the flavors name, kube-vip and kube-router (with the CNI
//!   reference plugins), under their upstream names ([`node_addons`]), preloaded
//!   as the offline stand-in for their registries.
//! - A test image [`NODE_TEST_IMAGE`], one layer with Debian's static busybox, for
//!   checks that need a shell, `wget` or `httpd` in a pod (the workload e2e's
//!   pod-to-pod check); imported like the others. No template names it.
//! - The files of `images/node/overlay` (systemd units, containerd and kernel
//!   settings, cloud-init's datasource list, and `capl-node-report`, which prints
//!   container restarts and the API server's liveness to the serial console so a
//!   failed run's console log shows them).
//!
//! The disk (`images/node/disk.sh`): an MBR, a FAT partition with syslinux, the
//! kernel and its initramfs, and an ext4 root written by `mkfs.ext4 -d`: no loop
//! devices, no mounts. It is cached at
//! `~/.cache/cluster-api-provider-libvirt/node-image/<kubernetes>-<key>/node.qcow2`,
//! where the key hashes every input: the pinned versions, every file of
//! `images/node` but its Markdown and this source file. Go binaries are cached per version under
//! `.../node-image/go/`, and the Debian root as a tarball under `.../node-image/debian-root/`
//! (keyed by `packages` and `rootfs.sh`; only the newest is kept). Needs root (mmdebstrap, chroot), Go, `mmdebstrap`,
//! `syslinux`, `syslinux-common`, `mtools`, `dosfstools`, `e2fsprogs`, `fdisk`, `qemu-utils`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::go_modules::{go_build, install_file, prepare_module};
use crate::{node_addons, short_hash};

// The versions file is also included by control_plane.rs (whose module is private);
// including it here keeps that file untouched.
use capl_testbed::control_plane_versions as versions;

use versions::{KUBERNETES_VERSION, NODE_TEST_IMAGE};

/// Release of `github.com/containerd/containerd/v2` built for the node.
pub const CONTAINERD_VERSION: &str = "v2.4.2";
/// The file name of the image inside its cache directory.
pub const IMAGE_FILE: &str = "node.qcow2";
/// The environment variable that overrides the cache root.
pub const CACHE_ENV: &str = capl_testbed::env::NODE_IMAGE_CACHE_DIR;

/// This file: part of the cache key, so that a change to how the image is built
/// never reuses an image built the old way.
const SELF_SOURCE: &str = include_str!("node_image.rs");
/// The add-on images' build and the Go build helpers: part of the cache key as well.
const ADDONS_SOURCE: &str = include_str!("node_addons.rs");
const GO_MODULES_SOURCE: &str = include_str!("go_modules.rs");

/// Commands of `k8s.io/kubernetes` built for the node (first three) and its images.
const KUBERNETES_COMMANDS: &[&str] =
    &["kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"];
/// Of those, the ones installed in the node's `/usr/local/bin`.
const NODE_COMMANDS: &[&str] = &["kubeadm", "kubelet", "kubectl"];
/// Commands of containerd installed in the node's `/usr/local/bin`.
const CONTAINERD_COMMANDS: &[&str] = &["containerd", "containerd-shim-runc-v2", "ctr"];

/// Files of the Debian root that kube-proxy's image needs besides its binary
/// (it runs iptables-restore, iptables-save, nft and conntrack). The
/// iptables commands are links to `xtables-nft-multi`, added by [`kube_proxy_layer`].
const KUBE_PROXY_TOOLS: &[&str] = &["/usr/sbin/xtables-nft-multi", "/usr/sbin/nft", "/usr/sbin/conntrack"];
const IPTABLES_LINKS: &[&str] = &[
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];
const XTABLES_DIR: &str = "/usr/lib/x86_64-linux-gnu/xtables";

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(clap::Args)]
pub struct Args {
    /// Build again even when the cached image exists.
    #[arg(long)]
    force: bool,
    /// The Kubernetes release of the node's kubeadm, kubelet, kubectl and control-plane
    /// images (`vX.Y.Z`, a release of `k8s.io/kubernetes` the Go module proxy serves).
    /// Default: the pinned release. The previous minor, which upgrade tests start from,
    /// is `PREVIOUS_KUBERNETES_VERSION` of the pinned versions.
    #[arg(long, default_value = KUBERNETES_VERSION)]
    kubernetes_version: String,
}

pub fn run(args: Args) -> Result<()> {
    let release = Release::parse(&args.kubernetes_version)?;
    let path = build_release(&release, args.force)?;
    println!("{}", path.display());
    Ok(())
}

/// The Kubernetes release a node image is built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// `vX.Y.Z` of `k8s.io/kubernetes`.
    pub version: String,
    /// Of its staging modules (`k8s.io/api`, `k8s.io/client-go`, ...): `v0.Y.Z`.
    pub staging: String,
    major: String,
    minor: String,
}

impl Release {
    /// The pinned release, the one the control plane and the flavors use.
    pub fn pinned() -> Self {
        Self::parse(KUBERNETES_VERSION).expect("the pinned Kubernetes version is vX.Y.Z")
    }

    /// `vX.Y.Z` (`X` = 1), as `kubeadm` and `clusterctl --kubernetes-version` spell it.
    pub fn parse(version: &str) -> Result<Self> {
        let numbers: Vec<&str> = version.strip_prefix('v').unwrap_or_default().split('.').collect();
        let valid =
            numbers.len() == 3 && numbers.iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !valid || numbers[0] != "1" {
            bail!(
                "--kubernetes-version {version:?} is not a Kubernetes release: write it as v1.Y.Z, e.g. {KUBERNETES_VERSION}"
            );
        }
        Ok(Self {
            version: version.to_string(),
            staging: format!("v0.{}.{}", numbers[1], numbers[2]),
            major: numbers[0].to_string(),
            minor: numbers[1].to_string(),
        })
    }
}

/// One image kubeadm will ask for: `registry.k8s.io/<name>:<tag>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageRef {
    /// As kubeadm prints it.
    full: String,
    /// The last path element: `kube-apiserver`, `etcd`, `coredns`, `pause`, ...
    name: String,
    tag: String,
}

fn parse_image_list(text: &str) -> Result<Vec<ImageRef>> {
    let mut images = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (repo, tag) = line.rsplit_once(':').with_context(|| format!("image {line:?} has no tag"))?;
        let name = repo.rsplit('/').next().unwrap_or(repo).to_string();
        images.push(ImageRef { full: line.to_string(), name, tag: tag.to_string() });
    }
    if images.is_empty() {
        bail!("`kubeadm config images list` printed no image");
    }
    Ok(images)
}

/// `3.6.8-0` (kubeadm's etcd tag) -> `v3.6.8` (the module version).
fn etcd_module_version(tag: &str) -> String {
    let base = tag.split('-').next().unwrap_or(tag);
    format!("v{}", base.trim_start_matches('v'))
}

/// Builds the image unless it is cached; returns the path of `node.qcow2`.
/// The node's Go binaries (Kubernetes, containerd, etcd, coredns, pause),
/// built once per version into the cache: their directory, the Go-side
/// settings of the shell, the image list kubeadm gave and the images to make.
pub struct GoBinaries {
    pub bin: PathBuf,
    pub list: String,
    images: Vec<ImageRef>,
}

/// Builds (or finds) the Go binaries the node image and the kind node image are made of.
pub fn go_binaries(release: &Release) -> Result<GoBinaries> {
    let hack = crate::repo_root().join("images/node");
    let cache = cache_root()?;
    let sh = go_shell()?;
    let version = &release.version;
    let go_dir = cache.join("go").join(format!("k8s-{version}_containerd-{CONTAINERD_VERSION}"));
    let bin = go_dir.join("bin");
    fs::create_dir_all(&bin)?;
    // `cargo xtask test` builds the node image and kind's node image in two
    // background jobs: the one that comes second waits here for the binaries
    // rather than building the same modules in the same directories. The
    // lock goes with the file, also when its process dies.
    let lock = fs::File::create(go_dir.join(".build.lock"))?;
    lock.lock().with_context(|| format!("locking {}", go_dir.display()))?;
    let go_started = Instant::now();
    build_kubernetes(&sh, release, &go_dir, &bin)?;
    build_containerd(&sh, &go_dir, &bin)?;
    let kubeadm = bin.join("kubeadm");
    let list = cmd!(sh, "{kubeadm} config images list --kubernetes-version {version}")
        .quiet()
        .read()
        .context("`kubeadm config images list` failed")?;
    let mut images = parse_image_list(&list)?;
    for image in &images {
        match image.name.as_str() {
            "etcd" => build_etcd(&sh, &go_dir, &bin, &etcd_module_version(&image.tag))?,
            "coredns" => build_coredns(&sh, &go_dir, &bin, &image.tag, &hack.join("coredns/main.go"))?,
            "pause" => build_pause(&sh, &go_dir, &bin, &hack.join("pause/main.go"))?,
            name if KUBERNETES_COMMANDS.contains(&name) => {}
            other => bail!("kubeadm asks for an image this builder does not know how to make: {other} ({image:?})"),
        }
    }
    images.extend(parse_image_list(NODE_TEST_IMAGE)?);
    eprintln!("node-image: Go binaries ready in {:.0?} ({})", go_started.elapsed(), bin.display());
    Ok(GoBinaries { bin, list, images })
}

/// A shell for Go builds: the machine's toolchain, no workspace, modules on.
fn go_shell() -> Result<Shell> {
    let sh = Shell::new()?;
    sh.set_var("GOTOOLCHAIN", "local");
    sh.set_var("GOWORK", "off");
    sh.set_var("GO111MODULE", "on");
    cmd!(sh, "go version").quiet().ignore_stdout().run().context("node-image needs the Go toolchain (`go` on PATH)")?;
    Ok(sh)
}

/// The image of the pinned Kubernetes release.
pub fn build(force: bool) -> Result<PathBuf> {
    build_release(&Release::pinned(), force)
}

/// The image of `release`: built, or found in the cache.
pub fn build_release(release: &Release, force: bool) -> Result<PathBuf> {
    let started = Instant::now();
    let repo = crate::repo_root();
    let hack = repo.join("images/node");
    let cache = cache_root()?;
    // 1. Go binaries, cached per version.
    let GoBinaries { bin, list, mut images } = go_binaries(release)?;
    let sh = go_shell()?;
    let addons = node_addons::build(&sh, &cache.join("go"))?;
    images.extend(parse_image_list(&node_addons::image_names())?);

    // 2. The cache key: versions, image list, every file of images/node but
    // its documentation (which changes no byte of the image), this file.
    let mut inputs = vec![
        NODE_TEST_IMAGE.to_string(),
        release.version.clone(),
        release.staging.clone(),
        CONTAINERD_VERSION.to_string(),
        list.clone(),
        SELF_SOURCE.to_string(),
        ADDONS_SOURCE.to_string(),
        GO_MODULES_SOURCE.to_string(),
    ];
    for (path, bytes) in files_under(&hack)?.into_iter().filter(|(path, _)| !path.ends_with(".md")) {
        inputs.push(path);
        inputs.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    let input_refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let key = format!("{}-{}", release.version, short_hash(&input_refs));
    let dir = cache.join(&key);
    let image = dir.join(IMAGE_FILE);
    if image.is_file() && !force {
        eprintln!("node-image: reusing {}", image.display());
        return Ok(image);
    }
    require_root_and_tools(&sh)?;
    // Not with_extension: the key has dots (v1.36.3-...).
    let work = cache.join(format!("{key}.partial"));
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    let root = work.join("root");

    // 3. Debian root directory: made by mmdebstrap, or unpacked from the tarball of the
    // last one made from the same package list and script (a change to the overlay or
    // the programs then costs seconds instead of a new mmdebstrap run).
    let t = Instant::now();
    let rootfs_sh = hack.join("rootfs.sh");
    let packages = hack.join("packages");
    let root_key = short_hash(&[&fs::read_to_string(&rootfs_sh)?, &fs::read_to_string(&packages)?]);
    let root_tar = cache.join("debian-root").join(format!("{root_key}.tar"));
    if root_tar.is_file() {
        fs::create_dir_all(&root)?;
        cmd!(sh, "tar -C {root} --numeric-owner -xpf {root_tar}")
            .quiet()
            .run()
            .context("unpacking the cached Debian root")?;
        eprintln!("node-image: Debian root unpacked from {} in {:.0?}", root_tar.display(), t.elapsed());
    } else {
        cmd!(sh, "{rootfs_sh} {packages} {root}").run().context("mmdebstrap (images/node/rootfs.sh) failed")?;
        eprintln!("node-image: Debian root in {:.0?}", t.elapsed());
        let dir = root_tar.parent().expect("has a parent");
        if dir.exists() {
            fs::remove_dir_all(dir)?; // only the newest root is kept
        }
        fs::create_dir_all(dir)?;
        let partial = dir.join(format!("{root_key}.tar.partial"));
        cmd!(sh, "tar -C {root} --numeric-owner -cpf {partial} .").quiet().run().context("saving the Debian root")?;
        fs::rename(&partial, &root_tar)?;
    }

    // 4. Our files, the node binaries and the container images.
    let t = Instant::now();
    let overlay = hack.join("overlay");
    cmd!(sh, "cp -a {overlay}/. {root}/").run().context("copying images/node/overlay")?;
    let pause = images.iter().find(|i| i.name == "pause").context("kubeadm names no pause image")?;
    let containerd_config = root.join("etc/containerd/config.toml");
    let text = fs::read_to_string(&containerd_config)?;
    fs::write(&containerd_config, text.replace("@PAUSE_IMAGE@", &pause.full))?;
    for name in NODE_COMMANDS.iter().chain(CONTAINERD_COMMANDS) {
        install_file(&bin.join(name), &root.join("usr/local/bin").join(name), 0o755)?;
    }
    let chroot_root = root.clone();
    for unit in ["containerd.service", "kubelet.service", "capl-node-report.service"] {
        cmd!(sh, "chroot {chroot_root} systemctl enable {unit}").quiet().run()?;
    }
    let archives_dir = work.join("archives");
    fs::create_dir_all(&archives_dir)?;
    let layers = work.join("layers");
    let mut archives = Vec::new();
    for image in &images {
        let layer = layers.join(&image.name);
        let entrypoint = image_layer(&sh, &root, &bin, &addons, image, &layer)?;
        let archive = archives_dir.join(format!("{}.tar", image.name));
        write_docker_archive(&sh, &layer, &image.full, &entrypoint, &archive, &work.join("archive"))?;
        archives.push(archive);
    }
    fs::remove_dir_all(&layers).ok();
    eprintln!("node-image: node files and {} image archives in {:.0?}", images.len(), t.elapsed());
    let t = Instant::now();
    preload_images(&sh, &bin, &root, &archives)?;
    fs::remove_dir_all(&archives_dir).ok();
    eprintln!("node-image: images imported into the node's containerd store in {:.0?}", t.elapsed());

    // 5. The disk.
    let t = Instant::now();
    let disk_sh = hack.join("disk.sh");
    let qcow2 = work.join(IMAGE_FILE);
    cmd!(sh, "{disk_sh} {root} {qcow2}").run().context("images/node/disk.sh failed")?;
    eprintln!("node-image: disk in {:.0?}", t.elapsed());
    fs::write(work.join("images.txt"), &list)?;
    cmd!(sh, "rm -rf {root}").quiet().run()?;
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::rename(&work, &dir)?;
    eprintln!("node-image: built {} in {:.0?}", image.display(), started.elapsed());
    Ok(image)
}

/// Where the Go builds of tools (not part of any image) go: beside the node
/// image's, under the same cache root.
pub fn go_cache_root() -> Result<PathBuf> {
    Ok(cache_root()?.join("go"))
}

fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set (or set CAPL_NODE_IMAGE_CACHE_DIR)")?)
            .join(".cache"),
    };
    Ok(cache.join("cluster-api-provider-libvirt/node-image"))
}

fn require_root_and_tools(sh: &Shell) -> Result<()> {
    let uid = cmd!(sh, "id -u").quiet().read()?;
    if uid.trim() != "0" {
        bail!("node-image runs mmdebstrap and chroot: run it as root");
    }
    let missing: Vec<&str> = ["mmdebstrap", "mkfs.fat", "mkfs.ext4", "sfdisk", "syslinux", "mcopy", "qemu-img"]
        .into_iter()
        .filter(|tool| {
            let check = format!("command -v {tool} || test -x /usr/sbin/{tool} || test -x /sbin/{tool}");
            cmd!(sh, "sh -c {check}").quiet().ignore_stdout().ignore_stderr().run().is_err()
        })
        .collect();
    if !missing.is_empty() || !Path::new("/usr/lib/syslinux/mbr/mbr.bin").is_file() {
        bail!(
            "node-image needs {} and /usr/lib/syslinux/mbr/mbr.bin: apt-get install mmdebstrap syslinux \
             syslinux-common mtools dosfstools e2fsprogs fdisk qemu-utils",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Every file under `dir`, by path relative to it, sorted.
fn files_under(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap_or(&path).to_string_lossy().into_owned();
                out.insert(rel, fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- Go builds

/// kubeadm, kubelet, kubectl and the control-plane commands from `k8s.io/kubernetes`.
///
/// Like `control_plane.rs`: the staging modules (`./staging/src/...` replaces in
/// kubernetes' go.mod) are replaced by their published versions. Built with the same
/// environment as the control plane's kube-apiserver (cgo as Go defaults) so that the
/// shared Go build cache is reused; the images carry the libc the binaries load.
fn build_kubernetes(sh: &Shell, release: &Release, go_dir: &Path, bin: &Path) -> Result<()> {
    let Release { version, staging: staging_version, major, minor } = release;
    if KUBERNETES_COMMANDS.iter().all(|c| bin.join(c).is_file()) {
        return Ok(());
    }
    let kubernetes = format!("k8s.io/kubernetes@{version}");
    let go_mod_path = {
        let _d = sh.push_dir(std::env::temp_dir());
        let json = cmd!(sh, "go mod download -json {kubernetes}").quiet().read()?;
        json.lines()
            .find_map(|l| l.trim().strip_prefix("\"GoMod\":"))
            .map(|v| v.trim().trim_end_matches(',').trim_matches('"').to_string())
            .with_context(|| format!("`go mod download -json {kubernetes}` printed no GoMod"))?
    };
    let upstream = fs::read_to_string(&go_mod_path)?;
    let staging: Vec<&str> = upstream
        .lines()
        .filter(|l| l.contains("=> ./staging/src/"))
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("replace").unwrap_or(l).split_whitespace().next()
        })
        .collect();
    if staging.is_empty() {
        bail!("the go.mod of {kubernetes} has no ./staging/src/ replace: update build_kubernetes");
    }
    let replaces: String = staging.iter().map(|m| format!("\t{m} => {m} {staging_version}\n")).collect();
    let go_mod = format!(
        "module capl.local/node-image/kubernetes\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n{replaces})\n"
    );
    let packages: Vec<String> = KUBERNETES_COMMANDS.iter().map(|c| format!("k8s.io/kubernetes/cmd/{c}")).collect();
    let package_refs: Vec<&str> = packages.iter().map(String::as_str).collect();
    let module = prepare_module(sh, go_dir, "kubernetes", &go_mod, &package_refs, &[])?;
    let mut ldflags = vec!["-s".to_owned(), "-w".to_owned()];
    for package in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
        for (var, value) in
            [("gitVersion", version.as_str()), ("gitMajor", major), ("gitMinor", minor), ("gitTreeState", "clean")]
        {
            ldflags.push(format!("-X {package}.{var}={value}"));
        }
    }
    let ldflags = ldflags.join(" ");
    for (command, package) in KUBERNETES_COMMANDS.iter().zip(&packages) {
        go_build(sh, &module, bin, command, package, &ldflags, false)?;
    }
    Ok(())
}

fn build_containerd(sh: &Shell, go_dir: &Path, bin: &Path) -> Result<()> {
    if CONTAINERD_COMMANDS.iter().all(|c| bin.join(c).is_file()) {
        return Ok(());
    }
    let go_mod = format!(
        "module capl.local/node-image/containerd\n\ngo 1.26.0\n\nrequire github.com/containerd/containerd/v2 {CONTAINERD_VERSION}\n"
    );
    let packages: Vec<String> =
        CONTAINERD_COMMANDS.iter().map(|c| format!("github.com/containerd/containerd/v2/cmd/{c}")).collect();
    let package_refs: Vec<&str> = packages.iter().map(String::as_str).collect();
    let module = prepare_module(sh, go_dir, "containerd", &go_mod, &package_refs, &[])?;
    let ldflags = format!(
        "-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION} \
         -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
    );
    for (command, package) in CONTAINERD_COMMANDS.iter().zip(&packages) {
        go_build(sh, &module, bin, command, package, &ldflags, true)?;
    }
    Ok(())
}

fn build_etcd(sh: &Shell, go_dir: &Path, bin: &Path, version: &str) -> Result<()> {
    if bin.join("etcd").is_file() {
        return Ok(());
    }
    let go_mod =
        format!("module capl.local/node-image/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {version}\n");
    let module = prepare_module(sh, go_dir, "etcd", &go_mod, &["go.etcd.io/etcd/server/v3"], &[])?;
    go_build(sh, &module, bin, "etcd", "go.etcd.io/etcd/server/v3", "-s -w", true)
}

fn build_coredns(sh: &Shell, go_dir: &Path, bin: &Path, version: &str, main_go: &Path) -> Result<()> {
    if bin.join("coredns").is_file() {
        return Ok(());
    }
    let main = fs::read_to_string(main_go).with_context(|| format!("reading {}", main_go.display()))?;
    let go_mod =
        format!("module capl.local/node-image/coredns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns {version}\n");
    let module = prepare_module(sh, go_dir, "coredns", &go_mod, &[], &[("main.go", main)])?;
    let ldflags = "-s -w -X github.com/coredns/coredns/coremain.GitCommit=capl-node-image";
    go_build(sh, &module, bin, "coredns", ".", ldflags, true)
}

fn build_pause(sh: &Shell, go_dir: &Path, bin: &Path, main_go: &Path) -> Result<()> {
    if bin.join("pause").is_file() {
        return Ok(());
    }
    let main = fs::read_to_string(main_go).with_context(|| format!("reading {}", main_go.display()))?;
    let module = prepare_module(
        sh,
        go_dir,
        "pause",
        "module capl.local/node-image/pause\n\ngo 1.26.0\n",
        &[],
        &[("main.go", main)],
    )?;
    go_build(sh, &module, bin, "pause", ".", "-s -w", true)
}

// ---------------------------------------------------------------- images

/// Fills `layer` with the image's files; returns its entrypoint (empty: the pod's
/// `command` names the binary, as kubeadm's manifests do).
fn image_layer(
    sh: &Shell,
    root: &Path,
    bin: &Path,
    addons: &node_addons::Binaries,
    image: &ImageRef,
    layer: &Path,
) -> Result<Vec<String>> {
    if layer.exists() {
        fs::remove_dir_all(layer)?;
    }
    fs::create_dir_all(layer.join("etc"))?;
    fs::create_dir_all(layer.join("tmp"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(layer.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    }
    fs::write(
        layer.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
    )?;
    fs::write(layer.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    fs::write(layer.join("etc/nsswitch.conf"), "hosts: files dns\n")?;
    let name = image.name.as_str();
    let tools = |files: &[String]| copy_shared_libraries(sh, root, layer, files);
    let iptables = || -> Result<Vec<String>> {
        kube_proxy_layer(root, layer)?;
        let mut files: Vec<String> = KUBE_PROXY_TOOLS.iter().map(|s| s.to_string()).collect();
        for entry in fs::read_dir(root.join(XTABLES_DIR.trim_start_matches('/')))? {
            let path = entry?.path();
            let rel = path.strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            files.push(format!("/{rel}"));
        }
        Ok(files)
    };
    if let Some(entrypoint) = node_addons::layer(name, addons, root, layer, &tools, &iptables)? {
        return Ok(entrypoint);
    }
    match name {
        "pause" => {
            install_file(&bin.join("pause"), &layer.join("pause"), 0o755)?;
            Ok(vec!["/pause".into()])
        }
        "coredns" => {
            install_file(&bin.join("coredns"), &layer.join("coredns"), 0o755)?;
            Ok(vec!["/coredns".into()])
        }
        "busybox" => {
            // Statically linked: no libraries to copy.
            install_file(&root.join("bin/busybox"), &layer.join("bin/busybox"), 0o755)?;
            std::os::unix::fs::symlink("busybox", layer.join("bin/sh"))?;
            Ok(vec!["/bin/sh".into()])
        }
        "etcd" => {
            install_file(&bin.join("etcd"), &layer.join("usr/local/bin/etcd"), 0o755)?;
            Ok(vec![])
        }
        _ => {
            let target = layer.join("usr/local/bin").join(name);
            install_file(&bin.join(name), &target, 0o755)?;
            let mut needs_libs = vec![format!("/usr/local/bin/{name}")];
            if name == "kube-proxy" {
                needs_libs.extend(iptables()?);
            }
            copy_shared_libraries(sh, root, layer, &needs_libs)?;
            Ok(vec![format!("/usr/local/bin/{name}")])
        }
    }
}

/// iptables (nft backend), nft and conntrack from the Debian root.
fn kube_proxy_layer(root: &Path, layer: &Path) -> Result<()> {
    for tool in KUBE_PROXY_TOOLS {
        let rel = tool.trim_start_matches('/');
        install_file(&root.join(rel), &layer.join(rel), 0o755)?;
    }
    for link in IPTABLES_LINKS {
        let path = layer.join("usr/sbin").join(link);
        std::os::unix::fs::symlink("xtables-nft-multi", &path)
            .with_context(|| format!("linking {}", path.display()))?;
    }
    let xtables = XTABLES_DIR.trim_start_matches('/');
    fs::create_dir_all(layer.join(xtables))?;
    for entry in fs::read_dir(root.join(xtables))? {
        let path = entry?.path();
        install_file(&path, &layer.join(xtables).join(path.file_name().expect("a file")), 0o644)?;
    }
    Ok(())
}

/// Copies into `layer` every shared library the files (paths inside the layer, or
/// inside the Debian root when not in the layer) load, as the root's `ldd` resolves them.
fn copy_shared_libraries(sh: &Shell, root: &Path, layer: &Path, files: &[String]) -> Result<()> {
    let probe = root.join("tmp/capl-ldd");
    fs::create_dir_all(&probe)?;
    let mut libs = std::collections::BTreeSet::new();
    for (i, file) in files.iter().enumerate() {
        let rel = file.trim_start_matches('/');
        let in_layer = layer.join(rel);
        let inside = if in_layer.is_file() {
            let copy = probe.join(format!("f{i}"));
            fs::copy(&in_layer, &copy)?;
            format!("/tmp/capl-ldd/f{i}")
        } else {
            file.clone()
        };
        let out = cmd!(sh, "chroot {root} ldd {inside}").quiet().ignore_status().output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("not found") {
            bail!("ldd in the node root cannot resolve every library of {file}:\n{text}");
        }
        for line in text.lines() {
            let line = line.trim();
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
            };
            if let Some(path) = path.filter(|p| p.starts_with('/')) {
                libs.insert(path.to_string());
            }
        }
    }
    fs::remove_dir_all(&probe).ok();
    for lib in libs {
        let rel = lib.trim_start_matches('/');
        // Follows symbolic links (merged /usr: /lib -> usr/lib) inside the root.
        let source = resolve_in_root(root, rel)?;
        install_file(&source, &layer.join(rel), 0o755)?;
    }
    Ok(())
}

/// The real file of `rel` inside `root`, following absolute and relative links
/// within the root (never the host's).
fn resolve_in_root(root: &Path, rel: &str) -> Result<PathBuf> {
    let mut current = PathBuf::new();
    let mut parts: Vec<String> = rel.split('/').filter(|p| !p.is_empty()).map(str::to_string).rev().collect();
    let mut hops = 0;
    while let Some(part) = parts.pop() {
        if part == ".." {
            current.pop();
            continue;
        }
        if part == "." {
            continue;
        }
        let candidate = current.join(&part);
        let full = root.join(&candidate);
        match fs::read_link(&full) {
            Ok(target) => {
                hops += 1;
                if hops > 40 {
                    bail!("too many links resolving {rel} in {}", root.display());
                }
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    current = PathBuf::new();
                }
                for p in target.split('/').filter(|p| !p.is_empty()).rev() {
                    parts.push(p.to_string());
                }
            }
            Err(_) => current = candidate,
        }
    }
    let full = root.join(&current);
    if !full.is_file() {
        bail!("{rel} is not a file in {}", root.display());
    }
    Ok(full)
}

/// Imports the image archives into the node root's containerd store
/// (`<root>/var/lib/containerd`, namespace `k8s.io`, unpacked for the overlayfs
/// snapshotter), with the node's own containerd and ctr run on the build host.
///
/// The containerd here has the CRI plugins disabled (the guest's CRI plugin lists the
/// `k8s.io` images when it starts, so nothing of CRI has to be prepared here), its
/// state and socket in a short-lived directory under /tmp (a unix socket path must
/// stay under 108 bytes), and is stopped before the disk is written.
fn preload_images(sh: &Shell, bin: &Path, root: &Path, archives: &[PathBuf]) -> Result<()> {
    let store = root.join("var/lib/containerd");
    if store.exists() {
        bail!("{} exists before the images are imported: the Debian root is not fresh", store.display());
    }
    fs::create_dir_all(&store)?;
    let daemon_dir = std::env::temp_dir().join(format!("capl-node-image-{}", std::process::id()));
    if daemon_dir.exists() {
        fs::remove_dir_all(&daemon_dir)?;
    }
    fs::create_dir_all(&daemon_dir)?;
    let address = daemon_dir.join("containerd.sock");
    let config = daemon_dir.join("config.toml");
    fs::write(
        &config,
        format!(
            "version = 3\nroot = {}\nstate = {}\n\
             disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.images', \
             'io.containerd.cri.v1.runtime', 'io.containerd.nri.v1.nri']\n\n[grpc]\n  address = {}\n",
            toml_string(&store),
            toml_string(&daemon_dir.join("state")),
            toml_string(&address)
        ),
    )?;
    let log_path = daemon_dir.join("containerd.log");
    let log = fs::File::create(&log_path)?;
    let child = std::process::Command::new(bin.join("containerd"))
        .arg("--config")
        .arg(&config)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting containerd on the build host")?;
    let mut daemon = Daemon(Some(child));
    let ctr = bin.join("ctr");
    let started = Instant::now();
    while cmd!(sh, "{ctr} --address {address} version").quiet().ignore_stdout().ignore_stderr().run().is_err() {
        if let Some(status) = daemon.0.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            bail!("containerd exited ({status}) before it answered:\n{}", fs::read_to_string(&log_path)?);
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            bail!(
                "containerd did not answer on {} within 60 s:\n{}",
                address.display(),
                fs::read_to_string(&log_path)?
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for archive in archives {
        cmd!(
            sh,
            "{ctr} --address {address} --namespace k8s.io images import --local --snapshotter overlayfs {archive}"
        )
        .quiet()
        .ignore_stdout()
        .run()
        .with_context(|| format!("importing {} into the node's containerd", archive.display()))?;
    }
    let listed = cmd!(sh, "{ctr} --address {address} --namespace k8s.io images list --quiet").quiet().read()?;
    daemon.stop()?;
    fs::remove_dir_all(&daemon_dir).ok();
    eprintln!("node-image: the node's containerd holds:\n{listed}");
    Ok(())
}

/// A containerd started by [`preload_images`]: stopped with SIGTERM (and waited for)
/// when dropped, so an error never leaves it running.
struct Daemon(Option<std::process::Child>);

impl Daemon {
    fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.0.take() {
            let pid = child.id().to_string();
            let _ = std::process::Command::new("kill").args(["-TERM", &pid]).status();
            let status = child.wait()?;
            if !status.success() && status.code().is_some() {
                bail!("containerd on the build host exited with {status}");
            }
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

fn toml_string(path: &Path) -> String {
    json_string(&path.to_string_lossy())
}

/// A docker archive (`docker save` layout; `ctr images import` reads it) with one layer.
fn write_docker_archive(
    sh: &Shell,
    layer: &Path,
    name: &str,
    entrypoint: &[String],
    archive: &Path,
    scratch: &Path,
) -> Result<()> {
    if scratch.exists() {
        fs::remove_dir_all(scratch)?;
    }
    fs::create_dir_all(scratch)?;
    let layer_tar = scratch.join("layer.tar");
    cmd!(
        sh,
        "tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C {layer} -cf {layer_tar} ."
    )
    .quiet()
    .run()?;
    let diff_id = sha256(sh, &layer_tar)?;
    let layer_dir = scratch.join(&diff_id);
    fs::create_dir_all(&layer_dir)?;
    fs::rename(&layer_tar, layer_dir.join("layer.tar"))?;
    let entrypoint_json = if entrypoint.is_empty() {
        "null".to_string()
    } else {
        format!("[{}]", entrypoint.iter().map(|e| json_string(e)).collect::<Vec<_>>().join(","))
    };
    let config = format!(
        "{{\"architecture\":\"amd64\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\
         \"config\":{{\"Env\":[{}],\"Entrypoint\":{entrypoint_json},\"WorkingDir\":\"/\"}},\
         \"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[\"sha256:{diff_id}\"]}},\
         \"history\":[{{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"cargo xtask node-image\"}}]}}",
        json_string(PATH_ENV)
    );
    let config_file = scratch.join("config.json");
    fs::write(&config_file, &config)?;
    let config_id = sha256(sh, &config_file)?;
    fs::rename(&config_file, scratch.join(format!("{config_id}.json")))?;
    let manifest = format!(
        "[{{\"Config\":\"{config_id}.json\",\"RepoTags\":[{}],\"Layers\":[\"{diff_id}/layer.tar\"]}}]",
        json_string(name)
    );
    fs::write(scratch.join("manifest.json"), manifest)?;
    let config_name = format!("{config_id}.json");
    cmd!(
        sh,
        "tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C {scratch} -cf {archive} manifest.json {config_name} {diff_id}"
    )
    .quiet()
    .run()?;
    fs::remove_dir_all(scratch)?;
    Ok(())
}

fn sha256(sh: &Shell, file: &Path) -> Result<String> {
    let out = cmd!(sh, "sha256sum {file}").quiet().read()?;
    Ok(out.split_whitespace().next().context("sha256sum printed nothing")?.to_string())
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadm_image_list_is_parsed_into_names_and_tags() {
        let list = "registry.k8s.io/kube-apiserver:v1.36.3\nregistry.k8s.io/coredns/coredns:v1.14.2\n\
                    registry.k8s.io/pause:3.10.2\nregistry.k8s.io/etcd:3.6.8-0\n";
        let images = parse_image_list(list).unwrap();
        assert_eq!(images.len(), 4);
        assert_eq!(images[1].name, "coredns");
        assert_eq!(images[1].tag, "v1.14.2");
        assert_eq!(images[1].full, "registry.k8s.io/coredns/coredns:v1.14.2");
        assert_eq!(etcd_module_version(&images[3].tag), "v3.6.8");
        assert!(parse_image_list("\n").is_err());
        assert!(parse_image_list("registry.k8s.io/notag").is_err());
    }

    #[test]
    fn links_resolve_inside_the_root_only() {
        let root = std::env::temp_dir().join(format!("capl-node-resolve-{}", std::process::id()));
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::write(root.join("usr/lib/x86_64-linux-gnu/libc.so.6"), b"elf").unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        fs::create_dir_all(root.join("lib64-real")).unwrap();
        std::os::unix::fs::symlink("/lib/x86_64-linux-gnu/libc.so.6", root.join("lib64-real/abs")).unwrap();
        assert_eq!(
            resolve_in_root(&root, "lib/x86_64-linux-gnu/libc.so.6").unwrap(),
            root.join("usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(resolve_in_root(&root, "lib64-real/abs").unwrap(), root.join("usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(resolve_in_root(&root, "lib/missing.so").is_err());
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_release_is_read_with_its_staging_version() {
        let release = Release::parse("v1.35.4").unwrap();
        assert_eq!((release.version.as_str(), release.staging.as_str()), ("v1.35.4", "v0.35.4"));
        assert_eq!((release.major.as_str(), release.minor.as_str()), ("1", "35"));
        for bad in ["1.35.4", "v1.35", "v2.0.0", "v1.35.x", "v1..4", ""] {
            let err = Release::parse(bad).unwrap_err().to_string();
            assert!(err.contains("write it as v1.Y.Z"), "{bad}: {err}");
        }
        assert_eq!(Release::pinned().version, KUBERNETES_VERSION);
        let previous = Release::parse(versions::PREVIOUS_KUBERNETES_VERSION).unwrap();
        assert_eq!(previous.minor.parse::<u32>().unwrap() + 1, Release::pinned().minor.parse::<u32>().unwrap());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
