//! cert-manager for the kind management cluster, built offline from its Go
//! module: the controller, cainjector and webhook images and the static
//! manifest its release publishes as `cert-manager.yaml`.
//!
//! v1.11.5 is the last release whose commands are packages of the main
//! module (later releases made each `cmd/` a module of its own, which the
//! module proxy here does not serve). Its module is copied out of the
//! module cache (read-only there) and built as the main module; the manifest
//! is rendered the way its release tooling renders it: the chart's
//! `Chart.yaml` from `Chart.template.yaml` with the version, the CRDs of
//! `deploy/crds` as the chart's `templates/crds.yaml` behind `installCRDs`,
//! then `helm template --kube-version <the cluster's> --namespace cert-manager --set installCRDs=true --set
//! creator=static --set startupapicheck.enabled=false` after the namespace.
//! helm (v3.12.3) is `go install`ed from its module. Everything is kept under
//! `~/.cache/cluster-api-provider-libvirt/cert-manager/<version>/`; the images
//! are made like the manager's (`images::manager_image`) under the names the
//! manifest uses, and rebuilt only when missing.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

/// The cert-manager release installed in the kind management cluster.
pub const VERSION: &str = "v1.11.5";
const MODULE: &str = "github.com/cert-manager/cert-manager";
const HELM_MODULE: &str = "helm.sh/helm/v3/cmd/helm@v3.12.3";
/// Its three components: the `cmd/` package and the image repository.
const COMPONENTS: [(&str, &str); 3] = [
    ("controller", "quay.io/jetstack/cert-manager-controller"),
    ("cainjector", "quay.io/jetstack/cert-manager-cainjector"),
    ("webhook", "quay.io/jetstack/cert-manager-webhook"),
];

/// What the kind stack installs.
pub struct CertManager {
    /// The static manifest (namespace, CRDs, RBAC, Deployments, webhooks).
    pub manifest: PathBuf,
    /// The images it names, in the docker engine.
    pub images: Vec<String>,
}

fn cache_dir() -> Result<PathBuf> {
    crate::paths::user_cache(&format!("cert-manager/{VERSION}"), "cert-manager")
}

/// Builds (or reuses) the binaries, the manifest and the images.
pub fn prepare() -> Result<CertManager> {
    let dir = cache_dir()?;
    let sh = Shell::new()?;
    let bin = dir.join("bin");
    let manifest = dir.join("cert-manager.yaml");
    let built = COMPONENTS.iter().all(|(name, _)| bin.join(name).is_file());
    if !built || !manifest.is_file() {
        let src = source(&sh, &dir)?;
        if !built {
            let _d = sh.push_dir(&src);
            let _cgo = sh.push_env("CGO_ENABLED", "0");
            let _flags = sh.push_env("GOFLAGS", "-mod=mod -buildvcs=false");
            let ldflags = format!("-X {MODULE}/pkg/util.AppVersion={VERSION}");
            let out = format!("{}/", bin.display());
            fs::create_dir_all(&bin)?;
            cmd!(sh, "nice -n 10 go build -ldflags {ldflags} -o {out} ./cmd/controller ./cmd/cainjector ./cmd/webhook")
                .run()
                .context("building cert-manager's controller, cainjector and webhook")?;
        }
        if !manifest.is_file() {
            render(&sh, &dir, &src, &manifest)?;
        }
        fs::remove_dir_all(&src)?;
    }
    let mut images = Vec::new();
    for (name, repository) in COMPONENTS {
        let image = format!("{repository}:{VERSION}");
        if !crate::images::image_exists(&sh, &image) {
            crate::images::binary_image(&bin.join(name), &image)?;
        }
        images.push(image);
    }
    Ok(CertManager { manifest, images })
}

/// A writable copy of the module's source under `dir/src`.
fn source(sh: &Shell, dir: &std::path::Path) -> Result<PathBuf> {
    let from = crate::go_modules::module_dir(sh, &format!("{MODULE}@{VERSION}"))?;
    let src = dir.join("src");
    if src.exists() {
        fs::remove_dir_all(&src)?;
    }
    fs::create_dir_all(dir)?;
    cmd!(sh, "cp -r {from} {src}").run()?;
    cmd!(sh, "chmod -R u+w {src}").run()?;
    Ok(src)
}

/// The static manifest, as the release's `cert-manager.yaml` is made.
fn render(sh: &Shell, dir: &std::path::Path, src: &std::path::Path, manifest: &std::path::Path) -> Result<()> {
    let helm_dir = dir.join("helm");
    let helm = helm_dir.join("helm");
    if !helm.is_file() {
        let _bin = sh.push_env("GOBIN", &helm_dir);
        let _flags = sh.push_env("GOFLAGS", "-mod=mod -buildvcs=false");
        cmd!(sh, "nice -n 10 go install {HELM_MODULE}").run().context("go install helm")?;
    }
    let chart = src.join("deploy/charts/cert-manager");
    let template = fs::read_to_string(chart.join("Chart.template.yaml"))?;
    let chart_yaml = template
        .replace("version: v0.1.0", &format!("version: {VERSION}"))
        .replace("appVersion: v0.1.0", &format!("appVersion: {VERSION}"))
        .replace("{{IS_PRERELEASE}}", "false");
    fs::write(chart.join("Chart.yaml"), chart_yaml)?;
    let mut crds = String::from("{{- if .Values.installCRDs }}\n");
    let mut names: Vec<PathBuf> = fs::read_dir(src.join("deploy/crds"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    names.sort();
    for path in names {
        crds.push_str("---\n");
        crds.push_str(&fs::read_to_string(&path)?);
    }
    crds.push_str("{{- end }}\n");
    fs::write(chart.join("templates/crds.yaml"), crds)?;
    // helm built from its module assumes Kubernetes v1.20, older than the chart allows.
    let kube_version = capl_testbed::control_plane_versions::KUBERNETES_VERSION;
    let rendered = cmd!(
        sh,
        "{helm} template --kube-version={kube_version} --namespace=cert-manager --set=installCRDs=true --set=creator=static --set=startupapicheck.enabled=false cert-manager {chart}"
    )
    .read()
    .context("helm template of cert-manager's chart")?;
    let namespace = fs::read_to_string(src.join("deploy/manifests/namespace.yaml"))?;
    fs::write(manifest, format!("{namespace}\n---\n{rendered}\n"))?;
    Ok(())
}
