//! The steps that form and grow a workload cluster, shared by the `workload`
//! scenarios and `cargo xtask demo`:
//! 1. the control-plane VM runs with an address (checked on the host);
//! 2. `kubeadm init` is done: the KubeadmControlPlane is initialized;
//! 3. the control plane is Available while its machine is the only guest: its
//!    Node Ready through the endpoint, its Machine Running with a nodeRef and
//!    the Node's providerID its LibvirtMachine's, KCP Available;
//! 4. one worker: the MachineDeployment scaled 0 -> 1, two Nodes Ready, two
//!    Machines Running, providerIDs;
//! 5. a workload is served across the two nodes: a Service's two replicas,
//!    one on each node, answer a Pod on the control-plane node that found the
//!    Service by name ([`super::service`]).
//!
//! Each step has a bound ([`Bounds::DOCUMENTED`]). A step that does not finish
//! within it, or that fails (kubeadm's own error on a guest's console fails it
//! at once), fails with a [`Stuck`] that names the step and quotes what the
//! cluster showed then ([`super::diagnose::diagnose`]).
//!
//! The worker boots only once KCP is Available: with a worker beside it, a
//! control plane whose CPUs QEMU emulates on 2 cores answers KCP's etcd and
//! readiness checks too slowly for minutes on end.

use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::client::{check_provider_ids, node_ready, wait_machines_running, wait_nodes_ready, workload_client};
use super::cluster::{CLUSTER, domains, kubeadm_control_plane};
use super::diagnose::{compact, condition_text, diagnose, kubeadm_failure};
use super::render::{Flavor, ServedImage, apply_flavor};
use crate::harness::machines::{Running, check_on_host, describe, running_facts};
use crate::harness::objects::{self, Kind};
use crate::harness::stack::Stack;
use crate::harness::wait::{Answered, Check, until};

/// How long each step may take. Ceilings, not expectations: QEMU emulates
/// every instruction of the guests on a 2-core machine, and the guests get
/// what CPU the machine has left.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// From `kubectl apply` to the control-plane VM running with its address.
    pub vm_started: Duration,
    /// From the VM running to `kubeadm init` done (KCP initialized); 3 to 8 minutes measured.
    pub kubeadm_init: Duration,
    /// From `kubeadm init` done to KCP Available with its Node Ready; about 2 minutes measured.
    pub control_plane_available: Duration,
    /// For a worker to be created, boot, join and become Ready; 3 to 19 minutes
    /// measured, the worker waiting for its kubelet's certificate while the
    /// control plane, sharing the 2 cores with it, restarted its controller manager.
    pub worker_joined: Duration,
    /// For a Service's two replicas to run, one on each node, and answer a
    /// client Pod; under a minute measured.
    pub service_answers: Duration,
}

impl Bounds {
    /// The bounds the demo documents and the scenarios use.
    pub const DOCUMENTED: Bounds = Bounds {
        vm_started: Duration::from_secs(10 * 60),
        kubeadm_init: Duration::from_secs(25 * 60),
        control_plane_available: Duration::from_secs(15 * 60),
        worker_joined: Duration::from_secs(30 * 60),
        service_answers: Duration::from_secs(10 * 60),
    };

    /// Every bound multiplied by `factor` (positive).
    pub fn scaled(self, factor: f64) -> Bounds {
        let scale = |d: Duration| d.mul_f64(factor);
        Bounds {
            vm_started: scale(self.vm_started),
            kubeadm_init: scale(self.kubeadm_init),
            control_plane_available: scale(self.control_plane_available),
            worker_joined: scale(self.worker_joined),
            service_answers: scale(self.service_answers),
        }
    }

    /// The bound of `step`.
    pub fn of(&self, step: Step) -> Duration {
        match step {
            Step::ControlPlaneVm => self.vm_started,
            Step::KubeadmInit => self.kubeadm_init,
            Step::ControlPlaneAvailable => self.control_plane_available,
            Step::WorkerJoined => self.worker_joined,
            Step::ServiceAnswers => self.service_answers,
        }
    }
}

