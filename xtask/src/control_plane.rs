//! `cargo xtask control-plane ...`: builds the local control plane (etcd,
//! kube-apiserver, kubectl, CAPI) for the tests from Go modules.
//!
//! Nothing can be downloaded as a binary on our machines, but the Go module proxy is
//! reachable, so `kube-apiserver`, `kubectl`, `etcd`, the Cluster API core manager, CAPI's
//! kubeadm bootstrap (CABPK) and control plane (KCP) managers, `clusterctl` and CAPI's
//! in-cluster IPAM provider manager are built from their modules with the machine's Go
//! toolchain, at the versions pinned in
//! `testbed/src/control_plane_versions.rs` (shared with the `testenv` crate, which runs them).
//!
//! The result is a directory in envtest layout (what `KUBEBUILDER_ASSETS` points to):
//!
//! ```text
//! <dir>/kube-apiserver  <dir>/etcd  <dir>/kubectl  <dir>/capi-manager  <dir>/capi-crds/*.yaml
//! <dir>/capi-kubeadm-bootstrap-manager  <dir>/capi-kubeadm-control-plane-manager  <dir>/clusterctl
//! <dir>/capi-webhooks/{core,kubeadm-bootstrap,kubeadm-control-plane}.yaml   config/webhook manifests
//! <dir>/kustomize                                       sigs.k8s.io/kustomize/kustomize/v5
//! <dir>/capi-repository/<label>/<version>/{<components>.yaml,metadata.yaml}
//!                                                       CAPI's release components (clusterctl local repositories)
//! <dir>/cert-manager-crds/*.yaml                        cert-manager's CRDs (deploy/crds of its module)
//! <dir>/capi-ipam-in-cluster-manager                    sigs.k8s.io/cluster-api-ipam-provider-in-cluster
//! <dir>/ipam-crds/*.yaml                                its pool CRDs (config/crd/bases of its module)
//! <dir>/src/{kubernetes,etcd,capi,capi-providers,kustomize,ipam}/
//!                                                       the generated Go modules (go.mod, go.sum, tools.go)
//! ```
//!
//! `<dir>` is `$CAPL_CONTROL_PLANE_DIR`, or `~/.cache/cluster-api-provider-libvirt/control-plane/<version-key>`.
//! The command is idempotent: what exists is not built again, and what is missing (for example
//! the kubeadm providers or the IPAM provider in a directory made before they were added) is
//! built on its own.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use capl_testbed::control_plane_versions as versions;

use versions::{
    CAPI_CRDS_DIR, CAPI_KUBEADM_BOOTSTRAP_MANAGER_BIN, CAPI_KUBEADM_CONTROL_PLANE_MANAGER_BIN, CAPI_MANAGER_BIN,
    CAPI_RELEASE_PROVIDERS, CAPI_RELEASE_REGISTRY, CAPI_REPOSITORY_DIR, CAPI_VERSION, CAPI_WEBHOOK_MANIFESTS,
    CAPI_WEBHOOKS_DIR, CERT_MANAGER_CRDS_DIR, CERT_MANAGER_VERSION, CLUSTERCTL_BIN, ETCD_BIN, ETCD_VERSION,
    IPAM_CRDS_DIR, IPAM_IN_CLUSTER_MANAGER_BIN, IPAM_IN_CLUSTER_VERSION, KUBE_APISERVER_BIN, KUBEBUILDER_ASSETS_ENV,
    KUBECTL_BIN, KUBERNETES_STAGING_VERSION, KUBERNETES_VERSION, KUSTOMIZE_BIN, KUSTOMIZE_VERSION,
};

/// The binaries built from the root module of `sigs.k8s.io/cluster-api` besides the core
/// manager, and their packages. At v1.14 `bootstrap/kubeadm`, `controlplane/kubeadm` and
/// `cmd/clusterctl` are packages of the root module (only `api` is a module of its own).
const CAPI_PROVIDER_COMMANDS: &[(&str, &str)] = &[
    (CAPI_KUBEADM_BOOTSTRAP_MANAGER_BIN, "sigs.k8s.io/cluster-api/bootstrap/kubeadm"),
    (CAPI_KUBEADM_CONTROL_PLANE_MANAGER_BIN, "sigs.k8s.io/cluster-api/controlplane/kubeadm"),
    (CLUSTERCTL_BIN, "sigs.k8s.io/cluster-api/cmd/clusterctl"),
];

