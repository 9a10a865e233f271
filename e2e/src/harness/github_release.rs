//! A provider repository served from this machine the way GitHub serves a
//! release, for clusterctl's GitHub repository client.
//!
//! With a `https://github.com/<owner>/<repo>/releases/...` URL in
//! clusterctl.yaml and a Go module proxy in `GOPROXY`, clusterctl lists the
//! repository's versions from the proxy (`GET <proxy>/github.com/<owner>/<repo>/@v/list`)
//! and downloads each file with a plain HTTPS GET of
//! `https://github.com/<owner>/<repo>/releases/download/<version>/<file>`,
//! the URL of a release asset; the GitHub API is only its fallback. Both
//! are served here, on 127.0.0.1:
//! - the module proxy over HTTP: the version list is the release directories;
//! - github.com through an HTTPS proxy (`HTTPS_PROXY`) that answers `CONNECT
//!   github.com:443` itself, with a certificate for github.com from a CA of
//!   its own that clusterctl trusts through `SSL_CERT_FILE`, and serves the
//!   release assets from `<root>/<version>/<file>`. Any other host or path is
//!   refused (403, 404), so nothing reaches the real GitHub.
//!
//! Each request is logged with its answer, which is how a scenario sees that
//! clusterctl took the files from the release URL.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use capl_testbed::certificates::Pki;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::file_server::read_request_head;

/// The repository name the release is served under.
pub const REPOSITORY: &str = "cluster-api-provider-libvirt";
/// How long a connection may stay silent before it is dropped.
const IDLE: Duration = Duration::from_secs(30);

