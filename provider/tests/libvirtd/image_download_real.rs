//! A base image named by URL, downloaded from a local HTTP server into the
//! private test libvirtd's base pool through libvirt's volume upload: the
//! volume holds the file byte for byte, libvirt reads it as the qcow2 it is,
//! and a download whose checksum does not match leaves nothing. Nothing is
//! booted.
//!
//! Needs `cargo xtask host up` and qemu-img (which makes the image).

use std::sync::Arc;
use std::time::Duration;

use capl::api::conditions::reasons;
use capl::api::{ChecksumType, ImageFormat, ImageUrl};
use capl::image::{DownloadSettings, ImageDownloads, ImageRequest, ImageState};
use capl_host::hypervisor::connections::{Connections, DEFAULT_MAX_CALLS_PER_HOST};
use capl_host::hypervisor::libvirt::LibvirtConnector;
use capl_host::hypervisor::{HostAdmin, Hypervisor};
use capl_host::volume_xml::{BackingStore, overlay_volume_xml, parse_volume};
use capl_host_test_support::real_host::connect_checked;
use capl_test_support::image_server::{ImageServer, Route, sha256_hex};
use capl_testbed::wait::{self, Bound, Check};
use testenv::test_host::{BASE_POOL, DISK_POOL};

const VIRTUAL_SIZE: u64 = 64 << 20;

/// A qcow2 file made by qemu-img, with a little data in it.
fn small_qcow2() -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("capl-image-url-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.qcow2");
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(VIRTUAL_SIZE.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running qemu-img (Debian's qemu-utils): {e}"));
    assert!(out.status.success(), "qemu-img create: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

async fn settled(
    downloads: &Arc<ImageDownloads>,
    connections: &Arc<Connections>,
    uri: &str,
    req: &ImageRequest,
) -> ImageState {
    wait::until(Bound::new(Duration::from_secs(120), Duration::from_millis(50)), || async {
        Ok::<_, ()>(match downloads.ensure(&connections.host(uri), BASE_POOL, req, "LibvirtMachine real/m").await {
            ImageState::Downloading(progress) => Check::Pending(progress),
            ended => Check::Done(ended),
        })
    })
    .await
    .unwrap_or_else(|stop| panic!("the download did not end: {stop:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_url_is_streamed_into_the_real_base_pool_and_read_back() {
    let _daemon = crate::share_real_daemon().await;
    let (uri, hv) = connect_checked();
    let image = Arc::new(small_qcow2());
    assert!(image.starts_with(b"QFI\xfb"), "qemu-img made no qcow2");
    let server =
        ImageServer::start(vec![("/small.qcow2", Route::Body { bytes: image.clone(), chunk: 16 * 1024 })]).await;
    let checksum = sha256_hex(&image);
    let req = ImageRequest::of(&ImageUrl {
        url: server.url("/small.qcow2"),
        checksum: checksum.clone(),
        checksum_type: ChecksumType::Sha256,
        format: ImageFormat::Qcow2,
    });
    let volume = req.volume();
    // qemu-img writes the same file every time: an earlier run's volume goes first.
    let _ = hv.volume_delete(BASE_POOL, &volume);

    let connections = Arc::new(Connections::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST));
    let downloads = Arc::new(ImageDownloads::new(DownloadSettings {
        remove_unused: true,
        removal_grace: Duration::ZERO,
        ..DownloadSettings::default()
    }));

    // A wrong checksum: the stream is aborted before it is finished and the volume removed.
    let wrong = ImageRequest { checksum: "f".repeat(64), ..req.clone() };
    match settled(&downloads, &connections, &uri, &wrong).await {
        ImageState::Failed { reason, message } => {
            assert_eq!(reason, reasons::IMAGE_CHECKSUM_MISMATCH, "{message}");
            assert!(message.contains(&checksum), "{message}");
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    let base = hv.volume_list(BASE_POOL).unwrap();
    assert!(!base.contains(&wrong.volume()), "the unchecked image is left in {BASE_POOL}: {base:?}");

    assert_eq!(settled(&downloads, &connections, &uri, &req).await, ImageState::Ready);
    let stored = hv.volume_download(BASE_POOL, &volume).unwrap();
    assert_eq!(stored.len(), image.len());
    assert_eq!(sha256_hex(&stored), checksum, "the volume's content is not the image");
    // libvirt reads the uploaded file as the qcow2 it is (format and virtual
    // size) once it refreshes the pool.
    hv.pool_refresh(BASE_POOL).unwrap();
    let info = parse_volume(&hv.volume_xml(BASE_POOL, &volume).unwrap()).unwrap();
    assert_eq!(info.format.as_deref(), Some("qcow2"), "{info:?}");
    assert_eq!(info.capacity, VIRTUAL_SIZE, "{info:?}");
    assert_eq!(server.gets("/small.qcow2"), 2, "one GET for the mismatch, one for the image");

    // There: no more GETs.
    assert_eq!(settled(&downloads, &connections, &uri, &req).await, ImageState::Ready);
    assert_eq!(server.gets("/small.qcow2"), 2);

    // --image-remove-unused: kept while an overlay in the disk pool uses it, removed after.
    let overlay = format!("capl-image-url-overlay-{}.qcow2", std::process::id());
    let backing = BackingStore { path: info.path.clone(), format: Some("qcow2".into()) };
    hv.volume_create(DISK_POOL, &overlay_volume_xml(&overlay, VIRTUAL_SIZE, &backing)).unwrap();
    let host = connections.host(&uri);
    assert_eq!(downloads.remove_if_unused(&host, BASE_POOL, &req).await, None, "an overlay uses it");
    assert!(hv.volume_list(BASE_POOL).unwrap().contains(&volume));
    hv.volume_delete(DISK_POOL, &overlay).unwrap();
    let note = downloads.remove_if_unused(&host, BASE_POOL, &req).await.expect("removed once unused");
    assert!(note.contains(&volume), "{note}");
    assert!(!hv.volume_list(BASE_POOL).unwrap().contains(&volume));
}
