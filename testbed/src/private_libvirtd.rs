//! One launcher for a private libvirtd: the test host of `cargo xtask host up`
//! ([`crate::test_host`]) and the extra daemons of testenv's lab both start and
//! stop theirs here, and the containerized libvirtd's image takes the same
//! [`QEMU_CONF`].
//!
//! A root libvirtd reads `/etc/libvirt/qemu.conf` and keeps its state in
//! `/run/libvirt`, `/var/lib/libvirt`, `/var/cache/libvirt` and
//! `/var/log/libvirt`; no option moves the driver directories. So `virtlogd`
//! and `libvirtd` run in a private mount namespace (`unshare --mount
//! --propagation private`) in which directories of the caller's
//! ([`Dirs`]) are bind-mounted over those five: the system's files are
//! untouched and invisible to it, and its socket appears outside at
//! [`Dirs::socket`]. Needs root (`unshare`, `mount`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The QEMU driver config of every private libvirtd (the file `qemu.conf` of
/// this crate; see its comments for why each line is there).
pub const QEMU_CONF: &str = include_str!("qemu.conf");

/// virtlogd's config: its log in the daemon's own log directory.
pub const VIRTLOGD_CONF: &str = "log_outputs = \"3:file:/var/log/libvirt/virtlogd.log\"\n";

/// The part of `libvirtd.conf` every private daemon has: only root may use the
/// sockets, no polkit; the log in the daemon's own log directory. A daemon that
/// listens on TCP appends its listener's lines.
pub const LIBVIRTD_CONF_BASE: &str = "unix_sock_group = \"root\"\n\
unix_sock_ro_perms = \"0700\"\n\
unix_sock_rw_perms = \"0700\"\n\
unix_sock_admin_perms = \"0700\"\n\
auth_unix_ro = \"none\"\n\
auth_unix_rw = \"none\"\n\
log_outputs = \"3:file:/var/log/libvirt/libvirtd.log\"\n";

/// libvirtd's arguments for a daemon on its unix sockets only, with the paths
/// as seen inside its mount namespace (the test host's, which also listens for
/// TLS, are [`crate::test_host::LIBVIRTD_ARGS`]).
pub const UNIX_ONLY_ARGS: [&str; 5] = ["-d", "-f", "/etc/libvirt/libvirtd.conf", "-p", "/run/libvirt/libvirtd.pid"];

/// The directories of one private daemon, outside its mount namespace: each
/// hides one of libvirt's system directories inside it.
pub struct Dirs {
    /// Over `/etc/libvirt`: the daemon's configs.
    pub etc: PathBuf,
    /// Over `/run/libvirt`: its sockets and pid files.
    pub run: PathBuf,
    /// Over `/var/lib/libvirt`: its state.
    pub lib: PathBuf,
    /// Over `/var/cache/libvirt`.
    pub cache: PathBuf,
    /// Over `/var/log/libvirt`: `libvirtd.log`, `virtlogd.log` and the guests' logs.
    pub log: PathBuf,
}

impl Dirs {
    /// `etc`, `run`, `lib`, `cache` and `log` under `dir`.
    pub fn under(dir: &Path) -> Self {
        Self {
            etc: dir.join("etc"),
            run: dir.join("run"),
            lib: dir.join("lib"),
            cache: dir.join("cache"),
            log: dir.join("log"),
        }
    }

    /// (our directory, the system path it hides inside the namespace)
    pub fn binds(&self) -> [(&Path, &'static str); 5] {
        [
            (&self.etc, "/etc/libvirt"),
            (&self.run, "/run/libvirt"),
            (&self.lib, "/var/lib/libvirt"),
            (&self.cache, "/var/cache/libvirt"),
            (&self.log, "/var/log/libvirt"),
        ]
    }

    /// The daemon's read-write unix socket.
    pub fn socket(&self) -> PathBuf {
        self.run.join("libvirt-sock")
    }

    /// `qemu+unix:///system?socket=<run>/libvirt-sock`.
    pub fn uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.socket().display())
    }

    pub fn libvirtd_pid_file(&self) -> PathBuf {
        self.run.join("libvirtd.pid")
    }

    pub fn virtlogd_pid_file(&self) -> PathBuf {
        self.run.join("virtlogd.pid")
    }
}

