//! What the test rig adds to a rendered flavor because its machines run under
//! software emulation (QEMU without KVM, guests sharing 2 host cores). None of
//! it is in `templates/`: a user's cluster on real hardware needs none of it.
//!
//! - kubeadm's timeouts: minutes instead of its defaults (4 min for the
//!   components, 1 min for API calls), for a control plane that takes minutes
//!   to start;
//! - the API server's and etcd's liveness checks tolerate 4 minutes of failures
//!   (a restart under CPU starvation takes minutes, so restarting early turns a
//!   slow control plane into one that never answers), and the readiness checks
//!   of the API server, etcd and scheduler run every 10 s (each is a new
//!   connection, a TLS handshake for two of them), patched in by kubeadm from
//!   `/etc/kubernetes/patches`;
//! - the API server's etcd health check waits 10 s, and the controller manager
//!   and scheduler keep their leases through 100 s without renewal; kube-vip
//!   keeps its lease through 40 s;
//! - ECDSA keys: a TLS handshake signs with the serving key, and an RSA-2048
//!   signature costs about 10 times as much;
//! - while `kubeadm init` starts the control plane, the node's daemons get a
//!   fifth of the CPU weight the pods have, restored after it;
//! - kube-router (the CNI the flavors' ClusterResourceSet applies) gets 5
//!   minutes to answer its health check after it starts, and its liveness
//!   check then allows 5 s per answer and tolerates 4 minutes of failures: on a
//!   worker starved by the control-plane guest beside it, kube-router's own
//!   check (1 s per answer, 10 s to start, 9 s of failures) killed it again and
//!   again before it wrote the node's pod range into the CNI configuration, so
//!   no Pod on that node got an address ("no IP ranges specified") for many
//!   minutes.
//!
//! One more piece of tuning is on the host, not in the manifest
//! ([`favour_control_plane`]): the control-plane guest gets 8 times the CPU
//! weight of the other guests. With two workers booting beside it, all three
//! guests' emulated vCPUs share the 2 host cores, and the control plane then
//! answered so slowly that KubeadmControlPlane's etcd member list (a
//! port-forward through the workload API server to etcd) failed for minutes,
//! turning KCP `Available=Unknown` ("Failed to get etcd members"), and kube-vip
//! missed its lease renewal and gave up the endpoint's address. A host with
//! KVM, or with a core per guest, needs none of this.
//!
//! The patch works on the objects `clusterctl generate cluster` printed: the
//! KubeadmControlPlane and KubeadmConfigTemplate of the default flavors, the
//! KubeadmControlPlaneTemplate, KubeadmConfigTemplate and the kube-vip patch of
//! the ClusterClass.

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_yaml::{Mapping, Value};

/// kubeadm's timeouts, in seconds.
const KUBEADM_TIMEOUT_SECONDS: u64 = 900;
/// The file kube-vip's static Pod is written to.
const KUBE_VIP_MANIFEST: &str = "/etc/kubernetes/manifests/kube-vip.yaml";
/// kube-vip's lease (seconds): duration, renew deadline, retry period.
const KUBE_VIP_LEASE: [(&str, &str); 3] =
    [("vip_leaseduration", "60"), ("vip_renewdeadline", "40"), ("vip_retryperiod", "5")];

/// The DaemonSet (and its container) of the flavors' CNI, in the ConfigMap a
/// ClusterResourceSet applies.
const KUBE_ROUTER: &str = "kube-router";
/// kube-router's probes: up to 5 minutes to start, then 4 minutes of failures
/// before a restart; 5 s per answer.
const KUBE_ROUTER_PROBES: &str = "{startupProbe: {periodSeconds: 5, timeoutSeconds: 5, failureThreshold: 60}, \
     livenessProbe: {periodSeconds: 10, timeoutSeconds: 5, failureThreshold: 24}}";

/// The CPU weight (cgroup `cpu.shares`) the control-plane guest gets; every
/// other guest keeps libvirt's 1024.
const CONTROL_PLANE_CPU_SHARES: u32 = 8192;

