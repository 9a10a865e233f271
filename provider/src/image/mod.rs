//! Base images named by URL (`spec.imageURL`): downloaded once per host and
//! basePool, streamed into a volume named after the checksum, checked while
//! they stream.
//!
//! [`ImageDownloads::ensure`] is what a machine about to be created asks: the
//! image is there (go on), it is being downloaded (how far), or its download
//! failed (why). The first machine that asks starts the download as a task of
//! its own; every machine asking for the same (host, pool, checksum) while it
//! runs waits for that one download (single flight) and reports its progress.
//! The task streams the body, through a small bounded channel, into
//! `virStorageVolUpload` on a blocking thread: at most a few chunks are in
//! memory. It checks the first bytes (qcow2's magic), the length (the
//! Content-Length, the size limit) and the checksum before it finishes the
//! stream; on any failure it aborts the stream and deletes the volume it
//! created, so a volume of that name is always a complete, checked image.
//! While that volume exists nothing is downloaded again.

pub mod fetch;

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::api::conditions::reasons;
use crate::api::{ChecksumType, ImageFormat, ImageUrl};
use capl_host::hypervisor::connections::HostHandle;
use capl_host::hypervisor::{ErrorKind, HypervisorError};

/// The default of `--image-max-size`: 64 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 30;
/// How long a failed download's answer is given to every machine that asks
/// before a new download is tried (shorter than the retry of a failed machine).
pub const FAILURE_KEPT: Duration = Duration::from_secs(10);
/// Chunks between the download and the upload thread.
const CHANNEL_CHUNKS: usize = 8;
const MIB: f64 = 1024.0 * 1024.0;

/// The bounds of every download (`--image-*` flags of the manager).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadSettings {
    /// Opening the TCP connection to the image's server.
    pub connect_timeout: Duration,
    /// No byte from the server for this long (the response's head included) fails the download.
    pub idle_timeout: Duration,
    /// Bodies larger than this are refused.
    pub max_bytes: u64,
    /// How often a machine waiting for a download looks at it again (and
    /// refreshes its condition's progress).
    pub progress_interval: Duration,
    /// Delete a downloaded image once the last machine on it is deleted and
    /// no volume of the host is an overlay on it (`--image-remove-unused`).
    pub remove_unused: bool,
    /// An image handed to a machine about to be created is not removed for
    /// this long (the machine's overlay may not exist yet).
    pub removal_grace: Duration,
}

impl Default for DownloadSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_bytes: DEFAULT_MAX_BYTES,
            progress_interval: Duration::from_secs(5),
            remove_unused: false,
            removal_grace: Duration::from_secs(300),
        }
    }
}

/// One image, as a LibvirtMachine names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRequest {
    pub url: String,
    /// Lowercase hex.
    pub checksum: String,
    pub checksum_type: ChecksumType,
    pub format: ImageFormat,
}

impl ImageRequest {
    pub fn of(spec: &ImageUrl) -> Self {
        Self {
            url: spec.url.clone(),
            checksum: spec.checksum.to_ascii_lowercase(),
            checksum_type: spec.checksum_type,
            format: spec.format,
        }
    }

    /// The volume the image is stored in.
    pub fn volume(&self) -> String {
        capl_host::naming::image_volume_name(self.checksum_type.as_str(), &self.checksum, self.format.as_str())
    }
}

/// What a machine is told about its image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageState {
    /// Nothing to download: the volume is there (or the host says something
    /// else, which creating the machine reports).
    Ready,
    /// Being downloaded: the condition's message.
    Downloading(String),
    /// The last download failed.
    Failed { reason: &'static str, message: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    uri: String,
    pool: String,
    volume: String,
}

/// A failed download: the reason and what went wrong, without the object.
#[derive(Debug, Clone)]
struct Failure {
    reason: &'static str,
    message: String,
}

impl Failure {
    fn download(message: String) -> Self {
        Self { reason: reasons::IMAGE_DOWNLOAD_FAILED, message }
    }
}

/// One download under way, or just ended.
struct Download {
    url: String,
    received: AtomicU64,
    /// The Content-Length, once known (0 before).
    total: AtomicU64,
    ended: Mutex<Option<(Result<(), Failure>, Instant)>>,
}

