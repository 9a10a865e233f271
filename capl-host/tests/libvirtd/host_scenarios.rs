//! The host scenarios of `host_scenarios/scenarios.rs` as one table, run on two backends,
//! as the conformance suite does:
//!
//! - libvirt-sim, a fresh simulated host per scenario;
//! - the private test libvirtd (`cargo xtask host up`; the contract is in
//!   `testenv::test_host`), with its network and pools. Domains are
//!   `type='qemu'` (TCG): KVM does not work on the test machines. The base
//!   image `capl-host-tests-base.qcow2` (64 MiB, empty: the guests need not
//!   boot) is created in the base pool on first use and kept.
//!
//! Each backend is one test. Its scenarios run on a few threads at once (each
//! in a namespace of its own), and the test fails listing every scenario that
//! failed, with its message.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use capl_host::hypervisor::HostAdmin;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::{InfraSpec, check_infrastructure};
use rstest::rstest;
use testenv::test_host;

use crate::host_sim::sim;
use capl_host_test_support::host::{Fixture, IMAGE_BYTES, ensure_base_image};

mod scenarios;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sim,
    RealLibvirtd,
}

impl Backend {
    /// The namespace prefix of this backend's machines.
    fn tag(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::RealLibvirtd => "real",
        }
    }
}

/// What one scenario gets.
struct Ctx<'a> {
    hv: &'a dyn HostAdmin,
    fx: &'a Fixture,
    /// `<backend>-<scenario tag>`: every name the scenario makes starts with it.
    namespace: String,
    /// A directory of this scenario's own under the system temp dir (which the
    /// private daemon sees as it is), removed afterwards.
    scratch: PathBuf,
}

struct Scenario {
    name: &'static str,
    /// Short: it becomes part of domain and volume names.
    tag: &'static str,
    run: fn(&Ctx),
    /// The backend this scenario needs, when only one models it.
    only_on: Option<Backend>,
}

const fn both(name: &'static str, tag: &'static str, run: fn(&Ctx)) -> Scenario {
    Scenario { name, tag, run, only_on: None }
}

const SCENARIOS: &[Scenario] = &[
    both("full_cycle", "full", |c| scenarios::full_cycle(c.hv, c.fx, &c.namespace)),
    both("stopped_machine_is_started", "stopped", |c| scenarios::stopped_machine_is_started(c.hv, c.fx, &c.namespace)),
    both("start_never_creates", "start", |c| scenarios::start_never_creates(c.hv, c.fx, &c.namespace)),
    both("reboot_by_domain_state", "reboot", |c| scenarios::reboot_by_domain_state(c.hv, c.fx, &c.namespace)),
    both("crash_after_every_step", "crash", |c| scenarios::crash_after_every_step(c.hv, c.fx, &c.namespace)),
    both("delete_after_partial_create", "partial", |c| {
        scenarios::delete_after_partial_create(c.hv, c.fx, &c.namespace)
    }),
    both("twenty_concurrent_machines", "par", |c| scenarios::twenty_concurrent_machines(c.hv, c.fx, &c.namespace)),
    both("foreign_domain_is_left_alone", "foreign", |c| {
        scenarios::foreign_domain_is_left_alone(c.hv, c.fx, &c.namespace)
    }),
    both("foreign_volume_is_left_alone", "foreign-vol", |c| {
        scenarios::foreign_volume_is_left_alone(c.hv, c.fx, &c.namespace)
    }),
    both("bad_disk_and_missing_image", "bad", |c| scenarios::bad_disk_and_missing_image(c.hv, c.fx, &c.namespace)),
    both("base_image_a_domain_writes_to_is_refused", "peek", |c| {
        scenarios::base_image_a_domain_writes_to_is_refused(c.hv, c.fx, &c.namespace)
    }),
    both("endpoint_address_is_avoided", "ep", |c| scenarios::endpoint_address_is_avoided(c.hv, c.fx, &c.namespace)),
    both("infra_missing_vs_inactive", "infra", |c| scenarios::infra_missing_vs_inactive(c.hv, c.fx, &c.namespace)),
    both("foreign_dhcp_entry_is_left_alone", "fdhcp", |c| {
        scenarios::foreign_dhcp_entry_is_left_alone(c.hv, c.fx, &c.namespace)
    }),
    both("recreated_machine_gets_fresh_objects", "reborn", |c| {
        scenarios::recreated_machine_gets_fresh_objects(c.hv, c.fx, &c.namespace)
    }),
    both("another_identitys_disk_is_not_adopted", "clash", |c| {
        scenarios::another_identitys_disk_is_not_adopted(c.hv, c.fx, &c.namespace)
    }),
    both("data_disks", "data", |c| scenarios::data_disks(c.hv, c.fx, &c.namespace)),
    both("ignition_config", "ign", |c| scenarios::ignition_config(c.hv, c.fx, &c.namespace)),
    both("data_disk_problems", "baddata", |c| scenarios::data_disk_problems(c.hv, c.fx, &c.namespace)),
    both("legacy_names_are_kept", "legacy", |c| scenarios::legacy_names_are_kept(c.hv, c.fx, &c.namespace)),
    both("unusable_network_fails_before_anything_is_made", "unnet", |c| {
        scenarios::unusable_network_fails_before_anything_is_made(c.hv, c.fx, &c.namespace)
    }),
    Scenario {
        name: "unsupported_pool_type_is_named",
        tag: "scsi",
        run: |c| scenarios::unsupported_pool_type_is_named(c.hv, c.fx, &c.namespace),
        // The simulator models only pools of type dir.
        only_on: Some(Backend::RealLibvirtd),
    },
    both("console_log_file", "log", console_log_file),
    both("static_addresses_on_a_bridge_network", "ipam", static_addresses_on_a_bridge),
    both("additional_nics", "nics", additional_nics),
    both("endpoint_from_network", "vip", |c| scenarios::endpoint_from_network(c.hv, c.fx, &c.namespace)),
    Scenario {
        name: "bridge_missing_is_named",
        tag: "nobr",
        run: bridge_missing,
        // The simulator does not model the host's network interfaces.
        only_on: Some(Backend::RealLibvirtd),
    },
    Scenario {
        name: "console_log_dir_missing_is_named",
        tag: "nolog",
        run: |c| {
            let missing = c.scratch.join("not-created");
            scenarios::console_log_dir_missing(c.hv, c.fx, &c.namespace, missing.to_str().unwrap())
        },
        // The simulator does not model the host's file system.
        only_on: Some(Backend::RealLibvirtd),
    },
];