/// The module of CAPI's in-cluster IPAM provider. Its manager is the module's root package
/// (`main.go` at the root, no `cmd/`).
const IPAM_IN_CLUSTER_MODULE: &str = "sigs.k8s.io/cluster-api-ipam-provider-in-cluster";

/// The marker of a staging module in kubernetes' go.mod: `k8s.io/api => ./staging/src/k8s.io/api`.
const STAGING_REPLACE_MARKER: &str = "=> ./staging/src/";

#[derive(clap::Subcommand)]
pub enum Command {
    /// Build (or reuse) kube-apiserver, etcd, kubectl, the CAPI core manager, the kubeadm
    /// bootstrap and control plane managers, clusterctl, kustomize, CAPI's CRDs, webhook
    /// manifests and release components, cert-manager's CRDs, and the in-cluster IPAM
    /// provider's manager and CRDs, then print their directory.
    Build,
    /// Print the control-plane directory (without building anything).
    Path,
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Build => {
            let dir = build()?;
            println!("{}", dir.display());
        }
        Command::Path => println!("{}", control_plane_dir()?.display()),
    }
    Ok(())
}

/// The control-plane cache directory (`$CAPL_CONTROL_PLANE_DIR` or the versioned default).
pub fn control_plane_dir() -> Result<PathBuf> {
    versions::control_plane_dir().map_err(anyhow::Error::msg)
}

/// Builds what is missing and returns the control-plane directory.
fn build() -> Result<PathBuf> {
    let dir = control_plane_dir()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating the control-plane directory {}", dir.display()))?;
    let sh = Shell::new()?;
    sh.set_var("GOTOOLCHAIN", "local");
    sh.set_var("GOWORK", "off");
    sh.set_var("GO111MODULE", "on");
    let go_version = cmd!(sh, "go version").quiet().read().context(
        "the Go toolchain is needed to build the control plane: install Go 1.26 or newer \
         (`go` must be on PATH)",
    )?;
    eprintln!("control plane: {} with {go_version}", dir.display());

    match versions::usable_kubebuilder_assets() {
        Some(assets) => eprintln!(
            "control plane: using kube-apiserver and etcd from {KUBEBUILDER_ASSETS_ENV}={}; \
             building neither",
            assets.display()
        ),
        None => {
            if missing(&dir, KUBE_APISERVER_BIN) || missing(&dir, KUBECTL_BIN) {
                build_kubernetes(&sh, &dir)?;
            }
            if missing(&dir, ETCD_BIN) {
                build_etcd(&sh, &dir)?;
            }
        }
    }
    if missing(&dir, CAPI_MANAGER_BIN) {
        build_capi_manager(&sh, &dir)?;
    }
    if CAPI_PROVIDER_COMMANDS.iter().any(|(binary, _)| missing(&dir, binary)) {
        build_capi_providers(&sh, &dir)?;
    }
    if CAPI_WEBHOOK_MANIFESTS.iter().any(|(file, _)| !dir.join(CAPI_WEBHOOKS_DIR).join(file).is_file()) {
        copy_capi_webhook_manifests(&sh, &dir)?;
    }
    // The kubeadm bootstrap and control plane CRDs came later; a cache without
    // them is copied again.
    if !dir.join(CAPI_CRDS_DIR).join(KUBEADM_CONTROL_PLANE_CRD).is_file() {
        copy_capi_crds(&sh, &dir)?;
    }
    // What `clusterctl init` installs offline: CAPI's release components built
    // with kustomize, and cert-manager's CRDs.
    if missing(&dir, KUSTOMIZE_BIN) {
        build_kustomize(&sh, &dir)?;
    }
    if !dir.join(CAPI_REPOSITORY_DIR).is_dir() {
        build_capi_repository(&sh, &dir)?;
    }
    if !dir.join(CERT_MANAGER_CRDS_DIR).is_dir() {
        copy_cert_manager_crds(&sh, &dir)?;
    }
    // CAPI's in-cluster IPAM provider came later still.
    if missing(&dir, IPAM_IN_CLUSTER_MANAGER_BIN) {
        build_ipam_in_cluster_manager(&sh, &dir)?;
    }
    if !dir.join(IPAM_CRDS_DIR).is_dir() {
        copy_ipam_crds(&sh, &dir)?;
    }
    Ok(dir)
}

