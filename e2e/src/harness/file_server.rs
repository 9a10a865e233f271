//! One file over HTTP/1.1 (on 127.0.0.1, or an address of this machine that
//! a kind cluster's Pods reach), as a user's web server offers a node
//! image: `GET /<name>` answers 200 with the file, any other path 404. Each
//! connection has a thread of its own and the file is streamed from disk, so
//! an image of any size costs no memory. The server counts the GETs of the
//! file, which is how a scenario sees that the provider downloaded it once.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};

/// How long a connection may stay silent before the server drops it.
const IDLE: Duration = Duration::from_secs(60);

/// The running server; dropping it stops accepting (connections under way end
/// with their transfer).
pub struct FileServer {
    addr: SocketAddr,
    name: String,
    gets: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl FileServer {
    /// Serves `file` as `/<its file name>` on a free port of 127.0.0.1.
    pub fn start(file: &Path) -> Result<Self> {
        Self::start_on(file, "127.0.0.1")
    }

    /// Serves `file` as `/<its file name>` on a free port of `address` (an
    /// address of this machine).
    pub fn start_on(file: &Path, address: &str) -> Result<Self> {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{} has no file name to serve it under", file.display()))?
            .to_string();
        std::fs::metadata(file).with_context(|| format!("serving {}", file.display()))?;
        let listener =
            TcpListener::bind((address, 0)).with_context(|| format!("binding {address}:0 for the image server"))?;
        let addr = listener.local_addr()?;
        let (gets, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (path, counted, stopped, served) = (format!("/{name}"), gets.clone(), stop.clone(), file.to_path_buf());
        let accept = std::thread::Builder::new().name("e2e-file-server".into()).spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (path, counted, served) = (path.clone(), counted.clone(), served.clone());
                let _ = std::thread::Builder::new()
                    .name("e2e-file-server-conn".into())
                    .spawn(move || serve(stream, &path, &served, &counted));
            }
        })?;
        Ok(Self { addr, name, gets, stop, accept: Some(accept) })
    }

    /// `http://<address>:<port>/<name>`.
    pub fn url(&self) -> String {
        format!("http://{}/{}", self.addr, self.name)
    }

    /// GET requests of the file so far.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.accept.take() {
            let _ = thread.join();
        }
    }
}

/// The method and target of an HTTP/1.1 request whose head `lines` reads (up
/// to and including the empty line; requests here have no body).
pub(crate) fn read_request_head(lines: &mut impl BufRead) -> Option<(String, String)> {
    let mut request = String::new();
    lines.read_line(&mut request).ok()?;
    let mut line = String::new();
    while lines.read_line(&mut line).map(|n| n > 0).unwrap_or(false) && line.trim_end() != "" {
        line.clear();
    }
    let mut words = request.split_whitespace();
    Some((words.next()?.to_string(), words.next()?.to_string()))
}

fn serve(stream: TcpStream, path: &str, file: &Path, gets: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(IDLE));
    let _ = stream.set_write_timeout(Some(IDLE));
    let Ok(reader) = stream.try_clone() else { return };
    let Some((method, target)) = read_request_head(&mut BufReader::new(reader)) else { return };
    let mut out = stream;
    let opened = (method == "GET" && target == path).then(|| std::fs::File::open(file)).and_then(Result::ok);
    let _ = match opened.and_then(|f| f.metadata().ok().map(|m| (f, m.len()))) {
        Some((mut f, length)) => {
            gets.fetch_add(1, Ordering::SeqCst);
            write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
            )
            .and_then(|()| std::io::copy(&mut f, &mut out).map(|_| ()))
        }
        None => out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    };
    let _ = out.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn get(url_path: &str, addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {url_path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn serves_the_file_by_name_counts_gets_and_answers_404_otherwise() {
        let dir = std::env::temp_dir().join(format!("capl-file-server-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.qcow2");
        std::fs::write(&file, "some image bytes").unwrap();
        let server = FileServer::start(&file).unwrap();
        assert!(server.url().ends_with("/node.qcow2"), "{}", server.url());
        let answer = get("/node.qcow2", server.addr);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("Content-Length: 16\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nsome image bytes"), "{answer}");
        assert!(get("/other.qcow2", server.addr).starts_with("HTTP/1.1 404"));
        assert_eq!(server.gets(), 1);
        let addr = server.addr;
        drop(server);
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "still listening after drop");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