/// Gives the control-plane guest `domain` 8 times the CPU weight of the other
/// guests on the test host (`virsh schedinfo --set cpu_shares=... --live`).
pub(crate) fn favour_control_plane(host: &crate::harness::host_view::HostView, domain: &str) -> Result<()> {
    let shares = format!("cpu_shares={CONTROL_PLANE_CPU_SHARES}");
    host.virsh(&["schedinfo", domain, "--set", &shares, "--live"]).with_context(|| {
        format!("giving the control-plane guest {domain} a CPU weight of {CONTROL_PLANE_CPU_SHARES}")
    })?;
    let seen = host.virsh(&["schedinfo", domain])?;
    if !seen.lines().any(|l| {
        l.split(':').map(str::trim).collect::<Vec<_>>() == ["cpu_shares", &CONTROL_PLANE_CPU_SHARES.to_string()]
    }) {
        bail!("the control-plane guest {domain} kept its CPU weight: virsh schedinfo says\n{seen}");
    }
    Ok(())
}

/// The rendered manifest with the emulation tuning added.
pub(crate) fn patch_manifest(rendered: &str) -> Result<String> {
    edit_documents(rendered, patch_object).context("patching the rendered manifest")
}

/// The YAML documents of `text`, each after `edit`, joined again (empty
/// documents dropped).
fn edit_documents(text: &str, mut edit: impl FnMut(&mut Value) -> Result<()>) -> Result<String> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let mut value = Value::deserialize(document).context("parsing a YAML document")?;
        if value.is_null() {
            continue;
        }
        edit(&mut value)?;
        out.push(serde_yaml::to_string(&value)?);
    }
    Ok(out.join("---\n"))
}

fn patch_object(object: &mut Value) -> Result<()> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    match kind.as_str() {
        "KubeadmControlPlane" => control_plane(at(object, &["spec", "kubeadmConfigSpec"])?, true),
        "KubeadmControlPlaneTemplate" => {
            control_plane(at(object, &["spec", "template", "spec", "kubeadmConfigSpec"])?, false)
        }
        "KubeadmConfigTemplate" => {
            worker(at(object, &["spec", "template", "spec"])?);
            Ok(())
        }
        "ClusterClass" => class_files(object),
        "ConfigMap" => kube_router_probes(object),
        _ => Ok(()),
    }
}

/// The mapping at `path`, created (empty) where missing.
fn at<'a>(value: &'a mut Value, path: &[&str]) -> Result<&'a mut Mapping> {
    let mut current = value;
    for key in path {
        let map = current.as_mapping_mut().with_context(|| format!("{key}: the parent is not a mapping"))?;
        current = map.entry(Value::from(*key)).or_insert_with(|| Value::Mapping(Mapping::new()));
    }
    current.as_mapping_mut().with_context(|| format!("{} is not a mapping", path.join(".")))
}

fn sequence<'a>(map: &'a mut Mapping, key: &str) -> Result<&'a mut Vec<Value>> {
    map.entry(Value::from(key))
        .or_insert_with(|| Value::Sequence(Vec::new()))
        .as_sequence_mut()
        .with_context(|| format!("{key} is not a list"))
}

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).expect("a constant of this file is YAML")
}

fn extra_args(component: &mut Mapping, args: &[(&str, &str)]) -> Result<()> {
    let list = sequence(component, "extraArgs")?;
    for (name, value) in args {
        list.push(yaml(&format!("{{name: {name}, value: \"{value}\"}}")));
    }
    Ok(())
}

fn timeouts(config: &mut Mapping, names: &[&str]) {
    let mut map = Mapping::new();
    for name in names {
        map.insert(Value::from(*name), Value::from(KUBEADM_TIMEOUT_SECONDS));
    }
    config.insert(Value::from("timeouts"), Value::Mapping(map));
}

