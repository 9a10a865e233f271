//! The Cluster API core manager (`capi-manager`, package `sigs.k8s.io/cluster-api/core`)
//! running against a [`TestEnv`].
//!
//! Its webhooks cannot be switched off by a flag (its `main` always registers them and its
//! readiness check waits for the webhook server), so it gets a free port and a serving
//! certificate from a throw-away CA. The API server is never told about those webhooks
//! (no Validating/MutatingWebhookConfiguration, conversion `None` on the CRDs), so objects
//! are not defaulted or validated by CAPI's webhooks here: tests must write complete
//! v1beta2 objects.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::TestEnv;
use crate::certificates::Pki;
use crate::free_port::free_loopback_ports;
use crate::supervised_process::SupervisedProcess;

/// How long the manager may take to answer its readiness probe.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// A running CAPI core manager; killed when dropped. Drop it before its [`TestEnv`].
pub struct CapiManager {
    process: SupervisedProcess,
    health_port: u16,
    dir: PathBuf,
}

impl CapiManager {
    pub(crate) async fn start(env: &TestEnv) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let binary = env.assets().capi_manager()?;
        let dir = env.scratch_dir().join(format!("capi-manager-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let cert_dir = dir.join("webhook-certs");
        std::fs::create_dir_all(&cert_dir).with_context(|| format!("creating {}", cert_dir.display()))?;
        let pki = Pki::new_ca("capi-webhook-ca")?;
        let (cert, key) = pki.serving_cert("capi-webhook")?;
        std::fs::write(cert_dir.join("tls.crt"), cert)?;
        std::fs::write(cert_dir.join("tls.key"), key)?;

        let [webhook_port, health_port, diagnostics_port] = free_loopback_ports()?;
        let args = vec![
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
            format!("--health-addr=127.0.0.1:{health_port}"),
            format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
            "--insecure-diagnostics=true".to_owned(),
            "--leader-elect=false".to_owned(),
        ];
        let process = SupervisedProcess::start(
            "capi-manager",
            &binary,
            &args,
            &[("KUBECONFIG", env.kubeconfig_path())],
            &dir.join("capi-manager.log"),
        )?;
        let manager = Self { process, health_port, dir };
        manager.wait_ready().await?;
        Ok(manager)
    }

    /// The last lines of the manager's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Fails, with the end of its log, if the manager has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.process.ensure_running()
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.process.ensure_running()?;
            let last = match http_get_status(self.health_port, "/readyz").await {
                Ok(200) => return Ok(()),
                Ok(status) => format!("HTTP {status}"),
                Err(err) => format!("{err:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "capi-manager was not ready on 127.0.0.1:{}/readyz within {READY_TIMEOUT:?} (last: {last}); \
                     last lines of {}:\n{}",
                    self.health_port,
                    self.dir.join("capi-manager.log").display(),
                    self.process.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The status code of a plain-HTTP `GET` on 127.0.0.1 (the manager's probe endpoint).
async fn http_get_status(port: u16, path: &str) -> Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let status_line = response.lines().next().unwrap_or_default();
    status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP response: {status_line:?}"))
}
