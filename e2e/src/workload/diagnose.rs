//! What a workload cluster that is stuck or failed shows: the Machines'
//! phases, the KubeadmControlPlane's conditions, the MachineDeployments'
//! replicas and each guest's kubeadm lines from its serial console (cloud-init
//! prints kubeadm's output there).

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::client::{pod_state, workload_client};
use super::cluster::{domains, kubeadm_control_plane};
use crate::harness::objects::{self, Kind};
use crate::harness::stack::Stack;

/// How long one look-up of a report may take: a report of a stuck cluster must
/// not get stuck itself.
const LOOKUP: Duration = Duration::from_secs(20);
/// How many kubeadm lines of each guest a report quotes.
const KUBEADM_LINES: usize = 12;

async fn bounded<T>(call: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(LOOKUP, call).await.map_err(|_| anyhow::anyhow!("no answer within {LOOKUP:?}"))?
}

/// The state of the namespace's workload cluster, as lines a person reads: each
/// Machine's phase, node and infrastructure Ready condition; each
/// KubeadmControlPlane's conditions; each MachineDeployment's replicas; the last
/// kubeadm lines of each guest's console.
pub(crate) async fn diagnose(stack: &Stack, ns: &str) -> String {
    let client = stack.client();
    let mut out = String::new();
    match bounded(objects::list(&client, ns, Kind::Machine)).await {
        Ok(machines) if machines.is_empty() => out.push_str("Machines: none\n"),
        Ok(machines) => {
            let lms = bounded(objects::list(&client, ns, Kind::LibvirtMachine)).await.unwrap_or_default();
            for machine in &machines {
                let name = objects::name(machine);
                let infra = objects::str_at(machine, &["spec", "infrastructureRef", "name"]).unwrap_or_default();
                let lm_ready = lms.iter().find(|lm| objects::name(lm) == infra).map(|lm| condition_text(lm, "Ready"));
                let _ = writeln!(
                    out,
                    "Machine {name}: phase {}, node {}, LibvirtMachine {infra} Ready {}",
                    objects::str_at(machine, &["status", "phase"]).unwrap_or("-"),
                    objects::str_at(machine, &["status", "nodeRef", "name"]).unwrap_or("-"),
                    lm_ready.unwrap_or_else(|| "(no LibvirtMachine)".into()),
                );
            }
        }
        Err(err) => {
            let _ = writeln!(out, "Machines: could not be listed: {err:#}");
        }
    }
    let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kubeadm_control_plane());
    match bounded(async { Ok(kcps.list(&ListParams::default()).await?.items) }).await {
        Ok(kcps) => {
            for kcp in &kcps {
                let initialized = kcp.data["status"]["initialization"]["controlPlaneInitialized"] == true;
                let _ = writeln!(
                    out,
                    "KubeadmControlPlane {}: initialized {initialized}, conditions: {}",
                    objects::name(kcp),
                    conditions(kcp)
                );
            }
        }
        Err(err) => {
            let _ = writeln!(out, "KubeadmControlPlanes: could not be listed: {err:#}");
        }
    }
    if let Ok(mds) = bounded(objects::list(&client, ns, Kind::MachineDeployment)).await {
        for md in &mds {
            let _ = writeln!(
                out,
                "MachineDeployment {}: replicas {}, ready {}",
                objects::name(md),
                md.data["spec"]["replicas"],
                md.data["status"]["readyReplicas"]
            );
        }
    }
    match domains(stack, ns) {
        Ok(domains) => {
            for domain in domains {
                let lines = kubeadm_lines(&stack.console_log(&domain), KUBEADM_LINES);
                if lines.is_empty() {
                    let _ = writeln!(out, "guest {domain}: no kubeadm line on its console yet");
                } else {
                    let _ = writeln!(out, "guest {domain}, its last kubeadm lines:\n  {}", lines.join("\n  "));
                }
            }
        }
        Err(err) => {
            let _ = writeln!(out, "domains: could not be listed: {err:#}");
        }
    }
    out.trim_end().to_string()
}

