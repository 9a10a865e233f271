//! Every scenario, in the order the suite runs them, with what each needs
//! of the stack.

use anyhow::Result;

use crate::harness::management::ManagementKind;
use crate::harness::stack::{Backend, Stack, StackConfig};
use crate::scenarios::{clusterctl_move, deployed, init, machine, multihost, upgrade};

/// The future a scenario returns: a one-line observation on success.
pub type ScenarioFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<String>> + 'a>>;
/// A scenario's entry point.
pub type ScenarioFn = for<'a> fn(&'a mut Stack) -> ScenarioFuture<'a>;

/// A scenario: a name for the summary and the function that runs it.
pub struct Scenario {
    pub name: &'static str,
    /// Short id for `--only` and for namespace names.
    pub id: &'static str,
    pub run: ScenarioFn,
    /// What it needs of the stack.
    pub needs: Needs,
}

/// What a scenario needs of the stack beyond a libvirt host and a management cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Any stack.
    Any,
    /// The private libvirtd (`cargo xtask host up`), for the reason given: its
    /// guests are routable from this machine, and other hosts can share its bridge.
    PrivateLibvirtd(&'static str),
    /// The local control plane and the provider as a local process (the
    /// scenario starts a second one of each), and the private libvirtd (it
    /// checks the volumes' files, by inode, on this machine's disk).
    LocalProcessesAndPrivateLibvirtd,
    /// The kind management cluster, with the provider as its Pod.
    Kind,
    /// The kind management cluster, made with the previous release of this
    /// provider (the scenario upgrades it; the scenarios after it run on the
    /// upgraded installation).
    KindFromPreviousRelease,
    /// Not the kind management cluster, for the reason given.
    NotKind(&'static str),
}

/// Why the scenarios of the provider's own logic run on the local management
/// cluster only: what they check does not depend on where the provider runs,
/// and on kind Cluster API's specs create, scale, replace and delete Machines
/// through the provider's Pod.
const SAME_ON_KIND: &str = "checks the provider's logic, which is the same on kind; \
     on kind, Cluster API's specs drive Machines through the provider's Pod";

impl Scenario {
    /// Why it cannot run on a stack of `config`, if it cannot.
    pub fn unmet(&self, config: &StackConfig) -> Option<String> {
        let kind = config.management == ManagementKind::Kind;
        match self.needs {
            Needs::Any => None,
            Needs::PrivateLibvirtd(why) => (!matches!(config.backend, Backend::Libvirt { .. }))
                .then(|| format!("needs the private libvirtd: {why}")),
            Needs::LocalProcessesAndPrivateLibvirtd => (kind || !matches!(config.backend, Backend::Libvirt { .. }))
                .then(|| {
                    "needs the local control plane, the provider as a local process and the private libvirtd \
                     (it starts a second manager and reads the volumes' inodes on this machine's disk)"
                        .to_string()
                }),
            Needs::Kind | Needs::KindFromPreviousRelease => {
                (!kind).then(|| "needs the kind management cluster (--kind)".to_string())
            }
            Needs::NotKind(why) => kind.then(|| why.to_string()),
        }
    }
}

/// All scenarios, in the order they run.
pub fn all() -> Vec<Scenario> {
    vec![
        // First: it needs nothing of the stack (a fresh API server of its own) and takes seconds.
        Scenario {
            name: "clusterctl init into a fresh management cluster",
            id: "init",
            run: |s| Box::pin(init::clusterctl_init(s)),
            needs: Needs::NotKind("the kind management cluster was made by clusterctl init"),
        },
        // First on kind: the rest of the suite runs on the upgraded installation.
        Scenario {
            name: "clusterctl upgrade from the previous release; machines untouched",
            id: "upgrade",
            run: |s| Box::pin(upgrade::upgrade(s)),
            needs: Needs::KindFromPreviousRelease,
        },
        Scenario {
            name: "the provider's Pod: Ready, leading, nonroot, read-only; rollout restart",
            id: "deployed",
            run: |s| Box::pin(deployed::deployed(s)),
            needs: Needs::Kind,
        },
        Scenario {
            name: "single machine, bootstrap Secret by name",
            id: "single",
            run: |s| Box::pin(machine::single_machine(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "MachineDeployment scaled 1 -> 3 -> 1",
            id: "md",
            run: |s| Box::pin(machine::machine_deployment(s)),
            needs: Needs::NotKind(SAME_ON_KIND),
        },
        Scenario {
            name: "paused Cluster creates nothing; unpaused it does",
            id: "pause",
            run: |s| Box::pin(machine::pause(s)),
            needs: Needs::NotKind(SAME_ON_KIND),
        },
        Scenario {
            name: "provider killed mid-create and restarted",
            id: "restart",
            run: |s| Box::pin(machine::restart(s)),
            needs: Needs::Any,
        },
        Scenario {
            name: "domain stopped behind the provider's back",
            id: "stopped",
            run: |s| Box::pin(machine::stopped_domain(s)),
            needs: Needs::NotKind(SAME_ON_KIND),
        },
        Scenario {
            name: "Cluster deletion removes everything it made",
            id: "delete",
            run: |s| Box::pin(machine::cluster_deletion(s)),
            needs: Needs::NotKind(SAME_ON_KIND),
        },
        Scenario {
            name: "one Cluster over two hosts on one bridge, addresses and endpoint from IPAM",
            id: "multihost",
            run: |s| Box::pin(multihost::multihost(s)),
            needs: Needs::PrivateLibvirtd("a second libvirtd shares its bridge"),
        },
        // Last: it adds clusterctl's inventory to the stack's management cluster.
        Scenario {
            name: "clusterctl move to a second management cluster",
            id: "move",
            run: |s| Box::pin(clusterctl_move::clusterctl_move(s)),
            // Also the private libvirtd: it reads the volumes' inodes on this machine's disk.
            needs: Needs::LocalProcessesAndPrivateLibvirtd,
        },
        // Last on kind: the log of every scenario's reconciles.
        Scenario {
            name: "the provider Pods' logs after every scenario",
            id: "pod-logs",
            run: |s| Box::pin(deployed::pod_logs(s)),
            needs: Needs::Kind,
        },
    ]
}
