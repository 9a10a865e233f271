//! The manager dies after each provisioning step and a new one (fresh
//! connection cache, fresh caches) takes over: the machine converges with
//! exactly one domain, one overlay, one seed ISO and one DHCP host.

use crate::support::*;
use capl::api::LibvirtMachine;
use capl_host::MachineNames;
use capl_host::hypervisor::{DomainState, Hypervisor};
use libvirt_sim::{Error, ErrorCode, Op};

/// The call that the step after step `k` makes first: failing it leaves the
/// host exactly as a manager that died right after step `k` would.
/// `None`: run all steps, kill once the domain runs (before it has an address).
const CRASH_POINTS: &[(&str, Option<(Op, u64)>)] = &[
    ("before the root disk", Some((Op::VolumeCreate, 1))),
    ("after the root disk", Some((Op::VolumeCreate, 2))),
    ("after the seed volume", Some((Op::VolumeUpload, 1))),
    ("after the seed upload", Some((Op::NetworkUpdate, 1))),
    ("after the DHCP reservation", Some((Op::DomainDefine, 1))),
    ("after the define", Some((Op::DomainSetAutostart, 1))),
    ("after autostart", Some((Op::DomainCreate, 1))),
    ("after the start", None),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_killed_after_each_step_converges_without_duplicates() {
    let w = World::new("rr-restart").await;
    provisioned_cluster(&w, "demo").await;
    let mut manager = w.start_manager();

    for (k, (point, fault)) in CRASH_POINTS.iter().enumerate() {
        let name = format!("m{k}");
        if let Some((op, n)) = fault {
            // The manager retries once or twice on its own status writes before
            // the kill: every later call of the op fails too, until the kill.
            for retry in 0..10 {
                w.host.fail_nth(
                    *op,
                    n + retry,
                    Error::new(ErrorCode::InternalError, format!("injected crash {point}")),
                );
            }
        }
        let lm = ready_machine_objects(&w, "demo", &name).await;
        let names = MachineNames::new(&w.ns, &name, lm.metadata.uid.as_deref().unwrap());
        let domain = names.domain.clone();

        match fault {
            // The dying manager got as far as the step before the failed call.
            Some(_) => {
                w.wait_for::<LibvirtMachine>(&name, &format!("the injected failure {point}"), |lm| {
                    condition(machine_conditions(lm), "DomainProvisioningReady")
                        .is_some_and(|c| c.status == "False" && c.message.contains("injected crash"))
                })
                .await;
                // The host is as a manager that died right after step k leaves it.
                let objects = w.host_objects();
                let present = (
                    objects.volumes.contains(&names.overlay_volume()),
                    objects.volumes.contains(&names.cloud_init_volume()),
                    objects.dhcp_hosts.iter().any(|h| h.ends_with(&format!(" {domain}"))),
                    objects.domains.contains(&domain),
                );
                assert_eq!(
                    present,
                    (k >= 1, k >= 2, k >= 4, k >= 5),
                    "(overlay, ISO, DHCP host, domain) {point}: {objects:?}"
                );
                if k >= 5 {
                    assert_eq!(w.inspect().domain_state(&domain).unwrap(), DomainState::Shutoff);
                }
            }
            None => {
                w.wait_host(&format!("domain {domain} running"), |hv| {
                    hv.domain_state(&domain).is_ok_and(|s| s == DomainState::Running)
                })
                .await;
            }
        }
        manager.kill().await;
        w.host.faults().clear();
        manager = w.start_manager();

        let lm = w.wait_for::<LibvirtMachine>(&name, &format!("Ready after a restart {point}"), machine_ready).await;
        let machines = k + 1;
        let objects = w.host_objects();
        assert_eq!(objects.domains.len(), machines, "domains after a restart {point}: {objects:?}");
        assert!(objects.domains.contains(&domain), "{objects:?}");
        assert_eq!(
            objects.volumes.len(),
            2 * machines,
            "one overlay and one ISO per machine after a restart {point}: {objects:?}"
        );
        assert_eq!(
            objects.dhcp_hosts.len(),
            machines,
            "one DHCP host per machine after a restart {point}: {objects:?}"
        );
        assert_eq!(w.inspect().domain_state(&domain).unwrap(), DomainState::Running);
        assert!(w.inspect().domain_autostart(&domain).unwrap(), "autostart after a restart {point}");
        assert_eq!(
            lm.spec.provider_id,
            Some(format!("libvirt://{}", lm.metadata.uid.clone().unwrap())),
            "providerID after a restart {point}"
        );
    }
    assert_eq!(w.host.domain_count(), CRASH_POINTS.len());
    manager.kill().await;
}
