//! `cargo xtask docker-engine up|down|status`: a docker engine for the tests
//! that need containers (the containerized libvirtd, the offline provider
//! image, kind), started like the private libvirtd is.
//!
//! - A docker engine that already answers `docker info` (the user's own, or
//!   `DOCKER_HOST`) is used as it is and never stopped.
//! - Otherwise `up` installs Debian's `docker.io` when `dockerd` is missing
//!   and starts `dockerd` by hand (these machines have no systemd), in a
//!   session of its own, with its pid in [`PID_FILE`] and its log in
//!   [`LOG_FILE`]; `down` stops only a dockerd whose pid is in that file.
//! - The storage driver is `vfs` (works on any filesystem, at the cost of disk
//!   and speed); `CAPL_DOCKERD_STORAGE_DRIVER` chooses another. Images stay in
//!   docker's data root (`/var/lib/docker`) between runs: that is the cache of
//!   the images `cargo xtask` builds.
//!
//! # docker and libvirt's NAT network
//!
//! dockerd adds its chains at the top of iptables' FORWARD chain, and when it
//! has to turn on IP forwarding itself it also sets FORWARD's policy to DROP.
//! libvirt's NAT networks accept their own traffic in chains of their own
//! (`LIBVIRT_FWI`/`LIBVIRT_FWO`/`LIBVIRT_FWX`), and docker's chains only act on
//! its bridges, so both forward side by side. `up` checks what it can see: the
//! FORWARD chain still jumps to libvirt's chains after dockerd started, when
//! it did before.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

/// Runtime files of a dockerd that `up` started.
const RUN_DIR: &str = "/run/capl-docker";
/// The pid file of a dockerd that `up` started (and only such a dockerd).
const PID_FILE: &str = "/run/capl-docker/dockerd.pid";
/// dockerd's output.
const LOG_FILE: &str = "/run/capl-docker/dockerd.log";
/// How long dockerd may take to answer after it was started.
const START_LIMIT: Duration = Duration::from_secs(90);
/// How long dockerd may take to exit after SIGTERM, before SIGKILL.
const STOP_LIMIT: Duration = Duration::from_secs(30);

#[derive(clap::Subcommand)]
pub enum Command {
    /// Use the docker engine that answers, or install and start dockerd.
    Up,
    /// Stop the dockerd that `up` started (an engine it did not start is left alone).
    Down,
    /// Whether an engine answers, and whether `up` started it.
    Status,
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Up => up().map(|_| ()),
        Command::Down => down(),
        Command::Status => {
            let sh = Shell::new()?;
            match (answers(&sh), ours()) {
                (true, Some(pid)) => {
                    eprintln!("docker engine: dockerd (pid {pid}) started by `cargo xtask docker-engine up`")
                }
                (true, None) => eprintln!("docker engine: answers; not started by cargo xtask (left alone by `down`)"),
                (false, _) => eprintln!("docker engine: none answers `docker info`"),
            }
            Ok(())
        }
    }
}

/// Whether `up` found an engine or started one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// An engine already answered; nobody here stops it.
    Theirs,
    /// `up` started dockerd; [`down`] stops it.
    Ours,
}

