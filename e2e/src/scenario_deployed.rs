//! The `deployed` scenario (`capl-e2e run --kind`): the provider as users
//! deploy it, from its container image, as a Pod of a kind management cluster
//! under a real kubelet and kube-controller-manager.
//!
//! What it needs comes from `cargo xtask e2e --kind` (all built offline, see
//! `xtask/src/kind.rs`): kind ([`KIND_BIN_ENV`]), its node image
//! ([`KIND_NODE_IMAGE_ENV`]), the directory whose `docker` is the wrapper kind
//! runs through ([`KIND_WRAPPER_DIR_ENV`], with the real client in
//! `CAPL_REAL_DOCKER`) and the manager image built offline
//! ([`PROVIDER_IMAGE_ENV`]).
//!
//! Steps, each checked from outside as an operator would:
//! 1. `kind create cluster` (one node, docker network `capl-kind`);
//! 2. `kind load docker-image` of the manager image and of CAPI's (made
//!    offline from the managers of `cargo xtask control-plane build`, named as
//!    CAPI's release components name them);
//! 3. `clusterctl init --core cluster-api --bootstrap kubeadm --control-plane
//!    kubeadm --infrastructure libvirt` from local repositories (this
//!    provider's release with the manager image), cert-manager's CRDs applied
//!    first and cert-manager declared externally provisioned; cert-manager
//!    itself cannot be built offline, so [`stand_in_for_cert_manager`] issues
//!    the Certificates' Secrets and injects the CA bundles; every provider's
//!    Deployment becomes Available;
//! 4. the provider's Pod is Ready and its name is the holder of the leader
//!    Lease;
//! 5. the Pod runs as non-root with a read-only root filesystem (the kubelet
//!    enforces `runAsNonRoot` against the image's user), its log is JSON line by
//!    line, and no API call was denied (`forbidden` in the log would show a
//!    missing RBAC rule);
//! 6. `kubectl rollout restart`: a new Pod becomes Ready, the old one goes,
//!    and the Lease moves to the new Pod;
//! 7. a machine through CAPI core: a containerized libvirtd (testcontainers,
//!    `testenv::container_libvirtd`) on the kind node's docker network,
//!    reached over `qemu+tls://<its address>/system` with a credentials
//!    Secret (CA, client certificate and key), with a NAT network and two
//!    pools defined and the test guest image uploaded; a Cluster,
//!    LibvirtCluster, bootstrap Secret, Machine and LibvirtMachine; CAPI core
//!    takes the Machine to Provisioned/Running, the LibvirtMachine gets its
//!    InternalIP from the guest's DHCP lease and its domain runs in the
//!    container; the Pod's log holds no bootstrap data; deleting the Machine
//!    deletes the LibvirtMachine, the domain and its volumes; then a
//!    MachineDeployment of 2 (LibvirtMachineTemplate) is scaled to 1, and
//!    deleting the Cluster leaves no domain, volume or DHCP host of it (the
//!    base image stays).
//!
//! The kind cluster is deleted afterwards, however the scenario ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::host_view::HostView;
use crate::objects::{self, Placement};
use crate::scenarios::say;
use crate::stack::upload_base_image_to;
use testenv::control_plane_versions::CAPI_VERSION;

