//! The add-on images the test node image preloads: kube-vip (the control-plane
//! endpoint's static Pod) and kube-router (the CNI), built from their Go
//! modules, under the names and tags their upstream manifests use. A user's
//! node pulls these from their registries; the test node has no registry, so
//! the images are in its containerd store already and `imagePullPolicy:
//! IfNotPresent` finds them.
//!
//! - `ghcr.io/kube-vip/kube-vip:<KUBE_VIP_VERSION>`: the static `/kube-vip`
//!   binary and CA certificates, entrypoint `/kube-vip`, as kube-vip's Dockerfile
//!   makes it (`FROM scratch`).
//! - `docker.io/cloudnativelabs/kube-router:<KUBE_ROUTER_VERSION>`: kube-router in
//!   `/usr/local/bin` with its `cni-install` script (from the module's
//!   `build/image-assets`), the reference CNI plugins kube-router uses (`bridge`,
//!   `host-local`, `loopback`, `portmap` of `github.com/containernetworking/plugins`)
//!   in `/usr/libexec/cni`, which `cni-install` copies to the host's `/opt/cni/bin`,
//!   and the tools it runs taken from the node's Debian root: iptables (nft
//!   backend), ipset, ip, conntrack, coreutils' install, a busybox shell and bash.
//!
//! The binaries are built once per version under
//! `~/.cache/cluster-api-provider-libvirt/node-image/go/<name>-<version>/bin`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

use crate::go_modules::{go_build, install_file, prepare_module};

/// Release of `github.com/kube-vip/kube-vip` (the templates' `KUBE_VIP_VERSION` default).
pub const KUBE_VIP_VERSION: &str = "v1.0.0";
/// Release of `github.com/cloudnativelabs/kube-router/v2`.
pub const KUBE_ROUTER_VERSION: &str = "v2.1.0";
/// Release of `github.com/containernetworking/plugins` put into kube-router's image.
pub const CNI_PLUGINS_VERSION: &str = "v1.10.0";

/// The images, as their upstream manifests name them.
pub fn image_names() -> String {
    format!(
        "ghcr.io/kube-vip/kube-vip:{KUBE_VIP_VERSION}\ndocker.io/cloudnativelabs/kube-router:{KUBE_ROUTER_VERSION}\n"
    )
}

/// The plugins kube-router's `cni-install` copies to `/opt/cni/bin`, with their packages.
const CNI_PLUGINS: &[(&str, &str)] = &[
    ("bridge", "github.com/containernetworking/plugins/plugins/main/bridge"),
    ("host-local", "github.com/containernetworking/plugins/plugins/ipam/host-local"),
    ("loopback", "github.com/containernetworking/plugins/plugins/main/loopback"),
    ("portmap", "github.com/containernetworking/plugins/plugins/meta/portmap"),
];

/// Busybox applets the image's shell scripts call (kube-router's `install-cni` init
/// container and `cni-install`).
/// Debian's static busybox has no `install`: coreutils' is among [`KUBE_ROUTER_TOOLS`].
const BUSYBOX_APPLETS: &[&str] = &["sh", "cp", "mv", "rm", "mkdir", "cat", "ls", "[", "test", "printf"];

/// Files of the Debian root that kube-router runs besides iptables (which comes as
/// kube-proxy's does).
const KUBE_ROUTER_TOOLS: &[&str] = &["/usr/sbin/ipset", "/usr/sbin/ip", "/usr/bin/bash", "/usr/bin/install"];

/// Where the add-on binaries are: one directory per program and version.
pub struct Binaries {
    kube_vip: PathBuf,
    kube_router: PathBuf,
    cni_plugins: PathBuf,
    /// `build/image-assets/cni-install` of the kube-router module.
    cni_install: PathBuf,
}

