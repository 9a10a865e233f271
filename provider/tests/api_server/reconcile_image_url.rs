//! A LibvirtMachine whose base image is named by URL (spec.imageURL), on the
//! real kube-apiserver with a simulated host and a local HTTP server: the
//! condition shows the download's progress, the machine is provisioned on
//! the downloaded image, and machines sharing the image share one download.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use capl::api::builders::ObjectBuilder;
use capl::api::capi::Machine;
use capl::api::conditions::reasons;
use capl::api::{ChecksumType, LibvirtMachine, LibvirtMachineSpec};
use capl::controller::Settings;
use capl::image::{DownloadSettings, ImageRequest};
use capl_host::hypervisor::{HostAdmin, Hypervisor};
use capl_test_support::image_server::{ImageServer, Route, qcow2_like, sha256_hex};
use kube::ResourceExt;

const MIB: usize = 1024 * 1024;

fn settings(w: &World) -> Settings {
    Settings {
        image_downloads: DownloadSettings {
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_bytes: 64 * MIB as u64,
            progress_interval: Duration::from_millis(200),
            ..DownloadSettings::default()
        },
        ..manager_settings(&w.ns)
    }
}

/// Machine + LibvirtMachine with its image from `url`, and the bootstrap Secret.
async fn machine_from_url(w: &World, cluster: &str, name: &str, url: &str, checksum: &str) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let m: Machine = w.apply(machine_json(name, cluster, name, Some(&secret))).await;
    let spec = LibvirtMachineSpec::sized(BASE_IMAGE, 1, 512, 10).from_url(url, ChecksumType::Sha256, checksum);
    let lm =
        LibvirtMachine::from_spec(name, spec).of_cluster(cluster).controlled_by::<Machine>(name, &m.uid().unwrap());
    let _: LibvirtMachine = w.apply(lm).await;
}

