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
//! The job runs a copy of this executable taken when the first job starts:
//! the foreground steps rebuild `target/debug/xtask` (the workspace tests build
//! every binary of the workspace), and a job started after that must not name
//! a file that is gone. The copy is read from `/proc/self/exe`, which opens the
//! running program even when its file was replaced.
//!
//! A thread of its own waits for the child and notes when it ended, so that a
//! job's time is its own even when it is joined long after it finished.
//!
//! The child runs in a session (so a process group) of its own, so that
//! stopping it (a failed foreground step drops the job) also stops what it
//! started (Go compilers, a build-time containerd), and so that a lower
//! priority holds against the emulated guests too (see [`own_session`]). Its output goes to a log file under
//! `target/tmp/background/`; a failed job's error quotes the end of it.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How a job shares the CPU with the foreground steps.
#[derive(Clone, Copy)]
pub enum Priority {
    /// As the foreground: for a job whose result the next steps soon wait for.
    Same,
    /// `nice -n 10`, for the job's session as well as its processes: the job
    /// takes what the foreground leaves idle.
    Lower,
}

impl Priority {
    /// The niceness of the job's processes and of its session's autogroup.
    fn niceness(self) -> &'static str {
        match self {
            Priority::Same => "0",
            Priority::Lower => "10",
        }
    }
}
/// How many lines of a failed job's log its error quotes.
const TAIL_LINES: usize = 40;
/// How long a stopped job's process group gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A running background job (see the module documentation).
pub struct Background {
    name: &'static str,
    /// The child's pid, which leads its process group.
    group: libc::pid_t,
    log: PathBuf,
    started: Instant,
    ended: Arc<Ended>,
    joined: bool,
}

/// How and when the child ended, once it has; set by the thread that waits for it.
#[derive(Default)]
struct Ended {
    at: Mutex<Option<(std::io::Result<ExitStatus>, Instant)>>,
    changed: Condvar,
}

impl Ended {
    /// Waits at most `within` (for ever with `None`) for the end; whether it came.
    fn wait(&self, within: Option<Duration>) -> bool {
        let guard = self.at.lock().unwrap_or_else(|e| e.into_inner());
        let guard = match within {
            None => self.changed.wait_while(guard, |at| at.is_none()).unwrap_or_else(|e| e.into_inner()),
            Some(within) => {
                self.changed.wait_timeout_while(guard, within, |at| at.is_none()).unwrap_or_else(|e| e.into_inner()).0
            }
        };
        guard.is_some()
    }
}

impl Background {
    /// Starts `cargo xtask <args>` in a child process group of its own.
    pub fn start(name: &'static str, priority: Priority, args: &[&str]) -> Result<Self> {
        static COPY: OnceLock<PathBuf> = OnceLock::new();
        let exe = match COPY.get() {
            Some(exe) => exe.clone(),
            None => {
                let dir = crate::target_dir().join("tmp/background");
                let copy = copy_program(Path::new("/proc/self/exe"), &dir)?;
                COPY.get_or_init(|| copy).clone()
            }
        };
        Self::start_program(name, priority, &exe, args)
    }

