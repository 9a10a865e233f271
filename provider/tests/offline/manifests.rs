//! The committed manifests are what the code generates, the CRDs carry what
//! the CAPI contract requires, and a release has the shape clusterctl expects.

use std::path::{Path, PathBuf};

use capl::manifests;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn committed_manifests_match_the_code() {
    let root = repo_root();
    let mut stale = Vec::new();
    let mut files = manifests::config_files();
    files.push(manifests::ManifestFile {
        path: "metadata.yaml".into(),
        documents: vec![manifests::clusterctl_metadata()],
    });
    for file in files {
        let committed = std::fs::read_to_string(root.join(&file.path)).unwrap_or_default();
        if committed != file.to_yaml() {
            stale.push(file.path);
        }
    }
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    for (path, flavor) in manifests::generated_flavors(&default_flavor).unwrap() {
        if std::fs::read_to_string(root.join(path)).unwrap_or_default() != flavor {
            stale.push(path.into());
        }
    }
    if std::fs::read_to_string(root.join(capl::api_reference::PATH)).unwrap_or_default()
        != capl::api_reference::markdown()
    {
        stale.push(capl::api_reference::PATH.into());
    }
    assert!(stale.is_empty(), "stale generated files {stale:?}: run `cargo xtask manifests` and commit the result");
}

/// Every field of the four kinds' schemas, found by a walk of its own, is a
/// row of the committed API reference.
#[test]
fn the_api_reference_lists_every_field_of_every_kind() {
    fn walk(path: &str, schema: &Value, out: &mut Vec<String>) {
        let (inner, inner_path) = if schema["type"] == "array" {
            (&schema["items"], format!("{path}[]"))
        } else if schema["additionalProperties"].is_object() {
            (&schema["additionalProperties"], format!("{path}.*"))
        } else {
            (schema, path.to_string())
        };
        for (name, child) in inner["properties"].as_object().into_iter().flatten() {
            let child_path = if inner_path.is_empty() { name.clone() } else { format!("{inner_path}.{name}") };
            if inner_path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
                continue;
            }
            out.push(child_path.clone());
            walk(&child_path, child, out);
        }
    }
    let reference = std::fs::read_to_string(repo_root().join(capl::api_reference::PATH)).unwrap();
    let mut kinds = 0;
    for crd in capl::api::crds() {
        let kind = crd.spec.names.kind.clone();
        let section = reference
            .split(&format!("\n## {kind}\n"))
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .unwrap_or_else(|| panic!("{} has no section {kind}", capl::api_reference::PATH));
        let value = serde_json::to_value(&crd).unwrap();
        let mut paths = Vec::new();
        walk("", &value["spec"]["versions"][0]["schema"]["openAPIV3Schema"], &mut paths);
        assert!(paths.iter().any(|p| p.starts_with("spec.")), "{kind}: no spec field found: {paths:?}");
        for path in paths {
            assert!(section.contains(&format!("| `{path}` |")), "{kind}: field {path} is not in the API reference");
        }
        kinds += 1;
    }
    assert_eq!(kinds, 6);
}