/// The steps, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    ControlPlaneVm,
    KubeadmInit,
    ControlPlaneAvailable,
    WorkerJoined,
    ServiceAnswers,
}

impl Step {
    pub const ALL: [Step; 5] = [
        Step::ControlPlaneVm,
        Step::KubeadmInit,
        Step::ControlPlaneAvailable,
        Step::WorkerJoined,
        Step::ServiceAnswers,
    ];

    /// What the step waits for, as the demo says it.
    pub fn title(self) -> &'static str {
        match self {
            Step::ControlPlaneVm => "the control-plane VM runs with an address",
            Step::KubeadmInit => "kubeadm init on the control-plane machine (KubeadmControlPlane initialized)",
            Step::ControlPlaneAvailable => {
                "the control plane Available (its Node Ready, its Machine Running, KubeadmControlPlane Available)"
            }
            Step::WorkerJoined => "the worker joins (two Nodes Ready, two Machines Running)",
            Step::ServiceAnswers => {
                "a Service answers across the nodes (its replicas on both, found by name from the control-plane node)"
            }
        }
    }

    fn number(self) -> usize {
        Step::ALL.iter().position(|s| *s == self).unwrap_or(0) + 1
    }
}

/// A step that did not finish within its bound, or failed: which one, and what
/// the cluster showed.
#[derive(Debug)]
pub struct Stuck {
    pub step: Step,
    pub bound: Duration,
    /// The wait's or the failure's own words.
    pub cause: String,
    /// [`diagnose`]'s report, taken when the step ended.
    pub diagnosis: String,
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stuck at step {} of {}, {} (bound {}): {}\nwhat the cluster shows:\n{}",
            self.step.number(),
            Step::ALL.len(),
            self.step.title(),
            span(self.bound),
            self.cause,
            self.diagnosis
        )
    }
}

impl std::error::Error for Stuck {}

/// The control plane once Available.
pub(crate) struct ControlPlane {
    /// The KubeadmControlPlane's name.
    pub(crate) kcp: String,
    /// A client of the workload cluster, through the endpoint.
    pub(crate) workload: Client,
}

/// The cluster with its worker.
pub(crate) struct Grown {
    /// Both Nodes, Ready.
    pub(crate) nodes: Vec<Node>,
}

type Say<'a> = Box<dyn Fn(String) + Send + Sync + 'a>;

/// A workload cluster being formed in a namespace of a [`Stack`].
pub(crate) struct Formation<'a> {
    stack: &'a Stack,
    ns: String,
    bounds: Bounds,
    client: Client,
    kcps: Api<DynamicObject>,
    started: Instant,
    rows: Mutex<Vec<(String, f64)>>,
    say: Say<'a>,
    /// The node image's web server, serving while the cluster lives.
    image: ServedImage,
}

impl<'a> Formation<'a> {
    /// Serves the node image, renders `flavor` for one control-plane machine and
    /// no worker and applies it ([`apply_flavor`]); the clock of the timing table starts here.
    pub(crate) fn apply(stack: &'a Stack, ns: &str, flavor: Flavor, bounds: Bounds, say: Say<'a>) -> Result<Self> {
        let started = Instant::now();
        let image = apply_flavor(stack, ns, flavor, &say)?;
        let client = stack.client();
        let kcps = Api::namespaced_with(client.clone(), ns, &kubeadm_control_plane());
        let rows = Mutex::new(Vec::new());
        Ok(Self { stack, ns: ns.to_string(), bounds, client, kcps, started, rows, say, image })
    }

