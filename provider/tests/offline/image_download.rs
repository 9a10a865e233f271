//! Base images named by URL (spec.imageURL), downloaded from a local HTTP
//! server into a simulated host's basePool: what a user reads on the
//! LibvirtMachine's condition for each way a download goes wrong, that no
//! volume is left behind, and that one image is downloaded once.

use std::sync::Arc;
use std::time::Duration;

use capl::api::conditions::reasons;
use capl::api::{ChecksumType, ImageFormat, ImageUrl};
use capl::image::{DownloadSettings, ImageDownloads, ImageRequest, ImageState};
use capl_host::hypervisor::connections::Connections;
use capl_host::hypervisor::sim::{SimConnector, SimHypervisor};
use capl_host::hypervisor::{HostAdmin, Hypervisor};
use capl_host::sim_host::BASE_POOL;
use capl_test_support::image_server::{ImageServer, Route, qcow2_like, sha256_hex, sha512_hex};
use capl_testbed::wait::{self, Bound, Check};

const MACHINE: &str = "LibvirtMachine default/m1";
const MIB: usize = 1024 * 1024;

/// A simulated host, its connection cache and the downloads of one manager.
struct Rig {
    uri: String,
    host: libvirt_sim::Host,
    connections: Arc<Connections>,
    downloads: Arc<ImageDownloads>,
}

impl Rig {
    fn new(name: &str) -> Self {
        Self::with(name, |_| {})
    }

    fn with(name: &str, adjust: impl FnOnce(&mut DownloadSettings)) -> Self {
        let uri = format!("qemu+tcp://sim-image-{name}/system");
        let host = capl_host::sim_host::register(&uri).unwrap_or_else(|e| panic!("building {uri}: {e}"));
        let settings = DownloadSettings {
            connect_timeout: Duration::from_secs(5),
            // The stalling server is the thing under test: give up on it soon.
            idle_timeout: Duration::from_millis(500),
            max_bytes: 8 * MIB as u64,
            progress_interval: Duration::from_millis(50),
            ..DownloadSettings::default()
        };
        let mut settings = settings;
        adjust(&mut settings);
        Self {
            uri,
            host,
            connections: Arc::new(Connections::new(Arc::new(SimConnector), 5)),
            downloads: Arc::new(ImageDownloads::new(settings)),
        }
    }

    async fn ensure(&self, request: &ImageRequest, object: &str) -> ImageState {
        self.downloads.ensure(&self.connections.host(&self.uri), BASE_POOL, request, object).await
    }

    /// Asks until the download has ended: what a machine is then told.
    async fn settled(&self, request: &ImageRequest) -> ImageState {
        wait::until(Bound::new(Duration::from_secs(60), Duration::from_millis(20)), || async {
            Ok::<_, ()>(match self.ensure(request, MACHINE).await {
                ImageState::Downloading(progress) => Check::Pending(progress),
                ended => Check::Done(ended),
            })
        })
        .await
        .unwrap_or_else(|stop| panic!("the download did not end: {stop:?}"))
    }

    /// The downloaded images in basePool.
    fn image_volumes(&self) -> Vec<String> {
        let hv = SimHypervisor::connect(&self.uri).unwrap();
        hv.volume_list(BASE_POOL).unwrap().into_iter().filter(|v| v.starts_with("capl-image-")).collect()
    }

    fn uploads(&self) -> u64 {
        self.host.counters().calls(libvirt_sim::Op::VolumeUpload)
    }
}

fn request(url: String, checksum: String) -> ImageRequest {
    ImageRequest::of(&ImageUrl { url, checksum, checksum_type: ChecksumType::Sha256, format: ImageFormat::Qcow2 })
}