/// The allocated-endpoint flavor is the default flavor with the LibvirtCluster
/// asking for an endpoint instead of naming one, and nothing else changed.
#[test]
fn the_allocated_endpoint_flavor_differs_from_the_default_only_in_the_endpoint() {
    let root = repo_root();
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    let flavor = manifests::allocated_endpoint_flavor(&default_flavor).unwrap();
    let docs = |text: &str| -> Vec<Value> {
        let (text, _) = crate::clusterctl_template::substitute(text);
        crate::clusterctl_template::parse_documents(&text)
    };
    let (default_docs, flavor_docs) = (docs(&default_flavor), docs(&flavor));
    assert_eq!(default_docs.len(), flavor_docs.len());
    for (before, after) in default_docs.iter().zip(&flavor_docs) {
        if before["kind"] == "LibvirtCluster" {
            assert!(after["spec"]["controlPlaneEndpoint"].is_null(), "{after}");
            assert!(after["spec"]["controlPlaneEndpointFrom"]["network"].is_object(), "{after}");
            let mut without = before.clone();
            without["spec"].as_object_mut().unwrap().remove("controlPlaneEndpoint");
            let mut after = after.clone();
            after["spec"].as_object_mut().unwrap().remove("controlPlaneEndpointFrom");
            assert_eq!(without, after);
        } else if before["kind"] == "KubeadmControlPlane" {
            // kube-vip's address is written on the node, from the kubeadm configuration.
            let mut expected = before.clone();
            let spec = &mut expected["spec"]["kubeadmConfigSpec"];
            let env = spec["files"][0]["content"]
                .as_str()
                .unwrap()
                .replace("value: 192.168.122.10\n", "value: CONTROL_PLANE_ENDPOINT_HOST\n");
            spec["files"][0]["content"] = env.into();
            let commands = after["spec"]["kubeadmConfigSpec"]["preKubeadmCommands"].as_array().unwrap();
            assert!(commands[0].as_str().unwrap().starts_with("sed -i \"s/CONTROL_PLANE_ENDPOINT_HOST/"), "{after}");
            spec["preKubeadmCommands"].as_array_mut().unwrap().insert(0, commands[0].clone());
            assert_eq!(&expected, after);
        } else {
            assert_eq!(before, after);
        }
    }
    let (_, variables) = crate::clusterctl_template::substitute(&flavor);
    assert!(!variables.contains("CAPL_CONTROL_PLANE_ENDPOINT_HOST"), "the flavor needs no endpoint address");
    assert!(variables.contains("CAPL_CONTROL_PLANE_ENDPOINT_PORT"), "the port stays a variable");

    // A default flavor the generator does not recognise is an error, not a silent copy.
    let changed = default_flavor.replace("controlPlaneEndpoint:\n", "controlPlaneEndpoint: \n");
    let err = manifests::allocated_endpoint_flavor(&changed).unwrap_err();
    assert!(err.contains("exactly once"), "{err}");
}

