//! Cluster API's own end-to-end specs (`sigs.k8s.io/cluster-api/test/e2e`),
//! run unchanged against this provider by the Ginkgo suite in `e2e/capi/`
//! (a Go test binary, [`SPECS_BIN_ENV`], built by `cargo xtask e2e capi`).
//!
//! [`run`] makes what the upstream framework expects and then runs the binary:
//! 1. the kind management cluster of the kind suite
//!    ([`crate::harness::kind_cluster::KindCluster`]: cert-manager, CAPI core,
//!    the kubeadm providers and this provider installed by `clusterctl init`);
//!    the framework finds the providers installed and skips its own init;
//! 2. a containerized libvirtd on the kind cluster's docker network, reached
//!    over TLS, with a network in `open` forward mode ([`network`]): the
//!    workload clusters' endpoints are routed, not hidden behind NAT, and this
//!    machine and the kind node get a route to the guests' subnet through the
//!    container. The framework (on this machine) and CAPI's controllers (in
//!    kind) reach each workload cluster's API server as they would on a lab
//!    network. The specs that act on the host themselves (remediation-reboot
//!    pauses a guest) get the daemon's unix socket URI for virsh in the e2e
//!    config ([`config::VIRSH_URI_VARIABLE`]);
//! 3. the node image served over HTTP on this machine's address on the docker
//!    network, named in the flavors by URL and checksum (the provider downloads
//!    it into the host's base pool);
//! 4. the flavors the specs ask for: the release's templates with the
//!    emulation tuning of [`crate::workload::emulation`] (machines under
//!    software emulation need longer timeouts; nothing else is changed), and
//!    the e2e config naming every provider from local files, the variables
//!    and the intervals ([`config`]);
//! 5. the specs, selected by their Ginkgo label, with a JSON report from which
//!    [`report`] prints the table: spec, result, duration.
//!
//! Every spec deletes its own cluster at its end; what the run leaves on the
//! host is reported as a failure.

mod config;
mod network;
pub mod report;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::harness::host_view::HostView;
use crate::harness::kind_cluster::{DOCKER_NETWORK, InstalledRelease, KindCluster};
use testenv::container_libvirtd::{ContainerLibvirtd, Options};

/// The environment variable naming the Ginkgo suite's test binary.
pub const SPECS_BIN_ENV: &str = capl_testbed::env::CAPI_SPECS_BIN;

/// One upstream spec as the suite labels it.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Its Ginkgo label, the name `--focus` takes.
    pub id: &'static str,
    /// What it checks, for `--help` and the docs.
    pub what: &'static str,
    /// Run by default (and in CI); the others only with `--all` or `--focus`.
    pub default: bool,
}

/// The specs of `e2e/capi/specs_test.go`, in the order they run.
pub const SPECS: &[Spec] = &[
    Spec {
        id: "quick-start",
        what: "QuickStartSpec with the default flavor: one control-plane machine and one worker",
        // md-remediation makes the same cluster from the default flavor with
        // a MachineHealthCheck added and checks it the same way before it
        // remediates, so CI runs that one.
        default: false,
    },
    Spec { id: "quick-start-topology", what: "QuickStartSpec with the ClusterClass flavor (topology)", default: true },
    Spec {
        id: "md-remediation",
        what: "MachineDeploymentRemediationSpec: a MachineHealthCheck replaces a worker whose Node turned unhealthy",
        default: true,
    },
    Spec {
        id: "md-scale",
        what: "MachineDeploymentScaleSpec: the workers' MachineDeployment scaled 1 -> 3 -> 1, then deleted",
        default: false,
    },
    Spec {
        id: "md-rollout",
        what: "KCPAndMachineDeploymentRolloutSpec: fields and taints changed in place reach Machines and Nodes \
               without replacing them, then a new LibvirtMachineTemplate rolls the workers",
        default: false,
    },
    Spec {
        id: "quick-start-data-disks",
        what: "QuickStartSpec with the data-disks flavor: etcd on a data disk of the control-plane machine, \
               whose cloud-init log shows the disk formatted and mounted",
        default: false,
    },
    Spec {
        id: "remediation-reboot",
        what: "the provider's remediation by reboot, a MachineHealthCheck naming a LibvirtRemediationTemplate: a \
               worker whose guest was paused is rebooted and stays the same Machine; a worker whose Node condition a \
               reboot cannot clear is rebooted once, then replaced by its MachineSet",
        default: false,
    },
];

