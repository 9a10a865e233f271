//! The guests' network for the upstream specs: a libvirt network in `open`
//! forward mode inside the containerized libvirtd, and routes to its subnet
//! through the container from this machine and from the kind node.
//!
//! libvirt's `nat` mode rejects connections into the guests' subnet that come
//! from another interface (its `LIBVIRT_FWI` chain), so neither the framework
//! nor CAPI's controllers could reach a workload cluster's endpoint. `open`
//! adds no firewall rule: the container forwards between its docker interface
//! and the bridge like a router, and guests answer through the bridge's
//! address. The guests need nothing beyond the subnet (the node image carries
//! every image it runs).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::harness::host_view::HostView;
use crate::harness::kind_cluster::{CLUSTER, Kubectl};
use testenv::test_host::DISK_POOL;

/// The network's name, bridge and subnet (not the private libvirtd's, whose
/// bridge may be up on this machine at the same time).
pub const NAME: &str = "capl-capi-net";
const BRIDGE: &str = "caplcapi0";
const PREFIX: &str = "10.252.0";
/// DHCP hands out .2 to .99; the endpoints are above.
const DHCP: (u8, u8) = (2, 99);
/// The control-plane endpoint of every spec's cluster (one cluster at a time).
pub const ENDPOINT_HOST: &str = "10.252.0.250";

/// `10.252.0.0/24`.
pub fn subnet() -> String {
    format!("{PREFIX}.0/24")
}

fn network_xml() -> String {
    format!(
        "<network>\n  <name>{NAME}</name>\n  <forward mode='open'/>\n  <bridge name='{BRIDGE}' stp='on' delay='0'/>\n  \
         <ip address='{PREFIX}.1' netmask='255.255.255.0'>\n    <dhcp>\n      \
         <range start='{PREFIX}.{}' end='{PREFIX}.{}'/>\n    </dhcp>\n  </ip>\n</network>\n",
        DHCP.0, DHCP.1
    )
}

/// Defines and starts the network and the pools on `host`, and routes the
/// subnet via `via` (the container's address on the docker network) here and
/// in the kind node. The routes go when the returned value is dropped.
pub fn define(host: &HostView, work_dir: &Path, via: &str) -> Result<Routes> {
    let file = work_dir.join("network.xml");
    std::fs::write(&file, network_xml())?;
    host.virsh(&["net-define", &file.display().to_string()])?;
    host.virsh(&["net-start", NAME])?;
    crate::harness::stack::define_container_pools(host, work_dir)?;
    let routes = Routes { subnet: subnet() };
    run("adding the route to the guests on this machine", Command::new("ip").args(routes.args("replace", via)))?;
    let node = format!("{CLUSTER}-control-plane");
    run(
        "adding the route to the guests in the kind node",
        Command::new(docker()).args(["exec", &node, "ip"]).args(routes.args("replace", via)),
    )?;
    Ok(routes)
}

/// The route on this machine (the kind node's goes with the node).
pub struct Routes {
    subnet: String,
}

impl Routes {
    fn args(&self, verb: &str, via: &str) -> Vec<String> {
        ["route", verb, &self.subnet, "via", via].iter().map(|s| s.to_string()).collect()
    }
}

impl Drop for Routes {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["route", "del", &self.subnet]).output();
    }
}

/// The docker client (the real one when kind runs through a wrapper).
fn docker() -> String {
    std::env::var(capl_testbed::env::REAL_DOCKER).unwrap_or_else(|_| "docker".into())
}