impl Download {
    fn progress(&self) -> String {
        let total = self.total.load(Ordering::SeqCst);
        let received = self.received.load(Ordering::SeqCst) as f64 / MIB;
        if total == 0 {
            format!("downloading the image from {}", self.url)
        } else {
            format!("downloaded {received:.1} of {:.1} MiB from {}", total as f64 / MIB, self.url)
        }
    }
}

/// The downloads of one manager process.
pub struct ImageDownloads {
    settings: DownloadSettings,
    client: fetch::HttpClient,
    running: Mutex<HashMap<Key, Arc<Download>>>,
    /// When each image was last handed to a machine about to be created.
    handed_out: Mutex<HashMap<Key, Instant>>,
    requests: AtomicU64,
    uploads: AtomicU64,
}

impl ImageDownloads {
    pub fn new(settings: DownloadSettings) -> Self {
        let client = fetch::client(settings.connect_timeout);
        Self {
            settings,
            client,
            running: Mutex::new(HashMap::new()),
            handed_out: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
        }
    }

    pub fn settings(&self) -> &DownloadSettings {
        &self.settings
    }

    /// HTTP GETs sent so far (redirects not counted).
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Uploads into a host started so far.
    pub fn uploads_started(&self) -> u64 {
        self.uploads.load(Ordering::SeqCst)
    }

    /// The image `request` in `pool` of `host`, for `object` (e.g.
    /// "LibvirtMachine ns/name", which failure messages name): there, being
    /// downloaded (started by this call if no download runs), or failed.
    pub async fn ensure(
        self: &Arc<Self>,
        host: &HostHandle,
        pool: &str,
        request: &ImageRequest,
        object: &str,
    ) -> ImageState {
        let key = Key { uri: host.uri().to_string(), pool: pool.to_string(), volume: request.volume() };
        if let Some(state) = self.known(&key, object) {
            return state;
        }
        if volume_exists(host, pool, &key.volume).await {
            // A download another reconcile started meanwhile creates the
            // volume before its first byte: while it runs, the volume is not
            // the image yet.
            if let Some(state) = self.known(&key, object) {
                return state;
            }
            self.handed_out.lock().expect("handed-out lock").insert(key, Instant::now());
            return ImageState::Ready;
        }
        let download = {
            let mut running = self.running.lock().expect("downloads lock");
            if let Some(d) = running.get(&key) {
                return ImageState::Downloading(d.progress());
            }
            let d = Arc::new(Download {
                url: request.url.clone(),
                received: AtomicU64::new(0),
                total: AtomicU64::new(0),
                ended: Mutex::new(None),
            });
            running.insert(key.clone(), d.clone());
            d
        };
        let (this, host, request, pool) = (self.clone(), host.clone(), request.clone(), pool.to_string());
        let progress = download.progress();
        tokio::spawn(async move {
            let result = this.download(&host, &pool, &key.volume, &request, &download).await;
            match &result {
                Ok(()) => {
                    tracing::info!(uri = %key.uri, pool = %pool, volume = %key.volume, url = %request.url, "downloaded base image")
                }
                Err(f) => {
                    tracing::warn!(uri = %key.uri, pool = %pool, url = %request.url, reason = f.reason, message = %f.message, "base image download failed")
                }
            }
            *download.ended.lock().expect("download lock") = Some((result, Instant::now()));
        });
        ImageState::Downloading(progress)
    }

    /// With `remove_unused`: deletes the image `request` from `pool` of
    /// `host` unless a download of it runs, it was handed to a machine less
    /// than `removal_grace` ago, or a volume of the host is an overlay on it.
    /// `Some` note for an event when it was removed.
    pub async fn remove_if_unused(&self, host: &HostHandle, pool: &str, request: &ImageRequest) -> Option<String> {
        if !self.settings.remove_unused {
            return None;
        }
        let key = Key { uri: host.uri().to_string(), pool: pool.to_string(), volume: request.volume() };
        if self.running.lock().expect("downloads lock").contains_key(&key) {
            return None;
        }
        let recent = self
            .handed_out
            .lock()
            .expect("handed-out lock")
            .get(&key)
            .is_some_and(|at| at.elapsed() < self.settings.removal_grace);
        if recent {
            tracing::info!(uri = %key.uri, pool, volume = %key.volume, "kept the downloaded image: a machine was given it lately");
            return None;
        }
        let (p, v) = (pool.to_string(), key.volume.clone());
        match host.call(move |h| capl_host::image::remove_unused_image(h, &p, &v)).await {
            Ok(capl_host::image::Removal::Removed) => {
                self.handed_out.lock().expect("handed-out lock").remove(&key);
                Some(format!(
                    "removed the downloaded image {pool}/{} from {}: no volume of the host is an overlay on it (--image-remove-unused)",
                    key.volume, key.uri
                ))
            }
            Ok(capl_host::image::Removal::InUse(users)) => {
                tracing::debug!(uri = %key.uri, pool, volume = %key.volume, ?users, "kept the downloaded image: overlays use it");
                None
            }
            Ok(capl_host::image::Removal::Absent) => None,
            Err(e) => {
                tracing::warn!(uri = %key.uri, pool, volume = %key.volume, error = %e, "cannot remove the unused downloaded image");
                None
            }
        }
    }

