//! The manager binary itself (`--hypervisor sim`, the README's demo mode)
//! against the real kube-apiserver: flags, leader election, probes, metrics,
//! a machine provisioned end to end, and a graceful stop on SIGTERM.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::capi::{Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use serde_json::json;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port").local_addr().unwrap().port()
}

/// `GET path` on 127.0.0.1:`port`: (status code, body), or None while nothing listens.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

struct ManagerProcess {
    child: Child,
    log: std::path::PathBuf,
}

impl ManagerProcess {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_binary_with_the_simulated_host_provisions_a_machine() {
    let w = World::new("rb-binary").await;
    let (metrics, health) = (free_port(), free_port());
    let log = w.env.scratch_dir().join(format!("manager-{}.log", w.ns));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"))
        .args(["--hypervisor", "sim", "--log-format", "json", "--leader-elect"])
        .args(["--namespace", &w.ns, "--leader-election-namespace", &w.ns])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{metrics}")])
        .args(["--health-probe-bind-address", &format!("127.0.0.1:{health}")])
        .env("KUBECONFIG", w.env.kubeconfig_path())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("start the manager binary");
    let mut manager = ManagerProcess { child, log };

    // The binary's simulated host answers on its default URI, qemu:///system.
    let c: Cluster = w.apply(cluster_json("demo", "demo", true)).await;
    let lc = libvirt_cluster_json("demo", "qemu:///system", Some(("demo", &c.uid().unwrap())));
    let _: LibvirtCluster = w.apply(lc).await;
    let _: Cluster = w.patch_status("demo", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    create_bootstrap_secret(&w, "m0-bootstrap", cloud_config("m0")).await;
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let _: LibvirtMachine = w.apply(libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())))).await;

    let started = Instant::now();
    loop {
        if let Some(lm) = w.api::<LibvirtMachine>().get_opt("m0").await.unwrap()
            && machine_ready(&lm)
        {
            break;
        }
        if let Ok(Some(status)) = manager.child.try_wait() {
            panic!("the manager exited with {status}:\n{}", manager.log_tail());
        }
        assert!(started.elapsed() < WAIT, "the machine did not become Ready; manager log:\n{}", manager.log_tail());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Leader election held a Lease in the given namespace.
    let lease: Lease = w
        .api()
        .get("cluster-api-provider-libvirt-leader")
        .await
        .unwrap_or_else(|e| panic!("no leader Lease in {}: {e}; manager log:\n{}", w.ns, manager.log_tail()));
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some_and(|h| !h.is_empty()));

    assert_eq!(http_get(health, "/healthz").map(|r| r.0), Some(200), "{}", manager.log_tail());
    assert_eq!(http_get(health, "/readyz").map(|r| r.0), Some(200), "{}", manager.log_tail());
    let (code, body) = http_get(metrics, "/metrics").expect("the metrics endpoint answers");
    assert_eq!(code, 200);
    assert!(body.contains("capl_reconciles_total{controller=\"libvirtmachine\"}"), "{body}");
    assert!(body.contains("capl_libvirt_operation_duration_seconds"), "{body}");

    // Graceful shutdown on SIGTERM.
    let pid = manager.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = manager.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < WAIT, "the manager did not stop on SIGTERM:\n{}", manager.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status.success(), "the manager exited with {status} on SIGTERM:\n{}", manager.log_tail());
    let log = std::fs::read_to_string(&manager.log).unwrap();
    assert!(
        log.lines().all(|l| l.trim().is_empty() || l.starts_with('{')),
        "--log-format json wrote a non-JSON line:\n{log}"
    );
}
