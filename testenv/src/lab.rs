//! A lab of several libvirt hosts on one machine, for tests of several hosts:
//!
//! - [`ExtraLibvirtd`]: one more private libvirtd (beside the test host of
//!   [`crate::test_host`]), with state, sockets and pools of its own under a
//!   directory that goes when it is dropped; no TLS listener, no NAT network;
//! - [`LabBridge`]: a Linux bridge with no address, and a network namespace of
//!   its own joined to it by a veth pair, which holds the lab subnet's gateway
//!   address: guests of every daemon plugged into the bridge share one L2, and
//!   no interface outside that namespace gets an address of the lab.
//!
//! Both need root (`unshare`, `mount`, `ip`); they fail naming what is missing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use capl_testbed::private_libvirtd::{self, Dirs, LIBVIRTD_CONF_BASE, UNIX_ONLY_ARGS};

/// How long a started daemon may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `program args`, failing with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} (is it installed? `cargo xtask host deps`)"))?;
    if !out.status.success() {
        bail!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One more private libvirtd, started by the launcher of `cargo xtask host up`'s test host
/// ([`private_libvirtd`]) with directories under [`Self::dir`] bind-mounted over libvirt's
/// system directories, on its unix sockets only. Dropping it destroys its domains, stops
/// it and removes the directory.
pub struct ExtraLibvirtd {
    dir: PathBuf,
    daemon: Dirs,
    uri: String,
}

impl ExtraLibvirtd {
    /// Starts the daemon `name` (a short word; the directory is
    /// `/var/lib/capl-libvirt-lab/<name>-<pid>`) and waits until it answers.
    pub fn start(name: &str) -> Result<Self> {
        let dir = PathBuf::from("/var/lib/capl-libvirt-lab").join(format!("{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let daemon_dirs = Dirs::under(&dir);
        let daemon = Self { uri: daemon_dirs.uri(), daemon: daemon_dirs, dir };
        private_libvirtd::start(&daemon.daemon, LIBVIRTD_CONF_BASE, &UNIX_ONLY_ARGS)?;
        private_libvirtd::wait_until_answering(&daemon.daemon, &format!("the lab libvirtd {name}"), READY_TIMEOUT)?;
        Ok(daemon)
    }

    /// `qemu+unix:///system?socket=<dir>/run/libvirt-sock`.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Where its state, sockets and pools live.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Defines, builds and starts a dir pool `name` under [`Self::dir`].
    pub fn add_dir_pool(&self, name: &str) -> Result<()> {
        let path = self.dir.join("pools").join(name);
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let xml = self.dir.join("etc").join(format!("{name}-pool.xml"));
        let text =
            format!("<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>", path.display());
        fs::write(&xml, text).with_context(|| format!("writing {}", xml.display()))?;
        self.virsh(&["pool-define", &xml.display().to_string()])?;
        self.virsh(&["pool-start", name])?;
        Ok(())
    }

    /// Defines and starts a network `name` in forward mode bridge onto the Linux bridge `bridge`.
    pub fn add_bridged_network(&self, name: &str, bridge: &str) -> Result<()> {
        let xml = self.dir.join("etc").join(format!("{name}-network.xml"));
        let text = format!("<network><name>{name}</name><forward mode='bridge'/><bridge name='{bridge}'/></network>");
        fs::write(&xml, text).with_context(|| format!("writing {}", xml.display()))?;
        self.virsh(&["net-define", &xml.display().to_string()])?;
        self.virsh(&["net-start", name])?;
        Ok(())
    }

    /// `virsh -c <uri> <args>`.
    pub fn virsh(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-q", "-c", &self.uri];
        all.extend_from_slice(args);
        run("virsh", &all)
    }
}

impl Drop for ExtraLibvirtd {
    fn drop(&mut self) {
        if let Ok(running) = self.virsh(&["list", "--name"]) {
            for domain in running.lines().map(str::trim).filter(|d| !d.is_empty()) {
                let _ = self.virsh(&["destroy", domain]);
            }
        }
        let _ = private_libvirtd::stop(&self.daemon);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A Linux bridge with no address, and a network namespace joined to it by a veth pair
/// whose end inside holds `gateway/prefix`. Dropping it deletes the namespace (and with it
/// the veth pair) and the bridge.
pub struct LabBridge {
    bridge: String,
    netns: String,
}

impl LabBridge {
    /// `tag`: a short word that names the bridge (`capl<tag>`, at most 15 characters with
    /// the prefix) and the namespace (`capl-lab-<tag>`).
    pub fn create(tag: &str, gateway: &str, prefix: u8) -> Result<Self> {
        let bridge = format!("capl{tag}");
        if bridge.len() > 15 {
            bail!("bridge name {bridge} is longer than the 15 characters Linux allows: use a shorter tag");
        }
        let lab = Self { bridge, netns: format!("capl-lab-{tag}") };
        let (outside, inside) = (format!("{}o", lab.bridge), format!("{}i", lab.bridge));
        if outside.len() > 15 {
            bail!("veth name {outside} is longer than 15 characters: use a shorter tag");
        }
        lab.remove();
        let address = format!("{gateway}/{prefix}");
        let steps: [&[&str]; 9] = [
            &["link", "add", "name", &lab.bridge, "type", "bridge"],
            &["link", "set", &lab.bridge, "up"],
            &["netns", "add", &lab.netns],
            &["link", "add", &outside, "type", "veth", "peer", "name", &inside],
            &["link", "set", &outside, "master", &lab.bridge],
            &["link", "set", &outside, "up"],
            &["link", "set", &inside, "netns", &lab.netns],
            &["-n", &lab.netns, "addr", "add", &address, "dev", &inside],
            &["-n", &lab.netns, "link", "set", &inside, "up"],
        ];
        for args in steps {
            run("ip", args).context("making the lab bridge and its namespace (as root; iproute2)")?;
        }
        Ok(lab)
    }

    /// The bridge's name, for `<bridge name=...>` of a libvirt network in forward mode bridge.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// Whether `address` answers a ping from inside the namespace (one try, 2 s; busybox's
    /// ping: `busybox-static` is one of the host packages, iputils is not).
    pub fn ping(&self, address: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.netns, "busybox", "ping", "-c", "1", "-W", "2", address])
            .output()
            .is_ok_and(|out| out.status.success())
    }

    fn remove(&self) {
        let _ = run("ip", &["netns", "del", &self.netns]);
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}

impl Drop for LabBridge {
    fn drop(&mut self) {
        self.remove();
    }
}