/// Builds (or finds) kube-vip, kube-router and the CNI plugins under `go_root`.
pub fn build(sh: &Shell, go_root: &Path) -> Result<Binaries> {
    let kube_vip_dir = go_root.join(format!("kube-vip-{KUBE_VIP_VERSION}"));
    let kube_vip_module = prepare_module(
        sh,
        &kube_vip_dir,
        "kube-vip",
        &format!(
            "module capl.local/node-image/kube-vip\n\ngo 1.26.0\n\nrequire github.com/kube-vip/kube-vip {KUBE_VIP_VERSION}\n"
        ),
        &["github.com/kube-vip/kube-vip"],
        &[],
    )?;
    let kube_vip_bin = kube_vip_dir.join("bin");
    fs::create_dir_all(&kube_vip_bin)?;
    let ldflags = format!("-s -w -X main.Version={KUBE_VIP_VERSION} -X main.Build=capl-node-image");
    go_build(sh, &kube_vip_module, &kube_vip_bin, "kube-vip", "github.com/kube-vip/kube-vip", &ldflags, true)?;

    let router_dir = go_root.join(format!("kube-router-{KUBE_ROUTER_VERSION}"));
    let router_module = prepare_module(
        sh,
        &router_dir,
        "kube-router",
        &format!(
            "module capl.local/node-image/kube-router\n\ngo 1.26.0\n\nrequire github.com/cloudnativelabs/kube-router/v2 {KUBE_ROUTER_VERSION}\n"
        ),
        &["github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"],
        &[],
    )?;
    let router_bin = router_dir.join("bin");
    fs::create_dir_all(&router_bin)?;
    let ldflags =
        format!("-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version={KUBE_ROUTER_VERSION}");
    go_build(
        sh,
        &router_module,
        &router_bin,
        "kube-router",
        "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
        &ldflags,
        true,
    )?;
    let module_dir = {
        let _d = sh.push_dir(&router_module);
        let format = "{{.Dir}}";
        cmd!(sh, "go list -m -f {format} github.com/cloudnativelabs/kube-router/v2").quiet().read()?
    };
    let cni_install = PathBuf::from(module_dir.trim()).join("build/image-assets/cni-install");

    let cni_dir = go_root.join(format!("cni-plugins-{CNI_PLUGINS_VERSION}"));
    let packages: Vec<&str> = CNI_PLUGINS.iter().map(|(_, p)| *p).collect();
    let cni_module = prepare_module(
        sh,
        &cni_dir,
        "cni-plugins",
        &format!(
            "module capl.local/node-image/cni-plugins\n\ngo 1.26.0\n\nrequire github.com/containernetworking/plugins {CNI_PLUGINS_VERSION}\n"
        ),
        &packages,
        &[],
    )?;
    let cni_bin = cni_dir.join("bin");
    fs::create_dir_all(&cni_bin)?;
    for (name, package) in CNI_PLUGINS {
        go_build(sh, &cni_module, &cni_bin, name, package, "-s -w", true)?;
    }
    Ok(Binaries {
        kube_vip: kube_vip_bin.join("kube-vip"),
        kube_router: router_bin.join("kube-router"),
        cni_plugins: cni_bin,
        cni_install,
    })
}

/// Fills `layer` for an add-on image (`kube-vip` or `kube-router`); returns its
/// entrypoint, or `None` for another image. `tools` copies files of the Debian root
/// and the libraries they load; `iptables` adds iptables as kube-proxy's image has it.
pub fn layer(
    name: &str,
    binaries: &Binaries,
    root: &Path,
    layer: &Path,
    tools: &dyn Fn(&[String]) -> Result<()>,
    iptables: &dyn Fn() -> Result<Vec<String>>,
) -> Result<Option<Vec<String>>> {
    match name {
        "kube-vip" => {
            install_file(&binaries.kube_vip, &layer.join("kube-vip"), 0o755)?;
            let certs = "etc/ssl/certs/ca-certificates.crt";
            install_file(&root.join(certs), &layer.join(certs), 0o644)?;
            Ok(Some(vec!["/kube-vip".into()]))
        }
        "kube-router" => {
            install_file(&binaries.kube_router, &layer.join("usr/local/bin/kube-router"), 0o755)?;
            install_file(&binaries.cni_install, &layer.join("usr/local/bin/cni-install"), 0o755)
                .context("kube-router's cni-install script (build/image-assets of its module)")?;
            for (plugin, _) in CNI_PLUGINS {
                install_file(&binaries.cni_plugins.join(plugin), &layer.join("usr/libexec/cni").join(plugin), 0o755)?;
            }
            install_file(&root.join("bin/busybox"), &layer.join("bin/busybox"), 0o755)?;
            for applet in BUSYBOX_APPLETS {
                std::os::unix::fs::symlink("busybox", layer.join("bin").join(applet))?;
            }
            for tool in KUBE_ROUTER_TOOLS {
                let rel = tool.trim_start_matches('/');
                install_file(&root.join(rel), &layer.join(rel), 0o755)?;
            }
            // `cni-install` starts with `#!/usr/bin/env bash`.
            install_file(&root.join("usr/bin/env"), &layer.join("usr/bin/env"), 0o755)?;
            let mut needs_libs: Vec<String> = KUBE_ROUTER_TOOLS.iter().map(|t| t.to_string()).collect();
            needs_libs.push("/usr/bin/env".into());
            needs_libs.extend(iptables()?);
            tools(&needs_libs)?;
            fs::create_dir_all(layer.join("var/lib/gobgp"))?;
            Ok(Some(vec!["/usr/local/bin/kube-router".into()]))
        }
        _ => Ok(None),
    }
}
