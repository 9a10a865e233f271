//! What the LibvirtMachine reconciler waits for, refuses, and leaves alone, on
//! the real kube-apiserver with a simulated libvirt host. Each "then" step
//! also exercises a watch: the Cluster, Machine and Secret watches map their
//! changes to the LibvirtMachine.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use capl::api::capi::{Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine, MACHINE_FINALIZER};
use capl_host::hypervisor::{DomainState, HostAdmin, Hypervisor};
use kube::ResourceExt;
use serde_json::json;

/// Nothing of machine `name` on the host, and no libvirt call that creates anything was made.
fn assert_nothing_created(w: &World, name: &str) {
    let objects = w.host_objects();
    assert!(!objects.domains.iter().any(|d| is_domain_of(w, name, d)), "a domain for {name} was created: {objects:?}");
    assert!(objects.volumes.is_empty(), "volumes were created: {objects:?}");
    assert!(objects.dhcp_hosts.is_empty(), "DHCP hosts were added: {objects:?}");
    let calls = w.calls_since_setup();
    for op in ["VolumeCreate", "VolumeUpload", "NetworkUpdate", "DomainDefine", "DomainCreate"] {
        assert!(!calls.contains_key(op), "{op} was called: {calls:?}");
    }
}

fn message(lm: &LibvirtMachine, type_: &str) -> String {
    condition(machine_conditions(lm), type_).map(|c| c.message.clone()).unwrap_or_default()
}

async fn wait_reason(w: &World, name: &str, type_: &str, status: &str, reason: &str) -> LibvirtMachine {
    w.wait_for::<LibvirtMachine>(name, &format!("{type_} {status}/{reason}"), |lm| {
        has(machine_conditions(lm), type_, status, Some(reason))
    })
    .await
}