/// The scenario's id in the summary table.
pub const SCENARIO: &str = "deployed";
pub const KIND_BIN_ENV: &str = "CAPL_KIND_BIN";
pub const KIND_NODE_IMAGE_ENV: &str = "CAPL_KIND_NODE_IMAGE";
pub const KIND_WRAPPER_DIR_ENV: &str = "CAPL_KIND_WRAPPER_DIR";
pub const PROVIDER_IMAGE_ENV: &str = "CAPL_PROVIDER_IMAGE";
/// CAPI's images made offline (`registry.k8s.io/cluster-api/...`), comma-separated.
pub const CAPI_IMAGES_ENV: &str = "CAPL_CAPI_IMAGES";
/// The tiny test guest (`cargo xtask guest-image`).
pub const GUEST_IMAGE_ENV: &str = "CAPL_GUEST_IMAGE";
/// The namespace of the machine of step 7.
const VM_NAMESPACE: &str = "capl-kind-vm";
/// The containerized host's network and pools.
const VM_NETWORK: &str = "capl-kind-net";
const VM_BASE_POOL: &str = "capl-kind-base";
const VM_DISK_POOL: &str = "capl-kind-disks";
const VM_LIMIT: Duration = Duration::from_secs(420);
/// The kind cluster the scenario creates and deletes.
pub const CLUSTER: &str = "capl-e2e";
/// The docker network of its node.
const NETWORK: &str = "capl-kind";
/// The provider's namespace and Deployment (config/manager).
const NAMESPACE: &str = "capl-system";
const DEPLOYMENT: &str = "capl-controller-manager";
const POD_SELECTOR: &str = "control-plane=controller-manager";
/// Bounds of the waits.
const CREATE_LIMIT: &str = "240s";
const ROLLOUT_LIMIT: &str = "300s";
const LEASE_LIMIT: Duration = Duration::from_secs(120);
const GONE_LIMIT: Duration = Duration::from_secs(120);

fn env_path(name: &str) -> Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set: run the kind scenarios with `cargo xtask e2e --kind`"))
}

/// kind and kubectl, with what they need.
struct Tools {
    kind: PathBuf,
    kubectl: PathBuf,
    path: std::ffi::OsString,
    kubeconfig: PathBuf,
}

impl Tools {
    fn kind(&self) -> Command {
        let mut c = Command::new(&self.kind);
        c.env("PATH", &self.path).env("KIND_EXPERIMENTAL_DOCKER_NETWORK", NETWORK);
        c
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        c
    }