/// The ssh and local flavors are the default flavor with other credentials:
/// ssh a Secret with an SSH key and known_hosts line, local none at all and a
/// URI that defaults to the manager's own host; nothing else changed.
#[test]
fn the_credential_flavors_differ_from_the_default_only_in_the_credentials() {
    let root = repo_root();
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    let docs = |text: &str| -> Vec<Value> {
        let (text, _) = crate::clusterctl_template::substitute(text);
        crate::clusterctl_template::parse_documents(&text)
    };
    let default_docs = docs(&default_flavor);
    let is_secret = |d: &Value| d["kind"] == "Secret";
    let without_credentials = |d: &Value| {
        let mut d = d.clone();
        if d["kind"] == "LibvirtCluster" {
            let spec = d["spec"].as_object_mut().unwrap();
            spec.remove("credentialsRef");
            spec.remove("uri");
        }
        d
    };
    let rest =
        |list: &[Value]| -> Vec<Value> { list.iter().filter(|d| !is_secret(d)).map(without_credentials).collect() };

    let ssh = manifests::ssh_flavor(&default_flavor).unwrap();
    let ssh_docs = docs(&ssh);
    let secret = ssh_docs.iter().find(|d| is_secret(d)).expect("the ssh flavor has its Secret");
    let keys: Vec<&String> = secret["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["known_hosts", "ssh-privatekey"]);
    let cluster = ssh_docs.iter().find(|d| d["kind"] == "LibvirtCluster").unwrap();
    assert_eq!(cluster["spec"]["credentialsRef"]["name"], secret["metadata"]["name"]);
    assert_eq!(secret["metadata"]["labels"]["clusterctl.cluster.x-k8s.io/move"], "");
    assert_eq!(rest(&ssh_docs), rest(&default_docs));
    let (_, variables) = crate::clusterctl_template::substitute(&ssh);
    assert!(variables.contains("CAPL_SSH_PRIVATE_KEY_B64") && variables.contains("CAPL_SSH_KNOWN_HOSTS_B64"));
    assert!(!variables.iter().any(|v| v.starts_with("CAPL_TLS_")), "{variables:?}");

    let local = manifests::local_flavor(&default_flavor).unwrap();
    let local_docs = docs(&local);
    assert!(!local_docs.iter().any(is_secret), "the local flavor has no Secret");
    let cluster = local_docs.iter().find(|d| d["kind"] == "LibvirtCluster").unwrap();
    assert!(cluster["spec"]["credentialsRef"].is_null(), "{cluster}");
    assert_eq!(rest(&local_docs), rest(&default_docs));
    let (_, variables) = crate::clusterctl_template::substitute(&local);
    assert!(!variables.iter().any(|v| v.starts_with("CAPL_TLS_") || v.starts_with("CAPL_SSH_")), "{variables:?}");
    assert!(local.contains("uri: ${CAPL_LIBVIRT_URI:=qemu:///system}"), "the local URI defaults to qemu:///system");

    // A default flavor the generators do not recognise is an error, not a silent copy.
    let changed = default_flavor.replace("name: ${CLUSTER_NAME}-libvirt-tls\n", "name: ${CLUSTER_NAME}-tls\n");
    for err in [manifests::ssh_flavor(&changed).unwrap_err(), manifests::local_flavor(&changed).unwrap_err()] {
        assert!(err.contains("exactly once"), "{err}");
    }
}

/// The bridged flavor is the default flavor on a bridge network, with an
/// InClusterIPPool that both LibvirtMachineTemplates take their addresses from
/// (and the LAN's DNS server); nothing else changed.
#[test]
fn the_bridged_flavor_adds_an_ip_pool_for_every_machine_and_nothing_else() {
    let root = repo_root();
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    let flavor = manifests::bridged_flavor(&default_flavor).unwrap();
    let docs = |text: &str| -> Vec<Value> {
        let (text, _) = crate::clusterctl_template::substitute(text);
        crate::clusterctl_template::parse_documents(&text)
    };
    let (default_docs, flavor_docs) = (docs(&default_flavor), docs(&flavor));
    let pools: Vec<&Value> = flavor_docs.iter().filter(|d| d["kind"] == "InClusterIPPool").collect();
    assert_eq!(pools.len(), 1, "one pool");
    let pool = pools[0];
    assert_eq!(pool["spec"]["addresses"][0], "10.77.0.10-10.77.0.99");
    assert_eq!((&pool["spec"]["prefix"], &pool["spec"]["gateway"]), (&Value::from(24), &Value::from("10.77.0.1")));
    let rest: Vec<&Value> = flavor_docs.iter().filter(|d| d["kind"] != "InClusterIPPool").collect();
    assert_eq!(rest.len(), default_docs.len());
    let mut templates = 0;
    for (before, after) in default_docs.iter().zip(rest) {
        let mut expected = before.clone();
        match before["kind"].as_str().unwrap() {
            "LibvirtCluster" => expected["spec"]["network"] = "sample".into(),
            "LibvirtMachineTemplate" => {
                templates += 1;
                let spec = &mut expected["spec"]["template"]["spec"];
                spec["addressesFromPools"] = serde_json::json!([
                    {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": pool["metadata"]["name"]}
                ]);
                spec["nameservers"] = serde_json::json!(["10.77.0.1"]);
            }
            _ => {}
        }
        assert_eq!(&expected, after);
    }
    assert_eq!(templates, 2, "the control plane's and the workers' templates");
    let (_, variables) = crate::clusterctl_template::substitute(&flavor);
    for name in ["CAPL_NETWORK", "CAPL_IP_POOL_RANGE", "CAPL_IP_POOL_GATEWAY", "CAPL_IP_POOL_PREFIX", "CAPL_NAMESERVER"]
    {
        assert!(variables.contains(name), "{name}");
    }
    assert!(flavor.contains("network: ${CAPL_NETWORK}\n"), "the bridge network has no default");
    let changed =
        default_flavor.replace("format: ${CAPL_IMAGE_FORMAT:=qcow2}\n", "format: \"${CAPL_IMAGE_FORMAT:=qcow2}\"\n");
    assert!(manifests::bridged_flavor(&changed).unwrap_err().contains("both LibvirtMachineTemplates"));
}

/// The pool-image flavor is the default flavor with each LibvirtMachineTemplate
/// naming a volume of the base pool instead of a URL and checksum; nothing
/// else changed, and it asks for no URL variable.
#[test]
fn the_pool_image_flavor_names_a_volume_instead_of_a_url_and_nothing_else() {
    let root = repo_root();
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    let flavor = manifests::pool_image_flavor(&default_flavor).unwrap();
    let docs = |text: &str| -> Vec<Value> {
        let (text, _) = crate::clusterctl_template::substitute(text);
        crate::clusterctl_template::parse_documents(&text)
    };
    let (default_docs, flavor_docs) = (docs(&default_flavor), docs(&flavor));
    assert_eq!(default_docs.len(), flavor_docs.len());
    let mut templates = 0;
    for (before, after) in default_docs.iter().zip(&flavor_docs) {
        let mut expected = before.clone();
        if before["kind"] == "LibvirtMachineTemplate" {
            templates += 1;
            let spec = expected["spec"]["template"]["spec"].as_object_mut().unwrap();
            assert!(spec.remove("imageURL").is_some(), "the default flavor names its image by URL: {before}");
            spec.insert("image".into(), after["spec"]["template"]["spec"]["image"].clone());
            assert!(after["spec"]["template"]["spec"]["image"].is_string(), "{after}");
        }
        assert_eq!(&expected, after);
    }
    assert_eq!(templates, 2, "the control plane's and the workers' templates");
    let (_, variables) = crate::clusterctl_template::substitute(&flavor);
    assert!(variables.contains("CAPL_IMAGE"), "{variables:?}");
    assert!(!variables.iter().any(|v| v.starts_with("CAPL_IMAGE_")), "{variables:?}");
    assert!(flavor.contains("      image: ${CAPL_IMAGE}\n"), "the volume has no default");

    let changed =
        default_flavor.replacen("checksumType: ${CAPL_IMAGE_CHECKSUM_TYPE:=sha256}", "checksumType: sha512", 1);
    assert!(manifests::pool_image_flavor(&changed).unwrap_err().contains("both LibvirtMachineTemplates"));
}

/// The data-disks flavor is the default flavor with an etcd data disk on
/// each control-plane machine, formatted and mounted by cloud-init from the
/// serial the disk's name gives it, and etcd's data directory under the
/// mount; nothing else changed.
#[test]
fn the_data_disks_flavor_puts_etcd_on_its_own_disk_and_changes_nothing_else() {
    let root = repo_root();
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    let flavor = manifests::data_disks_flavor(&default_flavor).unwrap();
    let docs = |text: &str| -> Vec<Value> {
        let (text, _) = crate::clusterctl_template::substitute(text);
        crate::clusterctl_template::parse_documents(&text)
    };
    let (default_docs, flavor_docs) = (docs(&default_flavor), docs(&flavor));
    assert_eq!(default_docs.len(), flavor_docs.len());
    let mut changed = Vec::new();
    for (before, after) in default_docs.iter().zip(&flavor_docs) {
        if before != after {
            changed.push(after.clone());
        }
    }
    let kinds: Vec<&str> = changed.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["KubeadmControlPlane", "LibvirtMachineTemplate"], "only these change");
    let (kcp, template) = (&changed[0], &changed[1]);
    assert!(template["metadata"]["name"].as_str().unwrap().ends_with("-control-plane"), "{template}");
    let disks = template["spec"]["template"]["spec"]["dataDisks"].as_array().unwrap();
    assert_eq!(disks.len(), 1, "{disks:?}");
    let name = disks[0]["name"].as_str().unwrap();
    let config = &kcp["spec"]["kubeadmConfigSpec"];
    let filesystem = &config["diskSetup"]["filesystems"][0];
    assert_eq!(filesystem["device"], format!("/dev/disk/by-id/virtio-{name}"), "{config}");
    let label = filesystem["label"].as_str().unwrap();
    let mount = config["mounts"][0].as_array().unwrap();
    assert_eq!(mount[0], format!("LABEL={label}"), "{config}");
    let data_dir = config["clusterConfiguration"]["etcd"]["local"]["dataDir"].as_str().unwrap();
    assert!(data_dir.starts_with(&format!("{}/", mount[1].as_str().unwrap())), "{data_dir} is under the mount");
    let mut expected = kcp.clone();
    let spec = expected["spec"]["kubeadmConfigSpec"].as_object_mut().unwrap();
    for key in ["diskSetup", "mounts", "clusterConfiguration"] {
        spec.remove(key);
    }
    let before = default_docs.iter().find(|d| d["kind"] == "KubeadmControlPlane").unwrap();
    assert_eq!(&expected, before, "the rest of the KubeadmControlPlane is the default flavor's");
    let (_, variables) = crate::clusterctl_template::substitute(&flavor);
    assert!(variables.contains("CAPL_ETCD_DISK_GIB"), "{variables:?}");
}

/// The flatcar flavor is the default flavor with both bootstrap configs in
/// format ignition, kubeadm's unit enabled, and the kubelet's provider ID
/// taken from the machine's SMBIOS UUID by the first command of each
/// config, since Ignition has no cloud-init templating; the rest of each
/// document is the default flavor's.
#[test]
fn the_flatcar_flavor_bootstraps_with_ignition_and_changes_nothing_else() {
    let root = repo_root();
    let default_flavor = std::fs::read_to_string(root.join(manifests::DEFAULT_FLAVOR)).unwrap();
    let flavor = manifests::flatcar_flavor(&default_flavor).unwrap();
    assert!(!flavor.contains("{{"), "cloud-init templating left in an Ignition flavor");
    let docs = |text: &str| -> Vec<Value> {
        let (text, _) = crate::clusterctl_template::substitute(text);
        crate::clusterctl_template::parse_documents(&text)
    };
    let (default_docs, flavor_docs) = (docs(&default_flavor), docs(&flavor));
    assert_eq!(default_docs.len(), flavor_docs.len());
    let mut configs = 0;
    for (before, after) in default_docs.iter().zip(&flavor_docs) {
        let path: &[&str] = match after["kind"].as_str().unwrap() {
            "KubeadmControlPlane" => &["spec", "kubeadmConfigSpec"],
            "KubeadmConfigTemplate" => &["spec", "template", "spec"],
            _ => {
                assert_eq!(before, after, "only the bootstrap configs change");
                continue;
            }
        };
        configs += 1;
        let config = path.iter().fold(after, |v, key| &v[*key]);
        assert_eq!(config["format"], "ignition", "{config}");
        let units = config["ignition"]["containerLinuxConfig"]["additionalConfig"].as_str().unwrap();
        assert!(units.contains("- name: kubeadm.service\n    enabled: true"), "{units}");
        let first = config["preKubeadmCommands"][0].as_str().unwrap();
        assert!(first.contains("/sys/class/dmi/id/product_uuid") && first.contains("/etc/kubeadm.yml"), "{first}");
        let ids: Vec<&Value> = ["initConfiguration", "joinConfiguration"]
            .iter()
            .filter_map(|c| config[*c]["nodeRegistration"]["kubeletExtraArgs"].as_array())
            .flatten()
            .filter(|arg| arg["name"] == "provider-id")
            .map(|arg| &arg["value"])
            .collect();
        assert!(!ids.is_empty() && ids.iter().all(|v| *v == "libvirt://__CAPL_INSTANCE_ID__"), "{ids:?}");
        assert!(first.contains("__CAPL_INSTANCE_ID__"), "the placeholder the first command replaces: {first}");
        // Everything else as in the default flavor, but the kube-vip commands' test for the init node.
        let strip = |doc: &Value| {
            let mut doc = doc.clone();
            let config = path.iter().fold(&mut doc, |v, key| &mut v[*key]).as_object_mut().unwrap();
            for key in [
                "format",
                "ignition",
                "preKubeadmCommands",
                "postKubeadmCommands",
                "initConfiguration",
                "joinConfiguration",
            ] {
                config.remove(key);
            }
            doc
        };
        assert_eq!(strip(before), strip(after));
    }
    assert_eq!(configs, 2, "the control plane's and the workers' bootstrap configs");
}

fn crd_json(kind: &str) -> Value {
    let crd = manifests::crds().into_iter().find(|c| c.spec.names.kind == kind).unwrap();
    serde_json::to_value(crd).unwrap()
}

#[rstest::rstest]
#[case("LibvirtCluster", "libvirtclusters")]
#[case("LibvirtMachine", "libvirtmachines")]
#[case("LibvirtClusterTemplate", "libvirtclustertemplates")]
#[case("LibvirtMachineTemplate", "libvirtmachinetemplates")]
fn crd_follows_the_contract(#[case] kind: &str, #[case] plural: &str) {
    let crd = crd_json(kind);
    assert_eq!(crd["metadata"]["name"], format!("{plural}.infrastructure.cluster.x-k8s.io"));
    assert_eq!(crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"], "v1alpha1");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let versions = crd["spec"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0]["name"], "v1alpha1");
    assert_eq!(versions[0]["served"], true);
    assert_eq!(versions[0]["storage"], true);
    if !kind.ends_with("Template") || kind == "LibvirtMachineTemplate" {
        assert!(versions[0]["subresources"]["status"].is_object(), "{kind} has a status subresource");
    }
}

fn schema<'a>(crd: &'a Value, path: &[&str]) -> &'a Value {
    let mut node = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for key in path {
        node = &node["properties"][key];
    }
    node
}