/// Reconciles of LibvirtMachines during `window`, once the manager has settled.
async fn reconciles_during(manager: &Manager, window: Duration) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = manager.reconciles("libvirtmachine");
    tokio::time::sleep(window).await;
    manager.reconciles("libvirtmachine") - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_owner_machine_creates_nothing() {
    let w = World::new("rg-noowner").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let _: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    // No ownerReference: CAPI has not adopted the LibvirtMachine yet.
    let _: LibvirtMachine = w.apply(libvirt_machine_json("m0", "demo", None)).await;

    let lm = wait_reason(&w, "m0", "InfrastructureReady", "Unknown", "WaitingForOwner").await;
    assert!(lm.finalizers().is_empty(), "{:?}", lm.finalizers());
    assert!(lm.spec.provider_id.is_none());
    assert_nothing_created(&w, "m0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_cluster_infrastructure_then_creates() {
    let w = World::new("rg-infra").await;
    let _manager = w.start_manager();
    let c: Cluster = w.apply(cluster_json("demo", "demo-lc", true)).await;
    let _: LibvirtCluster = w.apply(libvirt_cluster_json("demo-lc", &w.uri, Some(("demo", &c.uid().unwrap())))).await;
    ready_machine_objects(&w, "demo", "m0").await;

    let lm = wait_reason(&w, "m0", "InfrastructureReady", "False", "WaitingForClusterInfrastructureReady").await;
    assert!(message(&lm, "InfrastructureReady").contains("Cluster demo"), "{}", message(&lm, "InfrastructureReady"));
    assert!(has(machine_conditions(&lm), "Ready", "False", None), "{:#?}", machine_conditions(&lm));
    assert_nothing_created(&w, "m0");

    // CAPI marks the cluster infrastructure provisioned: the Cluster watch brings us back.
    let _: Cluster = w.patch_status("demo", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    w.wait_for::<LibvirtMachine>("m0", "Ready after the cluster infrastructure", machine_ready).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_bootstrap_data_secret_name_then_creates() {
    let w = World::new("rg-nodata").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    machine_pair(&w, "demo", "m0", None).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "WaitingForBootstrapData").await;
    assert!(has(machine_conditions(&lm), "InfrastructureReady", "True", None));
    assert!(message(&lm, "DomainProvisioningReady").contains("dataSecretName"));
    assert_nothing_created(&w, "m0");

    // The bootstrap provider sets dataSecretName: the Machine watch brings us back.
    let _: Machine = w.merge("m0", json!({ "spec": { "bootstrap": { "dataSecretName": "m0-bootstrap" } } })).await;
    w.wait_for::<LibvirtMachine>("m0", "Ready after dataSecretName was set", machine_ready).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_secret_created_after_the_machine_is_picked_up() {
    let w = World::new("rg-latesecret").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    machine_pair(&w, "demo", "m0", Some("m0-bootstrap")).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "WaitingForBootstrapData").await;
    assert!(
        message(&lm, "DomainProvisioningReady").contains("m0-bootstrap"),
        "{}",
        message(&lm, "DomainProvisioningReady")
    );
    assert_nothing_created(&w, "m0");

    // The Secret appears (type cluster.x-k8s.io/secret): the Secret watch brings us
    // back. The deadline is below the 60 s periodic look while a Secret is
    // missing, so that look cannot pass this test in the watch's place.
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    w.wait_for_within::<LibvirtMachine>(
        Duration::from_secs(45),
        "m0",
        "Ready after the Secret appeared, through the Secret watch",
        machine_ready,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_without_value_is_invalid_and_not_retried_in_a_loop() {
    let w = World::new("rg-novalue").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", BTreeMap::from([("format".to_string(), "cloud-config".to_string())]))
        .await;
    machine_pair(&w, "demo", "m0", Some("m0-bootstrap")).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "InvalidBootstrapData").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(text.contains("m0-bootstrap") && text.contains("\"value\""), "names the Secret and the key: {text}");
    w.wait_event("m0", "Warning", "InvalidBootstrapData", &text).await;
    assert_nothing_created(&w, "m0");

    let runs = reconciles_during(&manager, Duration::from_secs(6)).await;
    assert!(runs <= 1, "{runs} reconciles in 6 s of a machine waiting for a fixed Secret: a hot loop");
}

/// Bootstrap data in format `ignition` (CABPK's Flatcar output) reaches the
/// guest as the firmware config entries Ignition reads: a volume holding the
/// config byte for byte, named by the domain's fw_cfg entries; the seed ISO
/// is there too (it records the machine's identity). A format the provider
/// does not know is refused, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignition_bootstrap_data_goes_into_the_firmware_config() {
    let w = World::new("rg-ignition").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    let config = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,m0"}}]}}"#;
    create_bootstrap_secret(
        &w,
        "m0-bootstrap",
        BTreeMap::from([("value".to_string(), config.to_string()), ("format".to_string(), "ignition".to_string())]),
    )
    .await;
    machine_pair(&w, "demo", "m0", Some("m0-bootstrap")).await;
    let lm = w.wait_for::<LibvirtMachine>("m0", "Ready with Ignition", machine_ready).await;
    let domain = lm.status.unwrap().domain_name.unwrap();
    let hv = w.inspect();
    let volume = format!("ignition-{domain}.ign");
    assert_eq!(hv.volume_download(DOMAIN_POOL, &volume).unwrap(), config.as_bytes(), "the config, byte for byte");
    let xml = hv.domain_xml(&domain).unwrap();
    for entry in ["opt/com.coreos/config", "opt/org.flatcar-linux/config"] {
        assert!(xml.contains(&format!("<entry name='{entry}' file='")), "no fw_cfg entry {entry}: {xml}");
    }
    assert!(hv.volume_list(DOMAIN_POOL).unwrap().contains(&format!("cloudinit-{domain}.iso")), "the seed");

    create_bootstrap_secret(
        &w,
        "m1-bootstrap",
        BTreeMap::from([("value".to_string(), "x".to_string()), ("format".to_string(), "butane".to_string())]),
    )
    .await;
    machine_pair(&w, "demo", "m1", Some("m1-bootstrap")).await;
    let lm = wait_reason(&w, "m1", "DomainProvisioningReady", "False", "InvalidBootstrapData").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(text.contains("m1-bootstrap") && text.contains("\"butane\"") && text.contains("\"ignition\""), "{text}");
    assert!(!hv.domain_list().unwrap().iter().any(|d| is_domain_of(&w, "m1", d)), "a domain was made for m1");

    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    assert!(!hv.volume_list(DOMAIN_POOL).unwrap().contains(&volume), "the Ignition config outlived its machine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_cluster_creates_nothing_until_unpaused() {
    let w = World::new("rg-paused").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    let _: Cluster = w.merge("demo", json!({ "spec": { "paused": true } })).await;
    ready_machine_objects(&w, "demo", "m0").await;

    let lm = wait_reason(&w, "m0", "Paused", "True", "Paused").await;
    assert!(message(&lm, "Paused").contains("Cluster demo"), "{}", message(&lm, "Paused"));
    assert_nothing_created(&w, "m0");

    // Unpausing the Cluster reaches the LibvirtMachine through the Cluster watch.
    let _: Cluster = w.merge("demo", json!({ "spec": { "paused": false } })).await;
    let lm = w.wait_for::<LibvirtMachine>("m0", "Ready after unpausing", machine_ready).await;
    assert!(has(machine_conditions(&lm), "Paused", "False", Some("NotPaused")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_base_image_is_reported() {
    let w = World::new("rg-noimage").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    lm["spec"]["image"] = json!("no-such-image.qcow2");
    let _: LibvirtMachine = w.apply(lm).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "InfrastructureMissing").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(
        text.contains("m0") && text.contains("no-such-image.qcow2") && text.contains(BASE_POOL),
        "names machine, image and pool: {text}"
    );
    w.wait_event("m0", "Warning", "InfrastructureMissing", &text).await;
    assert_nothing_created(&w, "m0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_below_the_image_size_is_reported() {
    let w = World::new("rg-smalldisk").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    // The simulated base image is 2 GiB.
    lm["spec"]["diskGiB"] = json!(1);
    let _: LibvirtMachine = w.apply(lm).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "InvalidMachineSpec").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(
        text.contains("m0") && text.contains(BASE_IMAGE) && text.contains("diskGiB"),
        "names machine, image and field: {text}"
    );
    assert!(text.contains('2'), "says the smallest size that works: {text}");
    w.wait_event("m0", "Warning", "InvalidMachineSpec", &text).await;
    assert_nothing_created(&w, "m0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_model_the_host_does_not_list_is_reported() {
    let w = World::new("rg-cpumodel").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    // The simulated host's domain capabilities list no such model.
    lm["spec"]["cpu"] = json!({"mode": "custom", "model": "Penryn"});
    let _: LibvirtMachine = w.apply(lm).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "InvalidMachineSpec").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(
        text.contains("m0") && text.contains("spec.cpu.model \"Penryn\"") && text.contains("<mode name='custom'>"),
        "names machine, field, value and the host's reason: {text}"
    );
    w.wait_event("m0", "Warning", "InvalidMachineSpec", &text).await;
    assert_nothing_created(&w, "m0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_disk_in_a_pool_the_host_lacks_is_reported() {
    let w = World::new("rg-datapool").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    lm["spec"]["dataDisks"] =
        json!([{"name": "etcd", "sizeGiB": 4}, {"name": "logs", "sizeGiB": 1, "pool": "fast-ssd"}]);
    let _: LibvirtMachine = w.apply(lm).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "InfrastructureMissing").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(
        text.contains("m0") && text.contains("spec.dataDisks \"logs\" names storage pool \"fast-ssd\""),
        "names machine, disk and pool: {text}"
    );
    assert!(text.contains("does not exist") && text.contains("nothing was created"), "says why and what: {text}");
    w.wait_event("m0", "Warning", "InfrastructureMissing", &text).await;
    assert_nothing_created(&w, "m0");
}

/// The data disks are made with the machine, shown in its status (volume
/// and device), and deleted with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_disks_are_shown_in_status_and_go_with_the_machine() {
    let w = World::new("rg-datadisks").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    lm["spec"]["dataDisks"] = json!([
        {"name": "etcd", "sizeGiB": 4},
        {"name": "images", "sizeGiB": 8, "pool": BASE_POOL, "format": "raw", "bus": "sata"}
    ]);
    let _: LibvirtMachine = w.apply(lm).await;

    let lm = w.wait_for::<LibvirtMachine>("m0", "Ready with data disks", machine_ready).await;
    let status = lm.status.clone().unwrap();
    let domain = status.domain_name.clone().unwrap();
    let shown: Vec<(String, String, String)> =
        status.data_disks.unwrap().into_iter().map(|d| (d.name, d.volume, d.device)).collect();
    let etcd = format!("{domain}-data-etcd.qcow2");
    let images = format!("{domain}-data-images.raw");
    assert_eq!(
        shown,
        [
            ("etcd".to_string(), format!("{DOMAIN_POOL}/{etcd}"), "vdb".to_string()),
            ("images".to_string(), format!("{BASE_POOL}/{images}"), "sdb".to_string()),
        ]
    );
    let hv = w.inspect();
    assert!(hv.volume_list(DOMAIN_POOL).unwrap().contains(&etcd));
    assert!(hv.volume_list(BASE_POOL).unwrap().contains(&images));

    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    assert!(!hv.volume_list(DOMAIN_POOL).unwrap().contains(&etcd), "the data disk outlived its machine");
    assert!(!hv.volume_list(BASE_POOL).unwrap().contains(&images), "the data disk outlived its machine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_domain_with_our_name_is_a_collision_and_left_alone() {
    let w = World::new("rg-foreign").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    // The machine waits for its bootstrap Secret while a foreign domain takes its name.
    machine_pair(&w, "demo", "m0", Some("m0-bootstrap")).await;
    wait_reason(&w, "m0", "DomainProvisioningReady", "False", "WaitingForBootstrapData").await;
    let domain = domain_of(&w, "m0").await;
    let hv = w.inspect();
    hv.domain_define(&format!(
        "<domain type='qemu'><name>{domain}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os></domain>"
    ))
    .unwrap();
    hv.domain_start(&domain).unwrap();
    let foreign = hv.domain_xml(&domain).unwrap();
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;

    let lm = wait_reason(&w, "m0", "DomainProvisioningReady", "False", "DomainNameCollision").await;
    let text = message(&lm, "DomainProvisioningReady");
    assert!(text.contains(&domain), "names the domain: {text}");
    w.wait_event("m0", "Warning", "DomainNameCollision", &text).await;
    assert_eq!(hv.domain_xml(&domain).unwrap(), foreign, "the foreign domain was changed");
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);
    let objects = w.host_objects();
    assert!(objects.volumes.is_empty() && objects.dhcp_hosts.is_empty(), "{objects:?}");

    // Deleting the LibvirtMachine does not delete the foreign domain either.
    w.delete::<LibvirtMachine>("m0").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(hv.domain_xml(&domain).unwrap(), foreign, "deletion touched the foreign domain");
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);
}

/// clusterctl move pauses the Cluster, then deletes the moved objects from the
/// source cluster: the VM now belongs to the target cluster and must live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_deleted_machine_leaves_the_host_untouched() {
    let w = World::new("rg-move").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "m0").await;
    w.wait_for::<LibvirtMachine>("m0", "Ready", machine_ready).await;
    let domain = domain_of(&w, "m0").await;
    let host_before = w.host_objects();

    let _: Cluster = w.merge("demo", json!({ "spec": { "paused": true } })).await;
    wait_reason(&w, "m0", "Paused", "True", "Paused").await;
    let calls_before = w.calls();
    let runs_before = manager.reconciles("libvirtmachine");
    w.delete::<LibvirtMachine>("m0").await;
    let started = std::time::Instant::now();
    while manager.reconciles("libvirtmachine") == runs_before {
        assert!(started.elapsed() < WAIT, "the deletion was not reconciled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let lm: LibvirtMachine = w.api().get("m0").await.unwrap();
    assert!(lm.metadata.deletion_timestamp.is_some());
    assert_eq!(lm.finalizers(), [MACHINE_FINALIZER.to_string()], "the finalizer stays while paused");
    let delta = call_delta(&calls_before, &w.calls());
    for op in ["DomainDestroy", "DomainUndefine", "VolumeDelete", "NetworkUpdate"] {
        assert!(!delta.contains_key(op), "{op} was called while paused: {delta:?}");
    }
    assert_eq!(w.host_objects(), host_before);
    assert_eq!(w.inspect().domain_state(&domain).unwrap(), DomainState::Running);

    // clusterctl removes the finalizer of the source objects itself.
    let _: LibvirtMachine = w.merge("m0", json!({ "metadata": { "finalizers": null } })).await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    assert_eq!(w.host_objects(), host_before);
}

/// The `cluster.x-k8s.io/paused` annotation on the LibvirtMachine pauses it
/// like Cluster.spec.paused; removing it resumes (a change to the object itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_annotation_creates_nothing_until_removed() {
    let w = World::new("rg-annot").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    lm["metadata"]["annotations"] = json!({ "cluster.x-k8s.io/paused": "" });
    let _: LibvirtMachine = w.apply(lm).await;

    let lm = wait_reason(&w, "m0", "Paused", "True", "Paused").await;
    assert!(message(&lm, "Paused").contains("cluster.x-k8s.io/paused"), "{}", message(&lm, "Paused"));
    assert_nothing_created(&w, "m0");

    let _: LibvirtMachine =
        w.merge("m0", json!({ "metadata": { "annotations": { "cluster.x-k8s.io/paused": null } } })).await;
    w.wait_for::<LibvirtMachine>("m0", "Ready after the annotation was removed", machine_ready).await;
}
