//! The templates and the release install on a real kube-apiserver. Every
//! object of every template is accepted by an API server that
//! has CAPI's CRDs (core, kubeadm bootstrap, kubeadm control plane) and ours
//! installed: server-side apply, dry run, strict field validation. This
//! catches a misspelt or misplaced v1beta2 field, which parsing alone cannot.

use crate::clusterctl_template::{parse_documents, repo_root, substitute, template_files};
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};

#[tokio::test]
async fn every_template_object_is_accepted_by_the_api_server() {
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_capi_crds().await.unwrap();
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    let namespace = env.unique_namespace("templates").await.unwrap();
    let client = env.client();

    let mut checked = 0;
    for path in template_files() {
        let origin = path.file_name().unwrap().to_string_lossy().to_string();
        let (text, _) = substitute(&std::fs::read_to_string(&path).unwrap());
        for mut doc in parse_documents(&text) {
            let api_version = doc["apiVersion"].as_str().unwrap().to_string();
            let kind = doc["kind"].as_str().unwrap().to_string();
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            let (resource, caps) = pinned_kind(&client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{origin}: the API server does not serve {api_version} {kind}: {e}"));
            assert_eq!(caps.scope, Scope::Namespaced, "{origin}: {kind}");
            doc["metadata"]["namespace"] = namespace.clone().into();
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
            let params = PatchParams::apply("template-test").dry_run().validation_strict();
            api.patch(&name, &params, &Patch::Apply(&doc))
                .await
                .unwrap_or_else(|e| panic!("{origin}: {kind} {name} is rejected by the API server: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} objects checked");

    // The check has teeth: a field the schema does not know is refused.
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    let (resource, _) = pinned_kind(&client, &gvk).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let bogus = serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "bogus", "namespace": namespace},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtCluster", "name": "x"}, "controlPlaneReference": {}}
    });
    let params = PatchParams::apply("template-test").dry_run().validation_strict();
    let err = api.patch("bogus", &params, &Patch::Apply(&bogus)).await.unwrap_err();
    assert!(err.to_string().contains("controlPlaneReference"), "{err}");
}

fn release_documents() -> Vec<serde_json::Value> {
    capl::manifests::release_components(&capl::manifests::DeploymentSettings::default())
}

async fn apply_documents(client: &kube::Client, docs: &[serde_json::Value], dry_run: bool) {
    for doc in docs {
        let api_version = doc["apiVersion"].as_str().unwrap();
        let kind = doc["kind"].as_str().unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let (resource, caps) = pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await.unwrap();
        let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        let mut params = PatchParams::apply("install-test").validation_strict().force();
        if dry_run {
            params = params.dry_run();
        }
        api.patch(name, &params, &Patch::Apply(doc))
            .await
            .unwrap_or_else(|e| panic!("install.yaml: {kind} {name} is rejected by the API server: {e}"));
    }
}

#[tokio::test]
async fn the_release_installs_on_a_real_api_server() {
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    let docs = release_documents();
    // The Namespace and CRDs for real (the rest needs them), then everything as a dry run.
    let (first, rest): (Vec<_>, Vec<_>) =
        docs.into_iter().partition(|d| d["kind"] == "Namespace" || d["kind"] == "CustomResourceDefinition");
    apply_documents(&env.client(), &first, false).await;
    apply_documents(&env.client(), &rest, true).await;
}

/// LibvirtMachineTemplates are immutable, except for CAPI's topology dry runs.
#[tokio::test]
async fn machine_templates_are_immutable_but_topology_dry_runs_pass() {
    use capl::api::LibvirtMachineTemplate;
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    let client = env.client();
    let policy: Vec<_> = release_documents()
        .into_iter()
        .filter(|d| d["kind"].as_str().unwrap().starts_with("ValidatingAdmissionPolicy"))
        .collect();
    assert_eq!(policy.len(), 2);
    apply_documents(&client, &policy, false).await;

    let namespace = env.unique_namespace("immutable").await.unwrap();
    let api: Api<LibvirtMachineTemplate> = Api::namespaced(client, &namespace);
    let template: LibvirtMachineTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "workers"},
        "spec": {"template": {"spec": {"image": "base.qcow2"}}}
    }))
    .unwrap();
    api.create(&Default::default(), &template).await.unwrap();

    // The policy's binding takes a moment to be enforced; retry until it is.
    let change = serde_json::json!({"spec": {"template": {"spec": {"image": "other.qcow2"}}}});
    let mut denied = None;
    for _ in 0..60 {
        match api.patch("workers", &PatchParams::default().dry_run(), &Patch::Merge(&change)).await {
            Err(e) => {
                denied = Some(e.to_string());
                break;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
    let denied = denied.expect("a change to spec.template.spec is refused");
    assert!(denied.contains("spec.template.spec is immutable"), "{denied}");

    let topology_dry_run = serde_json::json!({
        "metadata": {"annotations": {"topology.cluster.x-k8s.io/dry-run": ""}},
        "spec": {"template": {"spec": {"image": "other.qcow2"}}}
    });
    let out = api.patch("workers", &PatchParams::default().dry_run(), &Patch::Merge(&topology_dry_run)).await.unwrap();
    assert_eq!(out.spec.template.spec.image.as_deref(), Some("other.qcow2"));
    // A real (not dry-run) write with the annotation is still refused.
    assert!(api.patch("workers", &PatchParams::default(), &Patch::Merge(&topology_dry_run)).await.is_err());
    // Labels and annotations may change.
    let labels = serde_json::json!({"metadata": {"labels": {"team": "a"}}});
    api.patch("workers", &PatchParams::default(), &Patch::Merge(&labels)).await.unwrap();
}

/// The API server applies our schema: defaults, bounds, patterns, and the
/// CEL rules that make fields immutable or settable once.
#[tokio::test]
async fn the_api_server_enforces_our_schema() {
    use capl::api::{LibvirtCluster, LibvirtMachine};
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    let namespace = env.unique_namespace("schema").await.unwrap();
    let machines: Api<LibvirtMachine> = Api::namespaced(env.client(), &namespace);
    let clusters: Api<LibvirtCluster> = Api::namespaced(env.client(), &namespace);
    let machine = |name: &str, spec: serde_json::Value| -> LibvirtMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    };

    // Defaults come from the server, not from the client.
    let raw: Api<DynamicObject> =
        Api::namespaced_with(env.client(), &namespace, &kube::discovery::ApiResource::erase::<LibvirtMachine>(&()));
    let created = raw
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachine",
                "metadata": {"name": "defaults"}, "spec": {"image": "base.qcow2"}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"],
        serde_json::json!({"image": "base.qcow2", "vcpu": 1, "memoryMiB": 1024, "diskGiB": 20})
    );

    // Bounds and patterns.
    let long_name = "w".repeat(65);
    for (name, spec, field) in [
        (
            "dns-name",
            serde_json::json!({"image": "b", "nameservers": ["10.0.0.1", "dns.lab\"\n  x"]}),
            "spec.nameservers[1]",
        ),
        (long_name.as_str(), serde_json::json!({"image": "b"}), "a Linux hostname has at most 64 characters"),
        ("no-vcpu", serde_json::json!({"image": "b", "vcpu": 0}), "spec.vcpu"),
        ("tiny-memory", serde_json::json!({"image": "b", "memoryMiB": 128}), "spec.memoryMiB"),
        ("no-disk", serde_json::json!({"image": "b", "diskGiB": 0}), "spec.diskGiB"),
        ("slash-image", serde_json::json!({"image": "../etc/passwd"}), "spec.image"),
        (
            "nic-both",
            serde_json::json!({"image": "b", "additionalNetworks": [{"network": "n", "bridge": "br0"}]}),
            "set exactly one of network",
        ),
        (
            "nic-none",
            serde_json::json!({"image": "b", "additionalNetworks": [{"addressesFromPools": [
                {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}]}]}),
            "set exactly one of network",
        ),
        (
            "nic-long-bridge",
            serde_json::json!({"image": "b", "additionalNetworks": [{"bridge": "a-bridge-name-too-long"}]}),
            "spec.additionalNetworks[0].bridge",
        ),
        (
            "nic-four",
            serde_json::json!({"image": "b", "additionalNetworks": [
                {"network": "a"}, {"network": "b"}, {"network": "c"}, {"network": "d"}]}),
            "spec.additionalNetworks",
        ),
    ] {
        let err = machines.create(&Default::default(), &machine(name, spec)).await.unwrap_err().to_string();
        assert!(err.contains(field), "{name}: {err}");
    }

    let longest = "w".repeat(64);
    let ipv6 = serde_json::json!({"image": "b", "nameservers": ["fd00::53", "10.0.0.1"]});
    machines.create(&Default::default(), &machine(&longest, ipv6)).await.expect("64 characters and addresses are fine");

    // Immutable fields, and providerID that can be set once.
    machines.create(&Default::default(), &machine("m", serde_json::json!({"image": "base.qcow2"}))).await.unwrap();
    let err = machines
        .patch("m", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"image": "other.qcow2"}})))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("image is immutable"), "{err}");
    for additional in [serde_json::json!([{"bridge": "br1"}]), serde_json::json!(null)] {
        let name = if additional.is_null() { "nics-removed" } else { "nics-added" };
        let spec = if additional.is_null() {
            serde_json::json!({"image": "base.qcow2", "additionalNetworks": [{"network": "n"}]})
        } else {
            serde_json::json!({"image": "base.qcow2"})
        };
        machines.create(&Default::default(), &machine(name, spec)).await.unwrap();
        let patch = serde_json::json!({"spec": {"additionalNetworks": additional}});
        let err = machines.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err().to_string();
        assert!(err.contains("additionalNetworks is immutable"), "{name}: {err}");
    }
    let set = serde_json::json!({"spec": {"providerID": "libvirt://1"}});
    machines.patch("m", &PatchParams::default(), &Patch::Merge(&set)).await.unwrap();
    let change = serde_json::json!({"spec": {"providerID": "libvirt://2"}});
    let err = machines.patch("m", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap_err().to_string();
    assert!(err.contains("providerID can be set once"), "{err}");

    // LibvirtCluster: URI schemes libvirt knows, immutable pools, endpoint set once.
    let cluster = |name: &str, uri: &str, endpoint: Option<serde_json::Value>| -> LibvirtCluster {
        let mut spec = serde_json::json!({"uri": uri, "network": "default", "basePool": "base", "domainPool": "disks"});
        if let Some(e) = endpoint {
            spec["controlPlaneEndpoint"] = e;
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtCluster",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    };
    let err = clusters
        .create(&Default::default(), &cluster("http", "https://lab/system", None))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec.uri"), "{err}");
    let port = serde_json::json!({"host": "10.0.0.1", "port": 70000});
    let err = clusters
        .create(&Default::default(), &cluster("port", "qemu:///system", Some(port)))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec.controlPlaneEndpoint.port"), "{err}");
    clusters.create(&Default::default(), &cluster("c", "qemu+tcp://lab/system", None)).await.unwrap();
    let err = clusters
        .patch("c", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"domainPool": "elsewhere"}})))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("domainPool is immutable"), "{err}");
    let endpoint = serde_json::json!({"spec": {"controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}}});
    clusters.patch("c", &PatchParams::default(), &Patch::Merge(&endpoint)).await.unwrap();
    let moved = serde_json::json!({"spec": {"controlPlaneEndpoint": {"host": "10.0.0.2", "port": 6443}}});
    let err = clusters.patch("c", &PatchParams::default(), &Patch::Merge(&moved)).await.unwrap_err().to_string();
    assert!(err.contains("controlPlaneEndpoint can be set once"), "{err}");
}

/// A release written by `capl-manifests release` into a fresh directory, and a
/// clusterctl.yaml whose `providers:` entry points at it (a file:// repository).
struct LocalRepository {
    root: std::path::PathBuf,
    version: String,
    config: std::path::PathBuf,
}

impl LocalRepository {
    fn release(version: &str) -> Self {
        // One directory per repository: tests that run at once each write and remove their own.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("capl-clusterctl-repo-{version}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_capl-manifests"))
            .args(["release", "--version", version, "--image"])
            .arg(format!("registry.example/cluster-api-provider-libvirt:{version}"))
            .arg("--root")
            .arg(repo_root())
            .arg("--out")
            .arg(&root)
            .output()
            .unwrap();
        assert!(output.status.success(), "release {version}: {}", String::from_utf8_lossy(&output.stderr));
        let config = root.join("clusterctl.yaml");
        let components = root.join("infrastructure-libvirt").join(version).join("infrastructure-components.yaml");
        std::fs::write(
            &config,
            format!(
                "providers:\n  - name: libvirt\n    type: InfrastructureProvider\n    url: file://{}\n",
                components.display()
            ),
        )
        .unwrap();
        Self { root, version: version.into(), config }
    }

    fn dir(&self) -> std::path::PathBuf {
        self.root.join("infrastructure-libvirt").join(&self.version)
    }

    /// Runs clusterctl with this repository's config; returns (success, stdout, stderr).
    fn clusterctl(&self, env: &testenv::TestEnv, args: &[&str], vars: &[(&str, &str)]) -> (bool, String, String) {
        let clusterctl = env.assets().clusterctl().expect("clusterctl (run `cargo xtask control-plane build`)");
        let output = std::process::Command::new(clusterctl)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            // `generate provider` reads no cluster and takes no --kubeconfig.
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("XDG_CONFIG_HOME", &self.root) // no user overrides, no cache shared with other runs
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

impl Drop for LocalRepository {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Where the flavors' node image is downloaded from, and its sha256.
const IMAGE_URL: &str = "https://images.lab.example/ubuntu-24.04-kube-v1.34.1.qcow2";
const IMAGE_SHA256: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
/// The volume the `pool-image` flavor names instead.
const POOL_IMAGE: &str = "ubuntu-24.04-kube-v1.34.1.qcow2";

/// The variables a user sets for `clusterctl generate cluster` (the required ones).
const CLUSTER_VARIABLES: &[(&str, &str)] = &[
    ("CAPL_LIBVIRT_URI", "qemu+tls://kvm1.lab.example/system"),
    ("CAPL_CONTROL_PLANE_ENDPOINT_HOST", "192.168.122.10"),
    ("CAPL_IMAGE_URL", IMAGE_URL),
    ("CAPL_IMAGE_CHECKSUM", IMAGE_SHA256),
    ("KUBERNETES_VERSION", "v1.34.1"),
    ("CAPL_TLS_CA_CRT_B64", "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="),
    ("CAPL_TLS_CLIENT_CRT_B64", "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="),
    ("CAPL_TLS_CLIENT_KEY_B64", "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCg=="),
];

/// What the `ssh` flavor needs instead of the TLS variables.
const SSH_VARIABLES: &[(&str, &str)] = &[
    ("CAPL_LIBVIRT_URI", "qemu+libssh://root@kvm1.lab.example/system"),
    ("CAPL_CONTROL_PLANE_ENDPOINT_HOST", "192.168.122.10"),
    ("CAPL_IMAGE_URL", IMAGE_URL),
    ("CAPL_IMAGE_CHECKSUM", IMAGE_SHA256),
    ("KUBERNETES_VERSION", "v1.34.1"),
    ("CAPL_SSH_PRIVATE_KEY_B64", "LS0tLS1CRUdJTiBPUEVOU1NIIFBSSVZBVEUgS0VZLS0tLS0K"),
    ("CAPL_SSH_KNOWN_HOSTS_B64", "a3ZtMS5sYWIuZXhhbXBsZSBzc2gtZWQyNTUxOSBBQUFBCg=="),
];

/// What the `bridged` flavor needs besides the TLS credentials: the bridge network and the pool.
const BRIDGED_VARIABLES: &[(&str, &str)] = &[
    ("CAPL_NETWORK", "lab-lan"),
    ("CAPL_IP_POOL_RANGE", "192.168.10.100-192.168.10.149"),
    ("CAPL_IP_POOL_GATEWAY", "192.168.10.1"),
    ("CAPL_NAMESERVER", "192.168.10.1"),
];

/// What the `local` flavor needs: no URI (it defaults to the manager's host), no credentials.
const LOCAL_VARIABLES: &[(&str, &str)] = &[
    ("CAPL_CONTROL_PLANE_ENDPOINT_HOST", "192.168.122.10"),
    ("CAPL_IMAGE_URL", IMAGE_URL),
    ("CAPL_IMAGE_CHECKSUM", IMAGE_SHA256),
    ("KUBERNETES_VERSION", "v1.34.1"),
];

#[tokio::test]
async fn clusterctl_reads_the_release_as_a_provider_repository() {
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    // v0.2.0: a series newer than the committed metadata.yaml lists.
    let repo = LocalRepository::release("v0.2.0");
    let (ok, out, err) =
        repo.clusterctl(env, &["generate", "provider", "--infrastructure", "libvirt:v0.2.0", "--describe"], &[]);
    assert!(ok, "clusterctl generate provider --describe: {err}");
    for expected in ["CAPL_CONCURRENCY", "CAPL_LOG_FORMAT", "CAPL_WATCH_NAMESPACE", "Version:            v0.2.0"] {
        assert!(out.contains(expected), "--describe lacks {expected}:\n{out}");
    }
    // Without any variable set: every variable has a default clusterctl accepts.
    let (ok, out, err) = repo.clusterctl(env, &["generate", "provider", "--infrastructure", "libvirt:v0.2.0"], &[]);
    assert!(ok, "clusterctl generate provider: {err}");
    assert!(out.contains("--namespace=*"), "the default watches every namespace");
    assert!(out.contains("image: registry.example/cluster-api-provider-libvirt:v0.2.0"));

    // The check has teeth: a version outside every release series is refused.
    let stale = repo.root.join("infrastructure-libvirt").join("v0.9.0");
    std::fs::create_dir_all(&stale).unwrap();
    for file in ["infrastructure-components.yaml", "metadata.yaml"] {
        std::fs::copy(repo.dir().join(file), stale.join(file)).unwrap();
    }
    let (ok, _, err) = repo.clusterctl(env, &["generate", "provider", "--infrastructure", "libvirt:v0.9.0"], &[]);
    assert!(!ok && err.contains("does not match any release series"), "{err}");
}

#[tokio::test]
async fn clusterctl_generates_every_flavor_and_the_api_server_accepts_it() {
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_capi_crds().await.unwrap();
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    env.install_ipam_crds().await.unwrap();
    let repo = LocalRepository::release("v0.1.0");
    let mut flavors: Vec<String> = std::fs::read_dir(repo.dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let stem = name.strip_prefix("cluster-template")?.strip_suffix(".yaml")?.to_string();
            Some(stem.strip_prefix('-').unwrap_or(&stem).to_string())
        })
        .collect();
    flavors.sort();
    assert!(flavors.contains(&String::new()) && flavors.contains(&"topology".to_string()), "{flavors:?}");
    let client = env.client();

    for flavor in &flavors {
        let namespace = env.unique_namespace("clusterctl-generate").await.unwrap();
        let mut args = vec!["generate", "cluster", "lab", "--infrastructure", "libvirt:v0.1.0", "-n", &namespace];
        if !flavor.is_empty() {
            args.extend(["--flavor", flavor]);
        }
        args.extend(["--worker-machine-count", "2"]);
        let bridged: Vec<(&str, &str)> = CLUSTER_VARIABLES.iter().chain(BRIDGED_VARIABLES).copied().collect();
        // The pool-image flavor names a volume: no URL, no checksum.
        let pool_image: Vec<(&str, &str)> = CLUSTER_VARIABLES
            .iter()
            .copied()
            .filter(|(name, _)| !name.starts_with("CAPL_IMAGE_"))
            .chain([("CAPL_IMAGE", POOL_IMAGE)])
            .collect();
        let (variables, credentials_key) = match flavor.as_str() {
            "ssh" => (SSH_VARIABLES, Some("ssh-privatekey")),
            "local" => (LOCAL_VARIABLES, None),
            "bridged" => (bridged.as_slice(), Some("tls.crt")),
            "pool-image" => (pool_image.as_slice(), Some("tls.crt")),
            _ => (CLUSTER_VARIABLES, Some("tls.crt")),
        };
        let (ok, out, err) = repo.clusterctl(env, &args, variables);
        assert!(ok, "clusterctl generate cluster (flavor {flavor:?}): {err}");
        let docs = parse_documents(&out);
        assert!(docs.iter().any(|d| d["kind"] == "Cluster"), "flavor {flavor:?} makes a Cluster");
        // Every machine's base image: a volume of the pool in the pool-image
        // flavor, the URL and checksum (sha256 and qcow2 by default) in the others.
        let machine_templates: Vec<&serde_json::Value> =
            docs.iter().filter(|d| d["kind"] == "LibvirtMachineTemplate").collect();
        if flavor == "topology" {
            // The ClusterClass clusterctl added: its templates' image is set from
            // the Cluster's variables (the_clusterclass_renders_the_endpoint_and_the_pod_network).
            for template in &machine_templates {
                assert_eq!(template["spec"]["template"]["spec"]["image"], "set-the-image-or-imageURL-variable");
            }
            let variables = &docs.iter().find(|d| d["kind"] == "Cluster").unwrap()["spec"]["topology"]["variables"];
            let image = variables.as_array().unwrap().iter().find(|v| v["name"] == "imageURL");
            assert_eq!(
                image.map(|v| v["value"].clone()),
                Some(
                    serde_json::json!({"url": IMAGE_URL, "checksum": IMAGE_SHA256, "checksumType": "sha256", "format": "qcow2"})
                ),
                "{variables}"
            );
        } else {
            assert_eq!(machine_templates.len(), 2, "flavor {flavor:?}: the control plane's and the workers'");
        }
        for template in machine_templates.iter().filter(|_| flavor != "topology") {
            let spec = &template["spec"]["template"]["spec"];
            if flavor == "pool-image" {
                assert_eq!(spec["image"], POOL_IMAGE, "{spec}");
                assert!(spec["imageURL"].is_null(), "{spec}");
            } else {
                assert!(spec["image"].is_null(), "flavor {flavor:?}: {spec}");
                assert_eq!(
                    spec["imageURL"],
                    serde_json::json!({"url": IMAGE_URL, "checksum": IMAGE_SHA256, "checksumType": "sha256", "format": "qcow2"}),
                    "flavor {flavor:?}"
                );
            }
        }
        if let Some(key) = credentials_key {
            // The host credentials: a Secret that clusterctl move takes along, named by the cluster.
            let secret = docs
                .iter()
                .find(|d| d["kind"] == "Secret" && d["data"][key].is_string())
                .unwrap_or_else(|| panic!("flavor {flavor:?} makes the credentials Secret with {key}"));
            assert!(secret["metadata"]["labels"]["clusterctl.cluster.x-k8s.io/move"].is_string(), "{secret}");
            let secret_name = secret["metadata"]["name"].as_str().unwrap();
            let named = docs.iter().any(|d| {
                (d["kind"] == "LibvirtCluster" && d["spec"]["credentialsRef"]["name"] == secret_name)
                    || (d["kind"] == "Cluster"
                        && d["spec"]["topology"]["variables"].as_array().is_some_and(|v| {
                            v.iter().any(|v| v["name"] == "credentialsSecret" && v["value"] == secret_name)
                        }))
            });
            assert!(named, "flavor {flavor:?}: the cluster names Secret {secret_name} as its credentials");
        } else {
            assert!(!docs.iter().any(|d| d["kind"] == "Secret"), "flavor {flavor:?} needs no credentials");
            let cluster = docs.iter().find(|d| d["kind"] == "LibvirtCluster").unwrap();
            assert_eq!(cluster["spec"]["uri"], "qemu:///system", "flavor {flavor:?}");
            assert!(cluster["spec"]["credentialsRef"].is_null(), "flavor {flavor:?}");
        }
        for doc in &docs {
            let api_version = doc["apiVersion"].as_str().unwrap();
            let kind = doc["kind"].as_str().unwrap();
            let name = doc["metadata"]["name"].as_str().unwrap();
            assert_eq!(doc["metadata"]["namespace"], namespace.as_str(), "flavor {flavor:?}: {kind} {name}");
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let (resource, _) = pinned_kind(&client, &GroupVersionKind::gvk(group, version, kind))
                .await
                .unwrap_or_else(|e| panic!("flavor {flavor:?}: the API server does not serve {kind}: {e}"));
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
            let params = PatchParams::apply("clusterctl-test").dry_run().validation_strict();
            api.patch(name, &params, &Patch::Apply(doc))
                .await
                .unwrap_or_else(|e| panic!("flavor {flavor:?}: {kind} {name} is rejected by the API server: {e}"));
        }
    }

    // A required variable left unset: clusterctl names it and writes nothing.
    let without_uri: Vec<(&str, &str)> =
        CLUSTER_VARIABLES.iter().copied().filter(|(name, _)| *name != "CAPL_LIBVIRT_URI").collect();
    let (ok, out, err) = repo.clusterctl(
        env,
        &["generate", "cluster", "lab", "--infrastructure", "libvirt:v0.1.0", "-n", "default"],
        &without_uri,
    );
    assert!(!ok && out.trim().is_empty(), "a missing variable fails");
    assert!(err.contains("CAPL_LIBVIRT_URI"), "the error names the variable: {err}");
}

/// The topology flavor as a user applies it (the ClusterClass, then the generated Cluster),
/// with CAPI core and the kubeadm providers running with their webhooks: CAPI's topology
/// controller renders the KubeadmControlPlane and the workers' KubeadmConfigTemplate
/// through the ClusterClass patches, with kube-vip's static Pod holding the Cluster's
/// endpoint, and nothing of the pod network (a ClusterResourceSet installs the CNI).
#[tokio::test]
async fn the_clusterclass_renders_the_endpoint_and_the_pod_network() {
    let env = testenv::TestEnv::start().await.expect("local control plane (run `cargo xtask control-plane build`)");
    let capi = env
        .start_capi(testenv::CapiOptions::new().with_kubeadm_providers().feature_gates("ClusterTopology=true"))
        .await
        .expect("CAPI core and kubeadm managers");
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    let namespace = env.unique_namespace("topology").await.unwrap();
    let client = env.client();
    let repo = LocalRepository::release("v0.1.0");
    let mut docs = parse_documents(&std::fs::read_to_string(repo.dir().join("clusterclass-libvirt.yaml")).unwrap());
    let vars: Vec<(&str, &str)> = CLUSTER_VARIABLES
        .iter()
        .copied()
        .filter(|(n, _)| *n != "KUBERNETES_VERSION")
        .chain([("CAPL_POD_CIDR", "10.77.0.0/16")])
        .collect();
    let (ok, out, err) = repo.clusterctl(
        &env,
        &[
            "generate",
            "cluster",
            "lab",
            "--infrastructure",
            "libvirt:v0.1.0",
            "--flavor",
            "topology",
            "-n",
            &namespace,
            "--kubernetes-version",
            "v1.36.3",
            "--control-plane-machine-count",
            "1",
            "--worker-machine-count",
            "1",
        ],
        &vars,
    );
    assert!(ok, "clusterctl generate cluster --flavor topology: {err}");
    docs.extend(parse_documents(&out));
    // A second Cluster of the same class naming a volume of the pool (the
    // `image` variable) instead of a URL.
    let mut by_volume = docs.iter().find(|d| d["kind"] == "Cluster").unwrap().clone();
    by_volume["metadata"]["name"] = "lab-volume".into();
    by_volume["metadata"]["labels"] = serde_json::json!({});
    let variables = by_volume["spec"]["topology"]["variables"].as_array_mut().unwrap();
    variables.retain(|v| v["name"] != "imageURL");
    variables.push(serde_json::json!({"name": "image", "value": POOL_IMAGE}));
    docs.push(by_volume);
    for mut doc in docs {
        doc["metadata"]["namespace"] = namespace.clone().into();
        let api_version = doc["apiVersion"].as_str().unwrap().to_string();
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
        let (resource, _) = pinned_kind(&client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        api.patch(&name, &PatchParams::apply("topology-test"), &Patch::Apply(&doc))
            .await
            .unwrap_or_else(|e| panic!("applying {gvk:?} {name}: {e}\n{}", capi.log_tail(20)));
    }

    let gvk = |group: &str, kind: &str| GroupVersionKind::gvk(group, "v1beta2", kind);
    let (kcp_resource, _) =
        pinned_kind(&client, &gvk("controlplane.cluster.x-k8s.io", "KubeadmControlPlane")).await.unwrap();
    let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &kcp_resource);
    let (kct_resource, _) =
        pinned_kind(&client, &gvk("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate")).await.unwrap();
    let kcts: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &kct_resource);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let (kcp, worker_config) = loop {
        let kcp = kcps.list(&Default::default()).await.unwrap().items.into_iter().next();
        let kct = kcts.list(&Default::default()).await.unwrap().items.into_iter().find(|t| {
            t.metadata.labels.as_ref().is_some_and(|l| l.contains_key("topology.cluster.x-k8s.io/deployment-name"))
        });
        if let (Some(kcp), Some(kct)) = (kcp, kct) {
            break (kcp, kct);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the topology controller rendered no KubeadmControlPlane and worker KubeadmConfigTemplate within 120 s:\n{}",
            capi.log_tail(30)
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    // Each Cluster's machine templates name its image as its variables do.
    let (lmt_resource, _) = pinned_kind(
        &client,
        &GroupVersionKind::gvk("infrastructure.cluster.x-k8s.io", "v1alpha1", "LibvirtMachineTemplate"),
    )
    .await
    .unwrap();
    let lmts: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &lmt_resource);
    let image_url =
        serde_json::json!({"url": IMAGE_URL, "checksum": IMAGE_SHA256, "checksumType": "sha256", "format": "qcow2"});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for (cluster, want_volume) in [("lab", false), ("lab-volume", true)] {
        let params = kube::api::ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}"));
        let templates = loop {
            let items = lmts.list(&params).await.unwrap().items;
            if items.len() == 2 {
                break items;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Cluster {cluster}: {} LibvirtMachineTemplates rendered, expected 2:\n{}",
                items.len(),
                capi.log_tail(30)
            );
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        };
        for template in templates {
            let spec = &template.data["spec"]["template"]["spec"];
            if want_volume {
                assert_eq!(spec["image"], POOL_IMAGE, "{spec}");
                assert!(spec["imageURL"].is_null(), "{spec}");
            } else {
                assert_eq!(spec["imageURL"], image_url, "{spec}");
                assert!(spec["image"].is_null(), "{spec}");
            }
        }
    }

    let spec = &kcp.data["spec"]["kubeadmConfigSpec"];
    let super_admin = "if [ -f /run/kubeadm/kubeadm.yaml ]; then sed -i 's#path: /etc/kubernetes/admin.conf#path: \
                       /etc/kubernetes/super-admin.conf#' /etc/kubernetes/manifests/kube-vip.yaml; fi";
    assert_eq!(spec["preKubeadmCommands"], serde_json::json!([super_admin]), "{spec}");
    let admin = "if [ -f /run/kubeadm/kubeadm.yaml ]; then sed -i 's#path: /etc/kubernetes/super-admin.conf#path: \
                 /etc/kubernetes/admin.conf#' /etc/kubernetes/manifests/kube-vip.yaml; fi";
    assert_eq!(spec["postKubeadmCommands"], serde_json::json!([admin]), "{spec}");
    let files = spec["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{spec}");
    assert_eq!(files[0]["path"], "/etc/kubernetes/manifests/kube-vip.yaml", "{spec}");
    let pod: serde_json::Value = serde_yaml::from_str(files[0]["content"].as_str().unwrap()).unwrap();
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "ghcr.io/kube-vip/kube-vip:v1.0.0", "{pod}");
    let env = |name: &str| container["env"].as_array().unwrap().iter().find(|e| e["name"] == name).cloned();
    assert_eq!(env("address").unwrap()["value"], "192.168.122.10", "kube-vip holds the endpoint: {pod}");
    assert_eq!(env("vip_arp").unwrap()["value"], "true", "{pod}");
    // The controller manager allocates the nodes' pod subnets (the CNI uses them).
    assert!(spec["clusterConfiguration"]["controllerManager"]["extraArgs"].is_null(), "{spec}");
    let worker = &worker_config.data["spec"]["template"]["spec"];
    assert!(worker["files"].is_null(), "{worker}");
    assert!(worker["preKubeadmCommands"].is_null(), "{worker}");
}

#[tokio::test]
async fn the_api_server_enforces_the_image_url_rules() {
    let (_, _, raw) = untyped_in_fresh_namespace::<capl::api::LibvirtMachine>("image-url").await;
    let machine = |name: &str, spec: serde_json::Value| untyped("LibvirtMachine", name, spec);
    let sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let url =
        |u: &str, checksum: &str, kind: &str| serde_json::json!({"url": u, "checksum": checksum, "checksumType": kind});

    // Accepted: https or http, a checksum of its algorithm's length; qcow2 by default.
    let created = raw
        .create(
            &Default::default(),
            &machine("ok", serde_json::json!({"imageURL": url("https://images.example/n.qcow2", sha256, "sha256")})),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["imageURL"]["format"], "qcow2");
    let sha512 = "ab".repeat(64);
    raw.create(
        &Default::default(),
        &machine("ok-512", serde_json::json!({"imageURL": url("http://10.0.0.1:8000/n.img", &sha512, "sha512")})),
    )
    .await
    .unwrap();

    let one_of = "set exactly one of image";
    for (name, spec, says) in [
        ("neither", serde_json::json!({"vcpu": 1}), one_of),
        (
            "both",
            serde_json::json!({"image": "b.qcow2", "imageURL": url("https://i/n.qcow2", sha256, "sha256")}),
            one_of,
        ),
        ("ftp", serde_json::json!({"imageURL": url("ftp://i/n.qcow2", sha256, "sha256")}), "spec.imageURL.url"),
        ("file", serde_json::json!({"imageURL": url("file:///var/n.qcow2", sha256, "sha256")}), "spec.imageURL.url"),
        (
            "short",
            serde_json::json!({"imageURL": url("https://i/n.qcow2", &sha256[..40], "sha256")}),
            "spec.imageURL.checksum",
        ),
        (
            "not-hex",
            serde_json::json!({"imageURL": url("https://i/n.qcow2", &"zz".repeat(32), "sha256")}),
            "spec.imageURL.checksum",
        ),
        (
            "512-as-256",
            serde_json::json!({"imageURL": url("https://i/n.qcow2", &sha512, "sha256")}),
            "64 hex digits for checksumType sha256",
        ),
        ("256-as-512", serde_json::json!({"imageURL": url("https://i/n.qcow2", sha256, "sha512")}), "128 for sha512"),
        ("md5", serde_json::json!({"imageURL": url("https://i/n.qcow2", sha256, "md5")}), "spec.imageURL.checksumType"),
        (
            "vmdk",
            serde_json::json!({"imageURL": {"url": "https://i/n.vmdk", "checksum": sha256, "checksumType": "sha256", "format": "vmdk"}}),
            "spec.imageURL.format",
        ),
    ] {
        let err = raw.create(&Default::default(), &machine(name, spec)).await.unwrap_err().to_string();
        assert!(err.contains(says), "{name}: {err}");
    }

    // Immutable: the URL, and the choice between image and imageURL.
    let change = serde_json::json!({"spec": {"imageURL": {"url": "https://images.example/other.qcow2"}}});
    let err = raw.patch("ok", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap_err().to_string();
    assert!(err.contains("imageURL is immutable"), "{err}");
    let swap = serde_json::json!({"spec": {"imageURL": null, "image": "b.qcow2"}});
    let err = raw.patch("ok", &PatchParams::default(), &Patch::Merge(&swap)).await.unwrap_err().to_string();
    assert!(err.contains("image and imageURL are immutable"), "{err}");
}

#[tokio::test]
async fn the_api_server_enforces_the_cpu_and_firmware_rules() {
    let (client, namespace, raw) = untyped_in_fresh_namespace::<capl::api::LibvirtMachine>("cpu-firmware").await;
    let machine = |name: &str, spec: serde_json::Value| -> DynamicObject {
        let mut full = serde_json::json!({"image": "b.qcow2"});
        full.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        untyped("LibvirtMachine", name, full)
    };

    // Accepted, with the server's defaults filled in.
    let created = raw
        .create(
            &Default::default(),
            &machine(
                "ok",
                serde_json::json!({"vcpu": 4, "cpu": {"mode": "custom", "model": "qemu64",
                    "topology": {"sockets": 1, "cores": 2, "threads": 2}}, "firmware": {"type": "uefi", "secureBoot": true}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["cpu"]["nestedVirtualization"], false);
    assert_eq!(created.data["spec"]["firmware"]["tpm"], false);
    let tpm_only =
        raw.create(&Default::default(), &machine("tpm", serde_json::json!({"firmware": {"tpm": true}}))).await.unwrap();
    assert_eq!(tpm_only.data["spec"]["firmware"]["type"], "bios");
    raw.create(
        &Default::default(),
        &machine("nested", serde_json::json!({"cpu": {"mode": "host-model", "nestedVirtualization": true}})),
    )
    .await
    .unwrap();

    for (name, spec, says) in [
        (
            "topology",
            serde_json::json!({"vcpu": 2, "cpu": {"mode": "host-model", "topology": {"sockets": 2, "cores": 2, "threads": 1}}}),
            "spec.cpu.topology sockets x cores x threads must equal spec.vcpu",
        ),
        (
            "zero-cores",
            serde_json::json!({"cpu": {"mode": "host-model", "topology": {"sockets": 1, "cores": 0, "threads": 1}}}),
            "spec.cpu.topology.cores",
        ),
        ("no-model", serde_json::json!({"cpu": {"mode": "custom"}}), "spec.cpu.model is required with mode custom"),
        (
            "stray-model",
            serde_json::json!({"cpu": {"mode": "host-passthrough", "model": "qemu64"}}),
            "spec.cpu.model is required with mode custom and refused with the other modes",
        ),
        (
            "nested-custom",
            serde_json::json!({"cpu": {"mode": "custom", "model": "qemu64", "nestedVirtualization": true}}),
            "spec.cpu.nestedVirtualization needs mode host-passthrough or host-model",
        ),
        ("mode", serde_json::json!({"cpu": {"mode": "maximum"}}), "spec.cpu.mode"),
        (
            "secure-bios",
            serde_json::json!({"firmware": {"secureBoot": true}}),
            "spec.firmware.secureBoot needs spec.firmware.type uefi",
        ),
        ("firmware-type", serde_json::json!({"firmware": {"type": "coreboot"}}), "spec.firmware.type"),
    ] {
        let err = raw.create(&Default::default(), &machine(name, spec)).await.unwrap_err().to_string();
        assert!(err.contains(says), "{name}: {err}");
    }

    // Immutable: the settings, and whether there are any.
    let change = serde_json::json!({"spec": {"cpu": {"model": "kvm64"}}});
    let err = raw.patch("ok", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap_err().to_string();
    assert!(err.contains("cpu is immutable"), "{err}");
    let drop = serde_json::json!({"spec": {"firmware": null}});
    let err = raw.patch("ok", &PatchParams::default(), &Patch::Merge(&drop)).await.unwrap_err().to_string();
    assert!(err.contains("firmware is immutable"), "{err}");
    let add = serde_json::json!({"spec": {"cpu": {"mode": "host-model"}}});
    let err = raw.patch("tpm", &PatchParams::default(), &Patch::Merge(&add)).await.unwrap_err().to_string();
    assert!(err.contains("cpu is immutable"), "{err}");

    // A template refuses what its machines would refuse, when it is applied.
    let templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &kube::discovery::ApiResource::erase::<capl::api::LibvirtMachineTemplate>(&()),
    );
    let template = |name: &str, spec: serde_json::Value| {
        untyped("LibvirtMachineTemplate", name, serde_json::json!({"template": {"spec": spec}}))
    };
    let ok = serde_json::json!({"image": "b.qcow2", "firmware": {"type": "uefi", "secureBoot": true}});
    templates.create(&Default::default(), &template("uefi", ok)).await.unwrap();
    for (name, spec, says) in [
        (
            "secure-bios",
            serde_json::json!({"image": "b.qcow2", "firmware": {"secureBoot": true}}),
            "spec.firmware.secureBoot needs spec.firmware.type uefi",
        ),
        (
            "two-images",
            serde_json::json!({"image": "b.qcow2", "imageURL": {"url": "http://images/b.qcow2", "checksum": "ab".repeat(32), "checksumType": "sha256"}}),
            "set exactly one of image",
        ),
    ] {
        let err = templates.create(&Default::default(), &template(name, spec)).await.unwrap_err().to_string();
        assert!(err.contains(says), "template {name}: {err}");
    }
}

/// The CRD refuses data disks the provider could not make, naming the rule,
/// fills in the defaults, and keeps them immutable; a template refuses the
/// same when it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_enforces_the_data_disk_rules() {
    let (client, namespace, raw) = untyped_in_fresh_namespace::<capl::api::LibvirtMachine>("data-disks").await;
    let machine = |name: &str, disks: serde_json::Value| {
        untyped("LibvirtMachine", name, serde_json::json!({"image": "b.qcow2", "dataDisks": disks}))
    };

    let created = raw
        .create(
            &Default::default(),
            &machine(
                "ok",
                serde_json::json!([{"name": "etcd", "sizeGiB": 10}, {"name": "logs", "sizeGiB": 1, "bus": "scsi", "device": "sdc"}]),
            ),
        )
        .await
        .unwrap();
    let disks = &created.data["spec"]["dataDisks"];
    assert_eq!((&disks[0]["format"], &disks[0]["bus"]), (&serde_json::json!("qcow2"), &serde_json::json!("virtio")));

    let nine: Vec<serde_json::Value> =
        (0..9).map(|i| serde_json::json!({"name": format!("d{i}"), "sizeGiB": 1})).collect();
    for (name, disks, says) in [
        ("zero", serde_json::json!([{"name": "etcd", "sizeGiB": 0}]), "spec.dataDisks[0].sizeGiB"),
        (
            "twice",
            serde_json::json!([{"name": "etcd", "sizeGiB": 1}, {"name": "etcd", "sizeGiB": 2}]),
            "spec.dataDisks names a disk twice",
        ),
        ("upper", serde_json::json!([{"name": "Etcd", "sizeGiB": 1}]), "spec.dataDisks[0].name"),
        ("long", serde_json::json!([{"name": "x".repeat(21), "sizeGiB": 1}]), "spec.dataDisks[0].name"),
        (
            "wrong-bus",
            serde_json::json!([{"name": "etcd", "sizeGiB": 1, "bus": "sata", "device": "vdb"}]),
            "spec.dataDisks[].device must be on the disk's bus",
        ),
        ("root", serde_json::json!([{"name": "etcd", "sizeGiB": 1, "device": "vda"}]), "spec.dataDisks[0].device"),
        (
            "same-device",
            serde_json::json!([{"name": "a", "sizeGiB": 1, "device": "vdc"}, {"name": "b", "sizeGiB": 1, "device": "vdc"}]),
            "spec.dataDisks asks for a device twice",
        ),
        ("format", serde_json::json!([{"name": "etcd", "sizeGiB": 1, "format": "vmdk"}]), "spec.dataDisks[0].format"),
        ("nine", serde_json::json!(nine), "spec.dataDisks: Too many"),
    ] {
        let err = raw.create(&Default::default(), &machine(name, disks)).await.unwrap_err().to_string();
        assert!(err.contains(says), "{name}: {err}");
    }

    // Immutable: the disks, and whether there are any.
    let grow = serde_json::json!({"spec": {"dataDisks": [{"name": "etcd", "sizeGiB": 20}]}});
    let err = raw.patch("ok", &PatchParams::default(), &Patch::Merge(&grow)).await.unwrap_err().to_string();
    assert!(err.contains("dataDisks is immutable"), "{err}");
    let drop = serde_json::json!({"spec": {"dataDisks": null}});
    let err = raw.patch("ok", &PatchParams::default(), &Patch::Merge(&drop)).await.unwrap_err().to_string();
    assert!(err.contains("dataDisks is immutable"), "{err}");

    let templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &kube::discovery::ApiResource::erase::<capl::api::LibvirtMachineTemplate>(&()),
    );
    let disks = serde_json::json!([{"name": "etcd", "sizeGiB": 1}, {"name": "etcd", "sizeGiB": 2}]);
    let template = untyped(
        "LibvirtMachineTemplate",
        "twice",
        serde_json::json!({"template": {"spec": {"image": "b.qcow2", "dataDisks": disks}}}),
    );
    let err = templates.create(&Default::default(), &template).await.unwrap_err().to_string();
    assert!(err.contains("spec.dataDisks names a disk twice"), "{err}");
}

/// The project's CRDs on the shared API server and a fresh namespace named
/// after `label`: the client, the namespace, and `K` there as untyped
/// objects (so that what is checked is the server's validation, not serde's).
async fn untyped_in_fresh_namespace<K>(label: &str) -> (kube::Client, String, Api<DynamicObject>)
where
    K: kube::Resource<DynamicType = ()>,
{
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    let namespace = env.unique_namespace(label).await.unwrap();
    let api = Api::namespaced_with(env.client(), &namespace, &kube::discovery::ApiResource::erase::<K>(&()));
    (env.client(), namespace, api)
}

/// Object `name` of our `kind` with `spec`, untyped: what a user applies,
/// whatever serde would make of it.
fn untyped(kind: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}
