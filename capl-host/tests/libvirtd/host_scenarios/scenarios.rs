//! The host scenarios, generic over the backend: the same functions run
//! against the simulator and a real libvirtd, as one table (`host_scenarios.rs`).

use std::collections::HashSet;
use std::net::Ipv4Addr;

use capl_host::hypervisor::{DomainState, HostAdmin, UndefineFlags};
use capl_host::infra::check_network;
use capl_host::network_xml::parse_network;
use capl_host::{
    CreateStep, FailureKind, HostError, MachineAddress, MachineSpec, ObjectKind, RebootMethod, create_machine,
    delete_machine, observe_machine, reboot_machine, run_create_steps, start_machine,
};
use capl_host_test_support::host::{
    Fixture, assert_created_once, dhcp_hosts, domain_id, fresh_spec, leftovers, our_entry, reserved_ip, spec, uid_for,
    user_data, with_data_disk,
};

/// create -> running -> steady state -> delete, nothing left behind; delete again is a no-op.
pub fn full_cycle(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let spec = fresh_spec(hv, fx, namespace, "full-0");
    let names = spec.names();
    let report = create_machine(hv, &spec, &user_data(&spec)).expect("create");
    assert!(report.created);
    assert_eq!(report.state, DomainState::Running);
    assert_eq!(report.provider_id, format!("libvirt://{}", spec.identity));
    assert_created_once(hv, fx, &spec);
    let domain = capl_host::domain_xml::parse_domain(&hv.domain_xml(&names.domain).unwrap()).unwrap();
    assert_eq!(domain.uuid, spec.identity);
    // Nothing else on the network has it: the MAC derived from the domain name, as ever.
    assert_eq!(domain.macs, vec![names.derived_mac()]);
    assert_eq!(report.mac, Some(names.derived_mac()));

    let again = create_machine(hv, &spec, &user_data(&spec)).expect("steady state");
    assert!(!again.created && !again.started);
    assert_eq!(again.state, DomainState::Running);
    assert_eq!(again.addresses.last(), Some(&MachineAddress::Hostname(spec.name.clone())));

    let observed = observe_machine(hv, &spec).expect("observe").expect("the domain exists");
    assert_eq!((observed.state, observed.created, observed.started), (DomainState::Running, false, false));
    assert_eq!((again.mac.as_ref(), observed.mac.as_ref()), (Some(&names.derived_mac()), Some(&names.derived_mac())));

    delete_machine(hv, &spec).expect("delete");
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());
    assert_eq!(observe_machine(hv, &spec).expect("observe after delete"), None);
    delete_machine(hv, &spec).expect("delete of a deleted machine");
}

/// A stopped machine is started again; its reserved address is kept.
pub fn stopped_machine_is_started(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let spec = fresh_spec(hv, fx, namespace, "stopped-0");
    let names = spec.names();
    create_machine(hv, &spec, &user_data(&spec)).expect("create");
    let ip = reserved_ip(hv, fx, &names);
    hv.domain_destroy(&names.domain).unwrap();
    assert_eq!(hv.domain_state(&names.domain).unwrap(), DomainState::Shutoff);
    let report = start_machine(hv, &spec).expect("start").expect("the domain exists");
    assert!(report.started && !report.created);
    assert_eq!(hv.domain_state(&names.domain).unwrap(), DomainState::Running);
    assert_eq!(reserved_ip(hv, fx, &names), ip);
    delete_machine(hv, &spec).expect("delete");
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// A machine is rebooted as its domain is found: a running one is reset (the
/// same domain id: the same QEMU process), a paused one destroyed and started
/// (a new process), a shut-off one started; each runs afterwards. A domain
/// at its name that another identity's metadata claims is a collision and
/// stays as it was; without a domain there is nothing to reboot.
pub fn reboot_by_domain_state(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let spec = fresh_spec(hv, fx, namespace, "reboot-0");
    let names = spec.names();
    let domain = names.domain.as_str();
    assert_eq!(reboot_machine(hv, &spec).expect("reboot of an absent machine"), None);
    create_machine(hv, &spec, &user_data(&spec)).expect("create");
    let reboot = || reboot_machine(hv, &spec).expect("reboot").expect("the domain exists");

    let first = domain_id(hv, domain).expect("the created domain runs");
    let done = reboot();
    assert_eq!((done.method, done.was, done.reset_error.as_deref()), (RebootMethod::Reset, DomainState::Running, None));
    assert_eq!(done.describe(), "reset (was running)");
    assert_eq!(hv.domain_state(domain).unwrap(), DomainState::Running);
    assert_eq!(domain_id(hv, domain), Some(first), "a reset keeps the QEMU process");

    hv.domain_suspend(domain).unwrap();
    assert_eq!(hv.domain_state(domain).unwrap(), DomainState::Paused);
    let done = reboot();
    assert_eq!((done.method, done.was), (RebootMethod::PowerCycle, DomainState::Paused), "{}", done.describe());
    assert_eq!(done.describe(), "destroyed and started (was paused)");
    assert_eq!(hv.domain_state(domain).unwrap(), DomainState::Running);
    let second = domain_id(hv, domain).expect("the power-cycled domain runs");
    assert_ne!(second, first, "a power cycle starts a new QEMU process");

    hv.domain_destroy(domain).unwrap();
    let done = reboot();
    assert_eq!((done.method, done.was), (RebootMethod::Start, DomainState::Shutoff), "{}", done.describe());
    assert_eq!(done.describe(), "started (was shut off)");
    assert_eq!(hv.domain_state(domain).unwrap(), DomainState::Running);
    assert_created_once(hv, fx, &spec);
    delete_machine(hv, &spec).expect("delete");
    assert_eq!(reboot_machine(hv, &spec).expect("reboot of a deleted machine"), None);
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());

    // A running domain at the machine's name whose metadata names another identity.
    let other = uid_for(namespace, "reboot-0-other");
    let foreign = format!(
        "<domain type='qemu'><name>{domain}</name><uuid>{other}</uuid><metadata>\
         <capl:machine xmlns:capl='{ns}'><capl:namespace>{namespace}</capl:namespace>\
         <capl:name>{name}</capl:name><capl:uid>{other}</capl:uid><capl:cluster>host-tests</capl:cluster>\
         </capl:machine></metadata><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os><devices/></domain>",
        ns = capl_host::domain_xml::METADATA_NAMESPACE,
        name = spec.name,
    );
    hv.domain_define(&foreign).expect("define the other identity's domain");
    hv.domain_start(domain).expect("start the other identity's domain");
    let (before_xml, before_id) = (hv.domain_xml(domain).unwrap(), domain_id(hv, domain));
    let err = reboot_machine(hv, &spec).expect_err("a reboot must refuse another identity's domain");
    assert_collision(&err, domain);
    assert!(err.to_string().contains(&other), "the error names the other identity: {err}");
    assert_eq!(hv.domain_state(domain).unwrap(), DomainState::Running, "the other identity's domain was stopped");
    assert_eq!(domain_id(hv, domain), before_id, "the other identity's domain was restarted");
    assert_eq!(hv.domain_xml(domain).unwrap(), before_xml, "the other identity's domain was changed");
    hv.domain_destroy(domain).unwrap();
    hv.domain_undefine(domain, UndefineFlags::all()).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// Starting a machine whose domain does not exist creates nothing: it says
/// so (`None`), and creating it takes the bootstrap data. Also after a crash
/// that left disks, seed and reservation but no domain.
pub fn start_never_creates(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let spec = fresh_spec(hv, fx, namespace, "start-0");
    assert_eq!(start_machine(hv, &spec).expect("start of an absent machine"), None);
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());

    let before_define = &CreateStep::ALL[..CreateStep::ALL.iter().position(|s| *s == CreateStep::Define).unwrap()];
    run_create_steps(hv, &spec, &user_data(&spec), before_define).unwrap();
    assert_eq!(start_machine(hv, &spec).expect("start without a domain"), None);
    assert!(!hv.domain_list().unwrap().contains(&spec.names().domain), "start defined a domain");

    let report = create_machine(hv, &spec, &user_data(&spec)).expect("create");
    assert!(report.created);
    assert_created_once(hv, fx, &spec);
    delete_machine(hv, &spec).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// A machine with a data disk, whose leftovers from an earlier, interrupted
/// test run are removed first.
fn fresh_with_data_disk(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str, name: &str) -> MachineSpec {
    let spec = with_data_disk(spec(fx, namespace, name), "data");
    let _ = delete_machine(hv, &spec);
    spec
}

/// For every k: run the first k create steps (a crash after step k), then a
/// full create, then delete: no duplicates, no leaks. The machine has a data
/// disk, so a crash after each of its steps is covered too.
pub fn crash_after_every_step(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    for k in 0..=CreateStep::ALL.len() {
        let spec = fresh_with_data_disk(hv, fx, namespace, &format!("crash-{k}"));
        run_create_steps(hv, &spec, &user_data(&spec), &CreateStep::ALL[..k])
            .unwrap_or_else(|e| panic!("first {k} steps: {e}"));
        // Running the same prefix twice (a crash during the retry) changes nothing.
        run_create_steps(hv, &spec, &user_data(&spec), &CreateStep::ALL[..k])
            .unwrap_or_else(|e| panic!("first {k} steps again: {e}"));
        create_machine(hv, &spec, &user_data(&spec))
            .unwrap_or_else(|e| panic!("create after a crash after step {k}: {e}"));
        assert_created_once(hv, fx, &spec);
        delete_machine(hv, &spec).unwrap_or_else(|e| panic!("delete after step {k}: {e}"));
        assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new(), "after step {k}");
    }
}