    /// [`Background::start`] with another program than this xtask.
    fn start_program(name: &'static str, priority: Priority, exe: &Path, args: &[&str]) -> Result<Self> {
        let dir = crate::target_dir().join("tmp/background");
        fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let niceness = priority.niceness();
        let mut command = Command::new("nice");
        command
            .args(["-n", niceness])
            .arg(exe)
            .args(args)
            .current_dir(crate::repo_root())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // SAFETY: between fork and exec the closure makes only async-signal-safe
        // system calls (setsid, open, write, close) and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                own_session(niceness);
                Ok(())
            });
        }
        let mut child = command.spawn().with_context(|| format!("starting the background job {name}"))?;
        let started = Instant::now();
        eprintln!("==> {name}: started in the background (log: {})", log.display());
        let group = child.id() as libc::pid_t;
        let ended = Arc::new(Ended::default());
        let noted = ended.clone();
        std::thread::Builder::new()
            .name(format!("wait-{name}"))
            .spawn(move || {
                let status = child.wait();
                *noted.at.lock().unwrap_or_else(|e| e.into_inner()) = Some((status, Instant::now()));
                noted.changed.notify_all();
            })
            .with_context(|| format!("starting the thread that waits for the background job {name}"))?;
        Ok(Self { name, group, log, started, ended, joined: false })
    }

    /// How long the job ran, once it has ended.
    pub fn ran(&self) -> Option<Duration> {
        let at = self.ended.at.lock().unwrap_or_else(|e| e.into_inner());
        at.as_ref().map(|(_, ended)| ended.duration_since(self.started))
    }

    /// Waits for the job to end, printing one line with how long it ran and how
    /// long it was waited for, and returns how long it ran; its failure is an
    /// error quoting the end of its log.
    pub fn join(mut self) -> Result<Duration> {
        self.joined = true;
        if self.ran().is_none() {
            eprintln!("==> {}: waiting for the background job", self.name);
        }
        let waited = Instant::now();
        self.ended.wait(None);
        let waited = waited.elapsed().as_secs_f64();
        let ran = self.ran().expect("the job has ended");
        let status = {
            let mut at = self.ended.at.lock().unwrap_or_else(|e| e.into_inner());
            let (status, _) = at.take().expect("the job has ended");
            status.with_context(|| format!("waiting for the background job {}", self.name))?
        };
        let total = ran.as_secs_f64();
        if status.success() {
            eprintln!("==> {}: done in the background in {total:.1} s (waited {waited:.1} s for it)", self.name);
            return Ok(ran);
        }
        eprintln!("==> {}: FAILED in the background after {total:.1} s", self.name);
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

/// In the child before exec: a session of its own (and so a process group of
/// its own, which [`Drop`] signals) with `niceness` as its autogroup's.
///
/// With the kernel's autogroup scheduling (on by default in Debian's and
/// Ubuntu's kernels) the CPU is first shared between sessions and cgroups and
/// only then between the processes of each by their niceness: a job niced in
/// the foreground's session would still take its session's share from the
/// emulated guests (each QEMU runs in libvirt's `machine` cgroup). In a
/// session of its own, whose autogroup has the job's niceness, it takes only
/// what the foreground and the guests leave. Where the kernel has no
/// autogroups the file is missing and the processes' niceness does the same.
fn own_session(niceness: &str) {
    // SAFETY: plain system calls on a NUL-terminated path and a byte buffer that outlive them.
    unsafe {
        libc::setsid();
        let fd = libc::open(c"/proc/self/autogroup".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, niceness.as_ptr().cast(), niceness.len());
            libc::close(fd);
        }
    }
}

/// Copies the program at `src` to `dir/xtask` (through a temporary name and a
/// rename, so that a job of an earlier run still executing the old copy keeps it).
fn copy_program(src: &Path, dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let copy = dir.join("xtask");
    let partial = dir.join(format!("xtask.partial-{}", std::process::id()));
    fs::copy(src, &partial).with_context(|| format!("copying {} to {}", src.display(), partial.display()))?;
    fs::rename(&partial, &copy).with_context(|| format!("renaming {} to {}", partial.display(), copy.display()))?;
    Ok(copy)
}

