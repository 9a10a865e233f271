//! The shipped flavors need only what a stock kubeadm node image carries
//! (kubernetes-sigs/image-builder: kubeadm, kubelet, kubectl, containerd,
//! crictl, cloud-init): no image of this project's test rig, no image that must
//! be in the node already, no program of ours run in the guest.

use serde_json::Value;

use crate::clusterctl_template::{parse_documents, substitute, template_files};

/// Every string of `value`, recursively.
fn strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The words of `text` (split at blanks, quotes, `;`, `|`, `&`, `(`, `)`, `=`
/// and path separators) that start with `capl-`: a command, script or unit of
/// this project's node image.
fn capl_commands(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || "\"'`;|&()=/,[]".contains(c))
        .filter(|word| word.starts_with("capl-"))
        .map(str::to_string)
        .collect()
}

/// What a shipped template must not hold, one line each.
fn violations(origin: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.contains("capl.local/") {
            found.push(format!("{origin}:{}: an image of the test rig: {}", number + 1, line.trim()));
        }
        let compact: String = line.chars().filter(|c| !c.is_whitespace() && *c != '"' && *c != '\'').collect();
        if compact.contains("imagePullPolicy:Never") {
            found.push(format!("{origin}:{}: imagePullPolicy Never: {}", number + 1, line.trim()));
        }
    }
    let (substituted, _) = substitute(text);
    let mut all = Vec::new();
    let docs = parse_documents(&substituted);
    for doc in &docs {
        strings(doc, &mut all);
    }
    for string in all {
        for command in capl_commands(string) {
            found.push(format!("{origin}: runs {command}: {}", string.lines().next().unwrap_or_default()));
        }
    }
    found
}

#[test]
fn shipped_templates_need_only_a_stock_kubeadm_image() {
    let files = template_files();
    assert!(files.len() >= 4, "templates/ holds the default, clusterclass, topology and example files");
    let mut found = Vec::new();
    for path in files {
        let origin = path.file_name().unwrap().to_string_lossy().to_string();
        found.extend(violations(&origin, &std::fs::read_to_string(&path).unwrap()));
    }
    assert!(found.is_empty(), "the shipped templates need more than a stock kubeadm image:\n{}", found.join("\n"));
}

#[test]
fn the_check_finds_each_thing_a_stock_image_lacks() {
    let template = |body: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n{body}");
    for (body, what) in [
        ("  a: |\n    image: capl.local/busybox:1.35\n", "an image of the test rig"),
        ("  a: |\n    imagePullPolicy: Never\n", "imagePullPolicy Never"),
        ("  a: \"imagePullPolicy: 'Never'\"\n", "imagePullPolicy Never"),
        ("  a: capl-control-plane-vip\n", "runs capl-control-plane-vip"),
        ("  a: systemctl enable --now capl-pod-network\n", "runs capl-pod-network"),
        ("  a: /usr/local/sbin/capl-control-plane-stagger 6443\n", "runs capl-control-plane-stagger"),
    ] {
        let found = violations("t.yaml", &template(body));
        assert!(found.iter().any(|f| f.contains(what)), "{body:?} was not reported as {what:?}: {found:?}");
    }
    let clean = template("  a: |\n    image: ghcr.io/kube-vip/kube-vip:v1.0.0\n    imagePullPolicy: IfNotPresent\n");
    assert_eq!(violations("t.yaml", &clean), Vec::<String>::new());
}

/// The kube-router manifest each flavor's ClusterResourceSet applies.
fn cni_manifest(file: &str) -> String {
    let path = crate::clusterctl_template::repo_root().join("templates").join(file);
    let (text, _) = substitute(&std::fs::read_to_string(&path).unwrap());
    let docs = parse_documents(&text);
    let crs = docs.iter().find(|d| d["kind"] == "ClusterResourceSet").unwrap_or_else(|| panic!("{file}: no CRS"));
    let name = crs["spec"]["resources"][0]["name"].as_str().unwrap();
    assert_eq!(crs["spec"]["resources"][0]["kind"], "ConfigMap", "{file}");
    let cluster = docs.iter().find(|d| d["kind"] == "Cluster").unwrap();
    for (key, value) in crs["spec"]["clusterSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&cluster["metadata"]["labels"][key], value, "{file}: the Cluster is not selected by the CRS");
    }
    let map = docs.iter().find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name).unwrap();
    map["data"]["kube-router.yaml"].as_str().unwrap().to_string()
}

#[test]
fn every_cluster_flavor_installs_the_same_cni_through_a_cluster_resource_set() {
    let default = cni_manifest("cluster-template.yaml");
    for file in ["cluster-template-topology.yaml", "cluster-template-allocated-endpoint.yaml"] {
        assert_eq!(cni_manifest(file), default, "{file} ships another CNI manifest than cluster-template.yaml");
    }
    let docs = parse_documents(&default);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ConfigMap", "DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]);
    let pod = &docs[1]["spec"]["template"]["spec"];
    for container in pod["containers"].as_array().unwrap().iter().chain(pod["initContainers"].as_array().unwrap()) {
        assert!(
            container["image"].as_str().unwrap().starts_with("docker.io/cloudnativelabs/kube-router:v"),
            "{container}"
        );
        assert_eq!(container["imagePullPolicy"], "IfNotPresent", "{container}");
    }
}