/// A delete that stopped after each of its parts leaves a state the next delete finishes.
pub fn delete_after_partial_create(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    for k in 0..=CreateStep::ALL.len() {
        let spec = fresh_with_data_disk(hv, fx, namespace, &format!("partial-{k}"));
        run_create_steps(hv, &spec, &user_data(&spec), &CreateStep::ALL[..k]).unwrap();
        delete_machine(hv, &spec).unwrap_or_else(|e| panic!("delete after the first {k} create steps: {e}"));
        assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new(), "after step {k}");
    }
}

/// 20 machines created at once on one network get 20 distinct addresses.
///
/// Runs every create step but the start: the addresses are chosen and
/// reserved, and the test machine does not have to run 20 TCG guests.
pub fn twenty_concurrent_machines(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let specs: Vec<MachineSpec> = (0..20).map(|i| fresh_spec(hv, fx, namespace, &format!("par-{i}"))).collect();
    let steps = &CreateStep::ALL[..CreateStep::ALL.len() - 1];
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            specs.iter().map(|s| scope.spawn(move || run_create_steps(hv, s, &user_data(s), steps))).collect();
        for (handle, s) in handles.into_iter().zip(&specs) {
            handle.join().expect("thread").unwrap_or_else(|e| panic!("create {}: {e}", s.name));
        }
    });
    let ips: Vec<Ipv4Addr> = specs.iter().map(|s| reserved_ip(hv, fx, &s.names())).collect();
    let distinct: HashSet<_> = ips.iter().collect();
    assert_eq!(distinct.len(), 20, "addresses: {ips:?}");
    let net = parse_network(&hv.network_xml(&fx.network).unwrap()).unwrap().ipv4.unwrap();
    assert!(ips.iter().all(|ip| *ip != net.address && net.contains(*ip)), "{ips:?} vs gateway {}", net.address);
    std::thread::scope(|scope| {
        for s in &specs {
            scope.spawn(move || delete_machine(hv, s).unwrap_or_else(|e| panic!("delete {}: {e}", s.name)));
        }
    });
    assert_eq!(leftovers(hv, fx, &specs), Vec::<String>::new());
}

/// A domain with our name but without our marker: create refuses it and
/// changes nothing. Delete leaves it untouched and says so, and removes what
/// is ours: the root disk, seed and reservation made before the domain
/// appeared. A volume or reservation the foreign domain uses is left too.
pub fn foreign_domain_is_left_alone(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let spec = fresh_spec(hv, fx, namespace, "foreign-0");
    let names = spec.names();
    let foreign_xml = |devices: &str| {
        format!(
            "<domain type='qemu'><name>{}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>{devices}</devices></domain>",
            names.domain
        )
    };
    hv.domain_define(&foreign_xml("")).expect("define the foreign domain");
    let before = hv.domain_xml(&names.domain).unwrap();

    let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("create must refuse a foreign domain");
    assert_collision(&err, &names.domain);
    let left = delete_machine(hv, &spec).expect("delete finishes beside a foreign domain");
    assert_eq!(
        left.iter().map(|l| (l.kind, l.object.as_str())).collect::<Vec<_>>(),
        [(ObjectKind::Domain, names.domain.as_str())]
    );
    assert!(left[0].to_string().contains("no cluster-api-provider-libvirt metadata"), "{}", left[0]);
    assert_eq!(hv.domain_xml(&names.domain).unwrap(), before, "the foreign domain was changed");
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), [format!("domain {}", names.domain)]);

    // Our disk, seed and reservation, made before the foreign domain took our name
    // (a create that stopped before its define): delete removes them, not the domain.
    hv.domain_undefine(&names.domain, UndefineFlags::all()).unwrap();
    let before_define = &CreateStep::ALL[..CreateStep::ALL.iter().position(|s| *s == CreateStep::Define).unwrap()];
    run_create_steps(hv, &spec, &user_data(&spec), before_define).unwrap();
    hv.domain_define(&foreign_xml("")).unwrap();
    let before = hv.domain_xml(&names.domain).unwrap();
    let left = delete_machine(hv, &spec).expect("delete beside a foreign domain");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(hv.domain_xml(&names.domain).unwrap(), before, "the foreign domain was changed");
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), [format!("domain {}", names.domain)]);

    // A foreign domain that uses our root disk and our MAC: both stay, the seed goes.
    hv.domain_undefine(&names.domain, UndefineFlags::all()).unwrap();
    run_create_steps(hv, &spec, &user_data(&spec), before_define).unwrap();
    let disk = hv.volume_xml(&fx.domain_pool, &names.overlay_volume()).unwrap();
    let disk_path = capl_host::volume_xml::parse_volume(&disk).unwrap().path;
    let devices = format!(
        "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk_path}'/><target dev='vda' bus='virtio'/></disk>\
         <interface type='network'><mac address='{}'/><source network='{}'/></interface>",
        names.derived_mac(),
        fx.network
    );
    hv.domain_define(&foreign_xml(&devices)).unwrap();
    let using = hv.domain_xml(&names.domain).unwrap();
    let left = delete_machine(hv, &spec).expect("delete beside a foreign domain that uses our disk");
    let kinds: Vec<ObjectKind> = left.iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [ObjectKind::Domain, ObjectKind::Volume, ObjectKind::DhcpHost], "{left:?}");
    assert!(left[1].object.ends_with(&names.overlay_volume()) && left[1].why.contains(&names.domain), "{}", left[1]);
    assert_eq!(hv.domain_xml(&names.domain).unwrap(), using, "the foreign domain was changed");
    let volumes = hv.volume_list(&fx.domain_pool).unwrap();
    assert!(volumes.contains(&names.overlay_volume()) && !volumes.contains(&names.cloud_init_volume()), "{volumes:?}");
    assert!(dhcp_hosts(hv, fx).iter().any(|(mac, name, _)| *mac == names.derived_mac() && *name == names.domain));

    // Once the foreign domain is gone, the next delete takes what is ours.
    hv.domain_undefine(&names.domain, UndefineFlags::all()).unwrap();
    assert_eq!(delete_machine(hv, &spec).expect("delete"), []);
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

fn assert_collision(err: &HostError, domain: &str) {
    match err {
        HostError::Collision { kind: ObjectKind::Domain, object, .. } => assert_eq!(object, domain),
        other => panic!("expected a domain collision on {domain}, got {other}"),
    }
    assert_eq!(err.kind(), FailureKind::DomainCollision);
    assert!(err.to_string().contains(domain), "{err}");
}

/// A foreign volume with our root disk's name is not adopted or deleted;
/// delete names it and finishes.
pub fn foreign_volume_is_left_alone(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let spec = fresh_spec(hv, fx, namespace, "foreign-vol-0");
    let names = spec.names();
    let xml = format!(
        "<volume><name>{}</name><capacity unit='bytes'>1048576</capacity><target><format type='raw'/></target></volume>",
        names.overlay_volume()
    );
    let _ = hv.volume_delete(&fx.domain_pool, &names.overlay_volume());
    hv.volume_create(&fx.domain_pool, &xml).unwrap();
    let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("create must refuse a foreign volume");
    assert!(
        matches!(&err, HostError::Collision { kind: ObjectKind::Volume, object, .. } if object.ends_with(&names.overlay_volume())),
        "{err}"
    );
    let left = delete_machine(hv, &spec).expect("delete leaves the foreign volume and finishes");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].kind, ObjectKind::Volume);
    assert!(
        left[0].object.ends_with(&names.overlay_volume()) && left[0].why.contains("not a qcow2 overlay"),
        "{}",
        left[0]
    );
    assert!(hv.volume_list(&fx.domain_pool).unwrap().contains(&names.overlay_volume()));
    hv.volume_delete(&fx.domain_pool, &names.overlay_volume()).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// A disk smaller than the image, and a missing image, fail clearly before anything is created.
