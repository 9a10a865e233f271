//! A child process (etcd, kube-apiserver, capi-manager) that cannot outlive the test process.
//!
//! Every child is killed explicitly when its owner is dropped (also while a test panics).
//! As a second line of defence, each child is started with `PR_SET_PDEATHSIG = SIGKILL`, so
//! that the kernel kills it when the test process dies without running destructors (a
//! `SIGKILL` from a test-runner timeout, or `exit` with a `static` instance still alive).
//! The death signal fires when the *thread* that forked the child ends, so every child is
//! forked by one spawner thread that lives as long as the process.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result};

type SpawnRequest = (Command, Sender<io::Result<Child>>);

/// A running child process whose stdout and stderr go to a log file.
pub struct SupervisedProcess {
    name: String,
    child: Mutex<Child>,
    log: PathBuf,
}

impl SupervisedProcess {
    /// Starts `program args...` with output appended to `log`.
    pub fn start(name: &str, program: &Path, args: &[String], envs: &[(&str, &Path)], log: &Path) -> Result<Self> {
        let log_file =
            File::create(log).with_context(|| format!("creating the log file {} of {name}", log.display()))?;
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).stdout(log_file.try_clone()?).stderr(log_file);
        for (key, value) in envs {
            command.env(key, value);
        }
        // A process group of its own: a Ctrl-C in the terminal reaches the test
        // or demo process, which stops its children in order (the demo deletes
        // its cluster first, which needs the API server); PR_SET_PDEATHSIG
        // below still ends them when that process dies.
        command.process_group(0);
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only calls the async-signal-safe
        // prctl and getppid; it allocates nothing except when building the error.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::other("the test process exited while starting the child"));
                }
                Ok(())
            });
        }
        let child = spawn_from_long_lived_thread(command)
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self { name: name.to_owned(), child: Mutex::new(child), log: log.to_owned() })
    }

    /// The process id (of a process that may have exited since).
    pub fn pid(&self) -> u32 {
        self.lock().id()
    }

    /// `Some(status)` once the process has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.lock().try_wait().ok().flatten()
    }

    /// Fails, with the end of the log, when the process has exited.
    pub fn ensure_running(&self) -> Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => anyhow::bail!(
                "{} exited ({status}); last lines of its log {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail(40)
            ),
        }
    }

    /// The last `lines` lines of the log (read from at most its last 64 KiB).
    pub fn log_tail(&self, lines: usize) -> String {
        let read = || -> io::Result<String> {
            let mut file = File::open(&self.log)?;
            let len = file.metadata()?.len();
            file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let all: Vec<&str> = text.lines().collect();
            Ok(all[all.len().saturating_sub(lines)..].join("\n"))
        };
        read().unwrap_or_else(|err| format!("(cannot read {}: {err})", self.log.display()))
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Kills the process (SIGKILL) and reaps it. Idempotent.
    pub fn kill(&self) {
        let mut child = self.lock();
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for SupervisedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_from_long_lived_thread(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("starting the testenv spawner thread");
        Mutex::new(requests)
    });
    let (reply, result) = channel();
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply))
        .map_err(|_| io::Error::other("the testenv spawner thread is gone"))?;
    result.recv().map_err(|_| io::Error::other("the testenv spawner thread is gone"))?
}