fn failed(state: ImageState) -> (&'static str, String) {
    match state {
        ImageState::Failed { reason, message } => (reason, message),
        other => panic!("expected a failed download, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_streamed_into_base_pool_under_its_checksum_and_never_downloaded_again() {
    let rig = Rig::new("good");
    let image = Arc::new(qcow2_like(3 * MIB + 12345));
    let server =
        ImageServer::start(vec![("/noble.qcow2", Route::Body { bytes: image.clone(), chunk: 64 * 1024 })]).await;
    let req = request(server.url("/noble.qcow2"), sha256_hex(&image).to_uppercase());
    let first = rig.ensure(&req, MACHINE).await;
    assert!(matches!(&first, ImageState::Downloading(m) if m.contains(&server.url("/noble.qcow2"))), "{first:?}");
    assert_eq!(rig.settled(&req).await, ImageState::Ready);

    let volume = req.volume();
    assert_eq!(volume, format!("capl-image-sha256-{}.qcow2", &sha256_hex(&image)[..32]));
    assert_eq!(rig.image_volumes(), vec![volume.clone()]);
    let hv = SimHypervisor::connect(&rig.uri).unwrap();
    let stored = hv.volume_download(BASE_POOL, &volume).unwrap();
    assert!(stored == *image, "the volume holds {} bytes, not the image's {}", stored.len(), image.len());

    // The volume is there: no GET, no upload, however often machines ask.
    for _ in 0..3 {
        assert_eq!(rig.ensure(&req, "LibvirtMachine default/m2").await, ImageState::Ready);
    }
    assert_eq!(server.gets("/noble.qcow2"), 1);
    assert_eq!(rig.downloads.requests_sent(), 1);
    assert_eq!(rig.uploads(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_image_with_a_sha512_checksum_is_stored_as_raw() {
    let rig = Rig::new("raw");
    let image = Arc::new(b"any bytes at all make a raw disk".repeat(1000));
    let server = ImageServer::start(vec![("/disk.img", Route::Body { bytes: image.clone(), chunk: 4096 })]).await;
    let req = ImageRequest::of(&ImageUrl {
        url: server.url("/disk.img"),
        checksum: sha512_hex(&image),
        checksum_type: ChecksumType::Sha512,
        format: ImageFormat::Raw,
    });
    assert_eq!(rig.settled(&req).await, ImageState::Ready);
    assert_eq!(rig.image_volumes(), vec![format!("capl-image-sha512-{}.raw", &sha512_hex(&image)[..32])]);
}

/// Two machines with the same image while it downloads: one GET, one upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_that_share_an_image_wait_for_one_download() {
    let rig = Rig::new("single-flight");
    let image = Arc::new(qcow2_like(2 * MIB));
    let server =
        ImageServer::start(vec![("/shared.qcow2", Route::Body { bytes: image.clone(), chunk: 16 * 1024 })]).await;
    let req = request(server.url("/shared.qcow2"), sha256_hex(&image));
    let (a, b) =
        tokio::join!(rig.ensure(&req, "LibvirtMachine default/a"), rig.ensure(&req, "LibvirtMachine default/b"));
    assert!(matches!(a, ImageState::Downloading(_)), "{a:?}");
    assert!(matches!(b, ImageState::Downloading(_)), "{b:?}");
    assert_eq!(rig.settled(&req).await, ImageState::Ready);
    assert_eq!(rig.ensure(&req, "LibvirtMachine default/b").await, ImageState::Ready);
    assert_eq!(server.gets("/shared.qcow2"), 1, "one HTTP GET for both machines");
    assert_eq!(rig.downloads.requests_sent(), 1);
    assert_eq!(rig.downloads.uploads_started(), 1);
    assert_eq!(rig.uploads(), 1, "one volume upload for both machines");
    assert_eq!(rig.image_volumes().len(), 1);
}

/// Each way a download fails: the reason and message on the machine's
/// condition, and no volume left in basePool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_file_is_reported_with_the_status_and_retried_only_later() {
    let rig = Rig::new("404");
    let server = ImageServer::start(vec![("/old.qcow2", Route::Status(404))]).await;
    let req = request(server.url("/gone.qcow2"), "ab".repeat(32));
    let (reason, message) = failed(rig.settled(&req).await);
    assert_eq!(reason, reasons::IMAGE_DOWNLOAD_FAILED);
    for part in [MACHINE, &server.url("/gone.qcow2"), "404 Not Found", "check spec.imageURL.url"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty());
    // Machines asking right after are given the same answer, not a new download.
    let (again, _) = failed(rig.ensure(&req, MACHINE).await);
    assert_eq!(again, reasons::IMAGE_DOWNLOAD_FAILED);
    assert_eq!(server.gets("/gone.qcow2"), 1);
    assert_eq!(rig.uploads(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_status_is_reported() {
    let rig = Rig::new("500");
    let server = ImageServer::start(vec![("/broken.qcow2", Route::Status(500))]).await;
    let (reason, message) = failed(rig.settled(&request(server.url("/broken.qcow2"), "cd".repeat(32))).await);
    assert_eq!(reason, reasons::IMAGE_DOWNLOAD_FAILED);
    assert!(message.contains("500 Internal Server Error") && message.contains("tried again"), "{message}");
    assert!(rig.image_volumes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_body_leaves_no_volume() {
    let rig = Rig::new("truncated");
    let image = Arc::new(qcow2_like(2 * MIB));
    let server = ImageServer::start(vec![("/cut.qcow2", Route::Truncated { bytes: image.clone(), sent: MIB })]).await;
    let (reason, message) = failed(rig.settled(&request(server.url("/cut.qcow2"), sha256_hex(&image))).await);
    assert_eq!(reason, reasons::IMAGE_DOWNLOAD_FAILED);
    for part in [MACHINE, &server.url("/cut.qcow2"), "the body ended after", &format!("of the {} bytes", 2 * MIB)] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty(), "the partial volume is removed: {:?}", rig.image_volumes());
    assert_eq!(rig.uploads(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_size_limit_is_refused_before_anything_is_stored() {
    let rig = Rig::new("oversized");
    let server = ImageServer::start(vec![("/huge.qcow2", Route::Declared { length: 40 << 30 })]).await;
    let (reason, message) = failed(rig.settled(&request(server.url("/huge.qcow2"), "ef".repeat(32))).await);
    assert_eq!(reason, reasons::IMAGE_DOWNLOAD_FAILED);
    for part in [
        MACHINE,
        &server.url("/huge.qcow2"),
        "42949672960 bytes (40.0 GiB)",
        "limit of 8388608 bytes (8.0 MiB)",
        "--image-max-size",
    ] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty());
    assert_eq!(rig.uploads(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stalls_fails_after_the_idle_timeout_and_leaves_no_volume() {
    let rig = Rig::new("stall");
    let image = Arc::new(qcow2_like(2 * MIB));
    let server =
        ImageServer::start(vec![("/slow.qcow2", Route::Stall { bytes: image.clone(), sent: 256 * 1024 })]).await;
    let (reason, message) = failed(rig.settled(&request(server.url("/slow.qcow2"), sha256_hex(&image))).await);
    assert_eq!(reason, reasons::IMAGE_DOWNLOAD_FAILED);
    for part in [MACHINE, &server.url("/slow.qcow2"), "no data for 0.5 s", "--image-idle-timeout"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty(), "the partial volume is removed: {:?}", rig.image_volumes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_a_qcow2_image_is_refused() {
    let rig = Rig::new("html");
    let page = Arc::new(b"<!DOCTYPE html><html><body>Download our image!</body></html>".to_vec());
    let server = ImageServer::start(vec![("/download", Route::Body { bytes: page.clone(), chunk: 1024 })]).await;
    let (reason, message) = failed(rig.settled(&request(server.url("/download"), sha256_hex(&page))).await);
    assert_eq!(reason, reasons::IMAGE_FORMAT_MISMATCH);
    for part in [MACHINE, &server.url("/download"), "not a qcow2 image", "HTML page", "spec.imageURL.format"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_with_another_checksum_is_not_stored() {
    let rig = Rig::new("checksum");
    let image = Arc::new(qcow2_like(MIB + 7));
    let server =
        ImageServer::start(vec![("/noble.qcow2", Route::Body { bytes: image.clone(), chunk: 32 * 1024 })]).await;
    let wrong = "0".repeat(64);
    let (reason, message) = failed(rig.settled(&request(server.url("/noble.qcow2"), wrong.clone())).await);
    assert_eq!(reason, reasons::IMAGE_CHECKSUM_MISMATCH);
    for part in [MACHINE, &server.url("/noble.qcow2"), &sha256_hex(&image), &wrong, "sha256sum"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty(), "the unchecked image is removed: {:?}", rig.image_volumes());
}

/// https is verified against the system's root certificates: a server whose
/// certificate comes from a CA they do not hold is refused, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_server_with_an_unknown_certificate_authority_is_refused() {
    let rig = Rig::new("https");
    let ca = capl_testbed::certificates::Pki::new_ca("capl image test CA").unwrap();
    let (cert, key) = ca.serving_cert("127.0.0.1").unwrap();
    let image = Arc::new(qcow2_like(64 * 1024));
    let server =
        ImageServer::start_tls(vec![("/n.qcow2", Route::Body { bytes: image.clone(), chunk: 4096 })], &cert, &key)
            .await;
    let url = server.url("/n.qcow2");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let (reason, message) = failed(rig.settled(&request(url.clone(), sha256_hex(&image))).await);
    assert_eq!(reason, reasons::IMAGE_DOWNLOAD_FAILED);
    for part in
        [MACHINE, url.as_str(), "UnknownIssuer", "does not verify against the manager's system root certificates"]
    {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(rig.image_volumes().is_empty());
    assert_eq!(server.gets("/n.qcow2"), 0, "no request is sent over an unverified connection");
}

/// `--image-remove-unused`: a downloaded image goes once no overlay uses it,
/// never while one does, and not at all without the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_image_is_removed_only_when_asked_and_no_overlay_uses_it() {
    let image = Arc::new(qcow2_like(256 * 1024));
    let server = ImageServer::start(vec![("/n.qcow2", Route::Body { bytes: image.clone(), chunk: 64 * 1024 })]).await;
    let req = request(server.url("/n.qcow2"), sha256_hex(&image));
    let overlay = |rig: &Rig| {
        let hv = SimHypervisor::connect(&rig.uri).unwrap();
        let base = capl_host::volume_xml::parse_volume(&hv.volume_xml(BASE_POOL, &req.volume()).unwrap()).unwrap();
        let backing = capl_host::volume_xml::BackingStore { path: base.path, format: Some("qcow2".into()) };
        let xml = capl_host::volume_xml::overlay_volume_xml("m1.qcow2", 1 << 30, &backing);
        hv.volume_create(capl_host::sim_host::DOMAIN_POOL, &xml).unwrap();
        hv
    };

    // Without the flag: kept.
    let off = Rig::with("remove-off", |s| s.removal_grace = Duration::ZERO);
    assert_eq!(off.settled(&req).await, ImageState::Ready);
    assert_eq!(off.downloads.remove_if_unused(&off.connections.host(&off.uri), BASE_POOL, &req).await, None);
    assert_eq!(off.image_volumes(), vec![req.volume()]);

    let on = Rig::with("remove-on", |s| {
        s.remove_unused = true;
        s.removal_grace = Duration::ZERO;
    });
    assert_eq!(on.settled(&req).await, ImageState::Ready);
    let hv = overlay(&on);
    let host = on.connections.host(&on.uri);
    assert_eq!(on.downloads.remove_if_unused(&host, BASE_POOL, &req).await, None, "an overlay uses it");
    assert_eq!(on.image_volumes(), vec![req.volume()]);
    hv.volume_delete(capl_host::sim_host::DOMAIN_POOL, "m1.qcow2").unwrap();
    let note = on.downloads.remove_if_unused(&host, BASE_POOL, &req).await.expect("removed once unused");
    assert!(
        note.contains(&format!("{BASE_POOL}/{}", req.volume())) && note.contains("--image-remove-unused"),
        "{note}"
    );
    assert!(on.image_volumes().is_empty());

    // An image just handed to a machine (whose overlay may not exist yet) is kept.
    let recent = Rig::with("remove-recent", |s| s.remove_unused = true);
    assert_eq!(recent.settled(&req).await, ImageState::Ready);
    let host = recent.connections.host(&recent.uri);
    assert_eq!(recent.downloads.remove_if_unused(&host, BASE_POOL, &req).await, None);
    assert_eq!(recent.image_volumes(), vec![req.volume()]);
}
