//! The README's main command checked as a user runs it, last in `cargo xtask
//! test`, on a machine where the private libvirtd is not running (the demo
//! must start it itself):
//! - [`exit_after_ready`]: `cargo xtask demo --exit-after-ready`, exactly as
//!   the README writes it, must report both Nodes of its Kubernetes cluster
//!   Ready and a Service answering across them, remove everything and exit 0;
//! - [`ctrl_c_cleans_up`]: `cargo xtask demo --quick`, interrupted with Ctrl-C
//!   (SIGINT to its process group, as a terminal sends it) once both machines
//!   run, must delete its cluster and exit 0.
//!
//! After either, the demo must not have had to sweep up after the provider, no
//! QEMU guest may be left, and the private libvirtd the demo started must be
//! stopped again.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::{libvirt_host, repo_root};

/// What the full demo prints once both Nodes are Ready.
const CLUSTER_READY_LINE: &str = "the workload cluster is ready: both Nodes are Ready";
/// What the quick demo prints once both guests run with their addresses.
const MACHINES_READY_LINE: &str = "both machines run and have their addresses";
/// What either prints when everything is deleted.
const DONE_LINE: &str = "done: everything stopped and removed";
/// What either prints when it had to remove what the provider left on the host
/// after the cluster was deleted: a leak, which fails the check.
const LEFTOVERS_LINE: &str = "removed what the provider left behind";
/// A backstop for the full demo, which bounds each of its steps itself (10 +
/// 25 + 15 + 30 + 10 minutes, see the demo's steps) after preparing the host
/// (everything cached by the test run before).
const CLUSTER_READY_WITHIN: Duration = Duration::from_secs(100 * 60);
/// Preparing (everything cached by the test run before) and booting two tiny
/// guests under TCG; the quick demo itself gives up after 10 minutes.
const MACHINES_READY_WITHIN: Duration = Duration::from_secs(20 * 60);
/// Deleting the cluster and stopping the daemon.
const CLEANUP_WITHIN: Duration = Duration::from_secs(300);

/// `cargo xtask demo --exit-after-ready`, the README's main command as written.
pub fn exit_after_ready() -> Result<()> {
    let mut demo = DemoRun::start("cargo", &["xtask", "demo", "--exit-after-ready"])?;
    let ready = demo.wait_for(CLUSTER_READY_LINE, CLUSTER_READY_WITHIN);
    // On its way out (ready or failed), the demo deletes everything by itself.
    let done = demo.wait_for(DONE_LINE, CLEANUP_WITHIN);
    let status = demo.wait_exit(CLEANUP_WITHIN)?;
    ready?;
    done?;
    ensure!(status.success(), "`cargo xtask demo --exit-after-ready` exited with {status}");
    demo.no_leftovers()?;
    nothing_left("`cargo xtask demo --exit-after-ready`")?;
    println!("demo check: both Nodes Ready, then the cluster deleted, the guests and the private libvirtd stopped");
    Ok(())
}

/// `cargo xtask demo --quick`, stopped with Ctrl-C once both machines run.
pub fn ctrl_c_cleans_up() -> Result<()> {
    // Through cargo, as the README writes it: the full demo's `cargo xtask`
    // may have rebuilt this very binary, so its path may name a deleted file.
    let mut demo = DemoRun::start("cargo", &["xtask", "demo", "--quick"])?;
    demo.wait_for(MACHINES_READY_LINE, MACHINES_READY_WITHIN)?;
    demo.signal(libc::SIGINT);
    let cleaned = demo.wait_for(DONE_LINE, CLEANUP_WITHIN);
    let status = demo.wait_exit(CLEANUP_WITHIN)?;
    cleaned?;
    ensure!(status.success(), "the demo exited with {status} after Ctrl-C");
    demo.no_leftovers()?;
    nothing_left("the demo's Ctrl-C")?;
    println!("demo check: Ctrl-C deleted the cluster, stopped the guests and the private libvirtd");
    Ok(())
}

/// A demo started in a process group of its own, like a terminal's foreground
/// job, its output echoed and watched line by line. Dropped before it exited,
/// it is killed, and the private libvirtd with it.
struct DemoRun {
    child: Child,
    group: i32,
    lines: mpsc::Receiver<String>,
    /// Every line received so far.
    seen: std::cell::RefCell<Vec<String>>,
    exited: bool,
}

impl DemoRun {
    fn start(program: &str, args: &[&str]) -> Result<Self> {
        ensure!(
            !libvirt_host::is_up(),
            "the demo check needs the private libvirtd stopped (the demo must start it itself): run `cargo xtask host down`"
        );
        println!("demo check: {program} {}", args.join(" "));
        let mut child = Command::new(program)
            .args(args)
            .current_dir(repo_root())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {program} {}", args.join(" ")))?;
        let group = child.id() as i32;
        let stdout = child.stdout.take().context("the demo's stdout")?;
        let (send, lines) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                println!("  [demo] {line}");
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, group, lines, seen: Default::default(), exited: false })
    }

    /// Waits for a line containing `wanted`; fails when the demo ends first or
    /// `within` passes.
    fn wait_for(&self, wanted: &str, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(wanted);
                    self.seen.borrow_mut().push(line);
                    if found {
                        return Ok(());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!("the demo did not print {wanted:?} within {within:?}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the demo ended before printing {wanted:?}"),
            }
        }
    }

    /// Fails when the demo said it removed what the provider left behind.
    fn no_leftovers(&self) -> Result<()> {
        let seen = self.seen.borrow();
        match seen.iter().find(|l| l.contains(LEFTOVERS_LINE)) {
            Some(line) => bail!("the provider left things on the host after the demo's cluster was deleted: {line}"),
            None => Ok(()),
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: sends a signal to the process group this check started.
        unsafe { libc::kill(-self.group, signal) };
    }

    /// Waits for the demo to exit, at most `within`.
    fn wait_exit(&mut self, within: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.exited = true;
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("the demo did not exit within {within:?} of being done or stopped");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for DemoRun {
    fn drop(&mut self) {
        if !self.exited {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
            let _ = libvirt_host::down();
        }
    }
}

/// No private libvirtd and no QEMU guest left after `what`.
fn nothing_left(what: &str) -> Result<()> {
    ensure!(!libvirt_host::is_up(), "the private libvirtd the demo started still runs after {what}");
    let guests = Command::new("pgrep").args(["-f", "qemu-system"]).output().context("running pgrep")?;
    ensure!(
        guests.stdout.is_empty(),
        "QEMU guests still run after {what}: pids {}",
        String::from_utf8_lossy(&guests.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    );
    Ok(())
}