    /// The node image the machines name by URL.
    pub(crate) fn image(&self) -> &ServedImage {
        &self.image
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Says `what` with the seconds since `kubectl apply`, and keeps it for [`Self::table`].
    pub(crate) fn mark(&self, what: impl Into<String>) {
        let what = what.into();
        let seconds = self.started.elapsed().as_secs_f64();
        (self.say)(format!("{what} at {seconds:.0} s"));
        self.rows.lock().expect("timings lock").push((what, seconds));
    }

    /// The marks so far, as a table of seconds since `kubectl apply`.
    pub(crate) fn table(&self) -> String {
        let rows = self.rows.lock().expect("timings lock");
        let width = rows.iter().map(|(w, _)| w.len()).max().unwrap_or(5);
        let mut out = format!("{:<width$}  {:>7}\n", "event", "seconds");
        for (what, seconds) in rows.iter() {
            out.push_str(&format!("{what:<width$}  {seconds:>7.0}\n"));
        }
        out
    }

    /// Steps 1 to 3: the control-plane machine alone, up to KCP Available.
    pub(crate) async fn control_plane(&self) -> Result<ControlPlane> {
        let (stack, client, ns) = (self.stack, &self.client, self.ns.as_str());
        let vm = self
            .step(Step::ControlPlaneVm, |deadline| async move {
                let vm = until("the control-plane LibvirtMachine to run with an address", left(deadline), || async {
                    let lms = objects::list(client, ns, Kind::LibvirtMachine).await?;
                    let running: Vec<Running> = lms.iter().filter_map(running_facts).collect();
                    Ok(match running.into_iter().next() {
                        Some(run) => Check::Done(run),
                        None => Check::Pending(lms.iter().map(describe).collect::<Vec<_>>().join("; ")),
                    })
                })
                .await?;
                check_on_host(stack, &vm).await?;
                super::emulation::favour_control_plane(stack.libvirt()?, &vm.domain)?;
                Ok(vm)
            })
            .await?;
        self.mark("control-plane VM started");

        // The KubeadmControlPlane is found by listing; there is one.
        let kcps = &self.kcps;
        let cp_domain = std::slice::from_ref(&vm.domain);
        let kcp = self
            .step(Step::KubeadmInit, |deadline| async move {
                until("the KubeadmControlPlane to be initialized (kubeadm init)", left(deadline), || async {
                    fail_if_kubeadm_failed(stack, cp_domain)?;
                    let list = kcps.list(&ListParams::default()).await?.items;
                    Ok(match list.as_slice() {
                        [kcp] if kcp.data["status"]["initialization"]["controlPlaneInitialized"] == true => {
                            Check::Done(objects::name(kcp))
                        }
                        [kcp] => Check::Pending(format!("status {}", compact(&kcp.data["status"]))),
                        other => Check::Pending(format!("{} KubeadmControlPlanes", other.len())),
                    })
                })
                .await
            })
            .await?;
        self.mark("kubeadm init done (KCP initialized)");

        let kcp_name = kcp.as_str();
        let workload = self
            .step(Step::ControlPlaneAvailable, |deadline| async move {
                let workload = workload_client(client, ns, left(deadline)).await?;
                let nodes = wait_nodes_ready(&Api::all(workload.clone()), 1, left(deadline)).await?;
                self.mark("control-plane Node Ready");
                wait_machines_running(client, ns, 1, left(deadline)).await?;
                check_provider_ids(client, ns, &nodes).await?;
                kcp_available(client, ns, kcps, kcp_name, left(deadline)).await?;
                Ok(workload)
            })
            .await?;
        self.mark("KCP Available, its Machine Running with a nodeRef");
        Ok(ControlPlane { kcp, workload })
    }

    /// Step 4: one worker (the MachineDeployment scaled from 0 to 1) joins: two
    /// Nodes Ready with their LibvirtMachines' providerIDs, two Machines Running
    /// with a nodeRef.
    pub(crate) async fn add_worker(&self, cp: &ControlPlane) -> Result<Grown> {
        self.step(Step::WorkerJoined, |deadline| async move { self.workers_joined(cp, 1, deadline).await }).await
    }

    /// Step 5: a Service whose replicas run on both nodes answers a client Pod
    /// on the control-plane node that found it by name ([`super::service`]).
    pub(crate) async fn serve_across_nodes(&self, cp: &ControlPlane, grown: &Grown) -> Result<String> {
        let answered = self
            .step(Step::ServiceAnswers, |deadline| async move {
                super::service::across_nodes(&cp.workload, &grown.nodes, left(deadline), &*self.say).await
            })
            .await?;
        self.mark("a Service answered across the nodes");
        Ok(answered)
    }

    async fn workers_joined(&self, cp: &ControlPlane, workers: u32, deadline: Instant) -> Result<Grown> {
        let (stack, client, ns) = (self.stack, &self.client, self.ns.as_str());
        let nodes_api: Api<Node> = Api::all(cp.workload.clone());
        let count = workers as usize + 1;
        self.scale_workers(workers).await?;
        let nodes =
            until(&format!("exactly {count} Nodes, all Ready, in the workload cluster"), left(deadline), || async {
                let domains = domains(stack, ns)?;
                fail_if_kubeadm_failed(stack, &domains)?;
                let list = nodes_api.list(&ListParams::default()).await.answered("listing Nodes")?.items;
                let ready = list.iter().filter(|n| node_ready(n)).count();
                Ok(if list.len() == count && ready == count {
                    Check::Done(list)
                } else {
                    let seen: Vec<String> =
                        list.iter().map(|n| format!("{} ready={}", n.name_any(), node_ready(n))).collect();
                    Check::Pending(format!("Nodes {seen:?}, domains {domains:?}"))
                })
            })
            .await?;
        self.mark(format!("{workers} worker(s): {count} Nodes Ready"));
        wait_machines_running(client, ns, count, left(deadline)).await?;
        check_provider_ids(client, ns, &nodes).await?;
        self.mark(format!("{count} Machines Running with a nodeRef"));
        Ok(Grown { nodes })
    }

    /// Sets the number of workers: the MachineDeployment's replicas.
    pub(crate) async fn scale_workers(&self, replicas: u32) -> Result<()> {
        let (client, ns) = (&self.client, self.ns.as_str());
        let md = format!("{CLUSTER}-md-0");
        let current = objects::get(client, ns, Kind::MachineDeployment, &md)
            .await?
            .with_context(|| format!("MachineDeployment {ns}/{md} does not exist"))?;
        let from = current.data["spec"]["replicas"].clone();
        objects::merge_patch(client, ns, Kind::MachineDeployment, &md, json!({"spec": {"replicas": replicas}})).await?;
        (self.say)(format!("MachineDeployment {md} scaled {from} -> {replicas}"));
        Ok(())
    }

    /// Runs one step with its bound ([`run_step`]), with [`diagnose`]'s report
    /// when it fails.
    async fn step<T, F, Fut>(&self, step: Step, run: F) -> Result<T>
    where
        F: FnOnce(Instant) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        run_step(step, self.bounds.of(step), &self.say, run, || diagnose(self.stack, &self.ns)).await
    }
}