fn missing(dir: &Path, binary: &str) -> bool {
    !dir.join(binary).is_file()
}

/// `kube-apiserver` and `kubectl` from `k8s.io/kubernetes`.
///
/// That module is not meant to be imported: it requires its staging modules at `v0.0.0`
/// and replaces them with `./staging/src/...`. Our module replaces each of them with the
/// published module at [`KUBERNETES_STAGING_VERSION`]; the list is read from the go.mod
/// of the pinned release so that it is always exactly the right one.
fn build_kubernetes(sh: &Shell, dir: &Path) -> Result<()> {
    let kubernetes = format!("k8s.io/kubernetes@{KUBERNETES_VERSION}");
    let upstream_go_mod = std::fs::read_to_string(downloaded_go_mod(sh, &kubernetes)?)
        .with_context(|| format!("reading the go.mod of {kubernetes}"))?;
    let staging = staging_modules(&upstream_go_mod);
    if staging.is_empty() {
        bail!(
            "the go.mod of {kubernetes} has no `{STAGING_REPLACE_MARKER}` replace line; \
             the way kubernetes publishes its staging modules changed: update build_kubernetes"
        );
    }
    let replaces: String =
        staging.iter().map(|module| format!("\t{module} => {module} {KUBERNETES_STAGING_VERSION}\n")).collect();
    let go_mod = format!(
        "module capl.local/control-plane/kubernetes\n\ngo 1.26.0\n\n\
         require k8s.io/kubernetes {KUBERNETES_VERSION}\n\nreplace (\n{replaces})\n"
    );
    let module = prepare_module(
        sh,
        dir,
        "kubernetes",
        &go_mod,
        &["k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubectl"],
    )?;

    // The version the binaries report (kubectl version, /version); CAPI refuses to run
    // against a server that reports the default "v0.0.0-master".
    let (major, minor) = major_minor(KUBERNETES_VERSION)?;
    let mut ldflags = vec!["-s".to_owned(), "-w".to_owned()];
    for package in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
        for (var, value) in
            [("gitVersion", KUBERNETES_VERSION), ("gitMajor", major), ("gitMinor", minor), ("gitTreeState", "clean")]
        {
            ldflags.push(format!("-X {package}.{var}={value}"));
        }
    }
    let ldflags = ldflags.join(" ");
    go_build(sh, &module, dir, KUBE_APISERVER_BIN, "k8s.io/kubernetes/cmd/kube-apiserver", &ldflags)?;
    go_build(sh, &module, dir, KUBECTL_BIN, "k8s.io/kubernetes/cmd/kubectl", &ldflags)?;
    Ok(())
}