/// A KubeadmControlPlane's (or its template's) kubeadmConfigSpec. `with_files`:
/// the probe patches and kube-vip's lease go into its files (a ClusterClass sets
/// the files with a patch of its own, see [`class_files`]).
fn control_plane(spec: &mut Mapping, with_files: bool) -> Result<()> {
    if with_files {
        files(sequence(spec, "files")?)?;
    }
    sequence(spec, "preKubeadmCommands")?
        .insert(0, Value::from("systemctl set-property --runtime system.slice CPUWeight=20"));
    sequence(spec, "postKubeadmCommands")?
        .push(Value::from("systemctl set-property --runtime system.slice CPUWeight=100"));
    let cluster = at_map(spec, "clusterConfiguration")?;
    cluster.insert(Value::from("encryptionAlgorithm"), Value::from("ECDSA-P256"));
    extra_args(at_map(cluster, "apiServer")?, &[("etcd-healthcheck-timeout", "10s")])?;
    let leases = [("leader-elect-lease-duration", "120s"), ("leader-elect-renew-deadline", "100s")];
    extra_args(at_map(cluster, "controllerManager")?, &leases)?;
    extra_args(at_map(cluster, "scheduler")?, &leases)?;
    let init = at_map(spec, "initConfiguration")?;
    init.insert(Value::from("patches"), yaml("{directory: /etc/kubernetes/patches}"));
    timeouts(
        init,
        &[
            "controlPlaneComponentHealthCheckSeconds",
            "kubeletHealthCheckSeconds",
            "kubernetesAPICallSeconds",
            "etcdAPICallSeconds",
        ],
    );
    let join = at_map(spec, "joinConfiguration")?;
    join.insert(Value::from("patches"), yaml("{directory: /etc/kubernetes/patches}"));
    timeouts(
        join,
        &[
            "controlPlaneComponentHealthCheckSeconds",
            "kubeletHealthCheckSeconds",
            "kubernetesAPICallSeconds",
            "etcdAPICallSeconds",
            "discoverySeconds",
            "tlsBootstrapSeconds",
        ],
    );
    Ok(())
}

fn at_map<'a>(map: &'a mut Mapping, key: &str) -> Result<&'a mut Mapping> {
    map.entry(Value::from(key))
        .or_insert_with(|| Value::Mapping(Mapping::new()))
        .as_mapping_mut()
        .with_context(|| format!("{key} is not a mapping"))
}

/// A KubeadmConfigTemplate's spec: the join's timeouts.
fn worker(spec: &mut Mapping) {
    let join = spec
        .entry(Value::from("joinConfiguration"))
        .or_insert_with(|| Value::Mapping(Mapping::new()))
        .as_mapping_mut()
        .expect("joinConfiguration is a mapping");
    timeouts(
        join,
        &["kubeletHealthCheckSeconds", "kubernetesAPICallSeconds", "discoverySeconds", "tlsBootstrapSeconds"],
    );
}

/// The probe patches kubeadm applies from /etc/kubernetes/patches, and kube-vip's
/// lease in its static Pod.
fn files(files: &mut Vec<Value>) -> Result<()> {
    let mut found = false;
    for file in files.iter_mut() {
        if file.get("path").and_then(Value::as_str) == Some(KUBE_VIP_MANIFEST) {
            let content = file.get("content").and_then(Value::as_str).context("kube-vip's file has no content")?;
            let patched = kube_vip_lease(content)?;
            file.as_mapping_mut().expect("a file is a mapping").insert(Value::from("content"), Value::from(patched));
            found = true;
        }
    }
    if !found {
        bail!("the flavor writes no {KUBE_VIP_MANIFEST}");
    }
    let probes = "{livenessProbe: {failureThreshold: 24}, readinessProbe: {periodSeconds: 10, failureThreshold: 6}}";
    for (component, probe) in [
        ("kube-apiserver", probes),
        ("etcd", probes),
        ("kube-scheduler", "{readinessProbe: {periodSeconds: 10, failureThreshold: 6}}"),
    ] {
        let mut container: Value = yaml(probe);
        container.as_mapping_mut().expect("a mapping").insert(Value::from("name"), Value::from(component));
        let content = serde_yaml::to_string(&yaml(&format!("{{spec: {{containers: [{}]}}}}", flow(&container)?)))?;
        files.push(yaml(&format!(
            "{{path: /etc/kubernetes/patches/{component}0+strategic.yaml, permissions: \"0644\"}}"
        )));
        files
            .last_mut()
            .and_then(Value::as_mapping_mut)
            .expect("a mapping")
            .insert(Value::from("content"), Value::from(content));
    }
    Ok(())
}

