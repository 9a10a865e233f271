//! Builds that only a later step needs, run beside the foreground steps.
//!
//! `cargo xtask test` spends most of a cold run's first hour on work that does
//! not need all of the machine at every moment: the workspace tests wait on
//! the API server, on libvirtd and on emulated guests, and a Debian root is
//! mostly downloads. A [`Background`] job runs another `cargo xtask` command
//! (this executable) in a child process, at the foreground's CPU priority or
//! a lower one (`nice`) so that it takes only what the foreground leaves idle;
//! the step that needs its result [`joins`](Background::join) it first. When everything it builds is
//! cached the job ends at once and costs nothing.
//!
//! The child runs in a process group of its own, so that stopping it (a failed
//! foreground step drops the job) also stops what it started (Go compilers,
//! a build-time containerd). Its output goes to a log file under
//! `target/tmp/background/`; a failed job's error quotes the end of it.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How a job shares the CPU with the foreground steps.
#[derive(Clone, Copy)]
pub enum Priority {
    /// As the foreground: for a job whose result the next steps soon wait for.
    Same,
    /// `nice -n 10`: the job takes what the foreground leaves idle.
    Lower,
}
/// How many lines of a failed job's log its error quotes.
const TAIL_LINES: usize = 40;
/// How long a stopped job's process group gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A running background job (see the module documentation).
pub struct Background {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
    started: Instant,
}

impl Background {
    /// Starts `cargo xtask <args>` in a child process group of its own.
    pub fn start(name: &'static str, priority: Priority, args: &[&str]) -> Result<Self> {
        let exe = std::env::current_exe().context("the path of the running xtask")?;
        Self::start_program(name, priority, &exe, args)
    }

    /// [`Background::start`] with another program than this xtask.
    fn start_program(name: &'static str, priority: Priority, exe: &Path, args: &[&str]) -> Result<Self> {
        let dir = crate::target_dir().join("tmp/background");
        fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let niceness = match priority {
            Priority::Same => "0",
            Priority::Lower => "10",
        };
        let child = Command::new("nice")
            .args(["-n", niceness])
            .arg(exe)
            .args(args)
            .current_dir(crate::repo_root())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting the background job {name}"))?;
        eprintln!("==> {name}: started in the background (log: {})", log.display());
        Ok(Self { name, child: Some(child), log, started: Instant::now() })
    }

    /// Waits for the job to end; its failure is an error quoting the end of its log.
    pub fn join(mut self) -> Result<()> {
        let mut child = self.child.take().expect("a job is joined once");
        let waited = Instant::now();
        let status = child.wait().with_context(|| format!("waiting for the background job {}", self.name))?;
        let total = self.started.elapsed().as_secs_f64();
        let waited = waited.elapsed().as_secs_f64();
        if status.success() {
            eprintln!("==> {}: done in the background in {total:.1} s (waited {waited:.1} s for it)", self.name);
            return Ok(());
        }
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
        bail!(
            "the background job {} failed ({status}) after {total:.0} s; the end of {}:\n{tail}",
            self.name,
            self.log.display()
        )
    }
}

impl Drop for Background {
    /// A job not joined (a foreground step failed first) is stopped with everything it started.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let group = child.id() as libc::pid_t;
        eprintln!("xtask: stopping the background job {} (process group {group})", self.name);
        // SAFETY: kill(2) with a negative pid signals the process group the child leads.
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                // Its children may outlive it; the group is signalled once more below.
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above; whatever of the group is left is killed.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The jobs run `ls` and `sleep` in place of `cargo xtask`.

    #[test]
    fn a_job_that_succeeds_joins_without_error() {
        let job = Background::start_program("test-job-succeeds", Priority::Lower, Path::new("ls"), &["/"]).unwrap();
        job.join().unwrap();
    }

    #[test]
    fn a_failed_job_quotes_its_log() {
        let missing = "/capl-background-test-no-such-file";
        let job = Background::start_program("test-job-fails", Priority::Same, Path::new("ls"), &[missing]).unwrap();
        let err = format!("{:#}", job.join().unwrap_err());
        assert!(err.contains("the background job test-job-fails failed"), "{err}");
        assert!(err.contains(missing), "the error quotes the job's own message: {err}");
    }

    #[test]
    fn a_job_dropped_before_its_end_is_stopped_with_its_children() {
        let job = Background::start_program("test-job-dropped", Priority::Lower, Path::new("sleep"), &["60"]).unwrap();
        let group = job.child.as_ref().unwrap().id() as libc::pid_t;
        drop(job);
        // The job's process group is gone once its processes are killed and reaped,
        // well before the minute the job would take.
        let dropped = Instant::now();
        loop {
            // SAFETY: signal 0 only asks whether any process of the group is left.
            if unsafe { libc::kill(-group, 0) } == -1 {
                assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ESRCH));
                break;
            }
            assert!(
                dropped.elapsed() < Duration::from_secs(20),
                "a process of the dropped job's group is still running"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
