//! Every YAML under templates/ and every example in README.md and the book
//! (`docs/src/*.md`) parses, our
//! kinds parse into our types, every reference resolves, and every clusterctl
//! variable is documented.

use std::collections::BTreeSet;

use capl::api::{
    LibvirtCluster, LibvirtClusterTemplate, LibvirtMachine, LibvirtMachineTemplate, LibvirtRemediation,
    LibvirtRemediationTemplate,
};
use serde_json::Value;

use crate::clusterctl_template::{parse_documents, repo_root, substitute, template_files};

/// Kinds that CAPI core and its kubeadm providers install.
const CAPI_KINDS: &[&str] = &[
    "Cluster",
    "ClusterClass",
    "Machine",
    "MachineDeployment",
    "MachineSet",
    "KubeadmControlPlane",
    "KubeadmControlPlaneTemplate",
    "KubeadmConfig",
    "KubeadmConfigTemplate",
    "ClusterResourceSet",
];

/// Parse a document of one of our kinds into its Rust type.
fn check_our_kind(doc: &Value, origin: &str) {
    let kind = doc["kind"].as_str().unwrap();
    let result = match kind {
        "LibvirtCluster" => serde_json::from_value::<LibvirtCluster>(doc.clone()).map(|_| ()),
        "LibvirtMachine" => serde_json::from_value::<LibvirtMachine>(doc.clone()).map(|_| ()),
        "LibvirtClusterTemplate" => serde_json::from_value::<LibvirtClusterTemplate>(doc.clone()).map(|_| ()),
        "LibvirtMachineTemplate" => serde_json::from_value::<LibvirtMachineTemplate>(doc.clone()).map(|_| ()),
        "LibvirtRemediation" => serde_json::from_value::<LibvirtRemediation>(doc.clone()).map(|_| ()),
        "LibvirtRemediationTemplate" => serde_json::from_value::<LibvirtRemediationTemplate>(doc.clone()).map(|_| ()),
        other => panic!("{origin}: unexpected kind {other} in our group"),
    };
    if let Err(err) = result {
        panic!("{origin}: {kind} {} does not parse into our type: {err}", doc["metadata"]["name"]);
    }
}

/// Every `{kind, name}` an object refers to through CAPI's reference fields.
fn references(value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let is_ref =
                    matches!(key.as_str(), "infrastructureRef" | "controlPlaneRef" | "configRef" | "templateRef");
                if is_ref && child["kind"].is_string() {
                    out.push((child["kind"].as_str().unwrap().into(), child["name"].as_str().unwrap().into()));
                }
                references(child, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| references(i, out)),
        _ => {}
    }
}

#[test]
fn every_template_parses_and_its_references_resolve() {
    let files = template_files();
    assert!(files.len() >= 4, "templates/ holds the default, clusterclass, topology and example files");
    for path in files {
        let origin = path.file_name().unwrap().to_string_lossy().to_string();
        let (text, _) = substitute(&std::fs::read_to_string(&path).unwrap());
        let docs = parse_documents(&text);
        assert!(!docs.is_empty(), "{origin} is empty");
        let defined: BTreeSet<(String, String)> = docs
            .iter()
            .map(|d| (d["kind"].as_str().unwrap().to_string(), d["metadata"]["name"].as_str().unwrap().to_string()))
            .collect();
        let mut namespaces = BTreeSet::new();
        for doc in &docs {
            let api_version = doc["apiVersion"].as_str().unwrap();
            if api_version.starts_with("infrastructure.cluster.x-k8s.io/") {
                assert_eq!(api_version, "infrastructure.cluster.x-k8s.io/v1alpha1", "{origin}");
                check_our_kind(doc, &origin);
            } else if api_version.starts_with("ipam.cluster.x-k8s.io/") {
                // The in-cluster IPAM provider's pool, at the version its release serves.
                assert_eq!(
                    (api_version, doc["kind"].as_str().unwrap()),
                    ("ipam.cluster.x-k8s.io/v1alpha2", "InClusterIPPool")
                );
            } else if api_version != "v1" {
                assert!(api_version.ends_with("/v1beta2"), "{origin}: CAPI objects use v1beta2, got {api_version}");
                assert!(CAPI_KINDS.contains(&doc["kind"].as_str().unwrap()), "{origin}: unknown kind {}", doc["kind"]);
            }
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                namespaces.insert(ns.to_string());
            }
            let mut refs = Vec::new();
            references(doc, &mut refs);
            for reference in refs {
                assert!(
                    defined.contains(&reference),
                    "{origin}: {} refers to {reference:?}, which the file does not define",
                    doc["kind"]
                );
            }
        }
        assert!(namespaces.len() <= 1, "{origin}: one namespace at most, found {namespaces:?}");
        if origin.starts_with("clusterclass-") {
            assert!(namespaces.is_empty(), "{origin}: ClusterClass files carry no namespace");
        }
    }
}