/// `etcd` from `go.etcd.io/etcd/server/v3`, whose root package is the etcd `main`.
fn build_etcd(sh: &Shell, dir: &Path) -> Result<()> {
    let go_mod = format!(
        "module capl.local/control-plane/etcd\n\ngo 1.26.0\n\n\
         require go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    );
    let module = prepare_module(sh, dir, "etcd", &go_mod, &["go.etcd.io/etcd/server/v3"])?;
    go_build(sh, &module, dir, ETCD_BIN, "go.etcd.io/etcd/server/v3", "-s -w")
}

/// The CAPI core manager: package `sigs.k8s.io/cluster-api/core` (its `main.go`).
fn build_capi_manager(sh: &Shell, dir: &Path) -> Result<()> {
    let module = prepare_module(sh, dir, "capi", &capi_go_mod("capi"), &["sigs.k8s.io/cluster-api/core"])?;
    go_build(sh, &module, dir, CAPI_MANAGER_BIN, "sigs.k8s.io/cluster-api/core", &capi_ldflags()?)
}

/// The kubeadm bootstrap and control plane managers and clusterctl (those missing).
///
/// They get a module of their own (`src/capi-providers`) so that the core manager's module,
/// and with it a cache made before they existed, stays as it was. Both modules require the
/// same two modules at the same version, so the build list, and with it Go's build cache of
/// the shared packages, is the same.
fn build_capi_providers(sh: &Shell, dir: &Path) -> Result<()> {
    let packages: Vec<&str> = CAPI_PROVIDER_COMMANDS.iter().map(|(_, package)| *package).collect();
    let module = prepare_module(sh, dir, "capi-providers", &capi_go_mod("capi-providers"), &packages)?;
    let ldflags = capi_ldflags()?;
    for (binary, package) in CAPI_PROVIDER_COMMANDS {
        if missing(dir, binary) {
            go_build(sh, &module, dir, binary, package, &ldflags)?;
        }
    }
    Ok(())
}

/// `kustomize` from `sigs.k8s.io/kustomize/kustomize/v5` at [`KUSTOMIZE_VERSION`].
fn build_kustomize(sh: &Shell, dir: &Path) -> Result<()> {
    let package = "sigs.k8s.io/kustomize/kustomize/v5";
    let go_mod =
        format!("module capl.local/control-plane/kustomize\n\ngo 1.26.0\n\nrequire {package} {KUSTOMIZE_VERSION}\n");
    let module = prepare_module(sh, dir, "kustomize", &go_mod, &[package])?;
    go_build(sh, &module, dir, KUSTOMIZE_BIN, package, "-s -w")
}

/// CAPI core and the kubeadm providers as clusterctl local repositories, built as CAPI's
/// `make release-manifests` builds them: the `config/default` of each, with the manager
/// image set to the release's (`registry.k8s.io/cluster-api/<image>:<version>`) and the
/// pull policy to `IfNotPresent` (its `manifest-modification` target), through
/// `kustomize build`; `metadata.yaml` is the module's. The layout is
/// `<dir>/capi-repository/<label>/<version>/{<components file>,metadata.yaml}`.
fn build_capi_repository(sh: &Shell, dir: &Path) -> Result<()> {
    let capi = format!("sigs.k8s.io/cluster-api@{CAPI_VERSION}");
    let module_dir = PathBuf::from(downloaded_field(sh, &capi, "Dir")?);
    let started = Instant::now();
    let partial = dir.join(format!(".partial-{CAPI_REPOSITORY_DIR}"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    // The module cache is read-only and the release edits two patch files: build from a copy.
    let sources = partial.join(".sources");
    let metadata = std::fs::read(module_dir.join("metadata.yaml"))
        .with_context(|| format!("reading metadata.yaml of {capi}: its layout changed"))?;
    for provider in CAPI_RELEASE_PROVIDERS {
        let config = Path::new(provider.module_dir).join("config");
        copy_tree(&module_dir.join(&config), &sources.join(&config))
            .with_context(|| format!("copying {} of {capi}", config.display()))?;
        let default = sources.join(&config).join("default");
        let image = format!("{CAPI_RELEASE_REGISTRY}/{}:{CAPI_VERSION}", provider.image);
        replace_field(&default.join("manager_image_patch.yaml"), "image:", &image)?;
        replace_field(&default.join("manager_pull_policy.yaml"), "imagePullPolicy:", "IfNotPresent")?;
        let kustomize = dir.join(KUSTOMIZE_BIN);
        let built = cmd!(sh, "{kustomize} build {default}")
            .quiet()
            .read()
            .with_context(|| format!("`kustomize build {}/config/default` failed", provider.module_dir))?;
        let version_dir = partial.join(provider.label).join(CAPI_VERSION);
        std::fs::create_dir_all(&version_dir)?;
        std::fs::write(version_dir.join(provider.components), format!("{built}\n"))?;
        std::fs::write(version_dir.join("metadata.yaml"), &metadata)?;
    }
    std::fs::remove_dir_all(&sources)?;
    let target = dir.join(CAPI_REPOSITORY_DIR);
    if target.exists() {
        std::fs::remove_dir_all(&target)?;
    }
    std::fs::rename(&partial, &target)?;
    eprintln!("control plane: built CAPI's release components in {} ({:.0?})", target.display(), started.elapsed());
    Ok(())
}

/// Copies a directory tree; the copies are writable whatever the source's modes.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("listing {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::write(&target, std::fs::read(entry.path())?)?;
        }
    }
    Ok(())
}