#[rstest::rstest]
#[case("LibvirtCluster", &["status", "conditions"], "type")]
#[case("LibvirtCluster", &["status", "failureDomains"], "name")]
#[case("LibvirtMachine", &["status", "conditions"], "type")]
fn lists_are_maps_keyed_as_the_contract_says(#[case] kind: &str, #[case] path: &[&str], #[case] key: &str) {
    let crd = crd_json(kind);
    let list = schema(&crd, path);
    assert_eq!(list["x-kubernetes-list-type"], "map", "{kind} {path:?}");
    assert_eq!(list["x-kubernetes-list-map-keys"], serde_json::json!([key]), "{kind} {path:?}");
}

#[test]
fn machine_defaults_and_bounds() {
    let crd = crd_json("LibvirtMachine");
    for (field, default, minimum) in [("vcpu", 1, 1), ("memoryMiB", 1024, 256), ("diskGiB", 20, 1)] {
        let node = schema(&crd, &["spec", field]);
        assert_eq!(node["default"], default, "{field} default");
        assert_eq!(node["minimum"].as_f64(), Some(minimum as f64), "{field} minimum");
    }
    // The base image is required as exactly one of image and imageURL, which
    // a rule says (a schema's required list cannot say "one of").
    let spec = schema(&crd, &["spec"]);
    assert!(spec.get("required").is_none(), "{spec}");
    assert!(rules(spec).contains(&"has(self.image) != has(self.imageURL)".to_string()), "{spec}");
    let url = schema(&crd, &["spec", "imageURL"]);
    assert_eq!(url["required"], serde_json::json!(["checksum", "checksumType", "url"]));
    assert_eq!(url["properties"]["format"]["default"], "qcow2");
}