/// Creates the directories of `dirs` (and the system mount points, which on a
/// machine without a system libvirt may be missing), writes `libvirtd_conf`,
/// [`QEMU_CONF`] and [`VIRTLOGD_CONF`] into [`Dirs::etc`], and starts virtlogd
/// and `libvirtd <libvirtd_args>` in a new private mount namespace. Returns
/// once both have daemonized; [`wait_until_answering`] waits for the socket.
pub fn start(dirs: &Dirs, libvirtd_conf: &str, libvirtd_args: &[&str]) -> Result<()> {
    for (ours, system) in dirs.binds() {
        fs::create_dir_all(ours).with_context(|| format!("creating {}", ours.display()))?;
        // An empty mount point is harmless.
        fs::create_dir_all(system).with_context(|| format!("creating the mount point {system}"))?;
    }
    for (name, body) in [("libvirtd.conf", libvirtd_conf), ("qemu.conf", QEMU_CONF), ("virtlogd.conf", VIRTLOGD_CONF)] {
        let path = dirs.etc.join(name);
        fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
    }
    let script = start_script(dirs, libvirtd_args);
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .context("running unshare (util-linux) to start virtlogd and libvirtd")?;
    if !out.status.success() {
        bail!(
            "starting virtlogd and libvirtd in a private mount namespace (as root) failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The shell script run inside the new mount namespace: the bind mounts, then
/// the two daemons (inside, the run directory is `/run/libvirt`).
fn start_script(dirs: &Dirs, libvirtd_args: &[&str]) -> String {
    let mut script = String::from("set -e\n");
    for (ours, system) in dirs.binds() {
        script.push_str(&format!("mount --bind '{}' '{system}'\n", ours.display()));
    }
    script.push_str("virtlogd -d -f /etc/libvirt/virtlogd.conf -p /run/libvirt/virtlogd.pid\n");
    script.push_str(&format!("libvirtd {}\n", libvirtd_args.join(" ")));
    script
}

/// Whether the daemon answers `virsh version` on its socket now.
pub fn answers(dirs: &Dirs) -> bool {
    dirs.socket().exists()
        && Command::new("virsh")
            .args(["-q", "-c", &dirs.uri(), "version"])
            .output()
            .is_ok_and(|out| out.status.success())
}

/// Waits until the daemon answers (every 200 ms); fails after `limit`, naming
/// it as `what` and pointing at its log.
pub fn wait_until_answering(dirs: &Dirs, what: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !answers(dirs) {
        if Instant::now() > deadline {
            bail!(
                "{what} did not answer on {} within {limit:?}; see {}",
                dirs.socket().display(),
                dirs.log.join("libvirtd.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The pid in `file` if that process is alive and its name is `name`.
pub fn live_pid(file: &Path, name: &str) -> Option<u32> {
    let pid: u32 = fs::read_to_string(file).ok()?.trim().parse().ok()?;
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    // /proc/<pid>/stat is "pid (comm) state ...": a zombie (Z) has exited.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next());
    (comm.trim() == name && state != Some(Some('Z'))).then_some(pid)
}

/// Stops libvirtd, then virtlogd: SIGTERM, then SIGKILL when one still runs
/// after 20 s. Their pid files are removed.
pub fn stop(dirs: &Dirs) -> Result<()> {
    for (file, name) in [(dirs.libvirtd_pid_file(), "libvirtd"), (dirs.virtlogd_pid_file(), "virtlogd")] {
        let Some(pid) = live_pid(&file, name) else {
            continue;
        };
        signal("TERM", pid).with_context(|| format!("stopping {name} (pid {pid})"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while live_pid(&file, name).is_some() {
            if Instant::now() > deadline {
                let _ = signal("KILL", pid);
                std::thread::sleep(Duration::from_millis(200));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = fs::remove_file(&file);
    }
    Ok(())
}

/// `kill -<signal> <pid>`.
fn signal(signal: &str, pid: u32) -> Result<()> {
    let out = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).output().context("running kill")?;
    if !out.status.success() {
        bail!("kill -{signal} {pid} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