/// Whether `docker info` answers within a bound.
pub fn answers(sh: &Shell) -> bool {
    cmd!(sh, "timeout 20 docker info").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// The pid of the dockerd that `up` started, while it runs.
fn ours() -> Option<u32> {
    capl_testbed::private_libvirtd::live_pid(Path::new(PID_FILE), "dockerd")
}

/// An engine that answers: the one there is, or dockerd started here.
pub fn up() -> Result<Engine> {
    let sh = Shell::new()?;
    if answers(&sh) {
        let engine = if ours().is_some() { Engine::Ours } else { Engine::Theirs };
        eprintln!(
            "docker engine: answers ({})",
            if engine == Engine::Ours { "started earlier by xtask" } else { "not ours: used as is" }
        );
        return Ok(engine);
    }
    crate::libvirt_host::require_root(
        "docker-engine up",
        "no docker engine answers `docker info`, and starting dockerd needs root; or start docker yourself, \
         or point DOCKER_HOST at an engine",
    )?;
    install_if_missing(&sh)?;
    let libvirt_before = forward_jumps_to_libvirt(&sh);
    fs::create_dir_all(RUN_DIR).with_context(|| format!("creating {RUN_DIR}"))?;
    let driver = std::env::var(capl_testbed::env::DOCKERD_STORAGE_DRIVER).unwrap_or_else(|_| "vfs".into());
    // A session of its own: dockerd outlives this command and no terminal signal reaches it.
    let script =
        format!("setsid dockerd --storage-driver {driver} --pidfile {PID_FILE} > {LOG_FILE} 2>&1 < /dev/null &");
    cmd!(sh, "sh -c {script}").quiet().run().context("starting dockerd")?;
    let deadline = Instant::now() + START_LIMIT;
    while !answers(&sh) {
        if Instant::now() > deadline {
            let log = fs::read_to_string(LOG_FILE).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
            bail!(
                "dockerd did not answer `docker info` within {START_LIMIT:?}; the end of {LOG_FILE}:\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    if libvirt_before && !forward_jumps_to_libvirt(&sh) {
        bail!(
            "after dockerd started, iptables' FORWARD chain no longer jumps to libvirt's chains \
             (LIBVIRT_FWX/FWI/FWO): libvirt's NAT network would stop forwarding; see `iptables -S FORWARD`"
        );
    }
    eprintln!("docker engine: dockerd started (storage driver {driver}, log {LOG_FILE})");
    Ok(Engine::Ours)
}

/// Stops the dockerd that `up` started; an engine it did not start is left alone.
pub fn down() -> Result<()> {
    let Some(pid) = ours() else {
        eprintln!("docker engine: no dockerd of ours runs ({PID_FILE}); nothing to stop");
        return Ok(());
    };
    let sh = Shell::new()?;
    let pid_arg = pid.to_string();
    cmd!(sh, "kill -TERM {pid_arg}").quiet().run().with_context(|| format!("stopping dockerd (pid {pid})"))?;
    let deadline = Instant::now() + STOP_LIMIT;
    while ours().is_some() {
        if Instant::now() > deadline {
            eprintln!("docker engine: dockerd (pid {pid}) still runs {STOP_LIMIT:?} after SIGTERM: SIGKILL");
            cmd!(sh, "kill -KILL {pid_arg}").quiet().ignore_status().run()?;
            std::thread::sleep(Duration::from_millis(500));
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = fs::remove_file(PID_FILE);
    eprintln!("docker engine: dockerd (pid {pid}) stopped");
    Ok(())
}

/// Installs Debian's/Ubuntu's `docker.io` when there is no `dockerd`.
fn install_if_missing(sh: &Shell) -> Result<()> {
    if ["/usr/sbin/dockerd", "/usr/bin/dockerd"].iter().any(|p| Path::new(p).is_file()) {
        return Ok(());
    }
    eprintln!("docker engine: installing docker.io (no dockerd on this machine)");
    sh.set_var("DEBIAN_FRONTEND", "noninteractive");
    let lock = ["-o", "DPkg::Lock::Timeout=600"];
    cmd!(sh, "apt-get {lock...} update").run().context("apt-get update failed")?;
    cmd!(sh, "apt-get {lock...} install -y --no-install-recommends docker.io")
        .run()
        .context("installing docker.io failed")?;
    Ok(())
}

/// Whether iptables' FORWARD chain jumps to libvirt's chains (false without iptables).
fn forward_jumps_to_libvirt(sh: &Shell) -> bool {
    cmd!(sh, "iptables -S FORWARD").quiet().ignore_stderr().read().is_ok_and(|rules| {
        ["LIBVIRT_FWX", "LIBVIRT_FWI", "LIBVIRT_FWO"].iter().all(|c| rules.contains(&format!("-j {c}")))
    })
}