fn provisioning(lm: &LibvirtMachine) -> Option<(String, String)> {
    condition(machine_conditions(lm), "DomainProvisioningReady").map(|c| (c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_on_an_image_url_show_the_download_and_boot_on_the_one_downloaded_image() {
    let w = World::new("rc-image-url").await;
    let manager = Manager::start_with_settings(w.client.clone(), w.connections(), settings(&w));
    let image = Arc::new(qcow2_like(4 * MIB));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let server =
        ImageServer::start(vec![("/node.qcow2", Route::Gated { bytes: image.clone(), sent: MIB, gate: gate.clone() })])
            .await;
    let url = server.url("/node.qcow2");
    let checksum = sha256_hex(&image);
    provisioned_cluster(&w, "demo").await;
    machine_from_url(&w, "demo", "worker-0", &url, &checksum).await;
    machine_from_url(&w, "demo", "worker-1", &url, &checksum).await;

    // Both wait for the one download, which is held after its first MiB.
    let progress = format!("downloaded 1.0 of 4.0 MiB from {url}");
    for name in ["worker-0", "worker-1"] {
        let lm: LibvirtMachine = w
            .wait_for(name, "the download's progress on DomainProvisioningReady", |lm: &LibvirtMachine| {
                provisioning(lm) == Some((reasons::DOWNLOADING_IMAGE.to_string(), progress.clone()))
            })
            .await;
        assert!(has(machine_conditions(&lm), "Ready", "False", None), "{:#?}", lm.status);
    }
    assert_eq!(w.host_objects().domains, Vec::<String>::new(), "nothing is created before the image is there");

    gate.add_permits(16);
    for name in ["worker-0", "worker-1"] {
        let _: LibvirtMachine = w.wait_for(name, "a provisioned, addressed, Ready machine", machine_ready).await;
    }
    assert_eq!(server.gets("/node.qcow2"), 1, "one GET for both machines");
    assert_eq!(manager.ctx.images.uploads_started(), 1, "one upload for both machines");
    let volume = ImageRequest::of(&capl::api::ImageUrl {
        url: url.clone(),
        checksum: checksum.clone(),
        checksum_type: ChecksumType::Sha256,
        format: Default::default(),
    })
    .volume();
    let hv = w.inspect();
    let mut base = hv.volume_list(BASE_POOL).unwrap();
    base.sort();
    assert_eq!(base, vec![volume.clone(), BASE_IMAGE.to_string()]);
    // Each root disk is an overlay on the downloaded image.
    for name in ["worker-0", "worker-1"] {
        let domain = domain_of(&w, name).await;
        let overlay = hv.volume_xml(DOMAIN_POOL, &format!("{domain}.qcow2")).unwrap();
        assert!(overlay.contains(&format!("/{volume}</path>")), "{overlay}");
    }

    // Deleting the machines leaves the image: other machines may use it.
    for name in ["worker-0", "worker-1"] {
        w.delete::<LibvirtMachine>(name).await;
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    assert_eq!(w.host_objects().domains, Vec::<String>::new());
    assert!(hv.volume_list(BASE_POOL).unwrap().contains(&volume));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_file_is_a_condition_and_a_warning_event() {
    let w = World::new("rc-image-404").await;
    let _manager = Manager::start_with_settings(w.client.clone(), w.connections(), settings(&w));
    let server = ImageServer::start(vec![]).await;
    let url = server.url("/moved.qcow2");
    provisioned_cluster(&w, "demo").await;
    machine_from_url(&w, "demo", "worker-0", &url, &"ab".repeat(32)).await;

    let lm: LibvirtMachine = w
        .wait_for("worker-0", "ImageDownloadFailed on DomainProvisioningReady", |lm: &LibvirtMachine| {
            provisioning(lm).is_some_and(|(reason, _)| reason == reasons::IMAGE_DOWNLOAD_FAILED)
        })
        .await;
    let (_, message) = provisioning(&lm).unwrap();
    let expected = format!(
        "LibvirtMachine {}/worker-0: downloading the image from {url}: the server answered 404 Not Found: check spec.imageURL.url (the file may have moved)",
        w.ns
    );
    assert_eq!(message, expected);
    w.wait_event("worker-0", "Warning", reasons::IMAGE_DOWNLOAD_FAILED, &expected).await;
    let hv = w.inspect();
    assert_eq!(hv.volume_list(BASE_POOL).unwrap(), vec![BASE_IMAGE.to_string()]);
    assert_eq!(w.host_objects().domains, Vec::<String>::new());
}

/// `--image-remove-unused`: deleting the last machine on a downloaded image
/// removes the image too, with an event saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_remove_unused_the_last_machine_takes_its_downloaded_image_along() {
    let w = World::new("rc-image-gc").await;
    let mut settings = settings(&w);
    settings.image_downloads.remove_unused = true;
    settings.image_downloads.removal_grace = Duration::ZERO;
    let _manager = Manager::start_with_settings(w.client.clone(), w.connections(), settings);
    let image = Arc::new(qcow2_like(MIB));
    let server = ImageServer::start(vec![("/n.qcow2", Route::Body { bytes: image.clone(), chunk: 64 * 1024 })]).await;
    let url = server.url("/n.qcow2");
    let checksum = sha256_hex(&image);
    provisioned_cluster(&w, "demo").await;
    machine_from_url(&w, "demo", "worker-0", &url, &checksum).await;
    let _: LibvirtMachine = w.wait_for("worker-0", "a provisioned, addressed, Ready machine", machine_ready).await;
    let volume = ImageRequest::of(&capl::api::ImageUrl {
        url,
        checksum,
        checksum_type: ChecksumType::Sha256,
        format: Default::default(),
    })
    .volume();
    let hv = w.inspect();
    assert!(hv.volume_list(BASE_POOL).unwrap().contains(&volume));

    w.delete::<LibvirtMachine>("worker-0").await;
    let note = format!(
        "removed the downloaded image {BASE_POOL}/{volume} from {}: no volume of the host is an overlay on it (--image-remove-unused)",
        w.uri
    );
    w.wait_event("worker-0", "Normal", "ImageRemoved", &note).await;
    w.wait_gone::<LibvirtMachine>("worker-0").await;
    assert_eq!(hv.volume_list(BASE_POOL).unwrap(), vec![BASE_IMAGE.to_string()]);
}
