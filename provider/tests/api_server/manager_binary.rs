//! Leader election of the manager binary as an operator runs it, two
//! replicas against the real API server with the embedded simulated host.
//! (reconcile_manager_binary.rs covers one replica provisioning a machine,
//! its metrics, logs and SIGTERM.)

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use capl_testbed::wait::{self, Bound};

use crate::clusterctl_template;

fn free_port() -> u16 {
    let [port] = testenv::free_loopback_ports().unwrap();
    port
}

/// Status code and body of `GET http://127.0.0.1:<port><path>`, or None if nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let bound = Bound::new(timeout, Duration::from_millis(250));
    let outcome = wait::blocking(bound, || Ok::<_, Infallible>(check().into()));
    assert!(outcome.is_ok(), "timed out waiting for {what}");
}

struct Manager {
    child: Child,
    health: u16,
}

impl Manager {
    fn start(kubeconfig: &std::path::Path, namespace: &str) -> Self {
        let (metrics, health) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"))
            .env("KUBECONFIG", kubeconfig)
            .args(["--hypervisor", "sim", "--leader-elect", "--log-format", "json"])
            .arg(format!("--namespace={namespace}"))
            .arg(format!("--leader-election-namespace={namespace}"))
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
            .stdout(std::fs::File::create(format!("/tmp/capl-manager-{health}.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, health }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "manager did not exit on SIGTERM; its log:\n{}",
                std::fs::read_to_string(format!("/tmp/capl-manager-{}.log", self.health)).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Lease's holder, or None while nobody holds it.
async fn lease_holder(client: &kube::Client, namespace: &str) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), namespace);
    let lease = leases.get_opt("cluster-api-provider-libvirt-leader").await.ok().flatten()?;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Waits (bounded) until `check` holds for the current Lease holder.
async fn wait_for_holder(
    client: &kube::Client,
    namespace: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let holder = lease_holder(client, namespace).await;
        if let Some(holder) = holder.as_deref().filter(|h| check(h)) {
            return holder.to_string();
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}; the Lease is held by {holder:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Lease identity names the process: `<hostname>_<pid>_<start>`.
fn held_by(holder: &str, pid: u32) -> bool {
    holder.contains(&format!("_{pid}_"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_replica_is_ready_and_takes_the_lease_over_on_sigterm() {
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_crds_from_dir(&clusterctl_template::repo_root().join("config/crd/bases")).await.unwrap();
    let namespace = env.unique_namespace("manager").await.unwrap();
    let kubeconfig = env.kubeconfig_path().to_path_buf();
    let client = env.client();

    let ns = namespace.clone();
    let kc = kubeconfig.clone();
    let first = tokio::task::spawn_blocking(move || {
        let m = Manager::start(&kc, &ns);
        wait_for("the first manager's /healthz", Duration::from_secs(60), || {
            get(m.health, "/healthz").is_some_and(|(c, _)| c == 200)
        });
        wait_for("the first manager's /readyz", Duration::from_secs(60), || {
            get(m.health, "/readyz").is_some_and(|(c, _)| c == 200)
        });
        m
    })
    .await
    .unwrap();
    let first_pid = first.child.id();
    wait_for_holder(&client, &namespace, "the first manager to lead", Duration::from_secs(60), |h| {
        held_by(h, first_pid)
    })
    .await;

    // A second replica becomes Ready while the first leads: readiness is
    // "able to serve", so a rolling update can finish.
    let ns = namespace.clone();
    let kc = kubeconfig.clone();
    let second = tokio::task::spawn_blocking(move || {
        let m = Manager::start(&kc, &ns);
        wait_for("the standby manager's /readyz", Duration::from_secs(60), || {
            get(m.health, "/readyz").is_some_and(|(c, _)| c == 200)
        });
        m
    })
    .await
    .unwrap();
    let second_pid = second.child.id();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holder = lease_holder(&client, &namespace).await.unwrap_or_default();
    assert!(held_by(&holder, first_pid), "the first replica still leads while the standby is ready; holder {holder}");

    // SIGTERM: the leader exits cleanly and hands the Lease over; the
    // standby takes it well within the Lease duration.
    let terminated = Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        let mut first = first;
        first.terminate()
    })
    .await
    .unwrap();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    wait_for_holder(&client, &namespace, "the standby to take the Lease over", Duration::from_secs(30), |h| {
        held_by(h, second_pid)
    })
    .await;
    eprintln!("Lease handed over {:.1} s after SIGTERM", terminated.elapsed().as_secs_f64());
    drop(second);
}
