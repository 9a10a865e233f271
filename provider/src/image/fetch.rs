//! The HTTP side of a download: the client, the request (with redirects
//! followed), and the checks made on the body while it streams.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::Digest;

use crate::api::{ChecksumType, ImageFormat};

/// The first bytes of every qcow2 file (`QFI\xfb`).
pub const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

/// Redirects followed before a download gives up.
const MAX_REDIRECTS: usize = 5;

pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<bytes::Bytes>>;

/// The client of every download: http and https (the system's root
/// certificates), HTTP/1, `connect_timeout` for each TCP connect.
pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let builder = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
        Ok(builder) => builder,
        Err(e) => {
            tracing::warn!(error = %e, "no system root certificates: https image URLs will fail verification");
            let config = rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    let https = builder.https_or_http().enable_http1().wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(https)
}

/// Why a request got no usable answer (the message says what, without the
/// object; the caller adds it).
#[derive(Debug)]
pub struct FetchError(pub String);

/// GET `url`, following up to [`MAX_REDIRECTS`] redirects; `wait` bounds the
/// wait for each response's head.
pub async fn get(client: &HttpClient, url: &str, wait: Duration) -> Result<Response<Incoming>, FetchError> {
    let mut current: Uri = url.parse().map_err(|e| FetchError(format!("{url} is not a URL: {e}")))?;
    for _ in 0..=MAX_REDIRECTS {
        let request = Request::get(current.clone())
            .header(hyper::header::USER_AGENT, "cluster-api-provider-libvirt")
            .body(Empty::new())
            .map_err(|e| FetchError(format!("cannot make a request for {current}: {e}")))?;
        let response = match tokio::time::timeout(wait, client.request(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(FetchError(format!("GET {current} failed: {}", error_chain(&e)))),
            Err(_) => {
                return Err(FetchError(format!(
                    "GET {current}: the server sent no answer within {} s",
                    wait.as_secs_f64()
                )));
            }
        };
        if !response.status().is_redirection() {
            return Ok(response);
        }
        let location = response
            .headers()
            .get(hyper::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| FetchError(format!("GET {current}: {} without a Location", response.status())))?;
        current = resolve(&current, location)
            .ok_or_else(|| FetchError(format!("GET {current}: redirected to {location:?}, which is not a URL")))?;
        if !matches!(current.scheme_str(), Some("http" | "https")) {
            return Err(FetchError(format!("redirected to {current}: only http and https are followed")));
        }
    }
    Err(FetchError(format!("{url}: more than {MAX_REDIRECTS} redirects")))
}

/// A redirect's Location against the URL that answered it.
fn resolve(base: &Uri, location: &str) -> Option<Uri> {
    let target: Uri = location.parse().ok()?;
    if target.scheme().is_some() {
        return Some(target);
    }
    let path = if location.starts_with('/') {
        location.to_string()
    } else {
        let dir = base.path().rsplit_once('/').map(|(dir, _)| dir).unwrap_or("");
        format!("{dir}/{location}")
    };
    Uri::builder().scheme(base.scheme()?.clone()).authority(base.authority()?.clone()).path_and_query(path).build().ok()
}

/// An error and its sources, one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A digest of either algorithm.
pub enum Hasher {
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub fn new(kind: ChecksumType) -> Self {
        match kind {
            ChecksumType::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            ChecksumType::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Sha512(h) => h.update(bytes),
        }
    }

    /// The digest, lowercase hex.
    pub fn hex(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What the first bytes of a body say about its format: `Err` with what they
/// are instead. `head` holds at least 4 bytes, or the whole body.
pub fn check_magic(format: ImageFormat, head: &[u8]) -> Result<(), String> {
    match format {
        ImageFormat::Raw => Ok(()),
        ImageFormat::Qcow2 if head.starts_with(&QCOW2_MAGIC) => Ok(()),
        ImageFormat::Qcow2 => {
            let shown: String = head
                .iter()
                .take(8)
                .map(|&b| if b.is_ascii_graphic() { (b as char).to_string() } else { format!("\\x{b:02x}") })
                .collect();
            let hint = if head.starts_with(b"<") || head.to_ascii_lowercase().starts_with(b"<!doctype") {
                " (an HTML page: the URL may point at a download page rather than the file)"
            } else {
                ""
            };
            Err(format!("starts with \"{shown}\", not with qcow2's magic \"QFI\\xfb\"{hint}"))
        }
    }
}

/// A status that is not 200, as a sentence with the fix.
pub fn status_problem(status: StatusCode) -> String {
    match status {
        StatusCode::NOT_FOUND => {
            "the server answered 404 Not Found: check spec.imageURL.url (the file may have moved)".to_string()
        }
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => format!(
            "the server answered {status}: the provider sends no credentials, so the image must be readable without them"
        ),
        s if s.is_server_error() => format!("the server answered {s}: it failed; the download is tried again"),
        s => format!("the server answered {s} instead of 200 OK: check spec.imageURL.url"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_redirects_resolve_against_the_url_that_answered() {
        let base: Uri = "http://h:8/a/b/img.qcow2".parse().unwrap();
        assert_eq!(resolve(&base, "/x.qcow2").unwrap().to_string(), "http://h:8/x.qcow2");
        assert_eq!(resolve(&base, "y.qcow2").unwrap().to_string(), "http://h:8/a/b/y.qcow2");
        assert_eq!(resolve(&base, "https://o/z").unwrap().to_string(), "https://o/z");
    }

    #[test]
    fn qcow2_magic_is_checked_and_raw_takes_anything() {
        assert!(check_magic(ImageFormat::Qcow2, b"QFI\xfb\0\0\0\x03").is_ok());
        let err = check_magic(ImageFormat::Qcow2, b"<!DOCTYPE html>").unwrap_err();
        assert!(err.contains("HTML page"), "{err}");
        assert!(check_magic(ImageFormat::Raw, b"anything").is_ok());
    }

    #[test]
    fn digests_are_lowercase_hex() {
        let mut h = Hasher::new(ChecksumType::Sha256);
        h.update(b"test");
        assert_eq!(h.hex(), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        let mut h = Hasher::new(ChecksumType::Sha512);
        h.update(b"test");
        assert_eq!(h.hex().len(), 128);
    }
}