/// The specs `focus` names (every default one when empty, all with `all`);
/// an unknown name is an error listing the known ones.
pub fn select(focus: &[String], all: bool) -> Result<Vec<Spec>> {
    if all {
        return Ok(SPECS.to_vec());
    }
    if focus.is_empty() {
        return Ok(SPECS.iter().filter(|s| s.default).copied().collect());
    }
    let mut chosen = Vec::new();
    for name in focus {
        let spec = SPECS.iter().find(|s| s.id == name).with_context(|| {
            let known: Vec<&str> = SPECS.iter().map(|s| s.id).collect();
            format!("no upstream spec {name:?}: the suite runs {}", known.join(", "))
        })?;
        chosen.push(*spec);
    }
    Ok(chosen)
}

fn say(message: String) {
    eprintln!("capi specs: {message}");
}

/// Steps 1 to 5 of the module's description; returns whether every spec passed.
pub fn run(specs: &[Spec]) -> Result<bool> {
    let started = Instant::now();
    let binary = std::env::var_os(SPECS_BIN_ENV)
        .map(PathBuf::from)
        .with_context(|| format!("{SPECS_BIN_ENV} is not set: run the upstream specs with `cargo xtask e2e capi`"))?;
    let node_image = std::env::var_os(capl_testbed::env::NODE_IMAGE).map(PathBuf::from).with_context(|| {
        format!("{} is not set: run the upstream specs with `cargo xtask e2e capi`", capl_testbed::env::NODE_IMAGE)
    })?;
    let work_dir = std::env::temp_dir().join(format!("capl-e2e-capi-{}", std::process::id()));
    std::fs::create_dir_all(&work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
    say(format!("work directory {} (artifacts, logs, the e2e config)", work_dir.display()));

    // 1. The management cluster. KubeadmControlPlane's manager gets the etcd
    // timeouts of the emulation tuning: its etcd calls go through the
    // workload API server to etcd on a guest that answers in seconds, not
    // milliseconds, and its default 15 s per call left `Available` at
    // "Failed to get etcd members" for minutes.
    let cluster = KindCluster::create_with(
        &work_dir.join("kind"),
        InstalledRelease::Current,
        config::INIT_VARIABLES,
        testenv::KCP_ETCD_TIMEOUTS,
        say,
    )?;

    // 2. The host, its network and the routes to it.
    let console_dir = work_dir.join("console");
    let options = Options { network: Some(DOCKER_NETWORK.into()), tls: true, console_dir: Some(console_dir.clone()) };
    let daemon = ContainerLibvirtd::start_with(options).map_err(anyhow::Error::msg)?;
    let tls = daemon.tls().context("the containerized libvirtd was started without TLS")?.clone();
    let host = HostView::new(daemon.uri());
    let routes = network::define(&host, &work_dir, &tls.address)?;
    say(format!(
        "libvirtd at {} with network {} ({}, forward mode open), routed from this machine and the kind node",
        tls.uri,
        network::NAME,
        network::subnet()
    ));
    cluster.add_manager_args(&[format!("--console-log-dir={}", testenv::container_libvirtd::CONSOLE_DIR)])?;

    // 3. The node image.
    let address = network::docker_gateway(DOCKER_NETWORK)?;
    let image = config::ServedImage::start(&node_image, &address)?;
    say(format!("node image served at {} (sha256 {})", image.url(), image.checksum));

    // 4. Flavors and the e2e config.
    let config_path = config::write(&config::Inputs {
        work_dir: &work_dir,
        release_dir: &work_dir.join("kind/repository"),
        image: &image,
        tls: &tls,
        virsh_uri: daemon.uri(),
    })?;

    // 5. The specs; the control planes get about the CPU weight the workload scenario gives them.
    let favour = network::ControlPlaneFavour::start(cluster.kubectl.clone());
    let report_path = work_dir.join("report.json");
    let passed = run_suite(&binary, specs, &work_dir, &config_path, &cluster.kubectl.kubeconfig, &report_path);
    favour.stop();
    let ids: Vec<&str> = specs.iter().map(|s| s.id).collect();
    let outcomes = report::read(&report_path, &ids);
    let leftovers = network::leftovers(&host);
    drop(routes);
    drop(daemon);
    drop(cluster);
    let outcomes = outcomes?;
    println!("\n{}", report::table(&outcomes));
    // For `cargo xtask e2e capi --all`, which keeps it in the developer docs.
    if let Some(path) = std::env::var_os(capl_testbed::env::E2E_SUMMARY) {
        std::fs::write(&path, report::dated_table(&outcomes, &today()))
            .with_context(|| format!("writing {}", Path::new(&path).display()))?;
    }
    say(format!("finished in {:.0} s; logs and artifacts in {}", started.elapsed().as_secs_f64(), work_dir.display()));
    if !leftovers.is_empty() {
        bail!("the specs left on the host: {}", leftovers.join(", "));
    }
    Ok(passed? && outcomes.iter().all(|o| o.passed()))
}

/// Today's date (UTC), as `date -u +%F` prints it.
fn today() -> String {
    Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Runs the Ginkgo binary for `specs`; its whole output goes to
/// `ginkgo.log` in `work_dir`, its steps and failures to stderr too.
fn run_suite(
    binary: &Path,
    specs: &[Spec],
    work_dir: &Path,
    config_path: &Path,
    kubeconfig: &Path,
    report_path: &Path,
) -> Result<bool> {
    let labels: Vec<&str> = specs.iter().map(|s| s.id).collect();
    let log_path = work_dir.join("ginkgo.log");
    let mut log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    say(format!("running {} (output in {})", labels.join(", "), log_path.display()));
    let mut child = Command::new(binary)
        .arg(format!("-e2e.config={}", config_path.display()))
        .arg(format!("-e2e.artifacts-folder={}", work_dir.join("artifacts").display()))
        .arg(format!("-e2e.kubeconfig={}", kubeconfig.display()))
        .arg(format!("-ginkgo.label-filter={}", labels.join(" || ")))
        .arg(format!("-ginkgo.json-report={}", report_path.display()))
        .args(["-ginkgo.v", "-ginkgo.no-color", "-ginkgo.timeout=4h", "-test.timeout=0"])
        .current_dir(work_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let stdout = child.stdout.take().context("the suite's stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading the suite's output")?;
        writeln!(log, "{line}")?;
        let shown = line.trim_start();
        if shown.starts_with("STEP:") || shown.starts_with("[FAILED]") || shown.starts_with("[PANICKED]") {
            eprintln!("  {shown}");
        }
    }
    let status = child.wait().context("waiting for the suite")?;
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file(path: &str) -> String {
        let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
        std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("reading {}: {e}", full.display()))
    }

    /// The Ginkgo labels of `specs_test.go`, in file order.
    fn suite_labels() -> Vec<String> {
        let source = repo_file("e2e/capi/specs_test.go");
        source
            .lines()
            .filter(|line| line.starts_with("var _ = Describe("))
            .map(|line| {
                let label =
                    line.split("Label(\"").nth(1).unwrap_or_else(|| panic!("a Describe without a Label: {line}"));
                label.split('"').next().unwrap_or_default().to_string()
            })
            .collect()
    }

    #[test]
    fn the_suite_labels_each_listed_spec_once_in_order() {
        let listed: Vec<&str> = SPECS.iter().map(|s| s.id).collect();
        assert_eq!(suite_labels(), listed, "e2e/capi/specs_test.go and SPECS disagree");
    }

    #[test]
    fn the_developer_page_lists_each_spec_with_its_default() {
        let page = repo_file("docs/src/developing.md");
        for spec in SPECS {
            let row = page
                .lines()
                .find(|line| line.starts_with(&format!("| {} | `", spec.id)))
                .unwrap_or_else(|| panic!("docs/src/developing.md has no row for the spec {}", spec.id));
            let default = if spec.default { "| yes |" } else { "| no |" };
            assert!(row.ends_with(default), "the row of {} should end with {default:?}: {row}", spec.id);
        }
    }

    #[test]
    fn the_default_set_is_what_ci_runs_and_all_adds_the_rest() {
        let default: Vec<&str> = select(&[], false).unwrap().iter().map(|s| s.id).collect();
        assert_eq!(default, ["quick-start-topology", "md-remediation"]);
        assert_eq!(select(&[], true).unwrap().len(), SPECS.len());
        let err = select(&["md-nothing".into()], false).unwrap_err().to_string();
        assert!(err.contains("md-nothing") && err.contains("md-scale"), "{err}");
    }
}
