//! The conformance suite: one set of scenarios (see `conformance/scenarios.rs`), run
//! through the `Hypervisor` trait against three backends:
//!
//! 1. `libvirt-sim` through `capl::hypervisor::sim::SimHypervisor`;
//! 2. libvirt's in-process `test:///default` driver through `LibvirtHypervisor`;
//! 3. a real libvirtd, URI in `CAPL_TEST_LIBVIRT_URI`, through `LibvirtHypervisor`
//!    (`cargo xtask host up` starts one and prints the URI). Without the variable
//!    that test fails, it does not skip.
//!
//! Each backend is one test that runs every scenario, prints how many ran, passed and
//! were marked as not modeled (with the reason), and fails listing every failure.
//! Run: `cargo test -p cluster-api-provider-libvirt --test conformance -- --nocapture`.

#[path = "conformance/fixtures.rs"]
mod fixtures;
#[path = "conformance/scenarios.rs"]
mod scenarios;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};

use capl::hypervisor::Hypervisor;
use capl::hypervisor::libvirt::LibvirtHypervisor;
use capl::hypervisor::sim::SimHypervisor;
use fixtures::{Backend, Ctx};
use rstest::rstest;

const URI_ENV: &str = "CAPL_TEST_LIBVIRT_URI";

fn open(backend: Backend) -> (Box<dyn Hypervisor>, Option<libvirt_sim::Host>) {
    match backend {
        Backend::Sim => {
            let uri = format!("sim:///conformance-{}", std::process::id());
            // Leases outlive their domain, as with dnsmasq (the simulator's default drops them).
            let host = libvirt_sim::Host::builder(&uri)
                .release_leases_on_stop(false)
                .build()
                .expect("build the simulated host");
            let hv = SimHypervisor::connect(&uri).expect("connect to the simulated host");
            (Box::new(hv), Some(host))
        }
        Backend::TestDriver => {
            let hv = LibvirtHypervisor::connect("test:///default").expect("open libvirt's test:///default driver");
            (Box::new(hv), None)
        }
        Backend::RealLibvirtd => {
            let uri = std::env::var(URI_ENV).unwrap_or_else(|_| {
                panic!(
                    "{URI_ENV} is not set: the real-libvirtd conformance run needs a private libvirtd. \
                     Start one with `cargo xtask host up` and export the URI it prints, e.g. \
                     `{URI_ENV}=<uri> cargo test -p cluster-api-provider-libvirt --test conformance` \
                     (see libvirt-sim/README.md)"
                )
            });
            let hv = LibvirtHypervisor::connect(&uri)
                .unwrap_or_else(|e| panic!("connect to {uri} ({URI_ENV}): {e}; is `cargo xtask host up` running?"));
            (Box::new(hv), None)
        }
    }
}

/// A number unique to this process run, so parallel or repeated runs do not clash.
fn run_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    (std::process::id() % 100_000) * 10 + NEXT.fetch_add(1, Ordering::SeqCst)
}

#[rstest]
#[case::sim(Backend::Sim)]
#[case::test_driver(Backend::TestDriver)]
#[case::real_libvirtd(Backend::RealLibvirtd)]
fn conformance(#[case] backend: Backend) {
    let (hv, _host) = open(backend);
    let run = run_id();
    let only = std::env::var("CAPL_CONFORMANCE_ONLY").ok();
    let mut ran = 0;
    let mut marked = Vec::new();
    let mut failures = Vec::new();
    for (index, scenario) in scenarios::ALL.iter().enumerate() {
        if only.as_deref().is_some_and(|o| !scenario.name.contains(o)) {
            continue;
        }
        if let Some((_, reason)) = scenario.not_on.iter().find(|(b, _)| *b == backend) {
            marked.push(format!("{}: {reason}", scenario.name));
            continue;
        }
        ran += 1;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let ctx = Ctx::new(hv.as_ref(), backend, run, index as u32 + 1);
            (scenario.run)(&ctx);
        }));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into());
            failures.push(format!("{}: {message}", scenario.name));
        }
    }
    eprintln!(
        "conformance on {}: {ran} scenarios ran, {} passed, {} failed, {} marked as not modeled by this backend",
        backend.label(),
        ran - failures.len(),
        failures.len(),
        marked.len()
    );
    for m in &marked {
        eprintln!("  not modeled by {}: {m}", backend.label());
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} scenarios failed on {}:\n{}",
        failures.len(),
        backend.label(),
        failures.join("\n")
    );
}