/// Watches a KubeadmControlPlane's `Available` condition from when it is made
/// until [`KcpWatch::finish`]: every state the API server reports is looked at,
/// so a control plane that stops being Available while workers join or leave is
/// seen even if it recovers before the next step.
pub(crate) struct KcpWatch {
    task: tokio::task::JoinHandle<()>,
    lapses: std::sync::Arc<Mutex<Vec<String>>>,
    name: String,
}

impl KcpWatch {
    pub(crate) fn start(formation: &Formation<'_>, name: &str) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let lapses = std::sync::Arc::new(Mutex::new(Vec::new()));
        let seen = lapses.clone();
        let api = formation.kcps.clone();
        let started = formation.started;
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).default_backoff().applied_objects().boxed();
            while let Some(event) = stream.next().await {
                let Ok(kcp) = event else { continue };
                if !matches!(objects::condition(&kcp, "Available"), Some(("True", _))) {
                    let at = started.elapsed().as_secs();
                    seen.lock().expect("lapses lock").push(format!(
                        "at {at} s: Available {}; EtcdClusterHealthy {}",
                        condition_text(&kcp, "Available"),
                        condition_text(&kcp, "EtcdClusterHealthy")
                    ));
                }
            }
        });
        Self { task, lapses, name: name.to_string() }
    }

    /// Stops watching; fails with every state seen in which the control plane was not Available.
    pub(crate) fn finish(self, during: &str) -> Result<()> {
        let lapses = self.lapses.lock().expect("lapses lock");
        if !lapses.is_empty() {
            bail!("KubeadmControlPlane {} stopped being Available while {during}:\n{}", self.name, lapses.join("\n"));
        }
        Ok(())
    }
}

