//! A private `TestEnv` leaves nothing behind: not when dropped, not when its test panics.
//!
//! Needs `cargo xtask control-plane build`.

use std::path::Path;

use anyhow::Result;
use testenv::TestEnv;

/// The loopback port of `https://127.0.0.1:<port>`.
fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().and_then(|port| port.parse().ok()).unwrap_or_else(|| panic!("no port in {url}"))
}

fn assert_gone(dir: &Path, port: u16) {
    assert!(!dir.exists(), "{} must be removed at teardown", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "kube-apiserver must no longer listen on 127.0.0.1:{port} after teardown"
    );
}

#[tokio::test]
async fn dropping_a_private_instance_stops_it_and_removes_its_files() -> Result<()> {
    let env = TestEnv::start().await?;
    eprintln!("etcd + kube-apiserver ready after {:?}", env.startup_time());
    let dir = env.scratch_dir().to_owned();
    let port = port_of(env.server_url());
    assert!(dir.join("kubeconfig").is_file());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    drop(env);
    assert_gone(&dir, port);
    Ok(())
}

#[test]
fn a_panicking_test_still_tears_its_instance_down() {
    let (sender, receiver) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let env = TestEnv::start().await.expect("the test control plane starts");
            sender.send((env.scratch_dir().to_owned(), port_of(env.server_url()))).expect("the test waits");
            panic!("deliberate panic while the control plane runs");
        })
    });
    assert!(test.join().is_err(), "the thread must have panicked");
    let (dir, port) = receiver.recv().expect("the control plane had started before the panic");
    assert_gone(&dir, port);
}
