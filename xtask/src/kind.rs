//! kind without a registry or privileged containers: the kind binary from its
//! Go module, a node image made here (`cargo xtask kind-node-image`), and the
//! docker wrapper kind runs through (`hack/kind`).
//!
//! - **kind** [`KIND_VERSION`] is `go install`ed from the Go module proxy into
//!   `~/.cache/cluster-api-provider-libvirt/kind/`.
//! - **The node image** (`hack/kind/node-image.sh`): a Debian bookworm root
//!   (`hack/kind/packages`, by mmdebstrap, cached as a tarball), kind's
//!   base-image files from its module (entrypoint, systemd units,
//!   `/kind/bin`), containerd, kubeadm, kubelet and kubectl from `cargo xtask
//!   node-image`'s Go builds, a static bridge CNI config (one node, so kind's
//!   kindnetd image is not needed), and the control-plane images preloaded into
//!   the node's containerd; `docker import`ed as
//!   [`NODE_IMAGE_NAME`]`:<kubernetes>-<key>`, the key hashing `hack/kind` and
//!   the versions. The kubelet runs with `--fail-cgroupv1=false` (these hosts
//!   are on cgroup v1).
//! - **`--privileged`**: kind starts its nodes privileged, which fails on hosts
//!   whose capability bounding set lacks `CAP_SYS_RESOURCE`. kind runs `docker`
//!   from PATH, so `hack/kind/docker-wrapper`, installed as `docker` in a
//!   directory put first on kind's PATH, turns `--privileged` into the
//!   capabilities of the bounding set, unmasked `/proc` and `/sys` paths,
//!   `/dev/kmsg` and `/dev/fuse` and an allow-all device rule; the node image's
//!   entrypoint remounts the cgroup v1 hierarchies read-write (docker mounts
//!   them read-only without `--privileged`).

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::node_image::{self, CONTAINERD_VERSION};
use crate::{docker_engine, images, repo_root, short_hash, target_dir};

use capl_testbed::control_plane_versions as versions;
use versions::KUBERNETES_VERSION;

/// The kind release built from its Go module.
pub const KIND_VERSION: &str = "v0.33.0";
/// The repository (name) of the kind node image; the tag is `<kubernetes>-<key>`.
pub const NODE_IMAGE_NAME: &str = "capl.local/kind-node";

/// What a kind run needs: the binary, the node image, and the directory to put
/// first on kind's PATH (its `docker` is the wrapper) with the real client.
pub struct Kind {
    pub binary: PathBuf,
    pub node_image: String,
    pub wrapper_dir: PathBuf,
    pub real_docker: PathBuf,
}

/// `cargo xtask kind-node-image`: prints the node image's name.
pub fn node_image_command() -> Result<()> {
    docker_engine::up()?;
    println!("{}", node_image()?);
    Ok(())
}

/// Everything a kind run needs, built or found.
pub fn prepare() -> Result<Kind> {
    docker_engine::up()?;
    let binary = kind_binary()?;
    let node_image = node_image()?;
    let (wrapper_dir, real_docker) = wrapper()?;
    Ok(Kind { binary, node_image, wrapper_dir, real_docker })
}

fn cache_dir() -> Result<PathBuf> {
    crate::paths::user_cache("kind", "kind")
}

/// kind, `go install`ed once per version.
pub fn kind_binary() -> Result<PathBuf> {
    let dir = cache_dir()?.join(KIND_VERSION);
    let binary = dir.join("kind");
    if binary.is_file() {
        return Ok(binary);
    }
    fs::create_dir_all(&dir)?;
    let sh = Shell::new()?;
    sh.set_var("GOBIN", &dir);
    sh.set_var("GOFLAGS", "-mod=mod");
    let module = format!("sigs.k8s.io/kind@{KIND_VERSION}");
    cmd!(sh, "go install {module}").run().with_context(|| format!("go install {module}"))?;
    Ok(binary)
}

/// kind's module directory (its `images/base/files`).
fn kind_source(sh: &Shell) -> Result<PathBuf> {
    crate::go_modules::module_dir(sh, &format!("sigs.k8s.io/kind@{KIND_VERSION}"))
}

/// The wrapper directory (`docker` = `hack/kind/docker-wrapper`) and the real client.
fn wrapper() -> Result<(PathBuf, PathBuf)> {
    let sh = Shell::new()?;
    let real = cmd!(sh, "sh -c 'command -v docker'").quiet().read().context("no docker client on PATH")?;
    let dir = target_dir().join("tmp/kind-docker-wrapper");
    fs::create_dir_all(&dir)?;
    let wrapper = dir.join("docker");
    fs::copy(repo_root().join("hack/kind/docker-wrapper"), &wrapper)?;
    Ok((dir, PathBuf::from(real.trim())))
}

/// The node image, built unless the engine has it.
pub fn node_image() -> Result<String> {
    let hack = repo_root().join("hack/kind");
    let key = images::dir_key(&hack, &[KUBERNETES_VERSION, KIND_VERSION, CONTAINERD_VERSION])?;
    let image = format!("{NODE_IMAGE_NAME}:{KUBERNETES_VERSION}-{key}");
    let sh = Shell::new()?;
    if images::image_exists(&sh, &image) {
        eprintln!("kind-node-image: {image} is in the engine");
        return Ok(image);
    }
    let started = Instant::now();
    let go = node_image::go_binaries(&node_image::Release::pinned())?;
    let packages = fs::read_to_string(hack.join("packages"))?;
    let rootfs = cache_dir()?.join("debian-root").join(format!("{}.tar", short_hash(&[&packages])));
    let work = target_dir().join("tmp/kind-node-image");
    sh.set_var("IMAGE", &image);
    sh.set_var("K8S_VERSION", KUBERNETES_VERSION);
    sh.set_var("KIND_SRC", kind_source(&sh)?);
    sh.set_var("BIN", &go.bin);
    sh.set_var("WORK", &work);
    sh.set_var("ROOTFS_TAR", &rootfs);
    let script = hack.join("node-image.sh");
    if cmd!(sh, "bash {script}").run().is_err() {
        bail!("building the kind node image {image} failed (hack/kind/node-image.sh; output above)");
    }
    let _ = fs::remove_dir_all(&work);
    eprintln!("kind-node-image: built {image} in {:.0?}", started.elapsed());
    Ok(image)
}
