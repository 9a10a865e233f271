//! The conformance suite: one set of scenarios (see `conformance/scenarios.rs`), run
//! through the `Hypervisor` trait against four backends:
//!
//! 1. `libvirt-sim` through `capl_host::hypervisor::sim::SimHypervisor`;
//! 2. libvirt's in-process `test:///default` driver through `LibvirtHypervisor`;
//! 3. a real libvirtd, the private test host (`cargo xtask host up`; its URI from
//!    `testenv::test_host::uri`), through `LibvirtHypervisor`. Without it that
//!    test fails, it does not skip;
//! 4. a real libvirtd in a container this test starts with testcontainers
//!    (`testenv::container_libvirtd`: the image of `cargo xtask libvirtd-image`,
//!    on the docker engine of `cargo xtask docker-engine up`). Without an
//!    engine or the image that test fails naming the command, it does not skip.
//!
//! Each backend is one test that runs every scenario, prints how many ran, passed and
//! were marked as not modeled (with the reason), and fails listing every failure.
//! Run: `cargo test -p capl-host --test libvirtd conformance -- --nocapture`.

mod fixtures;
mod scenarios;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};

use capl_host::hypervisor::HostAdmin;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::sim::SimHypervisor;
use fixtures::{Backend, Ctx, SeenError, take_seen_errors};
use rstest::rstest;

/// What keeps a backend alive while the suite uses it: the simulated host, or the container.
enum Keep {
    Nothing,
    Sim(#[allow(dead_code)] libvirt_sim::Host),
    Container(#[allow(dead_code)] Box<testenv::container_libvirtd::ContainerLibvirtd>),
}

fn open(backend: Backend) -> (Box<dyn HostAdmin>, Keep) {
    match backend {
        Backend::Sim => {
            let uri = format!("sim:///conformance-{}-{}", std::process::id(), run_id());
            // Leases outlive their domain, as with dnsmasq (the simulator's default drops them).
            let host = libvirt_sim::Host::builder(&uri)
                .release_leases_on_stop(false)
                .build()
                .expect("build the simulated host");
            let hv = SimHypervisor::connect(&uri).expect("connect to the simulated host");
            (Box::new(hv), Keep::Sim(host))
        }
        Backend::TestDriver => {
            // Lifecycle events are dispatched by libvirt's event loop, which must be
            // registered before a connection is opened.
            capl_host::hypervisor::libvirt::ensure_event_loop().expect("libvirt's event loop");
            let hv = LibvirtHypervisor::connect("test:///default").expect("open libvirt's test:///default driver");
            (Box::new(hv), Keep::Nothing)
        }
        Backend::RealLibvirtd => {
            let uri = testenv::test_host::uri()
                .unwrap_or_else(|message| panic!("the real-libvirtd conformance run: {message}"));
            capl_host::hypervisor::libvirt::ensure_event_loop().expect("libvirt's event loop");
            let hv = LibvirtHypervisor::connect(&uri)
                .unwrap_or_else(|e| panic!("connect to {uri}: {e}; is `{}` running?", testenv::test_host::UP_COMMAND));
            (Box::new(hv), Keep::Nothing)
        }
        Backend::ContainerLibvirtd => {
            let daemon = testenv::container_libvirtd::ContainerLibvirtd::start()
                .unwrap_or_else(|message| panic!("the containerized-libvirtd conformance run: {message}"));
            capl_host::hypervisor::libvirt::ensure_event_loop().expect("libvirt's event loop");
            let hv = LibvirtHypervisor::connect(daemon.uri())
                .unwrap_or_else(|e| panic!("connect to {} (container {}): {e}", daemon.uri(), daemon.id()));
            (Box::new(hv), Keep::Container(Box::new(daemon)))
        }
    }
}

/// A number unique to this process run, so parallel or repeated runs do not clash.
fn run_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    (std::process::id() % 100_000) * 10 + NEXT.fetch_add(1, Ordering::SeqCst)
}

/// Runs one scenario; returns the expected errors it saw, or why it failed.
fn run_scenario(
    hv: &dyn HostAdmin,
    backend: Backend,
    run: u32,
    index: u32,
    scenario: &scenarios::Scenario,
) -> Result<Vec<SeenError>, String> {
    take_seen_errors();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let ctx = Ctx::new(hv, backend, run, index);
        (scenario.run)(&ctx);
    }));
    let seen = take_seen_errors();
    outcome.map(|()| seen).map_err(crate::panic_message)
}