    /// Runs kubectl and returns its stdout; an error carries its stderr.
    fn kubectl_out(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args).output().with_context(|| format!("running kubectl {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn kubectl_json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl_out(&all)?)?)
    }
}

fn run(what: &str, command: &mut Command) -> Result<()> {
    let out = command.output().with_context(|| format!("{what}: cannot start {:?}", command.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Deletes the kind cluster when dropped.
struct ClusterGuard<'a>(&'a Tools);

impl Drop for ClusterGuard<'_> {
    fn drop(&mut self) {
        let _ = self.0.kind().args(["delete", "cluster", "--name", CLUSTER]).output();
    }
}

/// Runs the scenario in `work_dir`.
pub fn run_scenario(work_dir: &Path) -> Result<()> {
    let assets = testenv::Assets::locate()?;
    let kubectl = assets.kubectl().context("no kubectl: run `cargo xtask control-plane build`")?;
    let wrapper_dir = env_path(KIND_WRAPPER_DIR_ENV)?;
    let mut path = std::ffi::OsString::from(&wrapper_dir);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    std::fs::create_dir_all(work_dir)?;
    let tools = Tools { kind: env_path(KIND_BIN_ENV)?, kubectl, path, kubeconfig: work_dir.join("kubeconfig") };
    let node_image = std::env::var(KIND_NODE_IMAGE_ENV).with_context(|| format!("{KIND_NODE_IMAGE_ENV} is not set"))?;
    let image = std::env::var(PROVIDER_IMAGE_ENV).with_context(|| format!("{PROVIDER_IMAGE_ENV} is not set"))?;

    // 1. The cluster (a leftover of an interrupted run first goes).
    let _ = tools.kind().args(["delete", "cluster", "--name", CLUSTER]).output();
    let t = Instant::now();
    let config = crate::repo_root().join("hack/kind/cluster.yaml");
    run(
        "kind create cluster",
        tools
            .kind()
            .args(["create", "cluster", "--name", CLUSTER, "--image", &node_image, "--wait", CREATE_LIMIT])
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&tools.kubeconfig),
    )?;
    let _guard = ClusterGuard(&tools);
    say(SCENARIO, format!("kind cluster {CLUSTER} ({node_image}) Ready in {:.0?}", t.elapsed()));

    // 2. The manager image and CAPI's, loaded into the node.
    let t = Instant::now();
    let capi_images = std::env::var(CAPI_IMAGES_ENV).with_context(|| format!("{CAPI_IMAGES_ENV} is not set"))?;
    let mut images: Vec<&str> = capi_images.split(',').filter(|i| !i.is_empty()).collect();
    images.push(&image);
    let mut load = tools.kind();
    load.args(["load", "docker-image", "--name", CLUSTER]).args(&images);
    run("kind load docker-image", &mut load)?;
    say(SCENARIO, format!("{} images loaded in {:.0?}: {}", images.len(), t.elapsed(), images.join(", ")));

    // 3. clusterctl init: CAPI core, the kubeadm providers and this provider.
    let t = Instant::now();
    clusterctl_init(&tools, work_dir, &image)?;
    say(SCENARIO, format!("clusterctl init: every provider's Deployment Available in {:.0?}", t.elapsed()));

    // 4. Rolled out, Ready, leading.
    let t = Instant::now();
    rollout_status(&tools)?;
    let first = ready_pods(&tools)?;
    ensure!(first.len() == 1, "one Ready manager Pod expected, found {first:?}");
    let first = first[0].clone();
    let holder = wait_for_lease_holder(&tools, &first)?;
    say(SCENARIO, format!("Pod {first} Ready and leading (Lease holder {holder}) {:.0?} after init", t.elapsed()));

    // 5. How it runs and what it logs.
    check_pod_security(&tools, &first)?;
    check_logs(&tools, &first)?;
    say(SCENARIO, "runs as non-root on a read-only root filesystem; JSON log, no denied API call");

    // 6. A rolling restart hands the Lease over.
    let t = Instant::now();
    run(
        "kubectl rollout restart",
        &mut tools.kubectl(&["rollout", "restart", "-n", NAMESPACE, &format!("deployment/{DEPLOYMENT}")]),
    )?;
    rollout_status(&tools)?;
    let deadline = Instant::now() + GONE_LIMIT;
    let second = loop {
        let pods = all_pods(&tools)?;
        let ready = ready_pods(&tools)?;
        if !pods.contains(&first) && ready.len() == 1 {
            break ready[0].clone();
        }
        if Instant::now() > deadline {
            bail!(
                "after the rollout restart the old Pod {first} is still there or no single new Pod is Ready: {pods:?}"
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    ensure!(second != first, "the rollout restart kept Pod {first}");
    let holder = wait_for_lease_holder(&tools, &second)?;
    check_logs(&tools, &second)?;
    say(SCENARIO, format!("rollout restart: {first} -> {second}, Lease holder {holder}, in {:.0?}", t.elapsed()));

    // 7. A machine, from the Pod, on a containerized libvirtd over TLS.
    let t = Instant::now();
    let summary = provision_a_machine(&tools, &second, work_dir)?;
    say(SCENARIO, format!("{summary} in {:.0?}", t.elapsed()));
    Ok(())
}

fn apply(tools: &Tools, documents: &[Value]) -> Result<()> {
    use std::io::Write as _;
    let mut child = tools
        .kubectl(&["apply", "--server-side", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kubectl apply")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    for d in documents {
        writeln!(stdin, "---\n{}", serde_json::to_string(d)?)?;
    }
    drop(stdin);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Waits (bounded) until `check` gives a value for `kind/name`'s JSON.
fn wait_for<T>(tools: &Tools, kind: &str, name: &str, what: &str, check: impl Fn(&Value) -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + VM_LIMIT;
    loop {
        let object = tools.kubectl_json(&["get", kind, "-n", VM_NAMESPACE, name])?;
        if let Some(value) = check(&object) {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("{kind} {name}: not {what} within {VM_LIMIT:?}; its status: {}", object["status"]);
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Step 7; returns what it saw.
fn provision_a_machine(tools: &Tools, pod: &str, work_dir: &Path) -> Result<String> {
    use testenv::container_libvirtd::{ContainerLibvirtd, Options};
    let guest_image = env_path(GUEST_IMAGE_ENV)?;
    let daemon = ContainerLibvirtd::start_with(Options { network: Some(NETWORK.into()), tls: true })
        .map_err(anyhow::Error::msg)?;
    let tls = daemon.tls().context("the containerized libvirtd was started without TLS")?.clone();
    let host = HostView::new(daemon.uri());
    let net_xml = work_dir.join("vm-network.xml");
    std::fs::write(
        &net_xml,
        format!(
            "<network><name>{VM_NETWORK}</name><forward mode='nat'/><bridge name='caplkind0'/>\
             <ip address='10.252.0.1' netmask='255.255.255.0'><dhcp><range start='10.252.0.2' end='10.252.0.99'/>\
             </dhcp></ip></network>"
        ),
    )?;
    host.virsh(&["net-define", &net_xml.display().to_string()])?;
    host.virsh(&["net-start", VM_NETWORK])?;
    for (pool, dir) in [(VM_BASE_POOL, "/var/lib/capl-kind/base"), (VM_DISK_POOL, "/var/lib/capl-kind/disks")] {
        host.virsh(&["pool-define-as", pool, "dir", "--target", dir])?;
        host.virsh(&["pool-build", pool])?;
        host.virsh(&["pool-start", pool])?;
    }
    let image = upload_base_image_to(&host, VM_BASE_POOL, &guest_image, "guest", "cargo xtask guest-image")?;

    let (cluster, machine) = ("c1", "c1-m0");
    let user_data = objects::user_data(cluster);
    apply(tools, &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": VM_NAMESPACE}})])?;
    apply(
        tools,
        &[json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                   "metadata": {"name": "host-tls", "namespace": VM_NAMESPACE},
                   "stringData": {"ca.crt": tls.ca_pem, "tls.crt": tls.cert_pem, "tls.key": tls.key_pem}})],
    )?;
    let placement = Placement {
        uri: tls.uri.clone(),
        network: VM_NETWORK.into(),
        base_pool: VM_BASE_POOL.into(),
        domain_pool: VM_DISK_POOL.into(),
        image: image.clone(),
        endpoint_host: "10.252.0.250".into(),
    };
    let mut lc = objects::libvirt_cluster(VM_NAMESPACE, cluster, &placement);
    lc["spec"]["credentialsRef"] = json!({"name": "host-tls"});
    apply(
        tools,
        &[
            objects::cluster(VM_NAMESPACE, cluster, false),
            lc,
            objects::bootstrap_secret(VM_NAMESPACE, "c1-m0-bootstrap", cluster, &user_data),
            objects::machine(VM_NAMESPACE, machine, cluster, "c1-m0-bootstrap"),
            objects::libvirt_machine(VM_NAMESPACE, machine, cluster, &image, None),
        ],
    )?;
    let address = wait_for(tools, "libvirtmachine", machine, "provisioned with an InternalIP", |o| {
        let provisioned = o["status"]["initialization"]["provisioned"] == true;
        let ip = o["status"]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == "InternalIP")
            .and_then(|a| a["address"].as_str().map(str::to_string));
        ip.filter(|_| provisioned)
    })?;
    let phase = wait_for(tools, "machine.cluster.x-k8s.io", machine, "Provisioned or Running by CAPI core", |o| {
        o["status"]["phase"].as_str().filter(|p| matches!(*p, "Provisioned" | "Running")).map(str::to_string)
    })?;
    let domains = host.domains_with_prefix(&format!("{VM_NAMESPACE}-{machine}-"))?;
    ensure!(domains.len() == 1, "one domain of {machine} expected on the containerized libvirtd, found {domains:?}");
    let state = host.domain_state(&domains[0])?;
    ensure!(state.trim() == "running", "domain {} is {state}", domains[0]);
    check_logs(tools, pod)?;
    let logs = tools.kubectl_out(&["logs", "-n", NAMESPACE, pod])?;
    ensure!(!logs.contains(&format!("hello from {cluster}")), "the Pod logged the machine's bootstrap data");

    // Deleting the Machine (CAPI core deletes its LibvirtMachine) removes what it made on the host.
    tools.kubectl_out(&["delete", "machine.cluster.x-k8s.io", machine, "-n", VM_NAMESPACE, "--timeout=240s"])?;
    let lm_gone = tools.kubectl_out(&["get", "libvirtmachine", machine, "-n", VM_NAMESPACE, "--ignore-not-found"])?;
    ensure!(lm_gone.trim().is_empty(), "the LibvirtMachine outlived its Machine: {lm_gone}");
    let left = host.domains_with_prefix(&format!("{VM_NAMESPACE}-{machine}-"))?;
    let volumes: Vec<String> =
        host.volumes(VM_DISK_POOL)?.into_iter().filter(|v| v.contains(&format!("{VM_NAMESPACE}-{machine}"))).collect();
    ensure!(left.is_empty() && volumes.is_empty(), "after delete the host still has {left:?} {volumes:?}");
    let single = format!(
        "machine {machine} (CAPI phase {phase}) over {}: domain {} running at {address}, removed on delete",
        tls.uri, domains[0]
    );

    // A MachineDeployment of 2, scaled to 1; then the Cluster deleted.
    apply(
        tools,
        &[
            objects::libvirt_machine_template(VM_NAMESPACE, "c1-md", cluster, &image),
            objects::machine_deployment(VM_NAMESPACE, "c1-md", cluster, 2, "c1-md", "c1-m0-bootstrap"),
        ],
    )?;
    let addressed = |want: usize| -> Result<Vec<String>> {
        let deadline = Instant::now() + VM_LIMIT;
        loop {
            let list = tools.kubectl_json(&["get", "libvirtmachines", "-n", VM_NAMESPACE])?;
            let ips: Vec<String> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|o| o["metadata"]["deletionTimestamp"].is_null())
                .filter_map(|o| {
                    o["status"]["addresses"].as_array()?.iter().find(|a| a["type"] == "InternalIP")?["address"]
                        .as_str()
                        .map(str::to_string)
                })
                .collect();
            let running = host.domains_with_prefix(&format!("{VM_NAMESPACE}-c1-md-"))?;
            if ips.len() == want && running.len() == want {
                return Ok(ips);
            }
            if Instant::now() > deadline {
                bail!(
                    "MachineDeployment c1-md: {want} addressed machines expected within {VM_LIMIT:?}; IPs {ips:?}, domains {running:?}"
                );
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    };
    let two = addressed(2)?;
    tools.kubectl_out(&["scale", "machinedeployment.cluster.x-k8s.io", "c1-md", "-n", VM_NAMESPACE, "--replicas=1"])?;
    let one = addressed(1)?;
    tools.kubectl_out(&["delete", "cluster.cluster.x-k8s.io", cluster, "-n", VM_NAMESPACE, "--timeout=300s"])?;
    let domains_left = host.domains_with_prefix(&format!("{VM_NAMESPACE}-"))?;
    let volumes_left: Vec<String> =
        host.volumes(VM_DISK_POOL)?.into_iter().filter(|v| v.contains(VM_NAMESPACE)).collect();
    let dhcp_left: Vec<String> = host
        .dhcp_hosts(VM_NETWORK)?
        .into_iter()
        .filter(|h| h.name.contains(VM_NAMESPACE))
        .map(|h| format!("{} {} {}", h.mac, h.name, h.ip))
        .collect();
    ensure!(
        domains_left.is_empty() && volumes_left.is_empty() && dhcp_left.is_empty(),
        "after the Cluster's deletion the host still has {domains_left:?} {volumes_left:?} {dhcp_left:?}"
    );
    ensure!(host.volume_exists(VM_BASE_POOL, &image), "the Cluster's deletion removed the base image {image}");
    Ok(format!(
        "{single}; MachineDeployment 2 {two:?} -> 1 {one:?}; Cluster deleted: no domain, volume or DHCP host left"
    ))
}

fn rollout_status(tools: &Tools) -> Result<()> {
    let timeout = format!("--timeout={ROLLOUT_LIMIT}");
    let deployment = format!("deployment/{DEPLOYMENT}");
    tools.kubectl_out(&["rollout", "status", "-n", NAMESPACE, &deployment, &timeout]).map(|_| ()).map_err(|e| {
        let describe =
            tools.kubectl_out(&["describe", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR]).unwrap_or_default();
        e.context(format!("the manager Deployment did not roll out; its Pods:\n{describe}"))
    })
}

fn pods_json(tools: &Tools) -> Result<Vec<Value>> {
    let list = tools.kubectl_json(&["get", "pods", "-n", NAMESPACE, "-l", POD_SELECTOR])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn all_pods(tools: &Tools) -> Result<Vec<String>> {
    Ok(pods_json(tools)?.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string)).collect())
}

fn ready_pods(tools: &Tools) -> Result<Vec<String>> {
    Ok(pods_json(tools)?
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

/// Waits until a Lease in the provider's namespace is held by `pod`; returns the holder.
fn wait_for_lease_holder(tools: &Tools, pod: &str) -> Result<String> {
    let deadline = Instant::now() + LEASE_LIMIT;
    loop {
        let leases = tools.kubectl_json(&["get", "leases", "-n", NAMESPACE])?;
        let holders: Vec<String> = leases["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .collect();
        if let Some(h) = holders.iter().find(|h| h.starts_with(&format!("{pod}_"))) {
            return Ok(h.clone());
        }
        if Instant::now() > deadline {
            bail!("no Lease in {NAMESPACE} held by Pod {pod} within {LEASE_LIMIT:?}; holders: {holders:?}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn check_pod_security(tools: &Tools, pod: &str) -> Result<()> {
    let p = tools.kubectl_json(&["get", "pod", "-n", NAMESPACE, pod])?;
    let container = &p["spec"]["containers"][0];
    let pod_sc = &p["spec"]["securityContext"];
    let sc = &container["securityContext"];
    ensure!(sc["readOnlyRootFilesystem"] == true, "Pod {pod}: the manager's root filesystem is not read-only: {sc}");
    ensure!(
        sc["runAsNonRoot"] == true || pod_sc["runAsNonRoot"] == true,
        "Pod {pod}: runAsNonRoot is not set ({pod_sc}, {sc})"
    );
    ensure!(sc["allowPrivilegeEscalation"] == false, "Pod {pod}: privilege escalation allowed: {sc}");
    let ready = p["status"]["containerStatuses"][0]["ready"] == true;
    ensure!(ready, "Pod {pod}: the manager container is not ready");
    Ok(())
}

/// Every line is a JSON object with a level; nothing was forbidden; no cloud-config.
fn check_logs(tools: &Tools, pod: &str) -> Result<()> {
    let logs = tools.kubectl_out(&["logs", "-n", NAMESPACE, pod])?;
    let mut lines = 0;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("Pod {pod} logged a line that is not JSON: {line}"))?;
        ensure!(v.get("level").is_some(), "Pod {pod}: a log line without a level: {line}");
        ensure!(!line.contains("forbidden"), "Pod {pod}: an API call was denied (missing RBAC?): {line}");
        ensure!(!line.contains("#cloud-config"), "Pod {pod}: bootstrap data in the log: {line}");
    }
    ensure!(lines > 0, "Pod {pod} logged nothing");
    Ok(())
}

/// `clusterctl init` of CAPI core, the kubeadm providers and this provider
/// (release `v0.1.0` with the manager image `image`) from local repositories,
/// with cert-manager's CRDs applied first and cert-manager declared externally
/// provisioned ([`crate::clusterctl::LocalRepository::with_capi_release`]);
/// then [`stand_in_for_cert_manager`].
fn clusterctl_init(tools: &Tools, work_dir: &Path, image: &str) -> Result<()> {
    let assets = testenv::Assets::locate()?;
    run(
        "applying cert-manager's CRDs",
        tools.kubectl(&["apply", "--server-side", "-f"]).arg(assets.cert_manager_crds_dir()?),
    )?;
    let repository =
        crate::clusterctl::LocalRepository::release_with_image(&work_dir.join("repository"), "v0.1.0", image)?
            .with_capi_release(&assets)?;
    let kubeconfig = tools.kubeconfig.display().to_string();
    let core = format!("cluster-api:{CAPI_VERSION}");
    let kubeadm = format!("kubeadm:{CAPI_VERSION}");
    repository.clusterctl(&[
        "init",
        "--kubeconfig",
        &kubeconfig,
        "--core",
        &core,
        "--bootstrap",
        &kubeadm,
        "--control-plane",
        &kubeadm,
        "--infrastructure",
        "libvirt:v0.1.0",
    ])?;
    stand_in_for_cert_manager(tools)?;
    let timeout = format!("--timeout={ROLLOUT_LIMIT}");
    tools
        .kubectl_out(&["wait", "--for=condition=Available", "deployment", "--all", "-A", &timeout])
        .map(|_| ())
        .map_err(|e| {
            let pods = tools.kubectl_out(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_default();
            e.context(format!("the providers' Deployments did not become Available; Pods:\n{pods}"))
        })
}

/// What cert-manager would do for the providers' components: a Secret for
/// every Certificate (signed by one CA made here, with the Certificate's DNS
/// names), and that CA as the `caBundle` of every webhook configuration and
/// CRD conversion webhook annotated `cert-manager.io/inject-ca-from`.
/// (cert-manager itself cannot be built from the Go module proxy; see the README.)
fn stand_in_for_cert_manager(tools: &Tools) -> Result<()> {
    let ca = testenv::Pki::new_ca("capl-e2e-cert-manager-stand-in")?;
    let bundle = serde_json::to_value(k8s_openapi::ByteString(ca.ca_pem().as_bytes().to_vec()))?;
    let certificates = tools.kubectl_json(&["get", "certificates.cert-manager.io", "-A"])?;
    let mut secrets = Vec::new();
    for c in certificates["items"].as_array().into_iter().flatten() {
        let names: Vec<String> = c["spec"]["dnsNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        let secret = c["spec"]["secretName"].as_str().context("a Certificate without secretName")?;
        let namespace = c["metadata"]["namespace"].as_str().unwrap_or_default();
        let (cert, key) = ca.serving_cert_for(names.first().map_or("webhook", String::as_str), &names)?;
        secrets.push(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace},
            "stringData": {"ca.crt": ca.ca_pem(), "tls.crt": cert, "tls.key": key},
        }));
    }
    ensure!(!secrets.is_empty(), "clusterctl installed no cert-manager Certificate: nothing to stand in for");
    apply(tools, &secrets)?;
    for kind in ["validatingwebhookconfigurations", "mutatingwebhookconfigurations", "customresourcedefinitions"] {
        let list = tools.kubectl_json(&["get", kind])?;
        for object in list["items"].as_array().into_iter().flatten() {
            if object["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_null() {
                continue;
            }
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let patch: Vec<Value> = if kind == "customresourcedefinitions" {
                vec![json!({"op": "add", "path": "/spec/conversion/webhook/clientConfig/caBundle", "value": bundle})]
            } else {
                let webhooks = object["webhooks"].as_array().map_or(0, Vec::len);
                (0..webhooks)
                    .map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}))
                    .collect()
            };
            let patch = serde_json::to_string(&patch)?;
            tools.kubectl_out(&["patch", kind, name, "--type=json", "-p", &patch])?;
        }
    }
    Ok(())
}