pub fn bad_disk_and_missing_image(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let mut small = fresh_spec(hv, fx, namespace, "small-0");
    small.disk_gib = 0;
    let err = create_machine(hv, &small, &user_data(&small)).expect_err("disk smaller than the image");
    assert!(matches!(err, HostError::DiskTooSmall { min_gib: 1, .. }), "{err}");
    assert_eq!(err.kind(), FailureKind::InvalidMachineSpec);

    let mut missing = fresh_spec(hv, fx, namespace, "missing-0");
    missing.image = "no-such-image.qcow2".into();
    let err = create_machine(hv, &missing, &user_data(&missing)).expect_err("missing image");
    assert!(matches!(&err, HostError::ImageMissing { image, .. } if image == "no-such-image.qcow2"), "{err}");
    assert_eq!(err.kind(), FailureKind::InfrastructureMissing);
    assert!(err.to_string().contains(&fx.base_pool), "{err}");

    // An image the provider made for another machine: its root disk (an
    // overlay) or its seed ISO. Neither may become a base image.
    let other = fresh_spec(hv, fx, namespace, "other-0");
    create_machine(hv, &other, &user_data(&other)).unwrap();
    let mut refused = Vec::new();
    for (image, why) in [
        (other.names().overlay_volume(), "is an overlay backed by"),
        (other.names().cloud_init_volume(), "is a cloud-init seed ISO the provider made"),
    ] {
        let mut spec = fresh_spec(hv, fx, namespace, &format!("reuse-{}", refused.len()));
        spec.base_pool = fx.domain_pool.clone();
        spec.image = image.clone();
        let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("a provider-made volume as the image");
        assert!(matches!(&err, HostError::ImageUnusable { image: i, .. } if *i == image), "{err}");
        assert_eq!(err.kind(), FailureKind::InvalidMachineSpec);
        assert!(err.to_string().contains(why), "{err}");
        refused.push(spec);
    }
    assert_eq!(leftovers(hv, fx, &refused), Vec::<String>::new(), "nothing made for a refused machine");
    delete_machine(hv, &other).unwrap();
    assert_eq!(leftovers(hv, fx, &[small, missing, other]), Vec::<String>::new());
}

/// A base image that a domain on the host writes to (some VM's own disk put
/// in the base pool) is refused, naming that domain, before anything is made;
/// the same volume attached read-only is a base image like any other. The
/// domain and its disk are untouched.
pub fn base_image_a_domain_writes_to_is_refused(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let volume = format!("{namespace}-vm-disk.raw");
    let domain = format!("{namespace}-vm");
    let volume_xml = format!(
        "<volume><name>{volume}</name><capacity unit='bytes'>1048576</capacity><target><format type='raw'/></target></volume>"
    );
    // What a failed earlier run on the same daemon left.
    let _ = hv.domain_undefine(&domain, UndefineFlags::all());
    let _ = hv.volume_delete(&fx.base_pool, &volume);
    hv.volume_create(&fx.base_pool, &volume_xml).expect("create the VM's disk");
    let path = capl_host::volume_xml::parse_volume(&hv.volume_xml(&fx.base_pool, &volume).unwrap()).unwrap().path;
    let domain_xml = |uuid: &str, readonly: &str| {
        format!(
            "<domain type='qemu'><name>{domain}</name>{uuid}<memory unit='MiB'>64</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>\
             <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{path}'/>\
             <target dev='vda' bus='virtio'/>{readonly}</disk></devices></domain>"
        )
    };
    hv.domain_define(&domain_xml("", "")).expect("define the VM");
    let before = hv.domain_xml(&domain).unwrap();
    let uuid = format!("<uuid>{}</uuid>", capl_host::domain_xml::parse_domain(&before).unwrap().uuid);

    let mut spec = fresh_spec(hv, fx, namespace, "peek-0");
    spec.image = volume.clone();
    let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("another VM's disk as the base image");
    assert!(matches!(&err, HostError::ImageUnusable { image, .. } if *image == volume), "{err}");
    assert_eq!(err.kind(), FailureKind::InvalidMachineSpec);
    assert!(err.to_string().contains(&format!("is a disk that domain \"{domain}\" on")), "{err}");
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new(), "nothing made for it");
    assert_eq!(hv.domain_xml(&domain).unwrap(), before, "the VM was changed");

    // Read-only, the disk cannot change under the overlay: the root disk is made.
    hv.domain_define(&domain_xml(&uuid, "<readonly/>")).unwrap();
    run_create_steps(hv, &spec, &user_data(&spec), &[CreateStep::RootDisk]).expect("a read-only shared image");
    assert!(hv.volume_list(&fx.domain_pool).unwrap().contains(&spec.names().overlay_volume()));
    delete_machine(hv, &spec).unwrap();
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());
    hv.domain_undefine(&domain, UndefineFlags::all()).unwrap();
    assert!(hv.volume_list(&fx.base_pool).unwrap().contains(&volume), "the VM's disk is still there");
    hv.volume_delete(&fx.base_pool, &volume).unwrap();
}

/// The control-plane endpoint address is never handed out.
pub fn endpoint_address_is_avoided(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let first = fresh_spec(hv, fx, namespace, "ep-0");
    run_create_steps(hv, &first, &user_data(&first), &[CreateStep::DhcpReservation]).unwrap();
    let taken = reserved_ip(hv, fx, &first.names());
    delete_machine(hv, &first).unwrap();
    // The address the first machine got is now free; as the endpoint, it must be skipped.
    let mut second = fresh_spec(hv, fx, namespace, "ep-1");
    second.control_plane_host = Some(taken.to_string());
    run_create_steps(hv, &second, &user_data(&second), &[CreateStep::DhcpReservation]).unwrap();
    assert_ne!(reserved_ip(hv, fx, &second.names()), taken);
    delete_machine(hv, &second).unwrap();
    assert_eq!(leftovers(hv, fx, &[first, second]), Vec::<String>::new());
}

/// The cluster check tells missing from inactive and names the object; it changes nothing.
pub fn infra_missing_vs_inactive(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::{InfraSpec, check_infrastructure};
    let good =
        InfraSpec { network: fx.network.clone(), base_pool: fx.base_pool.clone(), domain_pool: fx.domain_pool.clone() };
    check_infrastructure(hv, &good).expect("the fixture's network and pools are active");

    let missing_net = InfraSpec { network: format!("{namespace}-no-net"), ..good.clone() };
    let err = check_infrastructure(hv, &missing_net).unwrap_err();
    assert!(matches!(&err, HostError::NetworkMissing { network, .. } if *network == missing_net.network), "{err}");
    assert_eq!(err.kind(), FailureKind::InfrastructureMissing);

    let missing_pool = InfraSpec { domain_pool: format!("{namespace}-no-pool"), ..good.clone() };
    let err = check_infrastructure(hv, &missing_pool).unwrap_err();
    assert!(matches!(&err, HostError::PoolMissing { pool, .. } if *pool == missing_pool.domain_pool), "{err}");

    let pool = format!("{namespace}-inactive");
    let pool_xml = format!("<pool type='dir'><name>{pool}</name><target><path>/tmp/{pool}</path></target></pool>");
    hv.pool_define(&pool_xml).expect("define an inactive pool");
    let network = format!("{namespace}-inact");
    let network_xml = format!("<network><name>{network}</name><ip address='10.251.7.1' prefix='24'/></network>");
    hv.network_define(&network_xml).expect("define an inactive network");

    let inactive_pool = InfraSpec { base_pool: pool.clone(), ..good.clone() };
    let err = check_infrastructure(hv, &inactive_pool).unwrap_err();
    assert!(matches!(&err, HostError::PoolInactive { pool: p, .. } if *p == pool), "{err}");
    assert_eq!(err.kind(), FailureKind::InfrastructureInactive);
    assert!(err.to_string().contains(&format!("virsh pool-start {pool}")), "{err}");

    let inactive_net = InfraSpec { network: network.clone(), ..good.clone() };
    let err = check_infrastructure(hv, &inactive_net).unwrap_err();
    assert!(matches!(&err, HostError::NetworkInactive { network: n, .. } if *n == network), "{err}");
    assert!(err.to_string().contains(&format!("virsh net-start {network}")), "{err}");

    // Nothing was started by the check.
    assert!(!hv.pool_is_active(&pool).unwrap());
    assert!(!hv.network_is_active(&network).unwrap());
    hv.pool_undefine(&pool).unwrap();
    hv.network_undefine(&network).unwrap();
}

