//! A workload cluster's manifest as a user makes it: `clusterctl generate
//! cluster` against the release of this checkout, with only the variables the
//! flavors document, then `kubectl apply`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use testenv::control_plane_versions::KUBERNETES_VERSION;
use testenv::test_host::{TLS_CA_CERT, TLS_PORT};

use super::cluster::CLUSTER;
use crate::harness::clusterctl::LocalRepository;
use crate::harness::file_server::FileServer;
use crate::harness::stack::{Stack, TEST_BASE_POOL, TEST_DISK_POOL, TEST_NETWORK};

/// The environment variable with the node image's path (`cargo xtask node-image` prints it).
pub const NODE_IMAGE_ENV: &str = capl_testbed::env::NODE_IMAGE;
/// The release clusterctl renders the template from.
const RELEASE_VERSION: &str = "v0.1.0";

/// Which of the release's flavors a workload cluster is rendered from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Flavor {
    /// `cluster-template-allocated-endpoint.yaml`: the default flavor (a
    /// KubeadmControlPlane and a MachineDeployment) with the
    /// endpoint allocated from the libvirt network by the provider.
    AllocatedEndpoint,
}

impl Flavor {
    /// The name `clusterctl generate cluster --flavor` takes, `None` for the default.
    pub(crate) fn name(self) -> Option<&'static str> {
        match self {
            Flavor::AllocatedEndpoint => Some("allocated-endpoint"),
        }
    }
}

/// Serves the node image (`$CAPL_NODE_IMAGE`) over HTTP on 127.0.0.1, renders
/// `flavor` with `clusterctl generate cluster` for cluster [`CLUSTER`] (one
/// control-plane machine, no worker) in `ns` with the image named by its URL
/// and checksum, and applies it with `kubectl apply`, as a user does. The
/// returned server must live until every machine has its disk.
pub(crate) fn apply_flavor(stack: &Stack, ns: &str, flavor: Flavor, say: &dyn Fn(String)) -> Result<ServedImage> {
    let image_path = std::env::var_os(NODE_IMAGE_ENV).map(PathBuf::from).with_context(|| {
        format!(
            "a workload cluster needs the Kubernetes node image: run `cargo xtask node-image` (as root) and set \
             {NODE_IMAGE_ENV} to the path it prints (`cargo xtask e2e` and `cargo xtask demo` do both)"
        )
    })?;
    let t = Instant::now();
    let image = ServedImage::start(stack, &image_path)?;
    say(format!(
        "node image served at {} (sha256 {}; {:.0} s), the provider downloads it into pool {TEST_BASE_POOL} as {}{}",
        image.url(),
        image.checksum,
        t.elapsed().as_secs_f64(),
        image.volume,
        if image.was_there { ", which an earlier cluster left there" } else { "" },
    ));
    let manifest = generate_cluster(stack, ns, &image, flavor)?;
    kubectl_apply(stack, None, &manifest)?;
    let flavor_arg = flavor.name().map(|f| format!(" --flavor {f}")).unwrap_or_default();
    let endpoint = match flavor {
        Flavor::AllocatedEndpoint => "allocated by the provider",
    };
    say(format!(
        "clusterctl generate cluster {CLUSTER}{flavor_arg} | kubectl apply: {} (1 control-plane machine, no worker yet, endpoint {endpoint})",
        manifest.display(),
    ));
    Ok(image)
}

/// The node image as a user offers it: a file on a web server, named in the
/// flavor by URL and sha256.
pub(crate) struct ServedImage {
    server: FileServer,
    checksum: String,
    /// The base-pool volume the provider downloads it to, named after its checksum.
    pub(crate) volume: String,
    /// The volume was in the base pool before this cluster (left by an earlier
    /// one): the provider must use it without downloading.
    pub(crate) was_there: bool,
}

impl ServedImage {
    fn start(stack: &Stack, file: &Path) -> Result<Self> {
        let checksum = sha256_of(file)?;
        // The provider's name for the downloaded image.
        let volume = capl_host::naming::image_volume_name("sha256", &checksum, "qcow2");
        let was_there = stack.libvirt()?.volume_exists(TEST_BASE_POOL, &volume);
        Ok(Self { server: FileServer::start(file)?, checksum, volume, was_there })
    }

    pub(crate) fn url(&self) -> String {
        self.server.url()
    }

    /// What a user expects once the machines run: the provider downloaded the
    /// image once for all of them (not at all when it was in the base pool
    /// before, left by an earlier cluster).
    pub(crate) fn check_downloaded(&self) -> Result<String> {
        let (gets, expected) = (self.server.gets(), u64::from(!self.was_there));
        ensure!(
            gets == expected,
            "the node image was downloaded {gets} times for this cluster, expected {expected} (once per host and \
             pool{})",
            if self.was_there { ", and not at all while its volume exists" } else { "" }
        );
        Ok(if self.was_there {
            format!("node image {} used from pool {TEST_BASE_POOL} without downloading it again", self.volume)
        } else {
            format!("node image downloaded once into pool {TEST_BASE_POOL} as {} for both machines", self.volume)
        })
    }
}

