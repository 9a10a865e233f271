//! The original Makefile's install/uninstall/deploy/undeploy targets, against
//! the current kubeconfig (kubectl's usual rules: KUBECONFIG or ~/.kube/config).

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::repo_root;

fn kubectl_present(sh: &Shell) -> Result<()> {
    if cmd!(sh, "kubectl version --client").quiet().ignore_stdout().ignore_stderr().run().is_err() {
        bail!(
            "kubectl not found on PATH: install it (e.g. `cargo xtask control-plane build` puts one in its cache directory)"
        );
    }
    Ok(())
}

/// Apply the CRDs.
pub fn install() -> Result<()> {
    let sh = Shell::new()?;
    kubectl_present(&sh)?;
    let crds = repo_root().join("config/crd/bases");
    cmd!(sh, "kubectl apply --server-side -f {crds}").run()?;
    Ok(())
}

/// Delete the CRDs (and with them every LibvirtCluster and LibvirtMachine).
pub fn uninstall() -> Result<()> {
    let sh = Shell::new()?;
    kubectl_present(&sh)?;
    let crds = repo_root().join("config/crd/bases");
    cmd!(sh, "kubectl delete --ignore-not-found -f {crds}").run()?;
    Ok(())
}

fn rendered_install(sh: &Shell, image: &str) -> Result<std::path::PathBuf> {
    let root = repo_root();
    let out = root.join("target/deploy/install.yaml");
    sh.change_dir(&root);
    cmd!(
        sh,
        "cargo run --quiet --locked -p cluster-api-provider-libvirt --bin capl-manifests -- install-yaml --image {image} --out {out}"
    )
    .run()?;
    Ok(out)
}

/// Apply CRDs, RBAC, the admission policy and the manager Deployment with `image`.
pub fn deploy(image: &str) -> Result<()> {
    let sh = Shell::new()?;
    kubectl_present(&sh)?;
    let install = rendered_install(&sh, image).context("rendering install.yaml")?;
    cmd!(sh, "kubectl apply --server-side -f {install}").run()?;
    Ok(())
}

/// Remove what `deploy` applied.
pub fn undeploy() -> Result<()> {
    let sh = Shell::new()?;
    kubectl_present(&sh)?;
    let install = rendered_install(&sh, "controller:latest")?;
    cmd!(sh, "kubectl delete --ignore-not-found -f {install}").run()?;
    Ok(())
}