fn rules(node: &Value) -> Vec<String> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|rules| rules.iter().map(|r| r["rule"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[rstest::rstest]
#[case("LibvirtCluster", &["uri", "network", "basePool", "domainPool"])]
#[case("LibvirtMachine", &["image", "diskGiB", "vcpu", "memoryMiB"])]
fn immutable_fields_carry_a_cel_rule(#[case] kind: &str, #[case] fields: &[&str]) {
    let crd = crd_json(kind);
    for field in fields {
        assert_eq!(rules(schema(&crd, &["spec", field])), vec!["self == oldSelf"], "{kind}.spec.{field}");
    }
}

#[test]
fn set_once_fields_carry_a_cel_rule() {
    let cluster = crd_json("LibvirtCluster");
    assert!(rules(schema(&cluster, &["spec"]))[0].contains("oldSelf.controlPlaneEndpoint"));
    let machine = crd_json("LibvirtMachine");
    assert!(rules(schema(&machine, &["spec"]))[0].contains("oldSelf.providerID"));
}

#[test]
fn template_specs_carry_no_transition_rules_so_topology_dry_runs_pass() {
    for kind in ["LibvirtClusterTemplate", "LibvirtMachineTemplate"] {
        let text = serde_json::to_string(&crd_json(kind)).unwrap();
        assert!(!text.contains("oldSelf"), "{kind}");
    }
    // The rules that judge one object alone stay: what its objects would refuse, the template refuses.
    let template = crd_json("LibvirtMachineTemplate");
    let firmware = schema(&template, &["spec", "template", "spec", "firmware"]);
    assert!(rules(firmware).iter().any(|r| r.contains("secureBoot")), "{firmware}");
    let cluster = crd_json("LibvirtClusterTemplate");
    assert!(rules(schema(&cluster, &["spec", "template", "spec"])).iter().any(|r| r.contains("has(self.hosts)")));
    let policy = manifests::config_files().into_iter().find(|f| f.path.contains("template_immutability")).unwrap();
    let expression = policy.documents[0]["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(expression.contains("request.dryRun") && expression.contains("topology.cluster.x-k8s.io/dry-run"));
}

#[rstest::rstest]
#[case("LibvirtCluster")]
#[case("LibvirtMachine")]
#[case("LibvirtClusterTemplate")]
#[case("LibvirtMachineTemplate")]
fn crd_schema_snapshot(#[case] kind: &str) {
    let crd = crd_json(kind);
    insta::assert_yaml_snapshot!(kind, crd["spec"]["versions"][0]);
}

#[test]
fn release_has_the_shape_clusterctl_expects() {
    let out = tempdir("release");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_capl-manifests"))
        .args(["release", "--version", "v0.1.0", "--image", "registry.example/capl:v0.1.0", "--root"])
        .arg(repo_root())
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let out_root = out.clone();
    let out = out.join("infrastructure-libvirt").join("v0.1.0");
    for artifact in ["infrastructure-components.yaml", "metadata.yaml", "cluster-template.yaml", "install.yaml"] {
        assert!(out.join(artifact).is_file(), "{artifact} missing");
    }
    for artifact in ["infrastructure-components.yaml", "install.yaml"] {
        let text = std::fs::read_to_string(out.join(artifact)).unwrap();
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .filter(|d: &Value| !d.is_null())
            .collect();
        assert_eq!(manifests::kinds(&docs).get("Namespace"), Some(&1), "{artifact}: exactly one Namespace");
        for doc in &docs {
            assert_eq!(
                doc["metadata"]["labels"]["cluster.x-k8s.io/provider"], "infrastructure-libvirt",
                "{artifact}: {} {} lacks the provider label",
                doc["kind"], doc["metadata"]["name"]
            );
        }
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let containers = deployment["spec"]["template"]["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0]["name"], "manager");
        assert_eq!(containers[0]["image"], "registry.example/capl:v0.1.0");
        let args: Vec<&str> = containers[0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(args.iter().any(|a| a.starts_with("--namespace=")), "{args:?}");
        let crds = docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").count();
        assert_eq!(crds, capl::api::crds().len());
        if artifact == "install.yaml" {
            assert!(!text.contains("${"), "install.yaml is applied with kubectl: no clusterctl variables");
        }
    }
    let metadata: Value = serde_yaml::from_str(&std::fs::read_to_string(out.join("metadata.yaml")).unwrap()).unwrap();
    assert_eq!(metadata["apiVersion"], "clusterctl.cluster.x-k8s.io/v1alpha3");
    assert_eq!(metadata["releaseSeries"][0]["contract"], "v1beta2");
    std::fs::remove_dir_all(out_root).unwrap();
}

/// Runs `capl-manifests release --version <version> --image <image> --out <out>`
/// on this repository, as `cargo xtask release` does.
pub fn run_release(version: &str, image: &str, out: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_capl-manifests"))
        .args(["release", "--version", version, "--image", image, "--root"])
        .arg(repo_root())
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

/// Runs `capl-manifests release` for `version`; returns (success, stderr, release directory).
fn release(version: &str) -> (bool, String, PathBuf) {
    let out = tempdir(&format!("release-{version}"));
    let output = run_release(version, "registry.example/capl:dev", &out);
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned(), out)
}

fn release_series(dir: &std::path::Path) -> Vec<(u64, u64, String)> {
    let metadata: Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("metadata.yaml")).unwrap()).unwrap();
    metadata["releaseSeries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["major"].as_u64().unwrap(), s["minor"].as_u64().unwrap(), s["contract"].as_str().unwrap().into()))
        .collect()
}

#[rstest::rstest]
#[case("v0.1.0", vec![(0, 1)])]
#[case("v0.1.7", vec![(0, 1)])]
#[case("v0.2.0", vec![(0, 1), (0, 2)])]
#[case("v0.2.0-rc.1", vec![(0, 1), (0, 2)])]
#[case("v1.0.0", vec![(0, 1), (1, 0)])]
fn a_release_lists_its_own_series(#[case] version: &str, #[case] expected: Vec<(u64, u64)>) {
    let (ok, stderr, out) = release(version);
    assert!(ok, "release {version} failed: {stderr}");
    let series = release_series(&out.join("infrastructure-libvirt").join(version));
    let expected: Vec<(u64, u64, String)> = expected.into_iter().map(|(a, b)| (a, b, "v1beta2".into())).collect();
    assert_eq!(series, expected);
    std::fs::remove_dir_all(out).unwrap();
}

#[test]
fn a_release_needs_a_canonical_image_reference() {
    let out = tempdir("release-image");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capl-manifests"))
        .args(["release", "--version", "v0.1.0", "--image", "capl:v0.1.0", "--root"])
        .arg(repo_root())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("registry host"), "{stderr}");
    for ok in ["registry.example/capl:v1", "localhost:5000/capl:v1", "localhost/capl:v1", "docker.io/library/capl:v1"] {
        assert_eq!(manifests::check_release_image(ok), Ok(()), "{ok}");
    }
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn a_release_of_an_unpublished_older_series_is_refused() {
    let (ok, stderr, out) = release("v0.0.3");
    assert!(!ok, "v0.0.3 is older than series 0.1 and was never published");
    assert!(stderr.contains("series 0.0") && stderr.contains("RELEASE_SERIES"), "{stderr}");
    assert!(!out.join("infrastructure-libvirt").join("v0.0.3").exists(), "nothing written");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn clusterctl_variables_all_have_non_empty_defaults() {
    // clusterctl treats `${VAR:=}` (an empty default) as a variable the user
    // must set, so `clusterctl init` would fail without it.
    let components = manifests::render_yaml(&manifests::release_components(
        &manifests::DeploymentSettings::clusterctl("example/capl:dev"),
    ));
    let mut variables = Vec::new();
    for (i, _) in components.match_indices("${") {
        let end = components[i..].find('}').unwrap() + i;
        variables.push(components[i + 2..end].to_string());
    }
    assert!(!variables.is_empty());
    for variable in variables {
        let (name, default) = variable.split_once(":=").unwrap_or((&variable, ""));
        assert!(name.starts_with("CAPL_"), "{name}: the components' variables are CAPL_*");
        assert!(!default.is_empty(), "{name} has an empty default: clusterctl would require it");
    }
}

#[test]
fn the_manager_deployment_rolls_over_without_downtime() {
    let components = manifests::release_components(&manifests::DeploymentSettings::default());
    let deployment = components.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let strategy = &deployment["spec"]["strategy"];
    assert_eq!(strategy["type"], "RollingUpdate");
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"], 0, "the old Pod serves until the new one is Ready");
    assert_eq!(strategy["rollingUpdate"]["maxSurge"], 1);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--leader-elect"), "one replica reconciles at a time: {args:?}");
}

#[test]
fn release_rejects_a_malformed_version() {
    let out = tempdir("bad-release");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capl-manifests"))
        .args(["release", "--version", "0.1", "--image", "x", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("vMAJOR.MINOR.PATCH"));
    let _ = std::fs::remove_dir_all(out);
}

/// `release --watch-namespace team-a`: the manager watches team-a only and its
/// rules (the same as the ClusterRole's) are a Role bound there; the Lease
/// stays in the provider's namespace. A bad namespace name is refused.
#[test]
fn a_release_for_one_namespace_grants_nothing_cluster_wide() {
    let out = tempdir("release-namespaced");
    let run = |ns: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_capl-manifests"))
            .args(["release", "--version", "v0.1.0", "--image", "registry.example/capl:v0.1.0", "--root"])
            .arg(repo_root())
            .arg("--out")
            .arg(&out)
            .args(["--watch-namespace", ns])
            .output()
            .unwrap()
    };
    let output = run("team-a");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let cluster_wide = manifests::release_components(&manifests::DeploymentSettings::default());
    let cluster_role = cluster_wide.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    for artifact in ["infrastructure-components.yaml", "install.yaml"] {
        let path = out.join("infrastructure-libvirt").join("v0.1.0").join(artifact);
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&std::fs::read_to_string(path).unwrap())
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .filter(|d: &Value| !d.is_null())
            .collect();
        let kinds = manifests::kinds(&docs);
        assert_eq!(kinds.get("ClusterRole"), None, "{artifact}: {kinds:?}");
        assert_eq!(kinds.get("ClusterRoleBinding"), None, "{artifact}: {kinds:?}");
        let role = docs.iter().find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "team-a").unwrap();
        assert_eq!(role["rules"], cluster_role["rules"], "{artifact}: the same rules, one namespace");
        let binding =
            docs.iter().find(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == "team-a").unwrap();
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["namespace"], "capl-system");
        let lease_role =
            docs.iter().find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "capl-system").unwrap();
        assert_eq!(lease_role["rules"][0]["resources"][0], "leases");
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(args.as_array().unwrap().iter().any(|a| a == "--namespace=team-a"), "{artifact}: {args}");
    }
    let refused = run("Team_A");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("\"Team_A\" is not a namespace name"), "{stderr}");
    let _ = std::fs::remove_dir_all(out);
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("capl-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