/// A run that fails before [`KcpWatch::finish`] drops the watch: its task
/// stops then too, rather than watching a deleted namespace until the process ends.
impl Drop for KcpWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs one step with its bound: says what it waits for, and turns a failure
/// or a timeout into a [`Stuck`] with the report `diagnose` gives then. `run`
/// gets the step's deadline; the waits inside end there with what they saw
/// last, and a call that would hold the step longer is cut off shortly after.
async fn run_step<T, F, Fut, D, DFut>(
    step: Step,
    bound: Duration,
    say: &dyn Fn(String),
    run: F,
    diagnose: D,
) -> Result<T>
where
    F: FnOnce(Instant) -> Fut,
    Fut: Future<Output = Result<T>>,
    D: FnOnce() -> DFut,
    DFut: Future<Output = String>,
{
    say(format!("step {}/{}: {} (at most {})", step.number(), Step::ALL.len(), step.title(), span(bound)));
    let deadline = Instant::now() + bound;
    let backstop = bound + BACKSTOP.min(bound);
    let outcome = match tokio::time::timeout(backstop, run(deadline)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(anyhow::anyhow!("no answer within {backstop:?}")),
    };
    match outcome {
        Ok(value) => Ok(value),
        Err(err) => Err(Stuck { step, bound, cause: format!("{err:#}"), diagnosis: diagnose().await }.into()),
    }
}

/// How long past its bound a step's calls may hold it before it is cut off
/// (at most the bound again).
const BACKSTOP: Duration = Duration::from_secs(60);

