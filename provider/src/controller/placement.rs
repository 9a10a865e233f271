//! Which host of a LibvirtCluster a new machine goes to.
//!
//! A Machine with `spec.failureDomain` goes to the host of that name. Any
//! other goes to the host with the most memory available (see
//! [`NodeMemory::available`]) among those that may run it (control-plane
//! machines only where `controlPlane` is true) and can hold it. Machines
//! placed but not yet defined on their host hold a reservation here, so that
//! machines created at once spread instead of all seeing the same free host;
//! a host's answer given after a domain was created counts that domain itself.
//! The choice is recorded in the LibvirtMachine's status and never made again.

use std::time::Instant;

use capl_host::hypervisor::NodeMemory;
use kube::ResourceExt;

use super::context::Context;
use super::credentials;
use super::error::Error;
use super::reservations::{Reservations, Reserved};
use crate::api::capi::Machine;
use crate::api::conditions::reasons;
use crate::api::{ClusterHost, LibvirtCluster, LibvirtMachine};

/// The label CAPI puts on control-plane Machines.
const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Why a machine could not be placed: a condition to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaced {
    pub reason: &'static str,
    pub message: String,
    /// Retry on a timer (memory may free up, a host may come back).
    pub transient: bool,
}

/// Whether CAPI marked the machine as a control-plane one.
fn is_control_plane(object: &LibvirtMachine, machine: Option<&Machine>) -> bool {
    object.labels().contains_key(CONTROL_PLANE_LABEL)
        || machine.is_some_and(|m| m.labels().contains_key(CONTROL_PLANE_LABEL))
}

/// The host `object` goes to, of LibvirtCluster `lc`, or why it fits nowhere.
/// Asks the candidate hosts for their memory only when there is a choice.
pub async fn place(
    ctx: &Context,
    ns: &str,
    object: &LibvirtMachine,
    machine: Option<&Machine>,
    lc: &LibvirtCluster,
) -> Result<Result<ClusterHost, Unplaced>, Error> {
    let name = object.name_any();
    let lc_name = lc.name_any();
    if let Some(problem) = lc.spec.host_list_problem() {
        return Ok(Err(Unplaced {
            reason: reasons::INVALID_HOSTS,
            message: format!("LibvirtCluster {lc_name}: {problem}"),
            transient: false,
        }));
    }
    let hosts = lc.spec.hosts();
    let control_plane = is_control_plane(object, machine);
    let wanted = machine.and_then(|m| m.spec.failure_domain.clone()).filter(|fd| !fd.is_empty());
    if let Some(fd) = wanted {
        let names: Vec<&str> = hosts.iter().filter_map(|h| h.failure_domain()).collect();
        let Some(host) = hosts.iter().find(|h| h.failure_domain() == Some(fd.as_str())) else {
            let fix = if names.is_empty() {
                format!(
                    "LibvirtCluster {lc_name} has one host (spec.uri) and no failure domains: remove the failure domain, or list hosts in spec.hosts"
                )
            } else {
                format!("set it to one of {} or add a host named {fd:?} to LibvirtCluster {lc_name}", names.join(", "))
            };
            return Ok(Err(Unplaced {
                reason: reasons::FAILURE_DOMAIN_NOT_FOUND,
                message: format!("LibvirtMachine {name}: the Machine's spec.failureDomain {fd:?} names no host: {fix}"),
                transient: false,
            }));
        };
        if control_plane && !host.control_plane {
            return Ok(Err(Unplaced {
                reason: reasons::FAILURE_DOMAIN_NOT_FOUND,
                message: format!(
                    "LibvirtMachine {name} is a control-plane machine and its failure domain {fd:?} is host {} with controlPlane: false: choose a host that takes control-plane machines",
                    host.uri
                ),
                transient: false,
            }));
        }
        return Ok(Ok(host.clone()));
    }
    if lc.spec.hosts.is_none() {
        // The one-host form: nothing to choose, and no memory check (as before hosts existed).
        return Ok(hosts.into_iter().next().ok_or_else(|| Unplaced {
            reason: reasons::INVALID_HOSTS,
            message: format!("LibvirtCluster {lc_name} names no host"),
            transient: false,
        }));
    }
    let candidates: Vec<ClusterHost> = hosts.into_iter().filter(|h| !control_plane || h.control_plane).collect();
    if candidates.is_empty() {
        return Ok(Err(Unplaced {
            reason: reasons::NO_HOST_FITS,
            message: format!(
                "LibvirtMachine {name} is a control-plane machine and no host of LibvirtCluster {lc_name} takes control-plane machines: set controlPlane: true on one"
            ),
            transient: false,
        }));
    }
    let owner = format!("LibvirtMachine {name}");
    let asked = Instant::now();
    let answers = futures::future::join_all(candidates.iter().map(|h| node_memory(ctx, ns, h, &owner))).await;
    let mut memory = Vec::new();
    for answer in answers {
        memory.push(answer?);
    }
    let need = object.spec.memory_mib.max(1) as u64 * MIB;
    let uid = object.uid().unwrap_or_default();
    // Choose and reserve under one lock: a machine placed at the same time sees this one.
    let mut reservations = ctx.placements.lock();
    let chosen = choose(&candidates, &memory, |uri| Reservations::reserved_on(&reservations, uri, asked), need);
    match chosen {
        Ok(i) => {
            let host = candidates[i].clone();
            reservations.insert(uid, Reserved::new(host.uri.clone(), need));
            Ok(Ok(host))
        }
        Err(why) => Ok(Err(Unplaced {
            reason: reasons::NO_HOST_FITS,
            message: format!(
                "LibvirtMachine {name} needs {} MiB and no host of LibvirtCluster {lc_name} can hold it: {why}; free memory on a host, add a host, or give the machine less memory",
                need / MIB
            ),
            transient: true,
        })),
    }
}

