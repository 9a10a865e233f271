//! The README's first command checked the way a user stops it, in its quick
//! form (two plain machines; the Kubernetes cluster of the default demo is the
//! e2e `workload` scenario's, checked there): `cargo xtask demo --quick`
//! started on a machine where the private libvirtd is not running,
//! interrupted with Ctrl-C (SIGINT to its process group, as a terminal sends
//! it) once both machines run, must leave nothing behind: the cluster deleted,
//! no QEMU guest left, the private libvirtd it started stopped again.
//! `cargo xtask test` runs it last, after it stopped the daemon of the tests.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::{libvirt_host, repo_root};

/// What the demo prints once both guests run with their addresses.
const READY_LINE: &str = "both machines run and have their addresses";
/// What it prints when everything is deleted.
const DONE_LINE: &str = "done: everything stopped and removed";
/// Bounds: preparing (everything cached by the test run before) and booting
/// two guests under TCG; then deleting the cluster and stopping the daemon.
const READY_WITHIN: Duration = Duration::from_secs(600);
const CLEANUP_WITHIN: Duration = Duration::from_secs(300);

pub fn ctrl_c_cleans_up() -> Result<()> {
    ensure!(
        !libvirt_host::is_up(),
        "the demo check needs the private libvirtd stopped (the demo must start it itself): run `cargo xtask host down`"
    );
    let xtask = std::env::current_exe().context("finding the xtask binary")?;
    let mut child = Command::new(&xtask)
        .args(["demo", "--quick"])
        .current_dir(repo_root())
        .stdout(Stdio::piped())
        // Its own process group, like a terminal's foreground job: Ctrl-C goes to all of it.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {} demo", xtask.display()))?;
    let group = child.id() as i32;
    let stdout = child.stdout.take().context("the demo's stdout")?;
    let (lines, seen) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("  [demo] {line}");
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let kill_group = |signal| {
        // SAFETY: sends a signal to the process group this function started.
        unsafe { libc::kill(-group, signal) };
    };

    let wait_for = |wanted: &str, within: Duration| -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match seen.recv_timeout(left) {
                Ok(line) if line.contains(wanted) => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => bail!("the demo did not print {wanted:?} within {within:?}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the demo ended before printing {wanted:?}"),
            }
        }
    };
    if let Err(e) = wait_for(READY_LINE, READY_WITHIN) {
        kill_group(libc::SIGKILL);
        let _ = child.wait();
        let _ = libvirt_host::down();
        return Err(e);
    }
    kill_group(libc::SIGINT);
    let cleaned = wait_for(DONE_LINE, CLEANUP_WITHIN);
    let deadline = Instant::now() + CLEANUP_WITHIN;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            kill_group(libc::SIGKILL);
            let _ = child.wait();
            let _ = libvirt_host::down();
            bail!("the demo did not exit within {CLEANUP_WITHIN:?} of Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    cleaned?;
    ensure!(status.success(), "the demo exited with {status} after Ctrl-C");
    ensure!(!libvirt_host::is_up(), "the private libvirtd the demo started still runs after Ctrl-C");
    let guests = Command::new("pgrep").args(["-f", "qemu-system"]).output().context("running pgrep")?;
    ensure!(
        guests.stdout.is_empty(),
        "QEMU guests still run after the demo's Ctrl-C: pids {}",
        String::from_utf8_lossy(&guests.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    );
    println!("demo check: Ctrl-C deleted the cluster, stopped the guests and the private libvirtd");
    Ok(())
}