/// A message with UUIDs replaced, so two hosts' messages compare.
fn normalized(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(c) = rest.chars().next() {
        let candidate = rest.get(..36).unwrap_or("");
        let is_uuid = candidate.len() == 36
            && candidate
                .char_indices()
                .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { c == '-' } else { c.is_ascii_hexdigit() });
        if is_uuid {
            out.push_str("<uuid>");
            rest = &rest[36..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Where the simulator's errors differ from the real libvirtd's for the same scenario:
/// a different code, or a different message (XML parser details excepted: libxml2 and
/// quick-xml word those differently).
fn differences(scenario: &str, real: &[SeenError], sim: &[SeenError]) -> Vec<String> {
    if real.len() != sim.len() {
        return vec![format!(
            "{scenario}: {} expected errors on the real libvirtd, {} on libvirt-sim",
            real.len(),
            sim.len()
        )];
    }
    real.iter()
        .zip(sim)
        .filter(|(r, s)| r.code != s.code || (r.code != 35 && normalized(&r.message) != normalized(&s.message)))
        .map(|(r, s)| {
            format!(
                "{scenario} / {}:\n    real: [{}] {}\n    sim:  [{}] {}",
                r.what, r.code, r.message, s.code, s.message
            )
        })
        .collect()
}

#[rstest]
#[case::sim(Backend::Sim)]
#[case::test_driver(Backend::TestDriver)]
#[case::real_libvirtd(Backend::RealLibvirtd)]
#[case::containerized_libvirtd(Backend::ContainerLibvirtd)]
fn conformance(#[case] backend: Backend) {
    let _daemon = (backend == Backend::RealLibvirtd).then(crate::share_real_daemon_blocking);
    let (hv, _host) = open(backend);
    // On a real libvirtd every scenario also runs on a simulated twin host, with the
    // same object names, and the errors both gave are compared message by message.
    let twin = backend.is_daemon().then(|| open(Backend::Sim));
    let run = run_id();
    let only = std::env::var(capl_testbed::env::CONFORMANCE_ONLY).ok();
    let mut ran = 0;
    let mut marked = Vec::new();
    let mut failures = Vec::new();
    let mut message_diffs = Vec::new();
    let mut compared = 0;
    for (index, scenario) in scenarios::ALL.iter().enumerate() {
        if only.as_deref().is_some_and(|o| !scenario.name.contains(o)) {
            continue;
        }
        if let Some((_, reason)) = scenario.not_on.iter().find(|(b, _)| *b == backend) {
            marked.push(format!("{}: {reason}", scenario.name));
            continue;
        }
        ran += 1;
        let index = index as u32 + 1;
        match run_scenario(hv.as_ref(), backend, run, index, scenario) {
            Err(message) => failures.push(format!("{}: {message}", scenario.name)),
            Ok(real) => {
                if let Some((twin_hv, _)) = &twin {
                    match run_scenario(twin_hv.as_ref(), Backend::Sim, run, index, scenario) {
                        Err(message) => failures.push(format!("{} (libvirt-sim twin): {message}", scenario.name)),
                        Ok(sim) => {
                            compared += real.len();
                            message_diffs.extend(differences(scenario.name, &real, &sim));
                        }
                    }
                }
            }
        }
    }
    use std::fmt::Write as _;
    let mut summary = String::new();
    let _ = writeln!(
        summary,
        "conformance on {}: {ran} scenarios ran, {} passed, {} failed, {} marked as not modeled by this backend",
        backend.label(),
        ran - failures.len(),
        failures.len(),
        marked.len()
    );
    for m in &marked {
        let _ = writeln!(summary, "  not modeled by {}: {m}", backend.label());
    }
    if twin.is_some() {
        let _ = writeln!(
            summary,
            "  libvirt-sim twin: {compared} expected errors compared, {} differ from the real libvirtd's",
            message_diffs.len()
        );
        for d in &message_diffs {
            let _ = writeln!(summary, "  {d}");
        }
    }
    crate::report(&format!("conformance-{}", backend.label().replace(['/', ':', ' '], "_")), &summary);
    assert!(
        failures.is_empty(),
        "{} of {ran} scenarios failed on {}:\n{}",
        failures.len(),
        backend.label(),
        failures.join("\n")
    );
    assert!(
        message_diffs.is_empty(),
        "libvirt-sim's errors differ from the real libvirtd's:\n{}",
        message_diffs.join("\n")
    );
}

#[test]
fn the_twin_comparison_reports_different_codes_and_messages() {
    assert_eq!(
        normalized("domain 'd' already exists with uuid 5f0c3c1e-0d7e-4a39-9a6c-0123456789ab."),
        "domain 'd' already exists with uuid <uuid>."
    );
    let seen = |code, message: &str| SeenError { what: "start twice".into(), code, message: message.into() };
    let real = [seen(55, "Requested operation is not valid: domain is already running")];
    assert!(differences("s", &real, &real).is_empty());
    assert_eq!(differences("s", &real, &[seen(9, &real[0].message)]).len(), 1);
    assert_eq!(differences("s", &real, &[seen(55, "domain is active")]).len(), 1);
    assert_eq!(differences("s", &real, &[]).len(), 1);
    let xml = |m: &str| [seen(35, m)];
    assert!(differences("s", &xml("at line 1: expected '>'"), &xml("at line 1: unexpected end")).is_empty());
}