/// The two servers; dropping this stops them.
pub struct GithubRelease {
    owner: String,
    proxy: SocketAddr,
    goproxy: SocketAddr,
    ca_file: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What the servers share: where the release is, under which owner, and the log.
struct Site {
    root: PathBuf,
    owner: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl GithubRelease {
    /// Serves `root` (one directory per version, holding that release's
    /// files) as the releases of `github.com/<owner>/cluster-api-provider-libvirt`;
    /// the CA clusterctl must trust is written into `work_dir`.
    pub fn serve(root: &Path, owner: &str, work_dir: &Path) -> Result<Self> {
        let pki = Pki::new_ca("capl-e2e github.com stand-in")?;
        let (cert_pem, key_pem) = pki.serving_cert_for("github.com", &["github.com".to_string()])?;
        std::fs::create_dir_all(work_dir)?;
        let ca_file = work_dir.join("github-release-ca.pem");
        std::fs::write(&ca_file, pki.ca_pem()).with_context(|| format!("writing {}", ca_file.display()))?;
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("reading the github.com certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("reading the github.com key")?;
        let tls = rustls::ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let tls = Arc::new(tls);

        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let site = Arc::new(Site { root: root.to_path_buf(), owner: owner.to_string(), log: log.clone() });
        let proxy = TcpListener::bind("127.0.0.1:0").context("binding the HTTPS proxy")?;
        let goproxy = TcpListener::bind("127.0.0.1:0").context("binding the module proxy")?;
        let (proxy_addr, goproxy_addr) = (proxy.local_addr()?, goproxy.local_addr()?);
        let threads = vec![
            accept_loop("e2e-github-proxy", proxy, stop.clone(), {
                let (site, tls) = (site.clone(), tls.clone());
                move |stream| tunnel(stream, &site, tls.clone())
            })?,
            accept_loop("e2e-goproxy", goproxy, stop.clone(), {
                let site = site.clone();
                move |stream| module_proxy(stream, &site)
            })?,
        ];
        Ok(Self { owner: owner.to_string(), proxy: proxy_addr, goproxy: goproxy_addr, ca_file, log, stop, threads })
    }

    /// The URL a user's clusterctl.yaml names for the latest release.
    pub fn components_url(&self) -> String {
        format!("https://github.com/{}/{REPOSITORY}/releases/latest/infrastructure-components.yaml", self.owner)
    }

    /// The environment clusterctl needs to reach these servers instead of
    /// GitHub and the public module proxy.
    pub fn clusterctl_env(&self) -> Vec<(String, String)> {
        let proxy = format!("http://{}", self.proxy);
        vec![
            ("GOPROXY".into(), format!("http://{}", self.goproxy)),
            ("HTTPS_PROXY".into(), proxy.clone()),
            ("https_proxy".into(), proxy),
            ("NO_PROXY".into(), String::new()),
            ("no_proxy".into(), String::new()),
            ("SSL_CERT_FILE".into(), self.ca_file.display().to_string()),
            // clusterctl's own update check asks the GitHub API, which is not served.
            ("CLUSTERCTL_DISABLE_VERSIONCHECK".into(), "true".into()),
        ]
    }

    /// Every request so far: `<host><path> <status>`.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for GithubRelease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting threads, which then see the flag.
        for addr in [self.proxy, self.goproxy] {
            let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Accepts on `listener` until `stop`, each connection on a thread of its own.
fn accept_loop(
    name: &str,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handle: impl Fn(TcpStream) + Clone + Send + 'static,
) -> Result<std::thread::JoinHandle<()>> {
    Ok(std::thread::Builder::new().name(name.into()).spawn(move || {
        for stream in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(IDLE));
            let _ = stream.set_write_timeout(Some(IDLE));
            let handle = handle.clone();
            let _ = std::thread::Builder::new().name("e2e-github-conn".into()).spawn(move || handle(stream));
        }
    })?)
}

impl Site {
    fn note(&self, host: &str, target: &str, status: u16) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{host}{target} {status}"));
    }

    /// The release versions: the directories under the root, sorted.
    fn versions(&self) -> Vec<String> {
        let mut versions: Vec<String> = std::fs::read_dir(&self.root)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        versions.sort();
        versions
    }

    /// A release asset for `target` (`/<owner>/<repo>/releases/download/<version>/<file>`).
    fn asset(&self, target: &str) -> Option<Vec<u8>> {
        let prefix = format!("/{}/{REPOSITORY}/releases/download/", self.owner);
        let (version, file) = target.strip_prefix(&prefix)?.split_once('/')?;
        let plain = |s: &str| !s.is_empty() && !s.starts_with('.') && !s.contains('/');
        if !plain(version) || !plain(file) {
            return None;
        }
        std::fs::read(self.root.join(version).join(file)).ok()
    }
}

/// `CONNECT github.com:443`, then the release assets over TLS as github.com.
fn tunnel(stream: TcpStream, site: &Site, tls: Arc<rustls::ServerConfig>) {
    let Ok(reader) = stream.try_clone() else { return };
    let Some((method, authority)) = read_request_head(&mut BufReader::new(reader)) else { return };
    let mut client = stream;
    if method != "CONNECT" || authority != "github.com:443" {
        site.note(&authority, "", 403);
        let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
        return;
    }
    let Ok(connection) = rustls::ServerConnection::new(tls) else { return };
    let mut secure = rustls::StreamOwned::new(connection, client);
    let Some((method, target)) = read_request_head(&mut BufReader::new(&mut secure)) else { return };
    let body = if method == "GET" { site.asset(&target) } else { None };
    site.note("github.com", &target, if body.is_some() { 200 } else { 404 });
    respond(&mut secure, body);
    secure.conn.send_close_notify();
    let _ = secure.flush();
    let _ = secure.sock.shutdown(Shutdown::Both);
}

/// The module proxy: `/github.com/<owner>/<repo>/@v/list` lists the versions.
fn module_proxy(stream: TcpStream, site: &Site) {
    let Ok(reader) = stream.try_clone() else { return };
    let Some((method, target)) = read_request_head(&mut BufReader::new(reader)) else { return };
    let list = format!("/github.com/{}/{REPOSITORY}/@v/list", site.owner);
    let body = (method == "GET" && target == list).then(|| {
        let versions = site.versions();
        versions.iter().map(|v| format!("{v}\n")).collect::<String>().into_bytes()
    });
    site.note("goproxy", &target, if body.is_some() { 200 } else { 404 });
    let mut out = stream;
    respond(&mut out, body);
    let _ = out.shutdown(Shutdown::Both);
}

/// 200 with `body`, or 404; the connection closes after it.
fn respond(out: &mut impl Write, body: Option<Vec<u8>>) {
    let _ = match body {
        Some(body) => write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .and_then(|()| out.write_all(&body)),
        None => out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    };
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn get(addr: SocketAddr, head: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    }

    #[test]
    fn the_module_proxy_lists_the_versions_and_other_hosts_are_refused() {
        let dir = std::env::temp_dir().join(format!("capl-github-release-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("v0.1.0")).unwrap();
        std::fs::create_dir_all(dir.join("v0.2.0")).unwrap();
        std::fs::write(dir.join("v0.2.0/metadata.yaml"), "kind: Metadata\n").unwrap();
        let work = dir.with_extension("work");
        let release = GithubRelease::serve(&dir, "someone", &work).unwrap();
        assert!(std::fs::read_to_string(work.join("github-release-ca.pem")).unwrap().contains("BEGIN CERTIFICATE"));
        let list =
            get(release.goproxy, "GET /github.com/someone/cluster-api-provider-libvirt/@v/list HTTP/1.1\r\n\r\n");
        assert!(list.ends_with("\r\n\r\nv0.1.0\nv0.2.0\n"), "{list}");
        let v2 =
            get(release.goproxy, "GET /github.com/someone/cluster-api-provider-libvirt/v2/@v/list HTTP/1.1\r\n\r\n");
        assert!(v2.starts_with("HTTP/1.1 404"), "{v2}");
        let other = get(release.proxy, "CONNECT api.github.com:443 HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 403"), "{other}");
        assert_eq!(
            release.requests(),
            [
                "goproxy/github.com/someone/cluster-api-provider-libvirt/@v/list 200",
                "goproxy/github.com/someone/cluster-api-provider-libvirt/v2/@v/list 404",
                "api.github.com:443 403"
            ]
        );
        let site = Site { root: dir.clone(), owner: "someone".into(), log: Arc::default() };
        let asset = |t: &str| site.asset(t).map(|b| String::from_utf8(b).unwrap());
        assert_eq!(
            asset("/someone/cluster-api-provider-libvirt/releases/download/v0.2.0/metadata.yaml").as_deref(),
            Some("kind: Metadata\n")
        );
        assert_eq!(asset("/someone/cluster-api-provider-libvirt/releases/download/v0.2.0/../v0.1.0"), None);
        assert_eq!(asset("/other/cluster-api-provider-libvirt/releases/download/v0.2.0/metadata.yaml"), None);
        drop(release);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&work).unwrap();
    }
}
