//! The provider under test: its manager binary as a local process (the
//! local control plane), or the Deployment `clusterctl init` made in a kind
//! cluster, as users run it. The scenarios kill and restart it the same way
//! on both: SIGKILL of the process, or a forced delete of the Pod (the
//! kubelet kills the container, the Deployment makes a new Pod).

use std::time::Duration;

use anyhow::{Result, bail};

use crate::harness::kind_cluster::{DEPLOYMENT, Kubectl, NAMESPACE};
use crate::harness::provider_process::ProviderProcess;
use crate::harness::wait::Check;

/// How long a new manager Pod may take to be Ready after the old one was killed.
const POD_READY: Duration = Duration::from_secs(180);

pub enum Provider {
    Process(ProviderProcess),
    /// The manager Deployment of a kind cluster.
    Pod(Kubectl),
}

impl Provider {
    /// Where its log is, for messages.
    pub fn log_hint(&self) -> String {
        match self {
            Provider::Process(p) => p.log_path().display().to_string(),
            Provider::Pod(_) => format!("kubectl logs -n {NAMESPACE} deployment/{DEPLOYMENT}"),
        }
    }

    /// The last `lines` lines of its log (of every manager Pod in a cluster).
    pub fn log_tail(&self, lines: usize) -> String {
        match self {
            Provider::Process(p) => p.log_tail(lines),
            Provider::Pod(kubectl) => kubectl
                .out(&["logs", "-n", NAMESPACE, &format!("deployment/{DEPLOYMENT}"), &format!("--tail={lines}")])
                .unwrap_or_else(|e| format!("({e:#})")),
        }
    }

    /// Fails when the process has exited (a Deployment restarts its Pods itself).
    pub fn ensure_running(&mut self) -> Result<()> {
        match self {
            Provider::Process(p) => p.ensure_running(),
            Provider::Pod(_) => Ok(()),
        }
    }

    /// Kills it at once, as a crash or an OOM kill would: SIGKILL of the
    /// process; in a cluster, a forced delete (grace period 0) of every
    /// manager Pod.
    pub fn kill(&mut self) {
        match self {
            Provider::Process(p) => p.kill(),
            Provider::Pod(kubectl) => {
                let selector = crate::harness::kind_cluster::POD_SELECTOR;
                let _ = kubectl.out(&[
                    "delete",
                    "pods",
                    "-n",
                    NAMESPACE,
                    "-l",
                    selector,
                    "--grace-period=0",
                    "--force",
                    "--wait=false",
                ]);
            }
        }
    }

    /// Starts it again: the process with the same flags; in a cluster, waits
    /// (bounded) for a new Pod to be Ready.
    pub async fn restart(&mut self) -> Result<()> {
        match self {
            Provider::Process(p) => p.restart().await,
            Provider::Pod(kubectl) => {
                crate::harness::wait::until("a manager Pod Ready after the kill", POD_READY, || async {
                    let pods = crate::blocking(|| kubectl.manager_pod_names())?;
                    if !pods.ready.is_empty() {
                        return Ok(Check::Done(()));
                    }
                    Ok(Check::Pending(format!("Pods {:?}, none Ready", pods.all)))
                })
                .await
            }
        }
    }

    /// The process, for what only a local process can do (the `move`
    /// scenario's second manager, the demo).
    pub fn process(&self) -> Result<&ProviderProcess> {
        match self {
            Provider::Process(p) => Ok(p),
            Provider::Pod(_) => bail!("the provider runs as a Pod here, not as a local process"),
        }
    }
}
