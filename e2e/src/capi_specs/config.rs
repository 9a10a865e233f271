//! The e2e config the upstream framework reads (`clusterctl.E2EConfig`) and
//! the flavors it names: every provider from local files (the release this
//! run installed and CAPI's release components of the control-plane cache),
//! the variables a user sets for this host, and the intervals of the waits.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use testenv::container_libvirtd::TlsClient;
use testenv::control_plane_versions::{CAPI_RELEASE_PROVIDERS, CAPI_VERSION, CapiReleaseProvider, KUBERNETES_VERSION};
use testenv::test_host::{BASE_POOL, DISK_POOL};

use crate::harness::clusterctl::INFRA_PROVIDER;
use crate::harness::file_server::FileServer;
use crate::harness::kind_cluster::{CLUSTER, CURRENT_VERSION};
use crate::workload::render::{base64, sha256_of};

/// The CAPI contract the providers' releases implement.
const CONTRACT: &str = "v1beta2";

/// The files of the specs' flavors: (name in the repository, the release's
/// file it comes from, the patch of `e2e/capi/flavors/` merged into it). Each
/// gets the emulation tuning (the ClusterClass too: clusterctl adds it to the
/// topology flavor).
const FLAVOR_FILES: &[(&str, &str, Option<&str>)] = &[
    ("cluster-template.yaml", "cluster-template.yaml", None),
    ("cluster-template-topology.yaml", "cluster-template-topology.yaml", None),
    ("clusterclass-libvirt.yaml", "clusterclass-libvirt.yaml", None),
    ("cluster-template-data-disks.yaml", "cluster-template-data-disks.yaml", None),
    ("cluster-template-md-remediation.yaml", "cluster-template.yaml", Some("md-remediation.yaml")),
    ("cluster-template-kcp-md-taints.yaml", "cluster-template.yaml", Some("kcp-md-taints.yaml")),
    ("cluster-template-remediation-reboot.yaml", "cluster-template.yaml", Some("remediation-reboot.yaml")),
];

/// The e2e config variable with the URI through which virsh on this machine
/// reaches the specs' libvirt host (its unix socket): remediation-reboot
/// pauses a worker's domain with `virsh -c URI suspend`. The flavors do not
/// use it.
pub const VIRSH_URI_VARIABLE: &str = "CAPL_E2E_VIRSH_URI";

/// What `clusterctl init` of the management cluster gets besides what the
/// kind suite sets: CAPI core and KCP accept and propagate `spec.taints` of
/// Machines only with this alpha feature gate, which md-rollout checks.
pub const INIT_VARIABLES: &[(&str, &str)] = &[("EXP_MACHINE_TAINT_PROPAGATION", "true")];

/// Where the flavors' patches are.
fn patches_dir() -> PathBuf {
    crate::repo_root().join("e2e/capi/flavors")
}

/// How long the specs' waits may take: (name, [timeout, poll]). Every machine
/// runs under software emulation on 2 cores: a control plane takes minutes.
const INTERVALS: &[(&str, [&str; 2])] = &[
    ("default/wait-controllers", ["5m", "10s"]),
    ("default/wait-cluster", ["10m", "10s"]),
    ("default/wait-control-plane", ["30m", "10s"]),
    ("default/wait-worker-nodes", ["30m", "10s"]),
    ("default/wait-machine-remediation", ["30m", "10s"]),
    ("default/wait-machine-upgrade", ["30m", "10s"]),
    ("default/wait-delete-cluster", ["15m", "10s"]),
    ("default/wait-nodes-ready", ["15m", "10s"]),
    // remediation-reboot: a Node turning unhealthy (about 2 minutes after its
    // guest is paused), a reboot and the boot to a Ready Node (2 to 4
    // minutes), or a reboot and the remediation's timeout (480 s).
    ("default/wait-reboot-remediation", ["20m", "10s"]),
    // remediation-reboot: a LibvirtRemediation shows `Failed` only from the
    // moment the provider gives up until its Machine, deleted by the
    // MachineSet at once, is gone with it: looked at every 2 s.
    ("default/wait-remediation-given-up", ["20m", "2s"]),
];

/// The node image as a user offers it: a file on a web server, named by URL and sha256.
pub struct ServedImage {
    server: FileServer,
    pub checksum: String,
}