/// A network without IPv4, and one whose only DHCP address is taken: the
/// cluster check reports the first, and a machine fails on each before
/// anything of it is made (no disk, no seed ISO, no reservation).
pub fn unusable_network_fails_before_anything_is_made(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::{InfraSpec, check_infrastructure};
    let good =
        InfraSpec { network: fx.network.clone(), base_pool: fx.base_pool.clone(), domain_pool: fx.domain_pool.clone() };
    let no_ipv4 = format!("{namespace}-nov4");
    let full = format!("{namespace}-full");
    for name in [&no_ipv4, &full] {
        let _ = hv.network_stop(name);
        let _ = hv.network_undefine(name);
    }
    hv.network_define(&format!("<network><name>{no_ipv4}</name></network>")).unwrap();
    hv.network_start(&no_ipv4).unwrap();
    hv.network_define(&format!(
        "<network><name>{full}</name><ip address='10.251.8.1' prefix='24'><dhcp>\
         <range start='10.251.8.2' end='10.251.8.2'/><host mac='52:54:00:ee:ee:01' name='not-ours' ip='10.251.8.2'/>\
         </dhcp></ip></network>"
    ))
    .unwrap();
    hv.network_start(&full).unwrap();

    let err = check_infrastructure(hv, &InfraSpec { network: no_ipv4.clone(), ..good.clone() }).unwrap_err();
    assert!(matches!(&err, HostError::NoIpv4 { network, .. } if *network == no_ipv4), "{err}");
    assert_eq!(err.kind(), FailureKind::InfrastructureUnsupported);
    check_infrastructure(hv, &InfraSpec { network: full.clone(), ..good.clone() })
        .expect("a full range is the machines' problem, not the cluster's");

    let mut specs = Vec::new();
    for (network, expected) in [(&no_ipv4, "has no IPv4"), (&full, "has no free address in 10.251.8.2-10.251.8.2")] {
        let mut spec = fresh_spec(hv, fx, namespace, &format!("net-{}", specs.len()));
        spec.network = network.clone();
        let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("no address for the machine");
        assert!(err.to_string().contains(expected), "{err}");
        let entries = hv.network_xml(network).unwrap();
        assert!(!entries.contains(&spec.names().domain), "a reservation was made on {network}: {entries}");
        specs.push(spec);
    }
    assert_eq!(leftovers(hv, fx, &specs), Vec::<String>::new(), "nothing made for the refused machines");
    for name in [&no_ipv4, &full] {
        hv.network_stop(name).unwrap();
        hv.network_undefine(name).unwrap();
    }
}

/// A pool of a type whose volumes are not files (here a SCSI host adapter's
/// LUNs, defined but never started) is reported by the cluster check by its type.
pub fn unsupported_pool_type_is_named(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::{InfraSpec, check_infrastructure};
    let pool = format!("{namespace}-scsi");
    let _ = hv.pool_undefine(&pool);
    hv.pool_define(&format!(
        "<pool type='scsi'><name>{pool}</name><source><adapter type='scsi_host' name='host99'/></source>\
         <target><path>/dev/disk/by-path</path></target></pool>"
    ))
    .unwrap();
    let spec = InfraSpec { network: fx.network.clone(), base_pool: fx.base_pool.clone(), domain_pool: pool.clone() };
    let err = check_infrastructure(hv, &spec).unwrap_err();
    assert!(
        matches!(&err, HostError::PoolTypeUnsupported { pool: p, pool_type, .. } if *p == pool && pool_type == "scsi"),
        "{err}"
    );
    assert_eq!(err.kind(), FailureKind::InfrastructureUnsupported);
    assert!(err.to_string().contains("use a pool of type dir, fs or netfs"), "{err}");
    assert!(!hv.pool_is_active(&pool).unwrap(), "the check started nothing");
    hv.pool_undefine(&pool).unwrap();
}

/// With a console log directory the serial console is also logged to `<dir>/<domain>-console.log`,
/// and the domain still starts.
pub fn console_log_file(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str, dir: &str) {
    let mut spec = fresh_spec(hv, fx, namespace, "log-0");
    spec.console_log_dir = Some(dir.to_string());
    let names = spec.names();
    create_machine(hv, &spec, &user_data(&spec)).expect("create with a console log");
    let xml = hv.domain_xml(&names.domain).unwrap();
    let expected = format!("{dir}/{}-console.log", names.domain);
    assert!(
        xml.contains(&format!("<log file='{expected}'")) || xml.contains(&format!("<log file=\"{expected}\"")),
        "{xml}"
    );
    assert_eq!(hv.domain_state(&names.domain).unwrap(), DomainState::Running);
    delete_machine(hv, &spec).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// A console log directory that does not exist on the host: the create
/// fails with an error that names the directory, the host and the fix, and
/// is not retried as a lost connection; delete removes everything.
pub fn console_log_dir_missing(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str, dir: &str) {
    let mut spec = fresh_spec(hv, fx, namespace, "nolog-0");
    spec.console_log_dir = Some(dir.to_string());
    let err =
        create_machine(hv, &spec, &user_data(&spec)).expect_err("a missing console log directory must fail the create");
    assert!(
        matches!(&err, HostError::ConsoleLogDirMissing { dir: d, uri, .. } if d == dir && uri == hv.uri()),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(dir) && message.contains(hv.uri()) && message.contains("--console-log-dir"), "{message}");
    assert_eq!(err.kind(), FailureKind::ProvisioningFailed, "{err}");
    assert!(!err.is_transient(), "{err}");
    // The next reconcile sees the defined domain and fails the same way.
    let again = create_machine(hv, &spec, &user_data(&spec)).expect_err("still missing");
    assert!(matches!(again, HostError::ConsoleLogDirMissing { .. }), "{again:?}");
    delete_machine(hv, &spec).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// Defines and starts network `name` in forward mode bridge onto the Linux bridge
/// `bridge` (a left-over one of that name is removed first); libvirt starts it
/// without looking for the bridge. Returns the name.
fn bridged_network(hv: &dyn HostAdmin, name: &str, bridge: &str) -> String {
    let _ = hv.network_stop(name);
    let _ = hv.network_undefine(name);
    hv.network_define(&format!(
        "<network><name>{name}</name><forward mode='bridge'/><bridge name='{bridge}'/></network>"
    ))
    .unwrap();
    hv.network_start(name).unwrap_or_else(|e| panic!("starting bridge-mode network {name} onto {bridge}: {e}"));
    name.to_string()
}

/// A control-plane endpoint from the network: the highest free address outside the
/// guests' ranges, the same one again for the same owner, another for another owner;
/// release deletes the owner's DNS host entry and nothing else.
pub fn endpoint_from_network(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::endpoint::{allocate_endpoint, endpoint_hostname, endpoint_of, release_endpoint};
    let (ours, theirs) = (endpoint_hostname(&format!("{namespace}-a")), endpoint_hostname(&format!("{namespace}-b")));
    for name in [&ours, &theirs] {
        let _ = release_endpoint(hv, &fx.network, name);
    }
    let a = allocate_endpoint(hv, &fx.network, &ours).expect("an endpoint");
    assert_eq!(allocate_endpoint(hv, &fx.network, &ours).unwrap(), a, "the same owner gets the same address");
    let b = allocate_endpoint(hv, &fx.network, &theirs).unwrap();
    assert_ne!(a, b);
    let subnet = parse_network(&hv.network_xml(&fx.network).unwrap()).unwrap().ipv4.unwrap();
    for ip in [a, b] {
        assert!(subnet.contains(ip) && ip != subnet.address, "{ip}");
        let ranges = capl_host::dhcp::address_ranges(&subnet);
        assert!(ranges.iter().all(|r| ip < r.start || ip > r.end), "{ip} is in a guest range {ranges:?}");
    }
    assert_eq!(release_endpoint(hv, &fx.network, &ours).unwrap(), Some(a));
    assert_eq!(release_endpoint(hv, &fx.network, &ours).unwrap(), None, "released once");
    assert_eq!(endpoint_of(hv, &fx.network, &theirs).unwrap(), Some(b), "the other entry stays");
    assert_eq!(release_endpoint(hv, &fx.network, &theirs).unwrap(), Some(b));
}

/// A network in forward mode bridge onto a Linux bridge the host does not have:
/// libvirt starts the network without looking, but its interface driver knows
/// the host's interfaces. The LibvirtCluster's check of the network and a
/// machine's create both fail naming the network, the bridge, the host and the
/// fix, as missing infrastructure that is not retried as a lost connection, and
/// the create leaves nothing on the host. A create that skips the lookup (as on
/// a host without the interface driver) fails at the domain's start, naming the
/// same, with the domain left defined. Once the bridge exists the check passes
/// and the create starts that domain; delete removes everything.
/// `bridge` must not exist when called; `make_bridge` creates it. The daemon
/// must have its interface driver (`libvirt-daemon-driver-interface`).
pub fn bridge_missing_is_named(
    hv: &dyn HostAdmin,
    fx: &Fixture,
    namespace: &str,
    bridge: &str,
    make_bridge: &dyn Fn(),
) {
    if let Err(e) = hv.interface_xml("lo") {
        panic!(
            "the libvirtd at {} cannot look up host interfaces ({e}): install its interface driver (libvirt-daemon-driver-interface; `cargo xtask host deps` does) and restart it",
            hv.uri()
        );
    }
    let lan = bridged_network(hv, &format!("{namespace}-nobr"), bridge);
    let mut spec = fresh_spec(hv, fx, namespace, "nobr-0");
    spec.network = lan.clone();
    spec.ipam = true;
    spec.static_addresses = vec![capl_host::cloud_init::StaticAddress {
        address: "10.231.251.10".parse().unwrap(),
        prefix: 24,
        gateway: None,
    }];
    let named = |err: &HostError| {
        assert!(
            matches!(err, HostError::BridgeNotOnHost { network, device, uri }
                if *network == lan && device == bridge && uri == hv.uri()),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&format!("ip link add {bridge} type bridge")), "{message}");
        assert!(message.contains("nothing was created"), "{message}");
        assert_eq!(err.kind(), FailureKind::InfrastructureMissing, "{err}");
        assert!(!err.is_transient(), "{err}");
    };
    named(&check_network(hv, &lan).expect_err("the cluster's check finds the bridge missing"));
    named(&create_machine(hv, &spec, &user_data(&spec)).expect_err("no bridge, no create"));
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new(), "nothing made without the bridge");
    // A host that cannot say (no interface driver) skips the lookup: the steps run and
    // the domain's start is what fails; the domain stays defined, stopped.
    let err = run_create_steps(hv, &spec, &user_data(&spec), &CreateStep::ALL).expect_err("no bridge, no start");
    assert!(
        matches!(&err, HostError::BridgeMissing { network, device, uri, .. }
            if *network == lan && device == bridge && uri == hv.uri()),
        "{err:?}"
    );
    assert!(err.to_string().contains("the domain stays defined, stopped"), "{err}");
    assert_eq!(err.kind(), FailureKind::InfrastructureMissing, "{err}");
    assert_eq!(hv.domain_state(&spec.names().domain).unwrap(), DomainState::Shutoff);
    make_bridge();
    check_network(hv, &lan).expect("the bridge exists now");
    let report = create_machine(hv, &spec, &user_data(&spec)).expect("the bridge exists now: the domain starts");
    assert_eq!(observe_machine(hv, &spec).unwrap().map(|r| r.state), Some(DomainState::Running), "{report:?}");
    assert_eq!(delete_machine(hv, &spec).expect("delete"), Vec::new());
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());
    hv.network_stop(&lan).unwrap();
    hv.network_undefine(&lan).unwrap();
}