/// Every condition of `object` as `Type=Status Reason: message`, `;`-separated.
fn conditions(object: &DynamicObject) -> String {
    let Some(list) = object.data["status"]["conditions"].as_array() else { return "(none)".into() };
    list.iter()
        .map(|c| {
            let message = c["message"].as_str().unwrap_or("").replace('\n', " ");
            format!(
                "{}={} {}{}",
                c["type"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or(""),
                if message.is_empty() { String::new() } else { format!(": {message}") }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `status reason: message` of the condition `type_` in `object`'s `status.conditions`.
pub(crate) fn condition_text(object: &DynamicObject, type_: &str) -> String {
    match objects::condition_entry(object, type_) {
        Some(c) => format!(
            "{} {}: {}",
            c["status"].as_str().unwrap_or("?"),
            c["reason"].as_str().unwrap_or(""),
            c["message"].as_str().unwrap_or("")
        ),
        None => "(not set)".to_owned(),
    }
}

/// Whether a console line is kubeadm's: its phase lines (`[preflight] ...`,
/// `[kubelet-start] ...`) as cloud-init prints them, its closing words, its
/// errors, and any line naming kubeadm.
pub(crate) fn is_kubeadm_line(line: &str) -> bool {
    kubeadm_phase(line).is_some() || KUBEADM_WORDS.iter().chain(&KUBEADM_CLOSING).any(|w| line.contains(w))
}

/// What kubeadm prints outside its phase lines that says how far it got.
const KUBEADM_WORDS: [&str; 2] = ["kubeadm", "error execution phase"];
/// kubeadm's words when `init` or `join` succeeded.
const KUBEADM_CLOSING: [&str; 2] = ["has initialized successfully", "This node has joined the cluster"];

/// The phase tag of a kubeadm line as cloud-init prints it on the console:
/// `cloud-init[538]: [certs] Generating ...` gives `certs`.
pub(crate) fn kubeadm_phase(line: &str) -> Option<&str> {
    let (_, after) = line.split_once("cloud-init[")?;
    let (_, said) = after.split_once("]: [")?;
    let (tag, _) = said.split_once(']')?;
    let plain = !tag.is_empty() && tag.chars().all(|c| c.is_ascii_lowercase() || c == '-' || c == '/');
    plain.then_some(tag)
}

/// A console line that shows how far kubeadm got: a phase line (keyed by its
/// phase, so that a narrator prints each phase once) or a closing line (keyed
/// by its words). Returns the key and what kubeadm said.
pub(crate) fn kubeadm_progress(line: &str) -> Option<(&str, &str)> {
    let said = line.split_once("]: ").map(|(_, said)| said.trim())?;
    if let Some(phase) = kubeadm_phase(line) {
        return Some((phase, said));
    }
    KUBEADM_CLOSING.iter().find(|w| line.contains(*w)).map(|w| (*w, said))
}

/// The last `count` kubeadm lines of a console ([`is_kubeadm_line`]), trimmed,
/// with their secrets hidden ([`redact`]).
pub(crate) fn kubeadm_lines(console: &str, count: usize) -> Vec<String> {
    let lines: Vec<&str> = console.lines().filter(|l| is_kubeadm_line(l)).collect();
    lines[lines.len().saturating_sub(count)..].iter().map(|l| redact(l.trim_end())).collect()
}

/// What follows these words on a kubeadm line is a credential of the cluster.
const SECRET_AFTER: [&str; 4] = ["--token ", "Using token: ", "--certificate-key ", "--discovery-token-ca-cert-hash "];

/// `line` with the value after each of [`SECRET_AFTER`] replaced by `<hidden>`:
/// kubeadm prints its bootstrap token and join command, and a report or the
/// narration may end up in a CI log.
pub(crate) fn redact(line: &str) -> String {
    let mut out = line.to_string();
    for marker in SECRET_AFTER {
        let mut from = 0;
        while let Some(at) = out[from..].find(marker) {
            let start = from + at + marker.len();
            let end = out[start..].find(char::is_whitespace).map_or(out.len(), |n| start + n);
            out.replace_range(start..end, "<hidden>");
            from = start + "<hidden>".len();
        }
    }
    out
}

/// kubeadm's own error when a serial console shows that `kubeadm init` or `join`
/// failed (cloud-init prints kubeadm's output there): the lines from its
/// `error execution phase` on, at most 20. `None` while nothing failed.
pub(crate) fn kubeadm_failure(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let first = lines.iter().position(|l| l.contains("error execution phase"))?;
    let start = first.saturating_sub(3);
    Some(lines[start..].iter().take(20).map(|l| redact(l.trim_end())).collect::<Vec<_>>().join("\n"))
}

/// On failure: what the workload cluster says about its Nodes and Pods, if it answers.
pub(crate) async fn report_workload(client: &Client, ns: &str) {
    let lookup = async {
        let workload = bounded(workload_client(client, ns, LOOKUP)).await?;
        let nodes =
            bounded(async { Ok(Api::<Node>::all(workload.clone()).list(&ListParams::default()).await?) }).await?;
        for node in nodes.items {
            let conditions: Vec<String> = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .map(|c| format!("{}={} {}", c.type_, c.status, c.message.unwrap_or_default()))
                .collect();
            eprintln!("--- workload Node {}: {conditions:?}", node.metadata.name.unwrap_or_default());
        }
        let pods = bounded(async { Ok(Api::<Pod>::all(workload).list(&ListParams::default()).await?) }).await?;
        for pod in pods.items {
            eprintln!(
                "--- workload Pod {}/{} on {}: {}",
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
                pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                pod_state(&pod)
            );
        }
        anyhow::Ok(())
    };
    if let Err(err) = lookup.await {
        eprintln!("--- the workload cluster could not be asked about its Nodes and Pods: {err:#}");
    }
}

/// On failure: keeps the CAPI managers' logs (KCP's says why it found the control plane
/// unavailable) beside the guests' consoles.
pub(crate) fn keep_capi_logs(stack: &Stack, ns: &str) {
    let dir = stack.work_dir.join(format!("capi-logs-{ns}"));
    if stack.management.keep_capi_logs(&dir) {
        eprintln!("e2e: the CAPI managers' logs are kept in {}", dir.display());
    }
}

/// On failure: the tail of every guest console of the namespace and where the logs are.
pub(crate) fn report_guests(stack: &Stack, ns: &str) {
    let Ok(domains) = domains(stack, ns) else { return };
    for domain in domains {
        let log = stack.console_log(&domain);
        let tail: Vec<&str> = log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
        eprintln!("--- serial console of {domain} (last {} lines) ---\n{}", tail.len(), tail.join("\n"));
    }
    if let Some(dir) = &stack.console_dir {
        eprintln!(
            "e2e: the guests' full serial consoles (kernel, cloud-init and kubeadm output) are kept in {}",
            dir.display()
        );
    }
}

/// A JSON value in one line, cut at 600 characters.
pub(crate) fn compact(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 600 { format!("{}...", &text[..600]) } else { text }
}

#[cfg(test)]
mod tests {
    use super::{kubeadm_failure, kubeadm_lines, kubeadm_phase, kubeadm_progress, redact};

    const CONSOLE: &str = "[    3.1] Run /init as init process\n\
        [  101.0] cloud-init[538]: [preflight] Running pre-flight checks\n\
        [  101.5] systemd[1]: Started kubelet.service\n\
        [  141.2] cloud-init[538]: [certs] Generating \"etcd/healthcheck-client\" certificate and key\n\
        [  150.0] cloud-init[538]: [wait-control-plane] Waiting for the kubelet to boot up the control plane\n\
        [  648.2] cloud-init[538]: Your Kubernetes control-plane has initialized successfully!\n\
        [  649.0] cloud-init[538]:   kubeadm join 10.251.0.254:6443 --token abc\n";

    #[test]
    fn kubeadm_phases_and_lines_are_read_from_the_console() {
        let phases: Vec<&str> = CONSOLE.lines().filter_map(kubeadm_phase).collect();
        assert_eq!(phases, ["preflight", "certs", "wait-control-plane"]);
        let last = kubeadm_lines(CONSOLE, 2);
        assert_eq!(last.len(), 2);
        assert!(last[0].contains("initialized successfully"), "{last:?}");
        assert_eq!(last[1], "[  649.0] cloud-init[538]:   kubeadm join 10.251.0.254:6443 --token <hidden>");
        assert_eq!(kubeadm_lines(CONSOLE, 10).len(), 5, "the kubelet's systemd line is not kubeadm's");
        assert!(kubeadm_lines("[    3.1] Run /init as init process\n", 10).is_empty());
        let progress: Vec<(&str, &str)> = CONSOLE.lines().filter_map(kubeadm_progress).collect();
        assert_eq!(
            progress.iter().map(|p| p.0).collect::<Vec<_>>(),
            ["preflight", "certs", "wait-control-plane", "has initialized successfully"]
        );
        assert_eq!(progress[0].1, "[preflight] Running pre-flight checks");
    }

    #[test]
    fn credentials_on_kubeadm_lines_are_hidden() {
        assert_eq!(
            redact("kubeadm join 10.0.0.1:6443 --token abc.def --discovery-token-ca-cert-hash sha256:0f \\"),
            "kubeadm join 10.0.0.1:6443 --token <hidden> --discovery-token-ca-cert-hash <hidden> \\"
        );
        assert_eq!(redact("[bootstrap-token] Using token: fy9562.ztwr"), "[bootstrap-token] Using token: <hidden>");
        assert_eq!(redact("--certificate-key"), "--certificate-key", "no value, nothing to hide");
        assert_eq!(redact("[certs] Generating \"ca\""), "[certs] Generating \"ca\"");
    }

    #[test]
    fn a_failed_kubeadm_is_found_in_the_console() {
        let ok = "[  141.2] cloud-init[538]: [certs] Generating \"etcd/healthcheck-client\"\n\
                  [  648.2] cloud-init[538]: Your Kubernetes control-plane has initialized successfully!\n";
        assert_eq!(kubeadm_failure(ok), None);
        let failed = "[  100.1] boot\n[  120.0] a\n[  121.0] b\n[  122.0] c\n\
            [  123.4] cloud-init[529]: error: error execution phase wait-control-plane: failed while waiting for \
            the control plane to start: [failed to read manifest for \"/etc/kubernetes/manifests/kube-controller-manager.yaml\"]\n\
            [  123.5] cloud-init[529]: To see the stack trace of this error execute with --v=5 or higher\n";
        let found = kubeadm_failure(failed).expect("the failure");
        assert!(found.starts_with("[  120.0] a"), "{found}");
        assert!(found.contains("failed to read manifest"), "{found}");
        assert!(found.ends_with("--v=5 or higher"), "{found}");
    }
}
