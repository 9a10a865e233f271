//! A local HTTP/1.1 server of base images on 127.0.0.1, started by a test:
//! each path answers one way (an image, a status, a body cut short, a body
//! that stalls, a length over any limit), and the server counts the GETs of
//! each path.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use sha2::Digest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// How one path answers.
#[derive(Debug, Clone)]
pub enum Route {
    /// 200 with these bytes, written in chunks of `chunk` bytes.
    Body { bytes: Arc<Vec<u8>>, chunk: usize },
    /// This status (e.g. 404) and a short text body.
    Status(u16),
    /// 200 with the Content-Length of all `bytes`, then only the first `sent`
    /// bytes, then the connection closes.
    Truncated { bytes: Arc<Vec<u8>>, sent: usize },
    /// 200 with the Content-Length of all `bytes`, then the first `sent`
    /// bytes, then nothing more while the connection stays open.
    Stall { bytes: Arc<Vec<u8>>, sent: usize },
    /// 200 announcing `length` bytes and sending none (a body over any limit).
    Declared { length: u64 },
    /// 200 with all of `bytes`: the first `sent`, then the rest once the test
    /// opens `gate` (adds permits), so that a download under way can be seen.
    Gated { bytes: Arc<Vec<u8>>, sent: usize, gate: Arc<tokio::sync::Semaphore> },
}

/// The running server; dropping it stops the server and every connection.
pub struct ImageServer {
    addr: SocketAddr,
    tls: bool,
    gets: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ImageServer {
    /// Serves `routes` on a free port of 127.0.0.1; other paths answer 404.
    pub async fn start(routes: Vec<(&str, Route)>) -> Self {
        Self::start_with(routes, None).await
    }

    /// [`ImageServer::start`] over TLS with this certificate and key (PEM):
    /// [`ImageServer::url`] then gives https URLs.
    pub async fn start_tls(routes: Vec<(&str, Route)>, cert_pem: &str, key_pem: &str) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("a usable certificate and key");
        Self::start_with(routes, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(routes: Vec<(&str, Route)>, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0 for the image server");
        let addr = listener.local_addr().expect("the image server's address");
        let routes: Arc<HashMap<String, Route>> =
            Arc::new(routes.into_iter().map(|(path, route)| (path.to_string(), route)).collect());
        let gets = Arc::new(Mutex::new(HashMap::new()));
        let counted = gets.clone();
        let tls_used = tls.is_some();
        let task = tokio::spawn(async move {
            // Owned by this task: aborting it drops every connection too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (routes, counted, tls) = (routes.clone(), counted.clone(), tls.clone());
                connections.spawn(async move {
                    match tls {
                        None => serve(stream, routes, counted).await,
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve(stream, routes, counted).await;
                            }
                        }
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Self { addr, tls: tls_used, gets, task }
    }

    /// `http://127.0.0.1:<port><path>` (https with TLS).
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// GET requests `path` received so far.
    pub fn gets(&self, path: &str) -> u64 {
        self.gets.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    routes: Arc<HashMap<String, Route>>,
    gets: Arc<Mutex<HashMap<String, u64>>>,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    *gets.lock().unwrap().entry(path.clone()).or_default() += 1;
    let ok = |length: u64| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
        )
    };
    let _ = match routes.get(&path) {
        None => status(&mut stream, 404).await,
        Some(Route::Status(code)) => status(&mut stream, *code).await,
        Some(Route::Body { bytes, chunk }) => {
            let mut out = stream.write_all(ok(bytes.len() as u64).as_bytes()).await;
            for part in bytes.chunks((*chunk).max(1)) {
                if out.is_err() {
                    break;
                }
                out = stream.write_all(part).await;
            }
            out
        }
        Some(Route::Truncated { bytes, sent }) => {
            let out = stream.write_all(ok(bytes.len() as u64).as_bytes()).await;
            let out = match out {
                Ok(()) => stream.write_all(&bytes[..*sent]).await,
                err => err,
            };
            let _ = stream.shutdown().await;
            out
        }
        Some(Route::Stall { bytes, sent }) => {
            let _ = stream.write_all(ok(bytes.len() as u64).as_bytes()).await;
            let _ = stream.write_all(&bytes[..*sent]).await;
            let _ = stream.flush().await;
            // The stall under test: the connection stays open and silent
            // until the client gives up (or the server is dropped).
            let mut sink = [0u8; 64];
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
            Ok(())
        }
        Some(Route::Declared { length }) => stream.write_all(ok(*length).as_bytes()).await,
        Some(Route::Gated { bytes, sent, gate }) => {
            let out = stream.write_all(ok(bytes.len() as u64).as_bytes()).await;
            let out = match out {
                Ok(()) => stream.write_all(&bytes[..*sent]).await,
                err => err,
            };
            let _ = stream.flush().await;
            let _open = gate.acquire().await;
            match out {
                Ok(()) => stream.write_all(&bytes[*sent..]).await,
                err => err,
            }
        }
    };
}

async fn status<S: AsyncWrite + Unpin>(stream: &mut S, code: u16) -> std::io::Result<()> {
    let body = format!("status {code}\n");
    let reason = match code {
        404 => "Not Found",
        403 => "Forbidden",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await
}

/// `length` bytes that start like a qcow2 file (its magic and version 3),
/// then a pattern: what the downloader checks, without qemu-img.
pub fn qcow2_like(length: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..length).map(|i| (i % 253) as u8).collect();
    bytes[..8.min(length)].copy_from_slice(&b"QFI\xfb\0\0\0\x03"[..8.min(length)]);
    bytes
}

/// The sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha512 of `bytes`, lowercase hex.
pub fn sha512_hex(bytes: &[u8]) -> String {
    sha2::Sha512::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