/// A bound as people say it: whole minutes, or seconds below one.
pub fn span(bound: Duration) -> String {
    match bound.as_secs() {
        s if s >= 60 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The time left until `deadline`.
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Fails with kubeadm's own error when the console of one of `domains` shows
/// that `kubeadm init` or `join` failed.
fn fail_if_kubeadm_failed(stack: &Stack, domains: &[String]) -> Result<()> {
    for domain in domains {
        if let Some(failure) = kubeadm_failure(&stack.console_log(domain)) {
            bail!("kubeadm failed in domain {domain}:\n{failure}");
        }
    }
    Ok(())
}

/// Waits for the KubeadmControlPlane `name` to be Available. While it is not, the
/// timeout error says why in KCP's words: its `Available` and `EtcdClusterHealthy`
/// messages and each control-plane Machine's `EtcdMemberHealthy` message (which
/// carries the etcd client's error).
async fn kcp_available(
    client: &Client,
    ns: &str,
    kcps: &Api<DynamicObject>,
    name: &str,
    within: Duration,
) -> Result<()> {
    until(&format!("KubeadmControlPlane {name} to be Available"), within, || async {
        let kcp = kcps.get_opt(name).await?.context("the KubeadmControlPlane is gone")?;
        if let Some(("True", _)) = objects::condition(&kcp, "Available") {
            return Ok(Check::Done(()));
        }
        let mut seen = vec![
            format!("Available {}", condition_text(&kcp, "Available")),
            format!("EtcdClusterHealthy {}", condition_text(&kcp, "EtcdClusterHealthy")),
        ];
        for machine in objects::list(client, ns, Kind::Machine).await? {
            if machine.labels().contains_key("cluster.x-k8s.io/control-plane") {
                seen.push(format!(
                    "Machine {} EtcdMemberHealthy {}",
                    machine.name_any(),
                    condition_text(&machine, "EtcdMemberHealthy")
                ));
            }
        }
        Ok(Check::Pending(seen.join("; ")))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet(_: String) {}

    #[tokio::test]
    async fn a_step_that_is_not_done_in_its_bound_names_itself_and_what_was_seen() {
        let err = run_step(
            Step::WorkerJoined,
            Duration::from_secs(2),
            &quiet,
            |deadline| async move {
                until("exactly 2 Nodes, all Ready", left(deadline), || async {
                    Ok(Check::<()>::Pending("Nodes [\"wl-cp ready=true\"]".into()))
                })
                .await
            },
            || async { "Machine wl-md-0-x: phase Provisioned".to_string() },
        )
        .await
        .expect_err("never done");
        let stuck = err.downcast_ref::<Stuck>().expect("a Stuck");
        assert_eq!(stuck.step, Step::WorkerJoined);
        let text = err.to_string();
        assert!(text.starts_with("stuck at step 4 of 5, the worker joins"), "{text}");
        assert!(text.contains("(bound 2 s): timed out after"), "{text}");
        assert!(text.contains("waiting for exactly 2 Nodes, all Ready; last seen:"), "{text}");
        assert!(text.contains("wl-cp ready=true"), "{text}");
        assert!(text.ends_with("what the cluster shows:\nMachine wl-md-0-x: phase Provisioned"), "{text}");
    }

    #[tokio::test]
    async fn a_call_that_never_returns_is_cut_off_after_the_bound() {
        let started = Instant::now();
        let err = run_step(
            Step::KubeadmInit,
            Duration::from_secs(1),
            &quiet,
            |_| std::future::pending::<Result<()>>(),
            || async { String::new() },
        )
        .await
        .expect_err("cut off");
        assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
        let stuck = err.downcast_ref::<Stuck>().expect("a Stuck");
        assert_eq!(stuck.step, Step::KubeadmInit);
        assert_eq!(stuck.cause, "no answer within 2s");
    }

    #[tokio::test]
    async fn a_failure_inside_a_step_is_reported_at_once_with_the_step() {
        let started = Instant::now();
        let err = run_step(
            Step::ControlPlaneVm,
            Duration::from_secs(600),
            &quiet,
            |_| async { Err::<(), _>(anyhow::anyhow!("kubeadm failed in domain d")) },
            || async { "guest d".to_string() },
        )
        .await
        .expect_err("failed");
        assert!(started.elapsed() < Duration::from_secs(30));
        let stuck = err.downcast_ref::<Stuck>().expect("a Stuck");
        assert_eq!((stuck.step, stuck.cause.as_str()), (Step::ControlPlaneVm, "kubeadm failed in domain d"));
    }

    /// The book's table of the demo's steps and bounds is the code's.
    #[test]
    fn the_book_documents_each_step_with_its_bound() {
        let page = crate::repo_root().join("docs/src/getting-started.md");
        let text = std::fs::read_to_string(&page).expect("the getting-started page");
        let rows: Vec<(String, String)> = text
            .lines()
            .skip_while(|l| !l.starts_with("| Step | Bound |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
                (cells[0].to_string(), cells[1].to_string())
            })
            .collect();
        let code: Vec<(String, String)> =
            Step::ALL.iter().map(|s| (s.title().to_string(), span(Bounds::DOCUMENTED.of(*s)))).collect();
        assert_eq!(rows, code, "{} differs from the demo's steps", page.display());
    }
}