/// Another DHCP entry of the network (under another name) uses the MAC the
/// machine derives from its domain name: the machine takes the next of its
/// MAC candidates, reserves an address of its own for it and defines its
/// domain with it; every later look (steady state, observe) reports that MAC.
/// Delete removes the machine's entry and leaves the other one as it was.
pub fn foreign_dhcp_entry_is_left_alone(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::hypervisor::NetworkUpdateCommand;
    let spec = fresh_spec(hv, fx, namespace, "foreign-dhcp-0");
    let names = spec.names();
    let net = parse_network(&hv.network_xml(&fx.network).unwrap()).unwrap().ipv4.unwrap();
    let last = capl_host::dhcp::address_ranges(&net).last().unwrap().end;
    let derived = names.derived_mac();
    let foreign_entry = (derived.clone(), format!("{namespace}-someone-else"), last.to_string());
    let foreign = format!("<host mac='{derived}' name='{}' ip='{last}'/>", foreign_entry.1);
    let _ = hv.network_update_dhcp_host(&fx.network, NetworkUpdateCommand::Delete, &foreign);
    hv.network_update_dhcp_host(&fx.network, NetworkUpdateCommand::AddLast, &foreign).unwrap();

    let report = create_machine(hv, &spec, &user_data(&spec)).expect("a taken MAC does not stop the create");
    assert!(report.created);
    let next = names.mac_candidates()[1].clone();
    assert_ne!(next, derived);
    assert_eq!(report.mac.as_ref(), Some(&next), "the machine took the next candidate");
    assert_created_once(hv, fx, &spec);
    let (mac, _, ip) = our_entry(hv, fx, &names);
    assert_eq!(mac, next);
    assert_ne!(ip, foreign_entry.2, "the machine reserved an address of its own");
    let domain = capl_host::domain_xml::parse_domain(&hv.domain_xml(&names.domain).unwrap()).unwrap();
    assert_eq!(domain.macs, vec![next.clone()]);
    assert!(dhcp_hosts(hv, fx).contains(&foreign_entry), "the other entry was changed");

    // Later reconciles read the MAC back from the domain, never derive it again.
    let steady = create_machine(hv, &spec, &user_data(&spec)).expect("steady state");
    assert!(!steady.created);
    assert_eq!(steady.mac.as_ref(), Some(&next));
    assert_eq!(observe_machine(hv, &spec).unwrap().expect("the domain exists").mac.as_ref(), Some(&next));
    assert_eq!(start_machine(hv, &spec).unwrap().expect("the domain exists").mac.as_ref(), Some(&next));

    assert_eq!(delete_machine(hv, &spec).expect("delete"), [], "the other entry is not at one of the machine's names");
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());
    let entries = dhcp_hosts(hv, fx);
    assert!(entries.contains(&foreign_entry), "delete removed or changed the other entry: {entries:?}");
    assert!(!entries.iter().any(|(mac, _, _)| *mac == next), "{entries:?}");
    hv.network_update_dhcp_host(&fx.network, NetworkUpdateCommand::Delete, &foreign).unwrap();
}

/// A LibvirtMachine deleted without host cleanup and created again under the
/// same name (a new identity) gets a fresh domain, disk, seed and DHCP entry:
/// nothing of the old machine is adopted, reported as a collision or changed.
pub fn recreated_machine_gets_fresh_objects(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    let old = fresh_spec(hv, fx, namespace, "reborn-0");
    create_machine(hv, &old, &user_data(&old)).unwrap();
    let old_names = old.names();
    let old_disk = hv.volume_xml(&fx.domain_pool, &old_names.overlay_volume()).unwrap();
    let mut new = old.clone();
    new.identity = uid_for(namespace, "reborn-0-second");
    let _ = delete_machine(hv, &new);
    let new_names = new.names();
    for (what, a, b) in [
        ("domain", &old_names.domain, &new_names.domain),
        ("root disk", &old_names.overlay_volume(), &new_names.overlay_volume()),
        ("seed ISO", &old_names.cloud_init_volume(), &new_names.cloud_init_volume()),
        ("MAC address", &old_names.derived_mac(), &new_names.derived_mac()),
    ] {
        assert_ne!(a, b, "the re-created machine's {what} is the old one's");
    }
    create_machine(hv, &new, &user_data(&new)).expect("a re-created machine is created afresh");
    assert_created_once(hv, fx, &new);
    assert_eq!(
        capl_host::domain_xml::parse_domain(&hv.domain_xml(&new_names.domain).unwrap()).unwrap().uuid,
        new.identity
    );
    // The old machine's objects are untouched.
    // (Compared as XML, not bytes: the old guest runs and writes its disk.)
    assert_eq!(
        stable_volume_xml(&hv.volume_xml(&fx.domain_pool, &old_names.overlay_volume()).unwrap()),
        stable_volume_xml(&old_disk)
    );
    assert_eq!(hv.domain_state(&old_names.domain).unwrap(), DomainState::Running);
    assert!(
        dhcp_hosts(hv, fx).iter().any(|(mac, name, _)| *mac == old_names.derived_mac() && *name == old_names.domain)
    );
    delete_machine(hv, &new).unwrap();
    assert!(hv.domain_list().unwrap().contains(&old_names.domain), "deleting the new machine removed the old one");
    delete_machine(hv, &old).unwrap();
    assert_eq!(leftovers(hv, fx, &[old, new]), Vec::<String>::new());
}