impl Drop for Background {
    /// A job not joined (a foreground step failed first) is stopped with everything it started.
    fn drop(&mut self) {
        if self.joined || self.ran().is_some() {
            return;
        }
        let group = self.group;
        eprintln!("xtask: stopping the background job {} (process group {group})", self.name);
        // SAFETY: kill(2) with a negative pid signals the process group the child leads.
        unsafe { libc::kill(-group, libc::SIGTERM) };
        // Its children may outlive it; the group is signalled once more below.
        self.ended.wait(Some(STOP_GRACE));
        // SAFETY: as above; whatever of the group is left is killed (the
        // child's pid stays reserved until the waiting thread reaps it).
        unsafe { libc::kill(-group, libc::SIGKILL) };
        self.ended.wait(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The jobs run `ls` and `sleep` in place of `cargo xtask`.

    /// A field of `/proc/<pid>/stat` after the command name (3 is the state).
    fn stat_field(stat: &str, field: usize) -> String {
        let after = stat.rsplit_once(") ").expect("a stat line").1;
        after.split(' ').nth(field - 3).expect("the field").to_string()
    }

    /// A lower-priority job leads a session of its own whose autogroup (where
    /// the kernel has them) has niceness 10, beside its processes' niceness.
    #[test]
    fn a_lower_priority_job_runs_niced_in_a_session_of_its_own() {
        let script = "cat /proc/self/stat; cat /proc/self/autogroup 2>/dev/null || echo 'no autogroup'";
        let job =
            Background::start_program("test-job-session", Priority::Lower, Path::new("sh"), &["-c", script]).unwrap();
        let leader = job.group;
        let log = job.log.clone();
        job.join().unwrap();
        let text = fs::read_to_string(&log).unwrap();
        let mut lines = text.lines();
        let stat = lines.next().expect("the job's stat line");
        // sh runs as the child itself (nice execs it), so it leads the session.
        assert_eq!(stat_field(stat, 6), leader.to_string(), "session of the job: {stat}");
        assert_eq!(stat_field(stat, 19), "10", "niceness of the job's processes: {stat}");
        let autogroup = lines.next().expect("the job's autogroup line");
        match fs::read_to_string("/proc/self/autogroup") {
            Ok(ours) => {
                assert!(autogroup.ends_with("nice 10"), "the job's autogroup: {autogroup}");
                let ours = ours.trim().split(' ').next().unwrap_or_default().to_string();
                assert!(!autogroup.starts_with(&format!("{ours} ")), "the job shares {ours} with this process");
            }
            Err(_) => assert_eq!(autogroup, "no autogroup"),
        }
    }

    #[test]
    fn a_job_that_succeeds_joins_without_error() {
        let job = Background::start_program("test-job-succeeds", Priority::Lower, Path::new("ls"), &["/"]).unwrap();
        job.join().unwrap();
    }

    /// A job joined long after it ended reports its own run time, not the
    /// time since its start.
    #[test]
    fn a_job_joined_after_its_end_reports_how_long_it_ran() {
        let job = Background::start_program("test-job-ran", Priority::Same, Path::new("ls"), &["/"]).unwrap();
        while job.ran().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The foreground is busy for a while before it joins.
        std::thread::sleep(Duration::from_millis(500));
        let since_start = job.started.elapsed();
        let ran = job.join().unwrap();
        assert!(ran + Duration::from_millis(500) <= since_start, "ran {ran:?}, {since_start:?} since the start");
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
    fn a_job_runs_a_copy_that_outlives_the_original_file() {
        let dir = crate::target_dir().join("tmp/background-test-copy");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let original = dir.join("ls");
        fs::copy("/bin/ls", &original).unwrap();
        let copy = copy_program(&original, &dir.join("jobs")).unwrap();
        // A rebuild replaces the original; the copy still runs.
        fs::remove_file(&original).unwrap();
        let job = Background::start_program("test-job-copy", Priority::Same, &copy, &["/"]).unwrap();
        job.join().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_running_program_is_copied_from_proc_self_exe() {
        let dir = crate::target_dir().join("tmp/background-test-self");
        let copy = copy_program(Path::new("/proc/self/exe"), &dir).unwrap();
        let running = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(fs::read(&copy).unwrap() == running, "the copy is the running test binary");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_job_dropped_before_its_end_is_stopped_with_its_children() {
        let job = Background::start_program("test-job-dropped", Priority::Lower, Path::new("sleep"), &["60"]).unwrap();
        let group = job.group;
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
