//! `cargo xtask test`: the README's test command and what CI runs.
//!
//! It sets up everything the tests need on a fresh Debian/Ubuntu machine and
//! then runs them; nothing is skipped. In order:
//! 1. host packages (libvirt, QEMU, dnsmasq, ISO tools) when missing, then
//!    the docs book (`cargo xtask docs`: its internal links checked, mdBook
//!    installed into the cache when missing, the book built);
//! 2. the local control plane (kube-apiserver, etcd, kubectl, CAPI core),
//!    built from Go modules into a cache outside the repository, or reused:
//!    a [`Background`] job beside steps 1 (the book), 3 and 4, joined before
//!    step 5; the node image (`cargo xtask node-image`) is another, at a
//!    lower priority, started with it and joined before Cluster API's specs
//!    in step 6, the first that boot it; what only the runs on kind need
//!    (`cargo xtask kind-prerequisites`: cert-manager, the previous release,
//!    the upstream specs' Ginkgo suite, kind's node image) is a third, at the
//!    lower priority, started once the control plane is built (their Go
//!    builds share its compiled packages), beside steps 5 and 6 up to the
//!    suite on kind;
//! 3. a private libvirtd with its own network and pools, and the test guest
//!    image (`cargo xtask guest-image`);
//! 4. a docker engine (`cargo xtask docker-engine up`: the running one, or
//!    dockerd installed and started), the containerized libvirtd's image
//!    (`cargo xtask libvirtd-image`, in `CAPL_LIBVIRTD_IMAGE` for the
//!    conformance suite's fourth backend), and the manager image built
//!    offline and checked (`cargo xtask docker-build --offline`);
//! 5. `cargo test` over the whole workspace, once, with that libvirtd's URI in
//!    `CAPL_TEST_LIBVIRT_URI` and the guest image in `CAPL_GUEST_IMAGE` (the
//!    integration tests are binaries by what they need: capl-host's `offline`
//!    and `libvirtd`, the provider's `offline`, `api_server` and `libvirtd`);
//!    then
//!    the summaries the suites wrote (how many conformance scenarios ran on
//!    each backend: libvirt-sim, `test:///default`, the real libvirtd and the
//!    containerized one);
//! 6. `cargo xtask e2e`: real CAPI Machines become real VMs, with its summary
//!    table, then `cargo xtask e2e --kind`: the suite on a kind management
//!    cluster, the provider as the Pod of its image, the host a containerized
//!    libvirtd, then `cargo xtask e2e capi`: Cluster API's own e2e specs (the
//!    default set) on kind (all three left out only when a test name filter
//!    was given);
//! 7. the private libvirtd is stopped again, and a dockerd that step 4
//!    started (unless `--keep-host`; also when a step fails on the way);
//! 8. the README's main command as written, `cargo xtask demo
//!    --exit-after-ready`: it must report both Nodes of its Kubernetes cluster
//!    Ready, delete everything and stop the private libvirtd it started; then
//!    `cargo xtask demo --quick`, stopped with Ctrl-C once its two machines
//!    run, must do the same ([`crate::demo_check`]; neither with `--keep-host`
//!    or a filter).

use capl_testbed::env;
use std::time::Instant;

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::background::{Background, Priority};
use crate::{docker_engine, e2e, guest_image, images, libvirt_host, repo_root, step};

/// Tests run at once in each test binary of the workspace.
const TEST_THREADS: &str = "4";

#[derive(clap::Args)]
pub struct Args {
    /// Leave the private libvirtd running afterwards (faster re-runs).
    #[arg(long)]
    keep_host: bool,
    /// Extra arguments passed to `cargo test` after `--`, e.g. a test name filter.
    #[arg(last = true)]
    cargo_test_args: Vec<String>,
}

/// Stops the private libvirtd and the dockerd this command started, when
/// [`Teardown::run`] is called or, if a step failed on the way (`?`), when dropped.
struct Teardown {
    armed: bool,
    dockerd: bool,
}

