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
    /// The manager Deployment of a kind cluster, and the Pods the last kill deleted.
    Pod {
        kubectl: Kubectl,
        killed: Vec<String>,
    },
}

impl Provider {
    /// Where its log is, for messages.
    pub fn log_hint(&self) -> String {
        match self {
            Provider::Process(p) => p.log_path().display().to_string(),
            Provider::Pod { .. } => format!("kubectl logs -n {NAMESPACE} deployment/{DEPLOYMENT}"),
        }
    }

    /// The last `lines` lines of its log (of every manager Pod in a cluster).
    pub fn log_tail(&self, lines: usize) -> String {
        match self {
            Provider::Process(p) => p.log_tail(lines),
            Provider::Pod { kubectl, .. } => kubectl
                .out(&["logs", "-n", NAMESPACE, &format!("deployment/{DEPLOYMENT}"), &format!("--tail={lines}")])
                .unwrap_or_else(|e| format!("({e:#})")),
        }
    }

    /// Fails when the process has exited (a Deployment restarts its Pods itself).
    pub fn ensure_running(&mut self) -> Result<()> {
        match self {
            Provider::Process(p) => p.ensure_running(),
            Provider::Pod { .. } => Ok(()),
        }
    }

    /// Kills it at once, as a crash or an OOM kill would: SIGKILL of the
    /// process; in a cluster, a forced delete (grace period 0) of every
    /// manager Pod, which must succeed.
    pub fn kill(&mut self) -> Result<()> {
        match self {
            Provider::Process(p) => {
                p.kill();
                Ok(())
            }
            Provider::Pod { kubectl, killed } => {
                let pods = kubectl.manager_pod_names()?;
                if pods.all.is_empty() {
                    bail!("no manager Pod in {NAMESPACE} to kill");
                }
                let mut args = vec!["delete", "pods", "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false"];
                args.extend(pods.all.iter().map(String::as_str));
                kubectl.out(&args)?;
                *killed = pods.all;
                Ok(())
            }
        }
    }

    /// Starts it again: the process with the same flags; in a cluster, waits
    /// (bounded) for a new Pod, not one the last kill deleted, to be Ready.
    pub async fn restart(&mut self) -> Result<()> {
        match self {
            Provider::Process(p) => p.restart().await,
            Provider::Pod { kubectl, killed } => {
                let old = std::mem::take(killed);
                crate::harness::wait::until("a new manager Pod Ready after the kill", POD_READY, || async {
                    let pods = crate::blocking(|| kubectl.manager_pod_names())?;
                    if pods.ready.iter().any(|p| !old.contains(p)) {
                        return Ok(Check::Done(()));
                    }
                    Ok(Check::Pending(format!("Pods {:?}, none Ready but the killed {old:?}", pods.all)))
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
            Provider::Pod { .. } => bail!("the provider runs as a Pod here, not as a local process"),
        }
    }
}