impl ServedImage {
    /// Serves `file` on `address` (an address of this machine the provider's Pod reaches).
    pub fn start(file: &Path, address: &str) -> Result<Self> {
        Ok(Self { checksum: sha256_of(file)?, server: FileServer::start_on(file, address)? })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }
}

pub struct Inputs<'a> {
    pub work_dir: &'a Path,
    /// The clusterctl repository the kind cluster was initialised from.
    pub release_dir: &'a Path,
    pub image: &'a ServedImage,
    pub tls: &'a TlsClient,
    /// The URI through which virsh on this machine reaches the host.
    pub virsh_uri: &'a str,
}

/// The framework's edits of a CAPI release's components (a regular expression
/// and its replacement each): KubeadmControlPlane's manager gets the etcd
/// timeouts of [`testenv::KCP_ETCD_TIMEOUTS`] after its first argument.
fn replacements(provider: &CapiReleaseProvider) -> Vec<Value> {
    if provider.type_ != "ControlPlaneProvider" {
        return Vec::new();
    }
    let mut new = "${1}- --leader-elect".to_string();
    for arg in testenv::KCP_ETCD_TIMEOUTS {
        new.push_str(&format!("\n${{1}}- {arg}"));
    }
    vec![json!({ "old": "(?m)^( +)- --leader-elect$", "new": new })]
}

/// Writes the flavors and the e2e config into the work directory; returns the config's path.
pub fn write(inputs: &Inputs) -> Result<PathBuf> {
    let release = inputs.release_dir.join(INFRA_PROVIDER).join(CURRENT_VERSION);
    let flavors = inputs.work_dir.join("flavors");
    std::fs::create_dir_all(&flavors)?;
    let mut files = vec![file(&crate::repo_root().join("metadata.yaml"), "metadata.yaml")];
    for (name, from, patch) in FLAVOR_FILES {
        let text = flavor(&release.join(from), patch.map(|p| patches_dir().join(p)).as_deref())?;
        let target = flavors.join(name);
        std::fs::write(&target, text)?;
        files.push(file(&target, name));
    }
    let mut providers = vec![json!({
        "name": "libvirt",
        "type": "InfrastructureProvider",
        "versions": [{
            "name": CURRENT_VERSION,
            "value": release.join("infrastructure-components.yaml"),
            "type": "url",
            "contract": CONTRACT,
            "files": files,
        }],
    })];
    let assets = testenv::Assets::locate()?;
    for provider in CAPI_RELEASE_PROVIDERS {
        let components = assets.capi_release_components(provider)?;
        let metadata = components.with_file_name("metadata.yaml");
        providers.push(json!({
            "name": provider.name,
            "type": provider.type_,
            "versions": [{
                "name": CAPI_VERSION,
                "value": components,
                "type": "url",
                "contract": CONTRACT,
                "files": [file(&metadata, "metadata.yaml")],
                "replacements": replacements(provider),
            }],
        }));
    }
    let tls = inputs.tls;
    let variables = json!({
        "KUBERNETES_VERSION": KUBERNETES_VERSION,
        "CAPL_LIBVIRT_URI": tls.uri,
        "CAPL_TLS_CA_CRT_B64": base64(tls.ca_pem.as_bytes())?,
        "CAPL_TLS_CLIENT_CRT_B64": base64(tls.cert_pem.as_bytes())?,
        "CAPL_TLS_CLIENT_KEY_B64": base64(tls.key_pem.as_bytes())?,
        "CAPL_IMAGE_URL": inputs.image.url(),
        "CAPL_IMAGE_CHECKSUM": inputs.image.checksum,
        "CAPL_NETWORK": super::network::NAME,
        "CAPL_BASE_POOL": BASE_POOL,
        "CAPL_DOMAIN_POOL": DISK_POOL,
        "CAPL_CONTROL_PLANE_ENDPOINT_HOST": super::network::ENDPOINT_HOST,
        // Guests whose CPUs QEMU emulates share 2 host cores: a worker with one
        // vCPU leaves the control plane (2 vCPUs) enough to keep answering.
        "CAPL_WORKER_VCPU": "1",
        VIRSH_URI_VARIABLE: inputs.virsh_uri,
    });
    let intervals: serde_json::Map<String, Value> =
        INTERVALS.iter().map(|(name, interval)| (name.to_string(), json!(interval))).collect();
    let config = json!({
        "managementClusterName": CLUSTER,
        "providers": providers,
        "variables": variables,
        "intervals": intervals,
    });
    let path = inputs.work_dir.join("e2e-config.yaml");
    std::fs::write(&path, serde_yaml::to_string(&config)?).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The release's file `source` with `patch` merged in and the emulation tuning.
fn flavor(source: &Path, patch: Option<&Path>) -> Result<String> {
    let mut text = std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    if let Some(patch) = patch {
        let patch_text = std::fs::read_to_string(patch).with_context(|| format!("reading {}", patch.display()))?;
        text = merged(&text, &patch_text)
            .with_context(|| format!("merging {} into {}", patch.display(), source.display()))?;
    }
    tuned(&text).with_context(|| format!("tuning {}", source.display()))
}

/// The documents of `base` with those of `patch` merged in: a patch document
/// with the kind and name of a base document is merged into it (mappings
/// key by key, anything else replaced); any other is added at the end.
fn merged(base: &str, patch: &str) -> Result<String> {
    let mut all = documents(base)?;
    for change in documents(patch)? {
        let key = |v: &serde_yaml::Value| {
            (v["kind"].as_str().map(str::to_string), v["metadata"]["name"].as_str().map(str::to_string))
        };
        match all.iter_mut().find(|d| key(d) == key(&change)) {
            Some(target) => merge(target, change),
            None => all.push(change),
        }
    }
    let out: Result<Vec<String>> = all.iter().map(|d| Ok(serde_yaml::to_string(d)?)).collect();
    Ok(out?.join("---\n"))
}

fn documents(text: &str) -> Result<Vec<serde_yaml::Value>> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(document)?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

fn merge(target: &mut serde_yaml::Value, change: serde_yaml::Value) {
    match (target, change) {
        (serde_yaml::Value::Mapping(target), serde_yaml::Value::Mapping(change)) => {
            for (key, value) in change {
                match target.get_mut(&key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        target.insert(key, value);
                    }
                }
            }
        }
        (target, change) => *target = change,
    }
}