/// Sets the value of every `<key> <value>` line of a YAML file (what CAPI's Makefile does with
/// `sed 's@image: .*@image: ...@'`); fails when no line has the key.
fn replace_field(path: &Path, key: &str, value: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut replaced = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| match line.find(key) {
            Some(at) => {
                replaced += 1;
                format!("{}{key} {value}", &line[..at])
            }
            None => line.to_string(),
        })
        .collect();
    if replaced == 0 {
        bail!("no `{key}` line in {}: CAPI's release layout changed", path.display());
    }
    std::fs::write(path, lines.join("\n") + "\n")?;
    Ok(())
}

/// Copies cert-manager's CRDs (`deploy/crds` of `github.com/cert-manager/cert-manager` at
/// [`CERT_MANAGER_VERSION`]), after checking that this is the version the pinned clusterctl
/// installs by default.
/// Copies the `*.yaml` files of `sources` (directories of the module `origin`) to
/// `<dir>/<name>`, through a `.partial-` directory renamed at the end, so that an
/// interrupted copy is never taken for a complete one. Files in the module cache are
/// read-only: the bytes are copied, not the mode. Fails when no YAML is found (the
/// module's layout changed). Returns the target directory and the number of files.
fn copy_yaml_files(dir: &Path, name: &str, sources: &[PathBuf], origin: &str) -> Result<(PathBuf, usize)> {
    let partial = dir.join(format!(".partial-{name}"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    let mut copied = 0;
    for source in sources {
        for entry in std::fs::read_dir(source).with_context(|| format!("listing {} ({origin})", source.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|ext| ext == "yaml") {
                let target = partial.join(path.file_name().expect("a listed file has a name"));
                std::fs::write(&target, std::fs::read(&path)?)
                    .with_context(|| format!("copying {} to {}", path.display(), target.display()))?;
                copied += 1;
            }
        }
    }
    if copied == 0 {
        let listed: Vec<String> = sources.iter().map(|s| s.display().to_string()).collect();
        bail!("no CRD YAML in {} ({origin}): its layout changed", listed.join(", "));
    }
    let target = dir.join(name);
    if target.exists() {
        std::fs::remove_dir_all(&target)?;
    }
    std::fs::rename(&partial, &target)?;
    Ok((target, copied))
}

fn copy_cert_manager_crds(sh: &Shell, dir: &Path) -> Result<()> {
    let capi = format!("sigs.k8s.io/cluster-api@{CAPI_VERSION}");
    let capi_dir = PathBuf::from(downloaded_field(sh, &capi, "Dir")?);
    let source = capi_dir.join("cmd/clusterctl/client/config/cert_manager_client.go");
    let text = std::fs::read_to_string(&source).with_context(|| format!("reading {}", source.display()))?;
    let default = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("CertManagerDefaultVersion = "))
        .map(|value| value.trim_matches('"'))
        .with_context(|| format!("no CertManagerDefaultVersion in {}", source.display()))?;
    if default != CERT_MANAGER_VERSION {
        bail!(
            "clusterctl {CAPI_VERSION} installs cert-manager {default} by default, CERT_MANAGER_VERSION is \
             {CERT_MANAGER_VERSION}: update testbed/src/control_plane_versions.rs"
        );
    }
    let cert_manager = format!("github.com/cert-manager/cert-manager@{CERT_MANAGER_VERSION}");
    let crds = PathBuf::from(downloaded_field(sh, &cert_manager, "Dir")?).join("deploy/crds");
    let (target, copied) = copy_yaml_files(dir, CERT_MANAGER_CRDS_DIR, &[crds], &cert_manager)?;
    eprintln!("control plane: copied {copied} cert-manager {CERT_MANAGER_VERSION} CRDs to {}", target.display());
    Ok(())
}

/// The in-cluster IPAM provider's manager, from its own module (not CAPI's: it requires its
/// own CAPI version, v1.11 at v1.1.0, for the `ipam.cluster.x-k8s.io/v1beta2` types).
///
/// `tools.go` imports the module's root package although it is a `main` package: `go mod
/// tidy` resolves the imports of a `main` package like any other (only `go build` of the
/// importing package would refuse it, and `tools.go` is never built: `tools` build tag).
fn build_ipam_in_cluster_manager(sh: &Shell, dir: &Path) -> Result<()> {
    let go_mod = format!(
        "module capl.local/control-plane/ipam\n\ngo 1.26.2\n\nrequire {IPAM_IN_CLUSTER_MODULE} {IPAM_IN_CLUSTER_VERSION}\n"
    );
    let module = prepare_module(sh, dir, "ipam", &go_mod, &[IPAM_IN_CLUSTER_MODULE])?;
    go_build(sh, &module, dir, IPAM_IN_CLUSTER_MANAGER_BIN, IPAM_IN_CLUSTER_MODULE, "-s -w")
}

/// Copies the IPAM provider's CRDs (`config/crd/bases` of its module: InClusterIPPool,
/// GlobalInClusterIPPool, InClusterPrefixPool, GlobalInClusterPrefixPool) to `<dir>/ipam-crds`,
/// as published (the bases have no conversion webhook; kustomize adds it in the release).
fn copy_ipam_crds(sh: &Shell, dir: &Path) -> Result<()> {
    let ipam = format!("{IPAM_IN_CLUSTER_MODULE}@{IPAM_IN_CLUSTER_VERSION}");
    let bases = PathBuf::from(downloaded_field(sh, &ipam, "Dir")?).join("config/crd/bases");
    let (target, copied) = copy_yaml_files(dir, IPAM_CRDS_DIR, &[bases], &ipam)?;
    eprintln!("control plane: copied {copied} IPAM provider {IPAM_IN_CLUSTER_VERSION} CRDs to {}", target.display());
    Ok(())
}

/// A module that builds commands of `sigs.k8s.io/cluster-api`.
///
/// The root module replaces `sigs.k8s.io/cluster-api/api` with `./api`, which does not
/// apply to a dependency, so our module requires the api module at the same version.
fn capi_go_mod(name: &str) -> String {
    format!(
        "module capl.local/control-plane/{name}\n\ngo 1.26.0\n\nrequire (\n\
         \tsigs.k8s.io/cluster-api {CAPI_VERSION}\n\
         \tsigs.k8s.io/cluster-api/api {CAPI_VERSION}\n)\n"
    )
}

/// The version CAPI's binaries report (`clusterctl version`, the managers' logs).
fn capi_ldflags() -> Result<String> {
    let (major, minor) = major_minor(CAPI_VERSION)?;
    Ok(format!(
        "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion={CAPI_VERSION} \
         -X sigs.k8s.io/cluster-api/version.gitMajor={major} \
         -X sigs.k8s.io/cluster-api/version.gitMinor={minor} \
         -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
    ))
}

/// Copies the webhook manifests (`config/webhook/manifests.yaml`) of CAPI core and the kubeadm
/// providers to `<dir>/capi-webhooks/`, as published: they point at an in-cluster Service,
/// which `testenv` rewrites to the URL of the manager it starts.
fn copy_capi_webhook_manifests(sh: &Shell, dir: &Path) -> Result<()> {
    let capi = format!("sigs.k8s.io/cluster-api@{CAPI_VERSION}");
    let module_dir = PathBuf::from(downloaded_field(sh, &capi, "Dir")?);
    let partial = dir.join(format!(".partial-{CAPI_WEBHOOKS_DIR}"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    for (file, source) in CAPI_WEBHOOK_MANIFESTS {
        let source = module_dir.join(source);
        // Files in the module cache are read-only; copy the bytes, not the mode.
        let bytes = std::fs::read(&source)
            .with_context(|| format!("reading {} (module {capi}): its layout changed", source.display()))?;
        std::fs::write(partial.join(file), bytes)?;
    }
    let target = dir.join(CAPI_WEBHOOKS_DIR);
    if target.exists() {
        std::fs::remove_dir_all(&target)?;
    }
    std::fs::rename(&partial, &target)?;
    eprintln!("control plane: copied CAPI's webhook manifests to {}", target.display());
    Ok(())
}

/// Copies the core CRDs (`core/config/crd/bases` of the CAPI module) to `<dir>/capi-crds`.
/// They are copied as published; `testenv` strips conversion webhooks when installing them.
/// A CRD of the kubeadm control plane provider, present in a complete copy.
const KUBEADM_CONTROL_PLANE_CRD: &str = "controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml";

/// Where the CRDs live in the CAPI module: core, and the kubeadm bootstrap and
/// control plane providers (the templates use KubeadmControlPlane and
/// KubeadmConfigTemplate, and tests validate them against the real schemas).
const CAPI_CRD_BASES: &[&str] =
    &["core/config/crd/bases", "bootstrap/kubeadm/config/crd/bases", "controlplane/kubeadm/config/crd/bases"];

fn copy_capi_crds(sh: &Shell, dir: &Path) -> Result<()> {
    let capi = format!("sigs.k8s.io/cluster-api@{CAPI_VERSION}");
    let module_dir = downloaded_field(sh, &capi, "Dir")?;
    let sources: Vec<PathBuf> = CAPI_CRD_BASES.iter().map(|base| Path::new(&module_dir).join(base)).collect();
    let (target, copied) = copy_yaml_files(dir, CAPI_CRDS_DIR, &sources, &format!("module {capi}"))?;
    eprintln!("control plane: copied {copied} CAPI CRDs to {}", target.display());
    Ok(())
}

/// Writes `<dir>/src/<name>/{go.mod,tools.go}` and resolves the dependency graph (`go mod tidy`).
/// `tools.go` imports the commands to build, behind the `tools` build tag, so that `go mod
/// tidy` records every module they need.
fn prepare_module(sh: &Shell, dir: &Path, name: &str, go_mod: &str, commands: &[&str]) -> Result<PathBuf> {
    let module = dir.join("src").join(name);
    std::fs::create_dir_all(&module)?;
    let imports: String = commands.iter().map(|command| format!("\t_ \"{command}\"\n")).collect();
    let tools_go = format!(
        "//go:build tools\n\n// Package tools pins the commands built from this module.\n\
         package tools\n\nimport (\n{imports})\n"
    );
    sh.write_file(module.join("tools.go"), tools_go)?;
    // Only a changed go.mod needs a new `go mod tidy` (which rewrites it with the indirect requirements).
    let template = module.join("go.mod.template");
    let unchanged =
        std::fs::read_to_string(&template).is_ok_and(|old| old == go_mod) && module.join("go.sum").is_file();
    if !unchanged {
        sh.write_file(module.join("go.mod"), go_mod)?;
        let _ = std::fs::remove_file(module.join("go.sum"));
        let _dir = sh.push_dir(&module);
        let started = Instant::now();
        cmd!(sh, "go mod tidy").run().with_context(|| {
            format!(
                "`go mod tidy` failed in {}: a module of {commands:?} could not be fetched or \
                 resolved (the error above names it)",
                module.display()
            )
        })?;
        eprintln!("control plane: go mod tidy ({name}) took {:.0?}", started.elapsed());
        sh.write_file(&template, go_mod)?;
    }
    Ok(module)
}

/// `go build -o <dir>/<binary> <package>`, through a temporary name so that an interrupted
/// build never leaves a binary that later runs would take for a complete one.
fn go_build(sh: &Shell, module: &Path, dir: &Path, binary: &str, package: &str, ldflags: &str) -> Result<()> {
    let partial = dir.join(format!(".partial-{binary}"));
    let _dir = sh.push_dir(module);
    let started = Instant::now();
    eprintln!("control plane: building {binary} from {package} ...");
    cmd!(sh, "go build -ldflags {ldflags} -o {partial} {package}")
        .run()
        .with_context(|| format!("`go build {package}` (for {binary}) failed in {}", module.display()))?;
    std::fs::rename(&partial, dir.join(binary))?;
    eprintln!("control plane: built {binary} in {:.0?}", started.elapsed());
    Ok(())
}

/// A field of `go mod download -json <module@version>` (`Dir` or `GoMod`), downloading it if needed.
fn downloaded_field(sh: &Shell, module_at_version: &str, field: &str) -> Result<String> {
    // Run outside any module so that the download does not resolve a module graph.
    let _dir = sh.push_dir(std::env::temp_dir());
    let json = cmd!(sh, "go mod download -json {module_at_version}")
        .quiet()
        .read()
        .with_context(|| format!("`go mod download {module_at_version}` failed"))?;
    json_string_field(&json, field)
        .with_context(|| format!("`go mod download -json {module_at_version}` printed no {field:?}: {json}"))
}

fn downloaded_go_mod(sh: &Shell, module_at_version: &str) -> Result<String> {
    downloaded_field(sh, module_at_version, "GoMod")
}

/// The value of `"field": "value"` in the flat JSON object that `go mod download -json` prints.
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":");
    let rest = json.lines().find_map(|line| line.trim().strip_prefix(key.as_str()))?;
    let value = rest.trim().trim_end_matches(',').strip_prefix('"')?.strip_suffix('"')?;
    Some(value.replace("\\\\", "\\"))
}

/// The module paths that kubernetes' go.mod replaces with `./staging/src/...`.
fn staging_modules(go_mod: &str) -> Vec<String> {
    go_mod
        .lines()
        .filter(|line| line.contains(STAGING_REPLACE_MARKER))
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("replace").unwrap_or(line).trim();
            line.split_whitespace().next().map(str::to_owned)
        })
        .collect()
}

