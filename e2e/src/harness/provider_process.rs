//! The provider's manager binary, started as a process with its real flags.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the manager may take to answer /readyz.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// `cluster-api-provider-libvirt` running against the test control plane.
pub struct ProviderProcess {
    binary: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    log_path: PathBuf,
    health_port: u16,
    child: Option<Child>,
    starts: usize,
}

impl ProviderProcess {
    /// Starts the binary with `args` plus a free health port (metrics off);
    /// its output is appended to `log_path`. Waits until /readyz answers.
    pub async fn start(binary: &Path, args: Vec<String>, kubeconfig: &Path, log_path: &Path) -> Result<Self> {
        if !binary.is_file() {
            bail!(
                "the provider binary {} does not exist: build it with \
                 `cargo build -p cluster-api-provider-libvirt --features sim --bin cluster-api-provider-libvirt`",
                binary.display()
            );
        }
        let mut process = Self {
            binary: binary.to_path_buf(),
            args,
            kubeconfig: kubeconfig.to_path_buf(),
            log_path: log_path.to_path_buf(),
            health_port: 0,
            child: None,
            starts: 0,
        };
        process.spawn().await?;
        Ok(process)
    }

    async fn spawn(&mut self) -> Result<()> {
        let [health_port] = testenv::free_loopback_ports().context("finding a free port")?;
        self.health_port = health_port;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("opening {}", self.log_path.display()))?;
        let mut command = Command::new(&self.binary);
        command.args(&self.args);
        // Metrics off unless the caller serves them (the benchmarks read them).
        if !self.args.iter().any(|a| a.starts_with("--metrics-bind-address")) {
            command.arg("--metrics-bind-address=0");
        }
        command
            .arg(format!("--health-probe-bind-address=127.0.0.1:{}", self.health_port))
            .env("KUBECONFIG", &self.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var(capl_testbed::env::E2E_PROVIDER_LOG).unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group: a Ctrl-C of the demo must not stop the provider
        // before the cluster it runs is deleted (PR_SET_PDEATHSIG ends it with the harness).
        command.process_group(0);
        // SAFETY: prctl is async-signal-safe; the child dies with the harness.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        self.starts += 1;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.ensure_running()?;
            if http_status(self.health_port, "/readyz").await.ok() == Some(200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the provider did not answer 127.0.0.1:{}/readyz within {READY_TIMEOUT:?}; end of {}:\n{}",
                    self.health_port,
                    self.log_path.display(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Fails, with the end of its log, when the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            self.child = None;
            bail!("the provider exited ({status}); end of {}:\n{}", self.log_path.display(), self.log_tail(30));
        }
        Ok(())
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash or an OOM kill would end it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same flags.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn().await
    }

    /// Another manager with the same binary and flags against another
    /// management cluster (the target of `clusterctl move`).
    pub async fn start_like(&self, kubeconfig: &Path, log_path: &Path) -> Result<Self> {
        Self::start(&self.binary, self.args.clone(), kubeconfig, log_path).await
    }

    /// How often the process was started.
    pub fn starts(&self) -> usize {
        self.starts
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path, lines)
    }
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file (reads at most its last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("({} cannot be read)", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn http_status(port: u16, path: &str) -> Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1).and_then(|code| code.parse().ok()).context("not an HTTP response")
}