impl Teardown {
    fn run(&mut self) -> Result<()> {
        self.armed = false;
        let libvirtd = step("stop private libvirtd", libvirt_host::down);
        let dockerd = if self.dockerd { step("stop dockerd", docker_engine::down) } else { Ok(()) };
        libvirtd.and(dockerd)
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if self.armed
            && let Err(err) = self.run()
        {
            eprintln!("xtask test: stopping what it started: {err:#}");
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    step("host packages", libvirt_host::deps)?;
    // The control plane is built (when it is not cached) beside the steps up to the
    // manager image; the workspace tests need it.
    let control_plane = Background::start("control-plane", Priority::Same, &["control-plane", "build"])?;
    // The Kubernetes node image is needed only by the end-to-end suite, after the
    // workspace tests: it is built (when not cached) beside everything before
    // that, at a lower priority, taking the CPU the foreground and the control
    // plane leave idle (most of it while the workspace suites wait on the API
    // server and libvirtd). The Kubernetes packages both builds compile are
    // compiled once, shared through the Go build cache.
    let node_image = if args.cargo_test_args.is_empty() {
        Some(Background::start("node-image", Priority::Lower, &["node-image"])?)
    } else {
        None
    };
    // The book first: a broken link fails in seconds, before the long steps.
    step("docs book", crate::docs::build)?;
    step("workflows (actionlint)", crate::workflows::lint)?;
    let mut teardown = Teardown { armed: !args.keep_host, dockerd: false };
    let uri = step("private libvirtd", libvirt_host::up)?;
    let image = step("guest image", || guest_image::build(false))?;
    let engine = step("docker engine", docker_engine::up)?;
    teardown.dockerd = engine == docker_engine::Engine::Ours;
    let libvirtd_image = step("containerized libvirtd image", images::libvirtd_image)?;
    step("manager image, built offline", || images::build_provider_offline(images::TEST_MANAGER_IMAGE))?;
    control_plane.join()?;
    // What only the suites on kind need (cert-manager, the previous release,
    // Cluster API's e2e suite, which mostly reuses the Kubernetes packages the
    // control plane's build compiled, and kind's node image, made of the node
    // image's binaries) is built beside the workspace tests and the suite on
    // the private libvirtd, at a lower priority, one after another.
    let kind_prerequisites = if args.cargo_test_args.is_empty() {
        Some(Background::start("kind-prerequisites", Priority::Lower, &["kind-prerequisites"])?)
    } else {
        None
    };

    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    sh.set_var(env::TEST_LIBVIRT_URI, &uri);
    sh.set_var(env::GUEST_IMAGE, &image);
    sh.set_var(env::LIBVIRTD_IMAGE, &libvirtd_image);
    // The integration suites spend most of their time waiting (on the API server,
    // on libvirtd, on the simulator's retry intervals): four tests at a time keep
    // the two cores busier than one per core does. A value set by the caller wins.
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        sh.set_var("RUST_TEST_THREADS", TEST_THREADS);
    }
    let extra = &args.cargo_test_args;
    let reports = crate::target_dir().join("tmp/reports");
    let _ = std::fs::remove_dir_all(&reports);
    let workspace = step("cargo test", || {
        cmd!(sh, "cargo test --workspace --exclude e2e --locked --no-fail-fast -- {extra...}")
            .run()
            .map_err(anyhow::Error::from)
    });
    print_reports(&reports);
    let e2e_units = step("e2e crate unit tests", || {
        cmd!(sh, "cargo test --locked -p e2e --lib --bins").run().map_err(anyhow::Error::from)
    });
    let packaged = step("crates: cargo package", crate::crates::package);
    let summaries = [e2e::summary_path("private"), e2e::summary_path("kind"), crate::capi_specs::summary_path()];
    for path in &summaries {
        let _ = std::fs::remove_file(path);
    }
    // The suites on the private libvirtd and on kind boot the small test guest
    // image; the node image is joined before Cluster API's specs, the first
    // step that boots it.
    let e2e = if extra.is_empty() { e2e::run(e2e::Args::for_test_command()) } else { Ok(()) };
    let kind_prerequisites = kind_prerequisites.map_or(Ok(()), |job| job.join().map(drop));
    let kind = if extra.is_empty() {
        kind_prerequisites.and_then(|()| e2e::run(e2e::Args::kind_for_test_command()))
    } else {
        Ok(())
    };
    let node_image = node_image.map_or(Ok(()), |job| job.join().map(drop));
    let capi = if extra.is_empty() {
        node_image.and_then(|()| crate::capi_specs::run(&e2e::CapiArgs::default()))
    } else {
        node_image
    };
    let e2e = e2e.and(kind).and(capi);
    let result = workspace.and(e2e_units).and(packaged).and(e2e);

    if !args.keep_host {
        teardown.run()?;
    }
    // The README's main command as written, then the quick demo stopped with
    // Ctrl-C: each starts the private libvirtd itself, so it is stopped first.
    let result = if !args.keep_host && extra.is_empty() {
        let full = step("demo: cargo xtask demo --exit-after-ready", crate::demo_check::exit_after_ready);
        let quick = step("demo: Ctrl-C cleans up", crate::demo_check::ctrl_c_cleans_up);
        result.and(full).and(quick)
    } else {
        result
    };
    // The e2e tables again, where the end of a long log shows them.
    for path in &summaries {
        if let Ok(table) = std::fs::read_to_string(path) {
            eprintln!("{table}");
        }
    }
    eprintln!("xtask test: finished in {:.0} s", started.elapsed().as_secs_f64());
    result
}

/// Prints the summaries the test suites wrote (conformance per backend).
fn print_reports(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!("xtask test: no test summaries in {} (did the libvirtd tests run?)", dir.display());
        return;
    };
    let mut files: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for file in files {
        if let Ok(text) = std::fs::read_to_string(&file) {
            eprint!("{text}");
        }
    }
}