/// `("1", "36")` for `v1.36.3`.
fn major_minor(version: &str) -> Result<(&str, &str)> {
    let mut parts = version.trim_start_matches('v').split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => bail!("version {version:?} is not of the form vMAJOR.MINOR.PATCH"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_are_read_from_block_and_single_replace_lines() {
        let go_mod = "module k8s.io/kubernetes\n\nreplace (\n\
                      \tk8s.io/api => ./staging/src/k8s.io/api\n\
                      \tgithub.com/x/y => github.com/x/y v1.0.0\n)\n\
                      replace k8s.io/kubectl => ./staging/src/k8s.io/kubectl\n";
        assert_eq!(staging_modules(go_mod), ["k8s.io/api", "k8s.io/kubectl"]);
    }

    #[test]
    fn json_field_is_extracted() {
        let json = "{\n\t\"Path\": \"k8s.io/kubernetes\",\n\t\"GoMod\": \"/m/k8s.io/kubernetes/@v/v1.36.3.mod\",\n}";
        assert_eq!(json_string_field(json, "GoMod").as_deref(), Some("/m/k8s.io/kubernetes/@v/v1.36.3.mod"));
        assert_eq!(json_string_field(json, "Dir"), None);
    }

    #[test]
    fn release_image_replaces_the_development_one() {
        let path = std::env::temp_dir().join(format!("capl-xtask-image-patch-{}.yaml", std::process::id()));
        std::fs::write(
            &path,
            "spec:\n  containers:\n    - image: gcr.io/staging/controller:main\n      name: manager\n",
        )
        .unwrap();
        replace_field(&path, "image:", "registry.k8s.io/cluster-api/controller:v1.14.2").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "spec:\n  containers:\n    - image: registry.k8s.io/cluster-api/controller:v1.14.2\n      name: manager\n"
        );
        assert!(replace_field(&path, "imagePullPolicy:", "IfNotPresent").is_err());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn major_minor_of_a_release() {
        assert_eq!(major_minor("v1.36.3").unwrap(), ("1", "36"));
        assert!(major_minor("latest").is_err());
    }
}