/// A volume's XML without what libvirt fills in or drops on its own: the
/// `<timestamps>` element, which changes whenever the file is read or
/// written, and the qcow2 header details (`<compat>`, `<clusterSize>`,
/// `<features>`) that libvirt reports for a volume it created but not after
/// a refresh of the pool, which any other user of the pool may start.
fn stable_volume_xml(xml: &str) -> String {
    let mut out = Vec::new();
    let mut in_timestamps = false;
    for line in xml.lines() {
        let t = line.trim();
        if t.starts_with("<timestamps>") {
            in_timestamps = !t.ends_with("</timestamps>");
            continue;
        }
        if in_timestamps {
            in_timestamps = !t.starts_with("</timestamps>");
            continue;
        }
        let refreshed = ["<compat>", "<clusterSize", "<features", "</features>"].iter().any(|p| t.starts_with(p));
        if t.is_empty() || refreshed {
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

/// A machine with addresses from IPAM on a libvirt network onto a host bridge
/// (`forward mode='bridge'`, no `<ip>`, no DHCP): the cluster's check takes
/// the network, the domain is defined on it and runs, the seed ISO carries a
/// network-config with the address for the domain's MAC, no DHCP entry is
/// made, the report has the address, and delete leaves nothing. `bridge` is a
/// Linux bridge that exists on the host (made by the caller).
pub fn static_addresses_on_a_bridge_network(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str, bridge: &str) {
    use capl_host::cloud_init::{StaticAddress, iso_file};
    use capl_host::{InfraSpec, check_infrastructure};
    let lan = bridged_network(hv, &format!("{namespace}-lan"), bridge);
    let infra =
        InfraSpec { network: lan.clone(), base_pool: fx.base_pool.clone(), domain_pool: fx.domain_pool.clone() };
    check_infrastructure(hv, &infra).expect("a bridge-mode network needs no <ip>: its machines take IPAM addresses");

    let mut spec = fresh_spec(hv, fx, namespace, "ipam-0");
    spec.network = lan.clone();
    spec.ipam = true;
    spec.static_addresses = vec![StaticAddress {
        address: "10.231.250.10".parse().unwrap(),
        prefix: 24,
        gateway: Some("10.231.250.1".parse().unwrap()),
    }];
    spec.nameservers = vec!["10.231.250.1".into()];
    let names = spec.names();
    create_machine(hv, &spec, &user_data(&spec)).expect("create on the bridge network");
    let report = observe_machine(hv, &spec).unwrap().expect("the domain exists");
    assert_eq!(report.state, DomainState::Running);
    assert!(
        report.addresses.contains(&MachineAddress::InternalIp("10.231.250.10".parse().unwrap())),
        "{:?}",
        report.addresses
    );
    let xml = hv.domain_xml(&names.domain).unwrap();
    assert!(xml.contains(&format!("<source network='{lan}'")), "{xml}");
    let mac = report.mac.clone().expect("the domain has a MAC");
    assert!(xml.contains(&mac), "{xml}");
    let seed = hv.volume_download(&fx.domain_pool, &names.cloud_init_volume()).unwrap();
    let config = String::from_utf8(iso_file(&seed, "network-config").expect("a network-config on the seed")).unwrap();
    assert!(config.contains(&format!("macaddress: \"{mac}\"")), "{config}");
    assert!(config.contains("- \"10.231.250.10/24\""), "{config}");
    assert!(config.contains("via: \"10.231.250.1\""), "{config}");
    assert!(!hv.network_xml(&lan).unwrap().contains("<host"), "no DHCP entry on the bridged network");
    assert!(!dhcp_hosts(hv, fx).iter().any(|(_, name, _)| *name == names.domain), "none on the cluster network either");

    assert_eq!(delete_machine(hv, &spec).expect("delete"), Vec::new());
    let left = leftovers(hv, fx, std::slice::from_ref(&spec));
    assert_eq!(left, Vec::<String>::new());
    hv.network_stop(&lan).unwrap();
    hv.network_undefine(&lan).unwrap();
}

/// A machine with two NICs besides the first (on the cluster's network, DHCP):
/// one on a bridge-mode libvirt network (DHCP in the guest), one straight on
/// a host bridge (`<interface type='bridge'>`) with a static address. Bad
/// input first: an additional network that does not exist (and, where the
/// host can say, a bridge it does not have) fails before anything is made,
/// naming the NIC and the fix. Then the domain gets the three NICs with their
/// MACs, the seed's network-config lists them (the first with DHCP and the MAC
/// of its reservation), only the first NIC holds a DHCP entry, and delete
/// leaves nothing. `bridge` exists on the host; `absent_bridge` does not.
pub fn additional_nics(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str, bridge: &str, absent_bridge: &str) {
    use capl_host::cloud_init::{StaticAddress, iso_file};
    use capl_host::{AdditionalNic, NicAttachment};
    let side = bridged_network(hv, &format!("{namespace}-side"), bridge);
    let mut spec = fresh_spec(hv, fx, namespace, "nics-0");
    let names = spec.names();
    let unattachable = |spec: &MachineSpec, index: usize, target: &str, fix: &str| {
        let err = create_machine(hv, spec, &user_data(spec)).expect_err("an additional NIC cannot be attached");
        assert!(
            matches!(&err, HostError::AdditionalNicUnattachable { index: i, target: t, uri, .. }
                if *i == index && t == target && uri == hv.uri()),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&format!("spec.additionalNetworks[{index}]")), "{message}");
        assert!(message.contains(fix), "{message}");
        assert!(message.contains("nothing was created"), "{message}");
        assert_eq!(err.kind(), FailureKind::InfrastructureMissing, "{err}");
        assert_eq!(leftovers(hv, fx, std::slice::from_ref(spec)), Vec::<String>::new(), "nothing made: {err}");
    };
    let absent = format!("{namespace}-absent");
    spec.additional_nics =
        vec![AdditionalNic { attach: NicAttachment::Network(absent.clone()), static_addresses: Vec::new() }];
    unattachable(&spec, 0, &format!("network \"{absent}\""), "virsh net-define");
    if hv.interface_xml("lo").is_ok() {
        // A host whose libvirtd has its interface driver says which bridges it has.
        spec.additional_nics = vec![
            AdditionalNic { attach: NicAttachment::Network(side.clone()), static_addresses: Vec::new() },
            AdditionalNic { attach: NicAttachment::Bridge(absent_bridge.into()), static_addresses: Vec::new() },
        ];
        unattachable(
            &spec,
            1,
            &format!("host bridge \"{absent_bridge}\""),
            &format!("ip link add {absent_bridge} type bridge"),
        );
    }

    let static_address = StaticAddress {
        address: "10.231.252.10".parse().unwrap(),
        prefix: 24,
        gateway: Some("10.231.252.1".parse().unwrap()),
    };
    spec.additional_nics = vec![
        AdditionalNic { attach: NicAttachment::Network(side.clone()), static_addresses: Vec::new() },
        AdditionalNic { attach: NicAttachment::Bridge(bridge.into()), static_addresses: vec![static_address] },
    ];
    create_machine(hv, &spec, &user_data(&spec)).expect("create with three NICs");
    let report = observe_machine(hv, &spec).unwrap().expect("the domain exists");
    assert_eq!(report.state, DomainState::Running);
    let (entry_mac, _, _) = our_entry(hv, fx, &names);
    assert_eq!(report.mac.as_deref(), Some(entry_mac.as_str()), "the first NIC is the one with the reservation");
    let domain = capl_host::domain_xml::parse_domain(&hv.domain_xml(&names.domain).unwrap()).unwrap();
    assert_eq!(domain.macs, vec![entry_mac.clone(), names.additional_mac(1), names.additional_mac(2)]);
    let xml = hv.domain_xml(&names.domain).unwrap();
    assert!(xml.contains(&format!("<source network='{side}'")), "{xml}");
    assert!(xml.contains("<interface type='bridge'>") && xml.contains(&format!("<source bridge='{bridge}'")), "{xml}");
    let seed = hv.volume_download(&fx.domain_pool, &names.cloud_init_volume()).unwrap();
    let config = String::from_utf8(iso_file(&seed, "network-config").expect("a network-config on the seed")).unwrap();
    let want = capl_host::cloud_init::network_config_for(
        &[
            capl_host::cloud_init::GuestInterface { mac: entry_mac, addresses: Vec::new(), dhcp: true },
            capl_host::cloud_init::GuestInterface { mac: names.additional_mac(1), addresses: Vec::new(), dhcp: true },
            capl_host::cloud_init::GuestInterface {
                mac: names.additional_mac(2),
                addresses: spec.additional_nics[1].static_addresses.clone(),
                dhcp: false,
            },
        ],
        &[],
    );
    assert_eq!(config, want);
    if hv.uri().starts_with("sim:") {
        // The simulator leases the first NIC's address at once (the real test disk does not boot).
        let ips: Vec<_> =
            report.addresses.iter().filter(|a| matches!(a, MachineAddress::InternalIp(_))).cloned().collect();
        assert_eq!(ips.len(), 2, "{:?}", report.addresses);
        assert_eq!(ips[1], MachineAddress::InternalIp("10.231.252.10".parse().unwrap()), "{:?}", report.addresses);
    }
    assert!(!hv.network_xml(&side).unwrap().contains("<host"), "no DHCP entry for an additional NIC");

    assert_eq!(delete_machine(hv, &spec).expect("delete"), Vec::new());
    assert_eq!(leftovers(hv, fx, std::slice::from_ref(&spec)), Vec::<String>::new());
    hv.network_stop(&side).unwrap();
    hv.network_undefine(&side).unwrap();
}

/// A root disk and seed at this machine's names that another identity made
/// (what a collision of names would leave after that machine's domain was
/// lost): the create refuses to use the disk, naming both identities, and a
/// delete leaves both volumes, byte for byte.
pub fn another_identitys_disk_is_not_adopted(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::cloud_init::{meta_data, nocloud_iso};
    use capl_host::volume_xml::iso_volume_xml;

    let spec = fresh_with_data_disk(hv, fx, namespace, "clash-0");
    let names = spec.names();
    let data = names.data_volume("data", "qcow2");
    let other = uid_for(namespace, "clash-0-other");
    // The other machine's root and data disks: what our first steps make.
    run_create_steps(hv, &spec, &user_data(&spec), &[CreateStep::RootDisk, CreateStep::DataDisks]).unwrap();
    // Its seed, written for its identity, the size ours would have.
    let seed = nocloud_iso(&user_data(&spec), meta_data(&other, &spec.name).as_bytes());
    hv.volume_create(&fx.domain_pool, &iso_volume_xml(&names.cloud_init_volume(), seed.len() as u64)).unwrap();
    hv.volume_upload(&fx.domain_pool, &names.cloud_init_volume(), &seed).unwrap();
    let disk_before = hv.volume_download(&fx.domain_pool, &names.overlay_volume()).unwrap();
    let data_before = hv.volume_download(&fx.domain_pool, &data).unwrap();

    let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("create must not adopt the other's disk");
    assert!(
        matches!(&err, HostError::Collision { kind: ObjectKind::Volume, object, .. } if object.ends_with(&names.overlay_volume())),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains(&other) && message.contains(&spec.identity), "the error names both identities: {message}");
    assert_eq!(err.kind(), FailureKind::ObjectCollision);
    assert!(!hv.domain_list().unwrap().contains(&names.domain), "no domain was defined on the other's disk");

    let left = delete_machine(hv, &spec).expect("delete leaves the other's volumes and finishes");
    let kept: HashSet<String> = left.iter().map(|l| l.object.clone()).collect();
    let expected: HashSet<String> = [names.overlay_volume(), data.clone(), names.cloud_init_volume()]
        .iter()
        .map(|v| format!("{}/{v}", fx.domain_pool))
        .collect();
    assert_eq!(kept, expected, "{left:?}");
    assert!(left.iter().all(|l| l.why.contains(&other)), "{left:?}");
    assert!(hv.volume_download(&fx.domain_pool, &names.overlay_volume()).unwrap() == disk_before, "root disk changed");
    assert!(hv.volume_download(&fx.domain_pool, &data).unwrap() == data_before, "data disk changed");
    assert_eq!(hv.volume_download(&fx.domain_pool, &names.cloud_init_volume()).unwrap(), seed);

    assert!(hv.volume_list(&fx.domain_pool).unwrap().contains(&data), "the other's data disk was deleted");

    hv.volume_delete(&fx.domain_pool, &names.overlay_volume()).unwrap();
    hv.volume_delete(&fx.domain_pool, &data).unwrap();
    hv.volume_delete(&fx.domain_pool, &names.cloud_init_volume()).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// Data disks on each bus, in two pools: made with the machine, each the
/// volume asked for, attached after the root disk with its name as serial
/// and its target device; the domain runs; a second create makes nothing
/// new; delete removes them all.
pub fn data_disks(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::data_disk::{DiskBus, DiskFormat};

    let mut spec = spec(fx, namespace, "data-0");
    spec.data_disks = vec![
        disk("etcd", 1, &fx.domain_pool, DiskFormat::Qcow2, DiskBus::Virtio, None),
        disk("images", 2, &fx.base_pool, DiskFormat::Raw, DiskBus::Sata, None),
        disk("logs", 1, &fx.domain_pool, DiskFormat::Qcow2, DiskBus::Scsi, Some("sdd")),
    ];
    let _ = delete_machine(hv, &spec);
    let report = create_machine(hv, &spec, &user_data(&spec)).expect("create with data disks");
    assert_created_once(hv, fx, &spec);
    let names = spec.names();
    let shown: Vec<(&str, String, &str)> =
        report.data_disks.iter().map(|d| (d.name.as_str(), d.volume.clone(), d.device.as_str())).collect();
    assert_eq!(
        shown,
        [
            ("etcd", format!("{}/{}", fx.domain_pool, names.data_volume("etcd", "qcow2")), "vdb"),
            ("images", format!("{}/{}", fx.base_pool, names.data_volume("images", "raw")), "sdb"),
            ("logs", format!("{}/{}", fx.domain_pool, names.data_volume("logs", "qcow2")), "sdd"),
        ]
    );
    let xml = hv.domain_xml(&names.domain).unwrap();
    for (serial, device, bus) in [("etcd", "vdb", "virtio"), ("images", "sdb", "sata"), ("logs", "sdd", "scsi")] {
        let target = format!("<target dev='{device}' bus='{bus}'/>");
        let at = xml.find(&target).unwrap_or_else(|| panic!("no {target} in {xml}"));
        let rest = &xml[at..xml[at..].find("</disk>").map(|end| at + end).unwrap()];
        assert!(rest.contains(&format!("<serial>{serial}</serial>")), "{serial} on {device}: {xml}");
    }
    assert!(xml.contains("model='virtio-scsi'"), "{xml}");
    let again = create_machine(hv, &spec, &user_data(&spec)).expect("create again");
    assert!(!again.created, "the second create made the machine again");
    assert_created_once(hv, fx, &spec);
    assert_eq!(delete_machine(hv, &spec).expect("delete"), []);
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

fn disk(
    name: &str,
    size_gib: u64,
    pool: &str,
    format: capl_host::data_disk::DiskFormat,
    bus: capl_host::data_disk::DiskBus,
    device: Option<&str>,
) -> capl_host::data_disk::DataDisk {
    capl_host::data_disk::DataDisk {
        name: name.into(),
        size_gib,
        pool: pool.into(),
        format,
        bus,
        device: device.map(str::to_string),
    }
}

/// Data disks that cannot be made are refused before anything is created,
/// with the reason: a pool the host lacks, a size of 0. A volume of someone
/// else's at a data disk's name is neither adopted nor deleted.
pub fn data_disk_problems(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::data_disk::{DiskBus, DiskFormat};
    use capl_host::error::PoolProblem;

    let mut nowhere = fresh_spec(hv, fx, namespace, "nopool-0");
    nowhere.data_disks = vec![disk("etcd", 1, "capl-no-such-pool", DiskFormat::Qcow2, DiskBus::Virtio, None)];
    let err = create_machine(hv, &nowhere, &user_data(&nowhere)).expect_err("a data disk in a missing pool");
    assert!(
        matches!(&err, HostError::DataDiskPool { disk, pool, problem: PoolProblem::Missing, .. }
            if disk == "etcd" && pool == "capl-no-such-pool"),
        "{err}"
    );
    assert_eq!(err.kind(), FailureKind::InfrastructureMissing);
    assert!(err.to_string().contains("spec.dataDisks \"etcd\" names storage pool \"capl-no-such-pool\""), "{err}");

    let mut empty = fresh_spec(hv, fx, namespace, "zero-0");
    empty.data_disks = vec![disk("etcd", 0, &fx.domain_pool, DiskFormat::Qcow2, DiskBus::Virtio, None)];
    let err = create_machine(hv, &empty, &user_data(&empty)).expect_err("a data disk of 0 GiB");
    assert_eq!(err.kind(), FailureKind::InvalidMachineSpec, "{err}");
    assert!(err.to_string().contains("\"etcd\" has sizeGiB 0"), "{err}");
    assert_eq!(leftovers(hv, fx, &[nowhere, empty]), Vec::<String>::new(), "nothing made for a refused machine");

    // Someone's raw volume at our data disk's name.
    let spec = fresh_with_data_disk(hv, fx, namespace, "fdata-0");
    let volume = spec.names().data_volume("data", "qcow2");
    let _ = hv.volume_delete(&fx.domain_pool, &volume);
    let xml = format!(
        "<volume><name>{volume}</name><capacity unit='bytes'>1048576</capacity><target><format type='raw'/></target></volume>"
    );
    hv.volume_create(&fx.domain_pool, &xml).unwrap();
    let err = create_machine(hv, &spec, &user_data(&spec)).expect_err("create must refuse a foreign volume");
    assert!(
        matches!(&err, HostError::Collision { kind: ObjectKind::Volume, object, .. } if object.ends_with(&volume)),
        "{err}"
    );
    assert_eq!(err.kind(), FailureKind::ObjectCollision);
    let left = delete_machine(hv, &spec).expect("delete leaves the foreign volume and finishes");
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0].object.ends_with(&volume) && left[0].why.contains("not the empty qcow2 volume of 1 GiB"),
        "{left:?}"
    );
    assert!(hv.volume_list(&fx.domain_pool).unwrap().contains(&volume), "the foreign volume was deleted");
    hv.volume_delete(&fx.domain_pool, &volume).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}

/// A machine created when names carried 6 hash digits keeps them: with its
/// recorded domain name (the legacy scheme) or with none ([`NameScheme::Either`],
/// as after `clusterctl move`) it is found, not created again, and deleted;
/// a new machine whose scheme is undecided gets the current, 16-digit names.
pub fn legacy_names_are_kept(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::naming::{HASH_LEN, LEGACY_HASH_LEN, NameScheme};

    let mut legacy = fresh_spec(hv, fx, namespace, "legacy-0");
    legacy.name_scheme = NameScheme::Legacy;
    let _ = delete_machine(hv, &legacy);
    let report = create_machine(hv, &legacy, &user_data(&legacy)).unwrap();
    let names = legacy.names();
    assert_eq!(report.domain, names.domain);
    let hash = names.domain.rsplit('-').next().unwrap();
    assert_eq!(hash.len(), LEGACY_HASH_LEN, "{}", names.domain);

    let mut current = legacy.clone();
    current.name_scheme = NameScheme::Current;
    assert_eq!(observe_machine(hv, &current).unwrap(), None, "the current names find nothing");

    let mut either = legacy.clone();
    either.name_scheme = NameScheme::Either;
    let found = observe_machine(hv, &either).unwrap().expect("the undecided scheme finds the 6-digit domain");
    assert_eq!(found.domain, names.domain);
    let again = create_machine(hv, &either, &user_data(&either)).unwrap();
    assert!(!again.created && again.domain == names.domain, "{again:?}");
    assert_created_once(hv, fx, &legacy);
    delete_machine(hv, &either).unwrap();
    assert_eq!(leftovers(hv, fx, &[legacy.clone(), current]), Vec::<String>::new());

    // Nothing under the 6-digit names: an undecided machine is a current one.
    let mut fresh = fresh_spec(hv, fx, namespace, "legacy-1");
    fresh.name_scheme = NameScheme::Either;
    let made = create_machine(hv, &fresh, &user_data(&fresh)).unwrap();
    assert!(made.created);
    assert_eq!(made.domain.rsplit('-').next().unwrap().len(), HASH_LEN, "{}", made.domain);
    delete_machine(hv, &fresh).unwrap();
    assert_eq!(leftovers(hv, fx, &[fresh]), Vec::<String>::new());
}

/// A machine whose bootstrap data is an Ignition config: the config goes into
/// a volume of its own, byte for byte, which the domain's firmware config
/// entries name (where Ignition's QEMU platform reads it); the seed is made
/// as for any machine, with a user-data that only says where the config is.
/// A create that stopped after any step finishes; a delete at any point
/// removes the config; a volume of someone else's at its name is left alone.
pub fn ignition_config(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str) {
    use capl_host::cloud_init::{meta_data, nocloud_iso};
    use capl_host::domain_xml::parse_domain;
    use capl_host::machine::IGNITION_SEED_USER_DATA;

    let config = br#"{"ignition":{"version":"3.4.0"}}"#.to_vec();
    let ignition = |name: &str| {
        let mut spec = spec(fx, namespace, name);
        spec.bootstrap_format = capl_host::BootstrapFormat::Ignition;
        let _ = delete_machine(hv, &spec);
        spec
    };
    let spec = ignition("ign-0");
    let names = spec.names();
    create_machine(hv, &spec, &config).expect("create with an Ignition config");
    let volume = names.ignition_volume();
    assert_eq!(hv.volume_download(&fx.domain_pool, &volume).unwrap(), config);
    let path = capl_host::volume_xml::parse_volume(&hv.volume_xml(&fx.domain_pool, &volume).unwrap()).unwrap().path;
    let xml = hv.domain_xml(&names.domain).unwrap();
    for entry in capl_host::domain_xml::IGNITION_FW_CFG_NAMES {
        assert!(xml.contains(&format!("<entry name='{entry}' file='{path}'/>")), "{entry}: {xml}");
    }
    assert!(parse_domain(&xml).unwrap().disk_paths.contains(&path), "the config is a file the domain reads");
    let seed = hv.volume_download(&fx.domain_pool, &names.cloud_init_volume()).unwrap();
    let expected = nocloud_iso(IGNITION_SEED_USER_DATA, meta_data(names.instance_id(), names.hostname()).as_bytes());
    assert!(seed.starts_with(&expected), "the seed records the identity, its user-data points at the config");
    assert!(!create_machine(hv, &spec, &config).unwrap().created, "a second create made the machine again");
    assert_eq!(delete_machine(hv, &spec).expect("delete"), []);
    assert!(!hv.volume_list(&fx.domain_pool).unwrap().contains(&volume), "the config outlived its machine");
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());

    // A create or a delete that stopped after the config was written.
    let upto = CreateStep::ALL.iter().position(|s| *s == CreateStep::IgnitionConfig).unwrap() + 1;
    for (i, finish_create) in [true, false].into_iter().enumerate() {
        let spec = ignition(&format!("ign-crash-{i}"));
        run_create_steps(hv, &spec, &config, &CreateStep::ALL[..upto]).unwrap();
        assert!(hv.volume_list(&fx.domain_pool).unwrap().contains(&spec.names().ignition_volume()));
        if finish_create {
            create_machine(hv, &spec, &config).expect("create after a crash after the config");
        }
        assert_eq!(delete_machine(hv, &spec).expect("delete"), []);
        let volumes = hv.volume_list(&fx.domain_pool).unwrap();
        assert!(!volumes.contains(&spec.names().ignition_volume()), "finish create {finish_create}: {volumes:?}");
        assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
    }

    // Someone's qcow2 volume at the config's name.
    let spec = ignition("ign-foreign-0");
    let volume = spec.names().ignition_volume();
    let _ = hv.volume_delete(&fx.domain_pool, &volume);
    let xml = format!(
        "<volume><name>{volume}</name><capacity unit='bytes'>1048576</capacity><target><format type='qcow2'/></target></volume>"
    );
    hv.volume_create(&fx.domain_pool, &xml).unwrap();
    let err = create_machine(hv, &spec, &config).expect_err("create must refuse a foreign volume");
    assert!(
        matches!(&err, HostError::Collision { kind: ObjectKind::Volume, object, .. } if object.ends_with(&volume)),
        "{err}"
    );
    let left = delete_machine(hv, &spec).expect("delete leaves the foreign volume and finishes");
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].object.ends_with(&volume) && left[0].why.contains("not a raw Ignition config"), "{left:?}");
    hv.volume_delete(&fx.domain_pool, &volume).unwrap();
    assert_eq!(leftovers(hv, fx, &[spec]), Vec::<String>::new());
}