/// On the real daemon the bridge is a Linux bridge made here (no address, no
/// port but the guest's: nothing outside is reached) and removed afterwards.
fn static_addresses_on_a_bridge(c: &Ctx) {
    let bridge = format!("capl-br{}", std::process::id() % 100_000);
    let real = !c.hv.uri().starts_with("sim:");
    if real {
        let made = std::process::Command::new("ip").args(["link", "add", "name", &bridge, "type", "bridge"]).status();
        assert!(
            made.as_ref().is_ok_and(|s| s.success()),
            "cannot make the Linux bridge {bridge} (`ip link add`, as root; iproute2): {made:?}"
        );
        let _ = std::process::Command::new("ip").args(["link", "set", &bridge, "up"]).status();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        scenarios::static_addresses_on_a_bridge_network(c.hv, c.fx, &c.namespace, &bridge)
    }));
    if real {
        let _ = std::process::Command::new("ip").args(["link", "del", &bridge]).status();
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A Linux bridge made here for the additional NICs (removed afterwards), and
/// a name no interface has.
fn additional_nics(c: &Ctx) {
    let bridge = format!("capl-nic{}", std::process::id() % 100_000);
    let absent = format!("capl-nx{}", std::process::id() % 100_000);
    let real = !c.hv.uri().starts_with("sim:");
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output().map(|out| out.status);
    if real {
        let _ = ip(&["link", "del", &bridge]);
        let made = ip(&["link", "add", "name", &bridge, "type", "bridge"]);
        assert!(made.as_ref().is_ok_and(|s| s.success()), "cannot make the Linux bridge {bridge}: {made:?}");
        let _ = ip(&["link", "set", &bridge, "up"]);
    }
    let outcome =
        catch_unwind(AssertUnwindSafe(|| scenarios::additional_nics(c.hv, c.fx, &c.namespace, &bridge, &absent)));
    if real {
        let _ = ip(&["link", "del", &bridge]);
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A bridge named by the test that does not exist until the scenario makes it
/// (then removed again).
fn bridge_missing(c: &Ctx) {
    let bridge = format!("capl-nb{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output().map(|out| out.status);
    let _ = ip(&["link", "del", &bridge]);
    let make = || {
        let made = ip(&["link", "add", "name", &bridge, "type", "bridge"]);
        assert!(made.as_ref().is_ok_and(|s| s.success()), "cannot make the Linux bridge {bridge}: {made:?}");
        let _ = ip(&["link", "set", &bridge, "up"]);
    };
    let outcome =
        catch_unwind(AssertUnwindSafe(|| scenarios::bridge_missing_is_named(c.hv, c.fx, &c.namespace, &bridge, &make)));
    let _ = ip(&["link", "del", &bridge]);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The console log goes to `<dir>/<domain>-console.log`; on a real host virtlogd writes the file.
fn console_log_file(c: &Ctx) {
    let dir = c.scratch.to_str().unwrap();
    scenarios::console_log_file(c.hv, c.fx, &c.namespace, dir);
    if c.hv.uri().starts_with("sim:") {
        return;
    }
    let logs: Vec<_> = std::fs::read_dir(&c.scratch).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(
        logs.iter().any(|name| name.to_string_lossy().ends_with("-console.log")),
        "virtlogd wrote no console log into {dir}: {logs:?}"
    );
}

/// The host for one scenario: a fresh simulated host, or a connection to the test libvirtd.
fn open(backend: Backend, tag: &str) -> (Box<dyn HostAdmin>, Option<libvirt_sim::Host>, Fixture) {
    match backend {
        Backend::Sim => {
            let (host, hv, fx) = sim(&format!("scenario-{tag}"));
            (Box::new(hv), Some(host), fx)
        }
        Backend::RealLibvirtd => {
            let uri = test_host::uri_or_panic();
            let hv = LibvirtHypervisor::connect(&uri).unwrap_or_else(|e| {
                panic!("cannot connect to the test libvirtd at {uri}: {e}: is `{}` running?", test_host::UP_COMMAND)
            });
            let fx = Fixture {
                network: test_host::NETWORK.into(),
                base_pool: test_host::BASE_POOL.into(),
                domain_pool: test_host::DISK_POOL.into(),
                image: "capl-host-tests-base.qcow2".into(),
                image_bytes: IMAGE_BYTES,
            };
            let infra = InfraSpec {
                network: fx.network.clone(),
                base_pool: fx.base_pool.clone(),
                domain_pool: fx.domain_pool.clone(),
            };
            if let Err(e) = check_infrastructure(&hv, &infra) {
                panic!("the test libvirtd at {uri} is not set up ({e}): run `{}`", test_host::UP_COMMAND);
            }
            ensure_base_image(&hv, &fx);
            (Box::new(hv), None, fx)
        }
    }
}

fn run_one(backend: Backend, scenario: &Scenario) -> Result<(), String> {
    let scratch = std::env::temp_dir().join(format!("capl-{}-{}-{}", backend.tag(), scenario.tag, std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let (hv, _host, fx) = open(backend, scenario.tag);
        let ctx = Ctx {
            hv: hv.as_ref(),
            fx: &fx,
            namespace: format!("{}-{}", backend.tag(), scenario.tag),
            scratch: scratch.clone(),
        };
        (scenario.run)(&ctx);
    }));
    let _ = std::fs::remove_dir_all(&scratch);
    outcome.map_err(crate::panic_message)
}

#[rstest]
#[case::sim(Backend::Sim)]
#[case::real_libvirtd(Backend::RealLibvirtd)]
fn host_scenarios(#[case] backend: Backend) {
    let _daemon = (backend == Backend::RealLibvirtd).then(crate::share_real_daemon_blocking);
    if backend == Backend::RealLibvirtd {
        // Fail once, clearly, rather than once per scenario.
        open(backend, "probe");
    }
    let only = std::env::var(capl_testbed::env::HOST_SCENARIO_ONLY).ok();
    let todo: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|s| s.only_on.is_none_or(|b| b == backend))
        .filter(|s| only.as_deref().is_none_or(|o| s.name.contains(o)))
        .collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 4);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(scenario) = todo.get(next.fetch_add(1, Ordering::SeqCst)) {
                    if let Err(message) = run_one(backend, scenario) {
                        failures.lock().unwrap().push(format!("{}: {message}", scenario.name));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    crate::report(
        &format!("host-scenarios-{}", backend.tag()),
        &format!("host scenarios on {}: {} ran, {} failed\n", backend.tag(), todo.len(), failures.len()),
    );
    assert!(
        failures.is_empty(),
        "{} of {} host scenarios failed on {}:\n{}",
        failures.len(),
        todo.len(),
        backend.tag(),
        failures.join("\n")
    );
}

/// Every scenario function of `host_scenarios/scenarios.rs` is in the table.
#[test]
fn the_table_lists_every_scenario() {
    let source = include_str!("host_scenarios/scenarios.rs");
    let missing: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("pub fn "))
        // A scenario: takes the host, the fixture and a namespace, returns nothing.
        .filter(|l| l.contains("hv: &dyn HostAdmin, fx: &Fixture, namespace: &str") && l.ends_with(") {"))
        .map(|l| &l[..l.find('(').unwrap()])
        .filter(|name| {
            !SCENARIOS.iter().any(|s| s.name == *name || s.name.starts_with(name) || name.starts_with(s.name))
        })
        .collect();
    assert!(missing.is_empty(), "host scenarios not in the table: {missing:?}");
}