    /// What the download of `key` says, when one runs or ended lately; a
    /// success or a failure older than [`FAILURE_KEPT`] is forgotten.
    fn known(&self, key: &Key, object: &str) -> Option<ImageState> {
        let mut running = self.running.lock().expect("downloads lock");
        let d = running.get(key)?;
        let state = match &*d.ended.lock().expect("download lock") {
            None => Some(ImageState::Downloading(d.progress())),
            Some((Err(f), at)) if at.elapsed() < FAILURE_KEPT => {
                Some(ImageState::Failed { reason: f.reason, message: format!("{object}: {}", f.message) })
            }
            Some(_) => None,
        };
        if state.is_none() {
            running.remove(key);
        }
        state
    }

    async fn download(
        &self,
        host: &HostHandle,
        pool: &str,
        volume: &str,
        request: &ImageRequest,
        progress: &Download,
    ) -> Result<(), Failure> {
        // Another process, or a download that just ended, may have made it.
        if volume_exists(host, pool, volume).await {
            return Ok(());
        }
        let url = &request.url;
        let s = &self.settings;
        self.requests.fetch_add(1, Ordering::SeqCst);
        let response = fetch::get(&self.client, url, s.idle_timeout).await.map_err(|e| {
            let fix = if e.0.contains("certificate") {
                "the server's certificate does not verify against the manager's system root certificates: serve the image with a certificate of a public CA".to_string()
            } else {
                format!(
                    "check that the URL is right and the server reachable from the manager (--image-connect-timeout {} s, --image-idle-timeout {} s)",
                    s.connect_timeout.as_secs_f64(),
                    s.idle_timeout.as_secs_f64()
                )
            };
            Failure::download(format!("downloading the image from {url}: {}: {fix}", e.0))
        })?;
        let status = response.status();
        if status != hyper::StatusCode::OK {
            return Err(Failure::download(format!(
                "downloading the image from {url}: {}",
                fetch::status_problem(status)
            )));
        }
        let length = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                Failure::download(format!(
                    "downloading the image from {url}: the server sent no Content-Length, so the image's size is not known before it is stored: serve the file with its length"
                ))
            })?;
        if length > s.max_bytes {
            return Err(Failure::download(format!(
                "downloading the image from {url}: it is {length} bytes ({}), more than the manager's limit of {} bytes ({}): use a smaller image or raise the manager's --image-max-size",
                human(length),
                s.max_bytes,
                human(s.max_bytes)
            )));
        }
        if length == 0 {
            return Err(Failure {
                reason: reasons::IMAGE_FORMAT_MISMATCH,
                message: format!(
                    "downloading the image from {url}: the body is empty, not a disk image: check spec.imageURL.url"
                ),
            });
        }
        progress.total.store(length, Ordering::SeqCst);

        let conn = host.stream_connection().await.map_err(|e| {
            Failure::download(format!("cannot open {} to store the image from {url}: {}", host.uri(), e.message))
        })?;
        let (tx, rx) = mpsc::channel::<std::io::Result<bytes::Bytes>>(CHANNEL_CHUNKS);
        self.uploads.fetch_add(1, Ordering::SeqCst);
        let (pool_name, volume_name) = (pool.to_string(), volume.to_string());
        let upload = tokio::task::spawn_blocking(move || {
            capl_host::image::store_image(conn.as_ref(), &pool_name, &volume_name, length, &mut ChannelReader::new(rx))
        });
        let streamed = self.stream_body(response.into_body(), request, length, progress, &tx).await;
        if let Err(failure) = &streamed {
            // The upload thread reads this, aborts the stream and deletes the volume.
            let _ = tx.send(Err(std::io::Error::other(failure.message.clone()))).await;
        }
        drop(tx);
        let stored = upload.await;
        streamed?;
        match stored {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Failure::download(format!(
                "storing the image from {url} as volume {volume} in pool {pool} on {}: {}: the partial volume was removed; the download is tried again",
                host.uri(),
                e.message
            ))),
            Err(e) => Err(Failure::download(format!("storing the image from {url}: the upload did not complete: {e}"))),
        }
    }

    /// Reads the body into `tx` with the checks: the idle timeout, the
    /// length, the format's magic, the checksum (before the stream ends).
    async fn stream_body(
        &self,
        mut body: hyper::body::Incoming,
        request: &ImageRequest,
        length: u64,
        progress: &Download,
        tx: &mpsc::Sender<std::io::Result<bytes::Bytes>>,
    ) -> Result<(), Failure> {
        let url = &request.url;
        let idle = self.settings.idle_timeout;
        let mut hasher = fetch::Hasher::new(request.checksum_type);
        let mut head: Vec<u8> = Vec::with_capacity(8);
        let mut received = 0u64;
        let truncated = |received: u64, why: String| {
            Failure::download(format!(
                "downloading the image from {url}: the body ended after {received} of the {length} bytes its Content-Length announced ({why}): the server or the connection broke off; the download is tried again"
            ))
        };
        loop {
            let frame = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => {
                    return Err(Failure::download(format!(
                        "downloading the image from {url}: no data for {} s after {received} of {length} bytes (the manager's --image-idle-timeout): the server is too slow or stalled; the download is tried again",
                        idle.as_secs_f64()
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(truncated(received, fetch::error_chain(&e))),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            if data.is_empty() {
                continue;
            }
            if received + data.len() as u64 > length {
                return Err(Failure::download(format!(
                    "downloading the image from {url}: the body is longer than the {length} bytes its Content-Length announced"
                )));
            }
            if head.len() < fetch::QCOW2_MAGIC.len() {
                let want = fetch::QCOW2_MAGIC.len() - head.len();
                head.extend_from_slice(&data[..want.min(data.len())]);
                let whole = received + data.len() as u64 == length;
                if head.len() >= fetch::QCOW2_MAGIC.len() || whole {
                    fetch::check_magic(request.format, &head).map_err(|what| Failure {
                        reason: reasons::IMAGE_FORMAT_MISMATCH,
                        message: format!(
                            "the file at {url} is not a {} image: it {what}: point spec.imageURL.url at the image file, or set spec.imageURL.format to its format",
                            request.format.as_str()
                        ),
                    })?;
                }
            }
            hasher.update(&data);
            received += data.len() as u64;
            progress.received.store(received, Ordering::SeqCst);
            if tx.send(Ok(data)).await.is_err() {
                // The upload ended early: its error is the one to report.
                return Ok(());
            }
        }
        if received < length {
            return Err(truncated(received, "the connection closed".into()));
        }
        let digest = hasher.hex();
        if digest != request.checksum {
            return Err(Failure {
                reason: reasons::IMAGE_CHECKSUM_MISMATCH,
                message: format!(
                    "the image downloaded from {url} has {kind} {digest}, but spec.imageURL.checksum is {expected}: the file changed or the checksum is wrong; the image was not stored. Put the right checksum in a new LibvirtMachineTemplate ({kind}sum of the file prints it)",
                    kind = request.checksum_type.as_str(),
                    expected = request.checksum
                ),
            });
        }
        Ok(())
    }
}

/// A size in GiB, or in MiB below 1 GiB.
fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

/// Whether `volume` is in `pool`. Any answer other than "no such volume"
/// counts as there: creating the machine then reports what the host says.
async fn volume_exists(host: &HostHandle, pool: &str, volume: &str) -> bool {
    let (pool, volume) = (pool.to_string(), volume.to_string());
    match host.call(move |h| h.volume_xml(&pool, &volume)).await {
        Ok(_) => true,
        Err(HypervisorError { kind: ErrorKind::NoStorageVol, .. }) => false,
        Err(_) => true,
    }
}

/// The upload thread's side of the channel: chunks as they come, an error
/// sent by the download as a read error, the end when the sender is gone.
struct ChannelReader {
    rx: mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    chunk: bytes::Bytes,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<std::io::Result<bytes::Bytes>>) -> Self {
        Self { rx, chunk: bytes::Bytes::new() }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}