const MIB: u64 = 1 << 20;

/// A host's memory, or why it cannot tell.
async fn node_memory(
    ctx: &Context,
    ns: &str,
    host: &ClusterHost,
    owner: &str,
) -> Result<Result<NodeMemory, String>, Error> {
    let opened = match credentials::host_connection_uri(ctx, ns, host, owner, false).await? {
        Ok(opened) => opened,
        Err(unusable) => return Ok(Err(unusable.message)),
    };
    let started = Instant::now();
    let result = ctx.connections.host(&opened).call(|h| h.node_memory()).await;
    ctx.metrics.host_operation("node_memory", started.elapsed());
    Ok(result.map_err(|err| credentials::as_user_wrote_it(err.to_string(), &opened, &host.uri)))
}

/// The index of the host with the most memory available after `reserved`
/// that can hold `need` bytes (the first of equals), or why none can, host by host.
pub fn choose(
    hosts: &[ClusterHost],
    memory: &[Result<NodeMemory, String>],
    reserved: impl Fn(&str) -> u64,
    need: u64,
) -> Result<usize, String> {
    let mut best: Option<(usize, u64)> = None;
    let mut why = Vec::new();
    for (i, (host, answer)) in hosts.iter().zip(memory).enumerate() {
        match answer {
            Ok(m) => {
                let left = m.available().saturating_sub(reserved(&host.uri));
                if left < need {
                    why.push(format!("{} has {} MiB available", host.describe(), left / MIB));
                } else if best.is_none_or(|(_, most)| left > most) {
                    best = Some((i, left));
                }
            }
            Err(err) => why.push(format!("{} did not answer: {err}", host.describe())),
        }
    }
    best.map(|(i, _)| i).ok_or_else(|| why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn host(name: &str) -> ClusterHost {
        ClusterHost {
            name: name.into(),
            uri: format!("sim:///{name}"),
            control_plane: true,
            network: "n".into(),
            base_pool: "b".into(),
            domain_pool: "d".into(),
            credentials: None,
        }
    }

    fn mem(total: u64, free: u64, committed: u64) -> Result<NodeMemory, String> {
        Ok(NodeMemory { total: total * GIB, free: free * GIB, committed: committed * GIB })
    }

    #[test]
    fn the_host_with_the_most_available_memory_wins() {
        let hosts = [host("a"), host("b"), host("c")];
        let memory = [mem(16, 10, 4), mem(16, 14, 2), mem(32, 8, 0)];
        assert_eq!(choose(&hosts, &memory, |_| 0, 2 * GIB), Ok(1));
    }

    #[test]
    fn committed_memory_of_stopped_domains_counts() {
        // b has more free memory, but its defined domains may take 15 of its 16 GiB.
        let hosts = [host("a"), host("b")];
        let memory = [mem(16, 6, 10), mem(16, 14, 15)];
        assert_eq!(choose(&hosts, &memory, |_| 0, 2 * GIB), Ok(0));
    }

    #[test]
    fn reservations_spread_machines_placed_at_once() {
        let hosts = [host("a"), host("b")];
        let memory = [mem(16, 16, 0), mem(16, 16, 0)];
        assert_eq!(choose(&hosts, &memory, |_| 0, 2 * GIB), Ok(0));
        assert_eq!(choose(&hosts, &memory, |uri| if uri == "sim:///a" { 2 * GIB } else { 0 }, 2 * GIB), Ok(1));
    }

    #[test]
    fn a_full_or_silent_host_is_skipped_and_named_when_nothing_fits() {
        let hosts = [host("a"), host("b")];
        let memory = [mem(16, 1, 0), Err("connection refused".to_string())];
        let why = choose(&hosts, &memory, |_| 0, 2 * GIB).unwrap_err();
        assert!(why.contains("host a (sim:///a) has 1024 MiB available"), "{why}");
        assert!(why.contains("host b (sim:///b) did not answer: connection refused"), "{why}");
        let memory = [mem(16, 1, 0), mem(16, 4, 0)];
        assert_eq!(choose(&hosts, &memory, |_| 0, 2 * GIB), Ok(1));
    }
}