#[test]
fn clusterclass_files_carry_no_variables_and_flavors_use_the_standard_ones() {
    for path in template_files() {
        let origin = path.file_name().unwrap().to_string_lossy().to_string();
        let (_, names) = substitute(&std::fs::read_to_string(&path).unwrap());
        if origin.starts_with("clusterclass-") || origin.starts_with("example-") {
            assert!(names.is_empty(), "{origin} must not use clusterctl variables: {names:?}");
        }
        if origin.starts_with("cluster-template") {
            for standard in [
                "CLUSTER_NAME",
                "NAMESPACE",
                "KUBERNETES_VERSION",
                "CONTROL_PLANE_MACHINE_COUNT",
                "WORKER_MACHINE_COUNT",
            ] {
                assert!(names.contains(standard), "{origin} does not use ${{{standard}}}");
            }
            for name in &names {
                let standard = [
                    "CLUSTER_NAME",
                    "NAMESPACE",
                    "KUBERNETES_VERSION",
                    "CONTROL_PLANE_MACHINE_COUNT",
                    "WORKER_MACHINE_COUNT",
                ];
                // The add-ons' versions, named as their projects' own manifests do.
                let add_on_versions = ["KUBE_VIP_VERSION", "KUBE_ROUTER_VERSION"];
                assert!(
                    standard.contains(&name.as_str())
                        || add_on_versions.contains(&name.as_str())
                        || name.starts_with("CAPL_"),
                    "{origin}: ${{{name}}} is neither standard, an add-on's version nor CAPL_-prefixed"
                );
            }
        }
    }
}

#[test]
fn every_template_variable_is_documented() {
    let doc = std::fs::read_to_string(repo_root().join(FLAVORS_PAGE)).unwrap();
    for path in template_files() {
        let (_, names) = substitute(&std::fs::read_to_string(&path).unwrap());
        for name in names {
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "${{{name}}} of {} is not in {FLAVORS_PAGE}",
                path.display()
            );
        }
    }
}

#[test]
fn kubeadm_configs_set_the_provider_id_the_provider_uses() {
    for path in template_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        if text.contains("kubeletExtraArgs") {
            // cloud-init's instance-id is the identity; Ignition has no templating, and the
            // flavor's first command sets it from the SMBIOS UUID, which is the same.
            let expected = if text.contains("format: ignition") {
                "value: libvirt://__CAPL_INSTANCE_ID__"
            } else {
                "value: \"libvirt://{{ ds.meta_data.instance_id }}\""
            };
            assert!(text.contains(expected), "{}", path.display());
            let occurrences = text.matches("kubeletExtraArgs").count();
            assert_eq!(
                text.matches("name: provider-id").count(),
                occurrences,
                "{}: every kubeletExtraArgs sets provider-id",
                path.display()
            );
        }
    }
}

/// The book's page with the flavors' variables table.
const FLAVORS_PAGE: &str = "docs/src/flavors.md";

/// README.md and the book's pages (`docs/src/*.md`).
fn documentation() -> Vec<(String, String)> {
    let mut files = vec![repo_root().join("README.md")];
    let pages = std::fs::read_dir(repo_root().join("docs/src")).unwrap();
    files.extend(pages.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "md")));
    files.sort();
    files.into_iter().map(|p| (p.display().to_string(), std::fs::read_to_string(&p).unwrap())).collect()
}

/// ```yaml blocks of README.md and the book that mention our API group, with
/// the file each is in.
fn documented_yaml_blocks() -> Vec<(String, String)> {
    documentation()
        .into_iter()
        .flat_map(|(file, text)| yaml_blocks(&text).into_iter().map(move |b| (file.clone(), b)))
        .collect()
}

fn yaml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start().starts_with("```")) {
            (None, true) if line.trim_start().trim_start_matches('`').starts_with("yaml") => {
                current = Some(String::new())
            }
            (Some(block), true) => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), false) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {}
        }
    }
    blocks.into_iter().filter(|b| b.contains("infrastructure.cluster.x-k8s.io")).collect()
}

#[test]
fn documented_examples_parse_into_our_types() {
    let blocks = documented_yaml_blocks();
    assert!(!blocks.is_empty(), "the book shows at least one LibvirtCluster/LibvirtMachine example");
    let mut kinds = BTreeSet::new();
    for (file, block) in blocks {
        // A block with clusterctl variables (the several-hosts example) is read filled in.
        let (block, _) = substitute(&block);
        for doc in parse_documents(&block) {
            if doc["apiVersion"].as_str().is_some_and(|v| v.starts_with("infrastructure.cluster.x-k8s.io/")) {
                check_our_kind(&doc, &file);
                kinds.insert(doc["kind"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(kinds.contains("LibvirtCluster") && kinds.contains("LibvirtMachine"), "{kinds:?}");
}

#[test]
fn the_example_machine_uses_the_documented_defaults() {
    let (text, _) =
        substitute(&std::fs::read_to_string(repo_root().join("templates/example-single-machine.yaml")).unwrap());
    let docs = parse_documents(&text);
    let machine: LibvirtMachine =
        serde_json::from_value(docs.iter().find(|d| d["kind"] == "LibvirtMachine").unwrap().clone()).unwrap();
    assert_eq!((machine.spec.vcpu, machine.spec.memory_mib, machine.spec.disk_gib), (2, 2048, 20));
    let defaulted: LibvirtMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": {"name": "m"}, "spec": {"image": "base.qcow2"}
    }))
    .unwrap();
    assert_eq!((defaulted.spec.vcpu, defaulted.spec.memory_mib, defaulted.spec.disk_gib), (1, 1024, 20));
}