/// A ConfigMap holding kube-router's manifest (for a ClusterResourceSet): its
/// DaemonSet's container gets [`KUBE_ROUTER_PROBES`], with the same HTTP check
/// as its liveness probe. Any other ConfigMap is left as it is.
fn kube_router_probes(config_map: &mut Value) -> Result<()> {
    let Some(data) = config_map.get_mut("data").and_then(Value::as_mapping_mut) else { return Ok(()) };
    for (key, text) in data.iter_mut() {
        let Some(manifest) = text.as_str() else { continue };
        let mut patched = false;
        let edited = edit_documents(manifest, |object| {
            if object["kind"].as_str() == Some("DaemonSet") && object["metadata"]["name"].as_str() == Some(KUBE_ROUTER)
            {
                kube_router_container(object)?;
                patched = true;
            }
            Ok(())
        })
        .with_context(|| format!("patching the ConfigMap's {key:?}"))?;
        if patched {
            *text = Value::from(edited);
        }
    }
    Ok(())
}

fn kube_router_container(daemon_set: &mut Value) -> Result<()> {
    let containers = daemon_set["spec"]["template"]["spec"]["containers"]
        .as_sequence_mut()
        .context("kube-router's DaemonSet has no containers")?;
    let container = containers
        .iter_mut()
        .find(|c| c["name"].as_str() == Some(KUBE_ROUTER))
        .and_then(Value::as_mapping_mut)
        .context("kube-router's DaemonSet has no container named kube-router")?;
    let check = container
        .get("livenessProbe")
        .and_then(|p| p.get("httpGet"))
        .cloned()
        .context("kube-router's container has no HTTP liveness probe")?;
    let Value::Mapping(probes) = yaml(KUBE_ROUTER_PROBES) else { unreachable!("a mapping") };
    for (name, mut probe) in probes {
        probe.as_mapping_mut().expect("a mapping").insert(Value::from("httpGet"), check.clone());
        container.insert(name, probe);
    }
    Ok(())
}

/// `value` as one line of flow YAML (JSON is YAML).
fn flow(value: &Value) -> Result<String> {
    Ok(serde_json::to_string(value)?)
}

/// kube-vip's static Pod with the longer lease. Edited as text: in a
/// ClusterClass the Pod holds Go template actions (`{{ .var }}`) that are not YAML.
fn kube_vip_lease(content: &str) -> Result<String> {
    let mut lines: Vec<String> = content.lines().map(str::to_string).collect();
    for (name, value) in KUBE_VIP_LEASE {
        let at = lines
            .iter()
            .position(|l| l.trim() == format!("- name: {name}"))
            .with_context(|| format!("kube-vip's static Pod does not set {name}"))?;
        let line = lines.get_mut(at + 1).filter(|l| l.trim_start().starts_with("value:"));
        let line = line.with_context(|| format!("kube-vip's {name} has no value on the line after its name"))?;
        let indent = line.len() - line.trim_start().len();
        *line = format!("{}value: \"{value}\"", " ".repeat(indent));
    }
    Ok(lines.join("\n") + "\n")
}