fn file(source: &Path, target: &str) -> Value {
    json!({"sourcePath": source, "targetName": target})
}

/// A release file with the emulation tuning, its clusterctl variables kept
/// as they were: every `${...}` of the original is in the result, and none
/// became quoted (a quoted `${PORT}` would render as a string where the API
/// wants a number).
fn tuned(text: &str) -> Result<String> {
    let tuned = crate::workload::emulation::patch_manifest(text)?;
    let variables = |t: &str| {
        let mut found: Vec<String> = t.match_indices("${").map(|(i, _)| variable_at(&t[i..])).collect();
        found.sort();
        // Comments, which the tuning drops, name variables the objects use too.
        found.dedup();
        found
    };
    ensure!(variables(&tuned) == variables(text), "the tuning changed the template's variables");
    let quoted = |t: &str| t.matches("'${").count() + t.matches("\"${").count();
    ensure!(quoted(&tuned) == quoted(text), "the tuning quoted a clusterctl variable");
    Ok(tuned)
}

/// `${NAME...}` at the start of `text`, up to its closing brace.
fn variable_at(text: &str) -> String {
    text.find('}').map_or(text, |end| &text[..=end]).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flavor_keeps_the_release_files_variables_when_tuned() {
        for (name, from, patch) in FLAVOR_FILES {
            let source = crate::repo_root().join("templates").join(from);
            let text = flavor(&source, patch.map(|p| patches_dir().join(p)).as_deref())
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_ne!(text, std::fs::read_to_string(&source).unwrap(), "{name} was not tuned");
        }
    }

    #[test]
    fn the_md_remediation_flavor_labels_the_workers_its_health_check_selects() {
        let source = crate::repo_root().join("templates/cluster-template.yaml");
        let text = flavor(&source, Some(&patches_dir().join("md-remediation.yaml"))).unwrap();
        let docs = documents(&text).unwrap();
        let md = docs.iter().find(|d| d["kind"] == "MachineDeployment").unwrap();
        assert!(md["spec"]["template"]["metadata"]["labels"].get("e2e.remediation.label").is_some());
        // The rest of the MachineDeployment is the release's.
        assert_eq!(md["spec"]["template"]["spec"]["infrastructureRef"]["kind"], "LibvirtMachineTemplate");
        let mhc = docs.iter().find(|d| d["kind"] == "MachineHealthCheck").unwrap();
        assert_eq!(mhc["spec"]["selector"]["matchLabels"], md["spec"]["template"]["metadata"]["labels"]);
        assert_eq!(docs.iter().filter(|d| d["kind"] == "MachineDeployment").count(), 1);
    }

    #[test]
    fn the_kcp_md_taints_flavor_taints_control_plane_and_worker_machines_alike() {
        let source = crate::repo_root().join("templates/cluster-template.yaml");
        let text = flavor(&source, Some(&patches_dir().join("kcp-md-taints.yaml"))).unwrap();
        let docs = documents(&text).unwrap();
        let kcp = docs.iter().find(|d| d["kind"] == "KubeadmControlPlane").unwrap();
        let md = docs.iter().find(|d| d["kind"] == "MachineDeployment").unwrap();
        let kcp_taints = &kcp["spec"]["machineTemplate"]["spec"]["taints"];
        let propagation: Vec<_> =
            kcp_taints.as_sequence().unwrap().iter().map(|t| t["propagation"].as_str().unwrap()).collect();
        assert_eq!(propagation, ["OnInitialization", "Always"]);
        assert_eq!(&md["spec"]["template"]["spec"]["taints"], kcp_taints);
        // The rest of both is the release's.
        assert_eq!(kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["kind"], "LibvirtMachineTemplate");
        assert!(kcp["spec"]["kubeadmConfigSpec"].is_mapping());
        assert_eq!(md["spec"]["template"]["spec"]["infrastructureRef"]["kind"], "LibvirtMachineTemplate");
    }

    #[test]
    fn the_remediation_reboot_flavor_hands_the_labelled_workers_to_the_reboot_template() {
        let source = crate::repo_root().join("templates/cluster-template.yaml");
        let text = flavor(&source, Some(&patches_dir().join("remediation-reboot.yaml"))).unwrap();
        let docs = documents(&text).unwrap();
        let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
        let md = find("MachineDeployment");
        let mhc = find("MachineHealthCheck");
        let template = find("LibvirtRemediationTemplate");
        assert_eq!(mhc["spec"]["selector"]["matchLabels"], md["spec"]["template"]["metadata"]["labels"]);
        assert_eq!(md["spec"]["template"]["spec"]["infrastructureRef"]["kind"], "LibvirtMachineTemplate");
        let reference = &mhc["spec"]["remediation"]["templateRef"];
        assert_eq!(reference["apiVersion"], template["apiVersion"]);
        assert_eq!(reference["kind"], "LibvirtRemediationTemplate");
        assert_eq!(reference["name"], template["metadata"]["name"]);
        assert_eq!(template["metadata"]["namespace"], mhc["metadata"]["namespace"]);
        let spec = &template["spec"]["template"]["spec"];
        assert_eq!((spec["retryLimit"].as_i64(), spec["timeoutSeconds"].as_i64()), (Some(1), Some(480)));
        let checks: Vec<(&str, &str)> = mhc["spec"]["checks"]["unhealthyNodeConditions"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
            .collect();
        assert_eq!(checks, [("Ready", "Unknown"), ("Ready", "False"), ("e2e.remediation.condition", "False")]);
    }

    /// The suite's Go files, as one text.
    fn suite_sources() -> String {
        let dir = crate::repo_root().join("e2e/capi");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "go"))
            .collect();
        names.sort();
        names.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect()
    }

    #[test]
    fn every_interval_the_suite_asks_for_by_itself_is_configured() {
        let sources = suite_sources();
        let asked: Vec<&str> = sources
            .split("GetIntervals(specName, \"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap_or_default())
            .collect();
        assert!(asked.contains(&"wait-remediation-given-up"), "{asked:?}");
        for key in asked {
            assert!(
                INTERVALS.iter().any(|(name, _)| *name == format!("default/{key}")),
                "the suite waits with the interval {key}, which INTERVALS lacks"
            );
        }
    }

    #[test]
    fn the_suite_reads_the_virsh_uri_from_the_variable_the_config_sets() {
        assert!(suite_sources().contains(&format!("const virshURIVariable = \"{VIRSH_URI_VARIABLE}\"")));
    }

    #[test]
    fn a_variable_that_becomes_quoted_is_refused() {
        let text = "kind: Foo\nspec:\n  port: ${PORT:=6443}\n";
        assert!(tuned(text).is_ok());
        assert_eq!(variable_at("${PORT:=6443}\n"), "${PORT:=6443}");
    }
}