fn run(what: &str, command: &mut Command) -> Result<String> {
    let out = command.output().with_context(|| format!("{what}: cannot start {:?}", command.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// This machine's IPv4 address on docker network `network` (its gateway),
/// which the kind cluster's Pods reach.
pub fn docker_gateway(network: &str) -> Result<String> {
    let gateways = run(
        &format!("reading docker network {network}'s gateway"),
        Command::new(docker()).args([
            "network",
            "inspect",
            network,
            "-f",
            "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
        ]),
    )?;
    gateways
        .split_whitespace()
        .find(|g| g.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
        .with_context(|| format!("docker network {network} has no IPv4 gateway (it has {gateways:?})"))
}

/// What is left on the host after the specs: every domain, every volume of
/// the domain pool and every DHCP host (the specs delete their clusters).
pub fn leftovers(host: &HostView) -> Vec<String> {
    let mut left: Vec<String> = host.domains().unwrap_or_default().into_iter().map(|d| format!("domain {d}")).collect();
    left.extend(host.volumes(DISK_POOL).unwrap_or_default().into_iter().map(|v| format!("volume {v}")));
    left.extend(host.dhcp_hosts(NAME).unwrap_or_default().into_iter().map(|h| format!("DHCP host {}", h.name)));
    left
}

/// Gives every control-plane guest more CPU weight than the workers as soon
/// as it runs, as the demo does for its own
/// ([`crate::workload::emulation::favour_control_plane`]). libvirtd in the
/// container has no cgroup CPU controller (`virsh schedinfo` says so), so the
/// weight is set the other way: every thread of the guest's QEMU process (a
/// process of this machine, seen in its `/proc`) gets nice
/// [`CONTROL_PLANE_NICE`], about 3 times the weight of the other guests'
/// threads at nice 0. A running control plane under emulation keeps about 1.6
/// of the 2 cores busy; at 9 times the weight (nice -10) a worker booting
/// beside it got 6 to 40 % of one core and took over 15 minutes to join. The specs make the machines, so a thread
/// looks every few seconds for running LibvirtMachines that
/// KubeadmControlPlane made (its label), until [`ControlPlaneFavour::stop`].
pub struct ControlPlaneFavour {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The nice value of a control-plane guest's QEMU threads (weight 3121 against 1024 at nice 0).
const CONTROL_PLANE_NICE: &str = "-5";

/// How often the host's domains are listed.
const FAVOUR_EVERY: Duration = Duration::from_secs(5);

impl ControlPlaneFavour {
    pub fn start(kubectl: Kubectl) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("capi-specs-favour".into())
            .spawn(move || {
                let mut done: Vec<String> = Vec::new();
                while !stopped.load(Ordering::SeqCst) {
                    for domain in running_control_plane_domains(&kubectl) {
                        if done.contains(&domain) {
                            continue;
                        }
                        match favour(&domain) {
                            Ok(threads) => {
                                eprintln!(
                                    "capi specs: control-plane guest {domain}: its {threads} QEMU threads at nice \
                                     {CONTROL_PLANE_NICE}"
                                );
                                done.push(domain);
                            }
                            Err(err) => eprintln!("capi specs: favouring control-plane guest {domain}: {err:#}"),
                        }
                    }
                    std::thread::park_timeout(FAVOUR_EVERY);
                }
            })
            .ok();
        Self { stop, thread }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// The domains of the running LibvirtMachines KubeadmControlPlane made (its
/// `cluster.x-k8s.io/control-plane` label), in every namespace.
fn running_control_plane_domains(kubectl: &Kubectl) -> Vec<String> {
    let Ok(list) = kubectl.json(&["get", "libvirtmachines", "-A", "-l", "cluster.x-k8s.io/control-plane"]) else {
        return Vec::new();
    };
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["status"]["state"] == "running")
        .filter_map(|m| m["status"]["domainName"].as_str().map(str::to_string))
        .collect()
}

/// Renices every thread of the QEMU process of `domain` (its command line has
/// `guest=<domain>`); returns how many.
fn favour(domain: &str) -> Result<usize> {
    let marker = format!("guest={domain},");
    let pid = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        })
        .with_context(|| format!("no QEMU process of {domain} in /proc"))?;
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().to_str().map(str::to_string)))
        .collect();
    run("renice", Command::new("renice").args(["-n", CONTROL_PLANE_NICE, "-p"]).args(&threads))?;
    Ok(threads.len())
}