/// The ClusterClass's `kube-vip` patch sets the control plane's files: the
/// probe patches and the lease go into its template.
fn class_files(class: &mut Value) -> Result<()> {
    let patches = class
        .get_mut("spec")
        .and_then(|s| s.get_mut("patches"))
        .and_then(Value::as_sequence_mut)
        .context("the ClusterClass has no patches")?;
    let patch = patches
        .iter_mut()
        .find(|p| p.get("name").and_then(Value::as_str) == Some("kube-vip"))
        .context("the ClusterClass has no patch named kube-vip")?;
    let json_patch = patch
        .get_mut("definitions")
        .and_then(|d| d.get_mut(0))
        .and_then(|d| d.get_mut("jsonPatches"))
        .and_then(|j| j.get_mut(0))
        .context("the kube-vip patch has no JSON patch")?;
    let template = json_patch
        .get("valueFrom")
        .and_then(|v| v.get("template"))
        .and_then(Value::as_str)
        .context("the kube-vip patch has no template")?;
    let mut list: Vec<Value> =
        serde_yaml::from_str(template).context("the kube-vip patch's template is not a YAML list")?;
    files(&mut list)?;
    let text = serde_yaml::to_string(&list)?;
    at(json_patch, &["valueFrom"])?.insert(Value::from("template"), Value::from(text));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shipped template with clusterctl's variables replaced (defaults, or a sample).
    fn rendered(file: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates").join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..].find('}').unwrap() + start;
            let inner = &rest[start + 2..end];
            out.push_str(inner.split_once(":=").map(|(_, d)| d).unwrap_or("192.168.122.10"));
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn documents(text: &str) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(text).map(|d| Value::deserialize(d).unwrap()).collect()
    }

    fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
        docs.iter().find(|d| d["kind"].as_str() == Some(kind)).unwrap()
    }

    fn kube_vip_env(files: &Value, name: &str) -> String {
        let file = files.as_sequence().unwrap().iter().find(|f| f["path"].as_str() == Some(KUBE_VIP_MANIFEST)).unwrap();
        let content = file["content"].as_str().unwrap();
        let mut lines = content.lines();
        lines.find(|l| l.trim() == format!("- name: {name}")).unwrap();
        lines.next().unwrap().trim().trim_start_matches("value:").trim().trim_matches('"').to_string()
    }

    #[test]
    fn the_default_flavor_gets_the_emulation_tuning_and_keeps_the_rest() {
        let before = documents(&rendered("cluster-template.yaml"));
        let after = documents(&patch_manifest(&rendered("cluster-template.yaml")).unwrap());
        assert_eq!(before.len(), after.len());
        let spec = &kind(&after, "KubeadmControlPlane")["spec"]["kubeadmConfigSpec"];
        assert_eq!(spec["initConfiguration"]["timeouts"]["controlPlaneComponentHealthCheckSeconds"], Value::from(900));
        assert_eq!(spec["joinConfiguration"]["timeouts"]["tlsBootstrapSeconds"], Value::from(900));
        assert_eq!(spec["initConfiguration"]["patches"]["directory"].as_str(), Some("/etc/kubernetes/patches"));
        assert_eq!(spec["clusterConfiguration"]["encryptionAlgorithm"].as_str(), Some("ECDSA-P256"));
        let pre = spec["preKubeadmCommands"].as_sequence().unwrap();
        assert_eq!(pre[0].as_str(), Some("systemctl set-property --runtime system.slice CPUWeight=20"));
        assert_eq!(pre.len(), 2, "the flavor's own command stays: {pre:?}");
        let post = spec["postKubeadmCommands"].as_sequence().unwrap();
        assert_eq!(post.last().unwrap().as_str(), Some("systemctl set-property --runtime system.slice CPUWeight=100"));
        let files = spec["files"].as_sequence().unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                KUBE_VIP_MANIFEST,
                "/etc/kubernetes/patches/kube-apiserver0+strategic.yaml",
                "/etc/kubernetes/patches/etcd0+strategic.yaml",
                "/etc/kubernetes/patches/kube-scheduler0+strategic.yaml"
            ]
        );
        let apiserver: Value = serde_yaml::from_str(files[1]["content"].as_str().unwrap()).unwrap();
        assert_eq!(apiserver["spec"]["containers"][0]["name"].as_str(), Some("kube-apiserver"));
        assert_eq!(apiserver["spec"]["containers"][0]["livenessProbe"]["failureThreshold"], Value::from(24));
        assert_eq!(kube_vip_env(&spec["files"], "vip_leaseduration"), "60");
        assert_eq!(kube_vip_env(&spec["files"], "address"), "192.168.122.10");
        let worker = &kind(&after, "KubeadmConfigTemplate")["spec"]["template"]["spec"];
        assert_eq!(worker["joinConfiguration"]["timeouts"]["discoverySeconds"], Value::from(900));
        for other in ["Cluster", "LibvirtCluster", "MachineDeployment", "ClusterResourceSet"] {
            assert_eq!(kind(&before, other), kind(&after, other), "{other} is the flavor's");
        }
    }

    /// The objects of the manifest a ClusterResourceSet's ConfigMap holds.
    fn cni_objects(config_map: &Value) -> Vec<Value> {
        documents(config_map["data"]["kube-router.yaml"].as_str().unwrap())
    }

    #[test]
    fn kube_router_gets_time_to_start_and_a_patient_liveness_check_and_nothing_else_changes() {
        for flavor in ["cluster-template.yaml", "cluster-template-topology.yaml"] {
            let before = cni_objects(kind(&documents(&rendered(flavor)), "ConfigMap"));
            let after = cni_objects(kind(&documents(&patch_manifest(&rendered(flavor)).unwrap()), "ConfigMap"));
            assert_eq!(before.len(), after.len(), "{flavor}");
            for (old, mut new) in before.into_iter().zip(after) {
                if new["kind"].as_str() != Some("DaemonSet") {
                    assert_eq!(old, new, "{flavor}: only kube-router's DaemonSet changes");
                    continue;
                }
                let container = &mut new["spec"]["template"]["spec"]["containers"][0];
                assert_eq!(container["name"].as_str(), Some("kube-router"));
                let check = old["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"].clone();
                assert_eq!(check["port"], Value::from(20244), "{flavor}: the flavor's own health check");
                let startup = &container["startupProbe"];
                assert_eq!(startup["httpGet"], check);
                assert_eq!(
                    startup["periodSeconds"].as_u64().unwrap() * startup["failureThreshold"].as_u64().unwrap(),
                    300
                );
                let liveness = &container["livenessProbe"];
                assert_eq!(liveness["httpGet"], check);
                assert_eq!(liveness["timeoutSeconds"], Value::from(5));
                assert_eq!(
                    liveness["periodSeconds"].as_u64().unwrap() * liveness["failureThreshold"].as_u64().unwrap(),
                    240
                );
                let map = container.as_mapping_mut().unwrap();
                map.remove("startupProbe");
                map.insert(
                    Value::from("livenessProbe"),
                    old["spec"]["template"]["spec"]["containers"][0]["livenessProbe"].clone(),
                );
                assert_eq!(old, new, "{flavor}: the rest of kube-router's DaemonSet is the flavor's");
            }
        }
    }

    #[test]
    fn the_cluster_class_gets_the_emulation_tuning_in_its_templates_and_its_kube_vip_patch() {
        let after = documents(&patch_manifest(&rendered("clusterclass-libvirt.yaml")).unwrap());
        let spec = &kind(&after, "KubeadmControlPlaneTemplate")["spec"]["template"]["spec"]["kubeadmConfigSpec"];
        assert_eq!(spec["initConfiguration"]["timeouts"]["kubernetesAPICallSeconds"], Value::from(900));
        assert!(spec["files"].is_null(), "the ClusterClass's patch sets the files: {spec:?}");
        let class = kind(&after, "ClusterClass");
        let patch =
            class["spec"]["patches"].as_sequence().unwrap().iter().find(|p| p["name"].as_str() == Some("kube-vip"));
        let template = patch.unwrap()["definitions"][0]["jsonPatches"][0]["valueFrom"]["template"].as_str().unwrap();
        let files: Value = serde_yaml::from_str(template).unwrap();
        assert_eq!(files.as_sequence().unwrap().len(), 4);
        assert_eq!(kube_vip_env(&files, "vip_renewdeadline"), "40");
        assert_eq!(kube_vip_env(&files, "address"), "{{ .controlPlaneEndpointHost }}");
    }
}