/// The sha256 of a file as `sha256sum` prints it.
pub(crate) fn sha256_of(file: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(file)
        .with_context(|| format!("the node image {} is missing: run `cargo xtask node-image`", file.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", file.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// base64 of `bytes`, as Kubernetes writes Secret data.
pub(crate) fn base64(bytes: &[u8]) -> Result<String> {
    let value = serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec()))?;
    value.as_str().map(str::to_string).context("ByteString did not serialize to a string")
}

/// Runs `clusterctl generate cluster` against the release of this checkout
/// with the variables a user sets for the private libvirtd; checks that
/// `--list-variables` lists every variable without a default it needed.
fn generate_cluster(stack: &Stack, ns: &str, image: &ServedImage, flavor: Flavor) -> Result<PathBuf> {
    let dir = stack.work_dir.join(match flavor {
        Flavor::AllocatedEndpoint => "workload-allocated-endpoint",
    });
    let repository = LocalRepository::release(&dir.join("repository"), RELEASE_VERSION)?;
    let ca = std::fs::read(TLS_CA_CERT)
        .with_context(|| format!("reading {TLS_CA_CERT}: start the private libvirtd with `cargo xtask host up`"))?;
    let signer = testenv::remote_access::host_ca()?;
    let (cert, key) = signer.client_cert("capl-e2e-workload", "capl-e2e")?;
    let infrastructure = format!("libvirt:{RELEASE_VERSION}");
    let kubeconfig = stack.management.kubeconfig_path().display().to_string();
    let mut generate = vec![
        "generate",
        "cluster",
        CLUSTER,
        "--infrastructure",
        &infrastructure,
        "--target-namespace",
        ns,
        "--kubeconfig",
        &kubeconfig,
    ];
    if let Some(name) = flavor.name() {
        generate.extend(["--flavor", name]);
    }
    let listed = repository.clusterctl(&[&generate[..], &["--list-variables"]].concat())?;
    let mut variables: Vec<(&str, String)> = vec![
        ("CAPL_LIBVIRT_URI", format!("qemu+tls://127.0.0.1:{TLS_PORT}/system")),
        ("CAPL_TLS_CA_CRT_B64", base64(&ca)?),
        ("CAPL_TLS_CLIENT_CRT_B64", base64(cert.as_bytes())?),
        ("CAPL_TLS_CLIENT_KEY_B64", base64(key.as_bytes())?),
        ("CAPL_IMAGE_URL", image.url()),
        ("CAPL_IMAGE_CHECKSUM", image.checksum.clone()),
        ("CAPL_NETWORK", TEST_NETWORK.to_string()),
        ("CAPL_BASE_POOL", TEST_BASE_POOL.to_string()),
        ("CAPL_DOMAIN_POOL", TEST_DISK_POOL.to_string()),
    ];
    match flavor {
        // The provider picks the address: the flavor asks for none.
        Flavor::AllocatedEndpoint => ensure!(
            !listed.contains("CAPL_CONTROL_PLANE_ENDPOINT_HOST"),
            "the allocated-endpoint flavor must not need CAPL_CONTROL_PLANE_ENDPOINT_HOST:\n{listed}"
        ),
    }
    // Guests whose CPUs QEMU emulates share 2 host cores: a worker with one vCPU
    // leaves the control plane (2 vCPUs) enough to keep answering.
    variables.push(("CAPL_WORKER_VCPU", "1".to_string()));
    for (name, _) in &variables {
        ensure!(
            listed.contains(name),
            "`clusterctl generate cluster --list-variables` does not list {name}, which the template uses:\n{listed}"
        );
    }
    let args = [
        &generate[..],
        &[
            "--kubernetes-version",
            KUBERNETES_VERSION,
            "--control-plane-machine-count",
            "1",
            // Without workers: the control plane is checked Available while it is
            // the only guest, then the workers are scaled up.
            "--worker-machine-count",
            "0",
        ],
    ]
    .concat();
    let env: Vec<(&str, &str)> = variables.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let rendered = repository.clusterctl_env(&args, &env)?;
    // What only this rig's emulated machines need (not in templates/).
    let rendered = super::emulation::patch_manifest(&rendered)?;
    let path = dir.join("cluster.yaml");
    std::fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `kubectl apply -f manifest` to the management cluster, into `namespace` when given.
pub(crate) fn kubectl_apply(stack: &Stack, namespace: Option<&str>, manifest: &Path) -> Result<()> {
    let kubectl = testenv::Assets::locate()?.kubectl().context("kubectl is not in the control-plane directory")?;
    let mut command = std::process::Command::new(&kubectl);
    command.arg("--kubeconfig").arg(stack.management.kubeconfig_path()).args(["apply", "--request-timeout=60s"]);
    if let Some(namespace) = namespace {
        command.args(["-n", namespace]);
    }
    let output = command.arg("-f").arg(manifest).output().with_context(|| format!("running {}", kubectl.display()))?;
    if !output.status.success() {
        bail!("kubectl apply -f {} failed: {}", manifest.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}
