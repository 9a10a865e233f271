//! The `workload` scenario (issue 13): a real Kubernetes cluster on libvirt VMs.
//!
//! `clusterctl generate cluster --flavor allocated-endpoint` renders the release's
//! default flavor with the control-plane endpoint allocated by the provider (the
//! `templates/cluster-template-allocated-endpoint.yaml` a user gets) for one
//! control-plane machine and no worker yet, with only the variables
//! `templates/README.md` documents;
//! `kubectl apply` gives it to the management cluster, where CAPI core, the
//! kubeadm bootstrap (CABPK) and control plane (KCP) managers (with their
//! webhooks) and this provider run. The machines boot the Kubernetes node image
//! (`cargo xtask node-image`) on the private libvirtd under software emulation
//! and run real `kubeadm init` / `kubeadm join`. Checked from outside, as a user
//! would:
//! - the LibvirtCluster's endpoint is allocated from the test network (outside
//!   its DHCP range, a DNS host entry on the host that names the LibvirtCluster)
//!   and CAPI copies it into the Cluster;
//! - KCP becomes Initialized and then Available while its machine is the only
//!   guest; through the endpoint (keepalived's address), with the kubeconfig of
//!   the `<cluster>-kubeconfig` Secret, its Node is Ready;
//! - the MachineDeployment scaled from 0 to 1 joins a worker; both Machines
//!   reach phase Running with a nodeRef and both Nodes are Ready with
//!   `spec.providerID` equal to their LibvirtMachine's;
//! - a Pod on the worker fetches a page from a Pod on the control-plane node;
//! - scaled back to 0, the worker's Node goes (drained, deleted) and its
//!   domain, disk, seed ISO and DHCP entry are removed;
//! - deleting the Cluster leaves nothing of the namespace's on the host, the
//!   endpoint's DNS host entry included.
//!
//! At most two emulated guests run at once on the 2 host cores, and KCP's
//! availability is checked before the second boots:
//! with a worker beside it, a control plane whose CPUs QEMU emulates on 2
//! cores answers KCP's etcd and readiness checks too slowly for minutes on end
//! (templates/README.md, "Slow machines").
//!
//! A failure prints the tail of each guest's serial console (kernel, cloud-init
//! and kubeadm output) and where the full logs are kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use testenv::control_plane_versions::{KUBERNETES_VERSION, NODE_TEST_IMAGE};
use testenv::test_host::{TLS_CA_CERT, TLS_PORT};

use crate::clusterctl::LocalRepository;
use crate::objects::{self, Kind};
use crate::scenarios::{Running, check_on_host, running_facts, say};
use crate::stack::{Stack, TEST_BASE_POOL, TEST_DISK_POOL, TEST_NETWORK, upload_base_image};
use crate::wait::{Answered, Check, until};

/// The environment variable with the node image's path (`cargo xtask node-image` prints it).
pub const NODE_IMAGE_ENV: &str = "CAPL_NODE_IMAGE";
const ID: &str = "workload";
pub(crate) const CLUSTER: &str = "wl";
/// The release clusterctl renders the template from.
const RELEASE_VERSION: &str = "v0.1.0";

// Ceilings, not expectations: QEMU emulates every instruction on a 2-core machine.
/// From `kubectl apply` to the control-plane VM running with its address.
const VM_STARTED: Duration = Duration::from_secs(600);
/// From the VM running to `kubeadm init` done (KCP Initialized); measured about 5 min.
const KUBEADM_INIT: Duration = Duration::from_secs(1500);
/// For a worker to be created, boot, join and become Ready: 8 to 19 minutes measured
/// on 2026-12-03, the worker waiting for its kubelet's certificate while the control
/// plane, sharing the 2 cores with it, restarted its controller manager.
const WORKER_JOINED: Duration = Duration::from_secs(1800);
/// For Nodes, Pods and conditions to settle once their machine runs.
const SETTLE: Duration = Duration::from_secs(600);

pub(crate) fn kubeadm_control_plane() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"),
        "kubeadmcontrolplanes",
    )
}

/// base64 of `bytes`, as Kubernetes writes Secret data.
fn base64(bytes: &[u8]) -> Result<String> {
    let value = serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec()))?;
    value.as_str().map(str::to_string).context("ByteString did not serialize to a string")
}

/// One row of the timing table.
struct Timings {
    id: &'static str,
    started: Instant,
    rows: Vec<(&'static str, f64)>,
}

impl Timings {
    fn mark(&mut self, what: &'static str) {
        let seconds = self.started.elapsed().as_secs_f64();
        say(self.id, format!("{what} at {seconds:.0} s"));
        self.rows.push((what, seconds));
    }

    fn table(&self) -> String {
        let width = self.rows.iter().map(|(w, _)| w.len()).max().unwrap_or(5);
        let mut out = format!("{:<width$}  {:>7}\n", "event", "seconds");
        for (what, seconds) in &self.rows {
            out.push_str(&format!("{what:<width$}  {seconds:>7.0}\n"));
        }
        out
    }
}

pub async fn workload(stack: &mut Stack) -> Result<String> {
    let ns = stack.namespace(ID).await?;
    let result = run(stack, &ns).await;
    report_failure(stack, &ns, result).await
}

/// The `workload-topology` scenario: a cluster from the ClusterClass flavor
/// (`clusterctl generate cluster --flavor topology --worker-machine-count 0`, which
/// adds the `libvirt` ClusterClass), checked up to what a user relies on: the
/// topology controller's KubeadmControlPlane Initialized and Available, its Machine
/// Running with a nodeRef and its Node Ready with the LibvirtMachine's providerID;
/// deleting the Cluster leaves nothing on the host. (Workers, pod traffic and
/// scaling are the same node image and machine code as in `workload`, not repeated
/// here: each emulated guest costs CI minutes.)
pub async fn workload_topology(stack: &mut Stack) -> Result<String> {
    let ns = stack.namespace(TOPOLOGY_ID).await?;
    let result = run_topology(stack, &ns).await;
    report_failure(stack, &ns, result).await
}

/// On a workload scenario's failure: what the workload cluster says, each guest's console
/// tail and the CAPI managers' logs kept, then the error with its whole chain of causes.
async fn report_failure(stack: &Stack, ns: &str, result: Result<String>) -> Result<String> {
    if let Err(err) = &result {
        report_workload(&stack.client(), ns).await;
        report_guests(stack, ns);
        keep_capi_logs(stack, ns);
        return Err(anyhow::anyhow!("{err:#}"));
    }
    result
}

const TOPOLOGY_ID: &str = "workload-topology";

async fn run_topology(stack: &mut Stack, ns: &str) -> Result<String> {
    let started = Instant::now();
    apply_flavor(stack, ns, Flavor::Topology, |m| say(TOPOLOGY_ID, m))?;
    let mut timings = Timings { id: TOPOLOGY_ID, started, rows: Vec::new() };
    let client = stack.client();
    let kcp_api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &kubeadm_control_plane());

    let cp = control_plane_vm(stack, &client, ns).await?;
    timings.mark("control-plane VM started");

    // The topology controller names the KubeadmControlPlane; there is one.
    let kcp_name = until("the KubeadmControlPlane to be initialized (kubeadm init)", KUBEADM_INIT, || async {
        fail_if_kubeadm_failed(stack, &cp)?;
        let kcps = kcp_api.list(&ListParams::default()).await?.items;
        Ok(match kcps.as_slice() {
            [kcp] if kcp.data["status"]["initialization"]["controlPlaneInitialized"] == true => {
                Check::Done(objects::name(kcp))
            }
            [kcp] => Check::Pending(format!("status {}", compact(&kcp.data["status"]))),
            other => Check::Pending(format!("{} KubeadmControlPlanes", other.len())),
        })
    })
    .await?;
    timings.mark("kubeadm init done (KCP initialized)");

    let (_, nodes) = control_plane_available(&client, ns, &kcp_api, &kcp_name, &mut timings).await?;

    crate::scenarios::clean_up(stack, ns).await?;
    let left = domains(stack, ns)?;
    ensure!(left.is_empty(), "domains left after the Cluster was deleted: {left:?}");
    timings.mark("Cluster deleted, nothing left on the host");
    let table = timings.table();
    eprintln!("  [{TOPOLOGY_ID}] timing (seconds since kubectl apply):\n{table}");
    Ok(format!("KubeadmControlPlane {kcp_name}, nodes {:?}\n{table}", node_names(&nodes)))
}

/// With the control-plane machine the only guest: its Node Ready through the endpoint,
/// its Machine Running with a nodeRef and the Node's providerID its LibvirtMachine's,
/// then KCP Available. Returns the workload cluster's client and its one Node.
async fn control_plane_available(
    client: &Client,
    ns: &str,
    kcp_api: &Api<kube::api::DynamicObject>,
    kcp_name: &str,
    timings: &mut Timings,
) -> Result<(Client, Vec<Node>)> {
    let workload = workload_client(client, ns).await?;
    let nodes_api: Api<Node> = Api::all(workload.clone());
    let nodes = wait_nodes_ready(&nodes_api, 1, SETTLE).await?;
    timings.mark("control-plane Node Ready");
    wait_machines_running(client, ns, 1).await?;
    check_provider_ids(client, ns, &nodes).await?;
    kcp_available(client, ns, kcp_api, kcp_name).await?;
    timings.mark("KCP Available, its Machine Running with a nodeRef");
    Ok((workload, nodes))
}

/// Uploads the node image (`$CAPL_NODE_IMAGE`) into the base pool, renders the default
/// flavor with `clusterctl generate cluster` for cluster [`CLUSTER`] (one control-plane
/// machine, no worker) in `ns`, and applies it with `kubectl apply`, as a user does.
/// Returns the rendered manifest.
pub(crate) fn apply_cluster(stack: &Stack, ns: &str, say: impl Fn(String)) -> Result<PathBuf> {
    apply_flavor(stack, ns, Flavor::Default, say)
}

/// Which of the release's flavors a workload cluster is rendered from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Flavor {
    /// `cluster-template.yaml`: a KubeadmControlPlane and a MachineDeployment.
    Default,
    /// `cluster-template-topology.yaml`: a Cluster of the `libvirt` ClusterClass
    /// (`clusterclass-libvirt.yaml`).
    Topology,
    /// `cluster-template-allocated-endpoint.yaml`: the default flavor with the
    /// endpoint allocated from the libvirt network by the provider.
    AllocatedEndpoint,
}

impl Flavor {
    /// The name `clusterctl generate cluster --flavor` takes, `None` for the default.
    fn name(self) -> Option<&'static str> {
        match self {
            Flavor::Default => None,
            Flavor::Topology => Some("topology"),
            Flavor::AllocatedEndpoint => Some("allocated-endpoint"),
        }
    }
}

/// [`apply_cluster`] for either flavor.
pub(crate) fn apply_flavor(stack: &Stack, ns: &str, flavor: Flavor, say: impl Fn(String)) -> Result<PathBuf> {
    let image_path = std::env::var_os(NODE_IMAGE_ENV).map(PathBuf::from).with_context(|| {
        format!(
            "a workload cluster needs the Kubernetes node image: run `cargo xtask node-image` (as root) and set \
             {NODE_IMAGE_ENV} to the path it prints (`cargo xtask e2e` and `cargo xtask demo` do both)"
        )
    })?;
    let t = Instant::now();
    let image = upload_base_image(stack.libvirt()?, &image_path, "node", "cargo xtask node-image")?;
    say(format!("node image in pool {TEST_BASE_POOL} as {image} ({:.0} s)", t.elapsed().as_secs_f64()));
    let manifest = generate_cluster(stack, ns, &image, flavor)?;
    kubectl_apply(stack, None, &manifest)?;
    let flavor_arg = flavor.name().map(|f| format!(" --flavor {f}")).unwrap_or_default();
    let endpoint = match flavor {
        Flavor::AllocatedEndpoint => "allocated by the provider".to_string(),
        _ => stack.placement.endpoint_host.clone(),
    };
    say(format!(
        "clusterctl generate cluster {CLUSTER}{flavor_arg} | kubectl apply: {} (1 control-plane machine, no worker yet, endpoint {endpoint})",
        manifest.display(),
    ));
    Ok(manifest)
}

async fn run(stack: &mut Stack, ns: &str) -> Result<String> {
    // What a user does: render the template with clusterctl, apply it with kubectl.
    let started = Instant::now();
    apply_flavor(stack, ns, Flavor::AllocatedEndpoint, |m| say(ID, m))?;
    let mut timings = Timings { id: ID, started, rows: Vec::new() };

    let client = stack.client();
    let (endpoint, endpoint_entry) = allocated_endpoint(stack, &client, ns).await?;
    say(ID, format!("control-plane endpoint {endpoint} allocated from network {TEST_NETWORK}"));
    let kcp_api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &kubeadm_control_plane());
    let kcp_name = format!("{CLUSTER}-control-plane");

    // 1. The control-plane VM runs.
    let cp = control_plane_vm(stack, &client, ns).await?;
    timings.mark("control-plane VM started");

    // 2. kubeadm init done: KCP Initialized. A kubeadm that failed in the guest
    // fails the scenario at once, with its own error from the serial console.
    until(&format!("KubeadmControlPlane {kcp_name} to be initialized (kubeadm init)"), KUBEADM_INIT, || async {
        fail_if_kubeadm_failed(stack, &cp)?;
        let kcp = kcp_api.get_opt(&kcp_name).await?;
        Ok(match kcp {
            Some(kcp) if kcp.data["status"]["initialization"]["controlPlaneInitialized"] == true => Check::Done(()),
            Some(kcp) => Check::Pending(format!("status {}", compact(&kcp.data["status"]))),
            None => Check::Pending("no KubeadmControlPlane".into()),
        })
    })
    .await?;
    timings.mark("kubeadm init done (KCP initialized)");

    // 3. The workload cluster through the endpoint, and KCP Available, while the
    // control-plane machine is the only guest.
    let (workload, _) = control_plane_available(&client, ns, &kcp_api, &kcp_name, &mut timings).await?;
    let nodes_api: Api<Node> = Api::all(workload.clone());

    // 4. The MachineDeployment scaled to one: the worker joins.
    let md = format!("{CLUSTER}-md-0");
    objects::merge_patch(&client, ns, Kind::MachineDeployment, &md, json!({"spec": {"replicas": 1}})).await?;
    say(ID, format!("MachineDeployment {md} scaled 0 -> 1"));
    let nodes = wait_nodes_ready(&nodes_api, 2, WORKER_JOINED).await?;
    timings.mark("worker joined (Node Ready)");
    let machines = wait_machines_running(&client, ns, 2).await?;
    check_provider_ids(&client, ns, &nodes).await?;
    timings.mark("both Machines Running with a nodeRef");
    say(ID, format!("Machines {machines:?}"));

    // 5. A Pod on the worker reaches a Pod on the control-plane node.
    let reply = pod_to_pod(&workload, &nodes).await?;
    timings.mark("Pod on the worker reached a Pod on the control-plane node");

    // 6. Scaled back to 0: the worker is drained and its machine removed.
    let with_worker = domains(stack, ns)?;
    ensure!(with_worker.len() == 2, "two machines must be two domains, found {with_worker:?}");
    objects::merge_patch(&client, ns, Kind::MachineDeployment, &md, json!({"spec": {"replicas": 0}})).await?;
    say(ID, format!("MachineDeployment {md} scaled 1 -> 0"));
    let removed = until("the worker's Machine, LibvirtMachine and domain to be removed", SETTLE, || async {
        let machines = objects::list(&client, ns, Kind::Machine).await?;
        let lms = objects::list(&client, ns, Kind::LibvirtMachine).await?;
        let now = domains(stack, ns)?;
        Ok(if machines.len() == 1 && lms.len() == 1 && now.len() == 1 {
            Check::Done(with_worker.iter().find(|d| !now.contains(d)).cloned())
        } else {
            Check::Pending(format!("{} Machines, {} LibvirtMachines, domains {now:?}", machines.len(), lms.len()))
        })
    })
    .await?
    .context("no domain disappeared")?;
    check_nothing_of(stack, &removed)?;
    wait_nodes_ready(&nodes_api, 1, SETTLE).await?;
    timings.mark("scaled back to 0 (worker's Node, VM, disk, ISO, reservation gone)");

    // 7. Deleting the Cluster leaves nothing on the host.
    crate::scenarios::clean_up(stack, ns).await?;
    let left = domains(stack, ns)?;
    ensure!(left.is_empty(), "domains left after the Cluster was deleted: {left:?}");
    let entries = endpoint_dns_hosts(stack, &endpoint_entry)?;
    ensure!(
        entries.is_empty(),
        "the endpoint's DNS host entry {endpoint_entry} is left on network {TEST_NETWORK} after the Cluster was deleted: {entries:?}"
    );
    timings.mark("Cluster deleted, nothing left on the host (endpoint released)");

    let table = timings.table();
    eprintln!("  [{ID}] timing (seconds since kubectl apply):\n{table}");
    Ok(format!(
        "endpoint {endpoint} (allocated); nodes {:?}; pod-to-pod reply {reply:?}; removed on scale-down: {removed}\n{table}",
        node_names(&nodes)
    ))
}

/// Runs `clusterctl generate cluster` against the release of this checkout
/// with the variables a user sets for the private libvirtd; checks that
/// `--list-variables` lists every variable without a default it needed.
fn generate_cluster(stack: &Stack, ns: &str, image: &str, flavor: Flavor) -> Result<PathBuf> {
    let dir = stack.work_dir.join(match flavor {
        Flavor::Default => "workload",
        Flavor::Topology => "workload-topology",
        Flavor::AllocatedEndpoint => "workload-allocated-endpoint",
    });
    let repository = LocalRepository::release(&dir.join("repository"), RELEASE_VERSION)?;
    let ca = std::fs::read(TLS_CA_CERT)
        .with_context(|| format!("reading {TLS_CA_CERT}: start the private libvirtd with `cargo xtask host up`"))?;
    let signer = testenv::remote_access::host_ca()?;
    let (cert, key) = signer.client_cert("capl-e2e-workload", "capl-e2e")?;
    let infrastructure = format!("libvirt:{RELEASE_VERSION}");
    let kubeconfig = stack.management.kubeconfig_path().display().to_string();
    let mut generate = vec![
        "generate",
        "cluster",
        CLUSTER,
        "--infrastructure",
        &infrastructure,
        "--target-namespace",
        ns,
        "--kubeconfig",
        &kubeconfig,
    ];
    if let Some(name) = flavor.name() {
        generate.extend(["--flavor", name]);
    }
    let listed = repository.clusterctl(&[&generate[..], &["--list-variables"]].concat())?;
    let mut variables: Vec<(&str, String)> = vec![
        ("CAPL_LIBVIRT_URI", format!("qemu+tls://127.0.0.1:{TLS_PORT}/system")),
        ("CAPL_TLS_CA_CRT_B64", base64(&ca)?),
        ("CAPL_TLS_CLIENT_CRT_B64", base64(cert.as_bytes())?),
        ("CAPL_TLS_CLIENT_KEY_B64", base64(key.as_bytes())?),
        ("CAPL_IMAGE", image.to_string()),
        ("CAPL_NETWORK", TEST_NETWORK.to_string()),
        ("CAPL_BASE_POOL", TEST_BASE_POOL.to_string()),
        ("CAPL_DOMAIN_POOL", TEST_DISK_POOL.to_string()),
    ];
    if flavor == Flavor::AllocatedEndpoint {
        // The provider picks the address: the flavor asks for none.
        ensure!(
            !listed.contains("CAPL_CONTROL_PLANE_ENDPOINT_HOST"),
            "the allocated-endpoint flavor must not need CAPL_CONTROL_PLANE_ENDPOINT_HOST:\n{listed}"
        );
    } else {
        variables.push(("CAPL_CONTROL_PLANE_ENDPOINT_HOST", stack.placement.endpoint_host.clone()));
    }
    if flavor != Flavor::Topology {
        // Guests whose CPUs QEMU emulates share 2 host cores: a worker with one vCPU
        // leaves the control plane (2 vCPUs) enough to keep answering.
        variables.push(("CAPL_WORKER_VCPU", "1".to_string()));
    }
    for (name, _) in &variables {
        ensure!(
            listed.contains(name),
            "`clusterctl generate cluster --list-variables` does not list {name}, which the template uses:\n{listed}"
        );
    }
    let args = [
        &generate[..],
        &[
            "--kubernetes-version",
            KUBERNETES_VERSION,
            "--control-plane-machine-count",
            "1",
            // Without workers: the scenarios check the control plane Available
            // while it is the only guest, then scale the workers up.
            "--worker-machine-count",
            "0",
        ],
    ]
    .concat();
    let env: Vec<(&str, &str)> = variables.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let rendered = repository.clusterctl_env(&args, &env)?;
    if flavor == Flavor::Topology {
        // clusterctl adds the ClusterClass the Cluster names (the release's
        // clusterclass-libvirt.yaml) when the management cluster lacks it.
        ensure!(
            rendered.contains("kind: ClusterClass"),
            "`clusterctl generate cluster --flavor topology` did not add the ClusterClass `libvirt`:\n{rendered}"
        );
    }
    let path = dir.join("cluster.yaml");
    std::fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `kubectl apply -f manifest` to the management cluster, into `namespace` when given.
pub(crate) fn kubectl_apply(stack: &Stack, namespace: Option<&str>, manifest: &Path) -> Result<()> {
    let kubectl = testenv::Assets::locate()?.kubectl().context("kubectl is not in the control-plane directory")?;
    let mut command = std::process::Command::new(&kubectl);
    command.arg("--kubeconfig").arg(stack.management.kubeconfig_path()).args(["apply", "--request-timeout=60s"]);
    if let Some(namespace) = namespace {
        command.args(["-n", namespace]);
    }
    let output = command.arg("-f").arg(manifest).output().with_context(|| format!("running {}", kubectl.display()))?;
    if !output.status.success() {
        bail!("kubectl apply -f {} failed: {}", manifest.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// A client of the workload cluster from the `<cluster>-kubeconfig` Secret CAPI writes.
pub(crate) async fn workload_client(client: &Client, ns: &str) -> Result<Client> {
    let (kubeconfig, _) = workload_kubeconfig(client, ns).await?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    Ok(Client::try_from(config)?)
}

/// The workload cluster's kubeconfig (parsed and as text) from the `<cluster>-kubeconfig`
/// Secret, waiting for CAPI to write it.
pub(crate) async fn workload_kubeconfig(client: &Client, ns: &str) -> Result<(Kubeconfig, String)> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = format!("{CLUSTER}-kubeconfig");
    let secret = until(&format!("Secret {ns}/{name}"), SETTLE, || async {
        Ok(match secrets.get_opt(&name).await? {
            Some(secret) => Check::Done(secret),
            None => Check::Pending("absent".into()),
        })
    })
    .await?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .with_context(|| format!("Secret {ns}/{name} has no key `value`"))?;
    let text = std::str::from_utf8(&value.0)?.to_string();
    Ok((Kubeconfig::from_yaml(&text)?, text))
}

/// Waits until exactly `count` Nodes exist and all are Ready; returns them.
async fn wait_nodes_ready(nodes: &Api<Node>, count: usize, timeout: Duration) -> Result<Vec<Node>> {
    until(&format!("exactly {count} Nodes, all Ready, in the workload cluster"), timeout, || async {
        let list = nodes.list(&ListParams::default()).await.answered("listing Nodes")?.items;
        let ready_count = list.iter().filter(|n| node_ready(n)).count();
        Ok(if ready_count >= count && list.len() == count {
            Check::Done(list)
        } else {
            let seen: Vec<String> = list
                .iter()
                .map(|n| format!("{} ready={}", n.metadata.name.clone().unwrap_or_default(), node_ready(n)))
                .collect();
            Check::Pending(format!("{seen:?}"))
        })
    })
    .await
}

/// Waits until the namespace has `count` Machines, all Running with a nodeRef; returns
/// `machine -> node`.
async fn wait_machines_running(client: &Client, ns: &str, count: usize) -> Result<BTreeMap<String, String>> {
    until(&format!("{count} Machines Running with a nodeRef"), SETTLE, || async {
        let machines = objects::list(client, ns, Kind::Machine).await?;
        let running: BTreeMap<String, String> = machines
            .iter()
            .filter(|m| m.data["status"]["phase"] == "Running")
            .filter_map(|m| Some((objects::name(m), objects::str_at(m, &["status", "nodeRef", "name"])?.to_string())))
            .collect();
        Ok(if machines.len() == count && running.len() == count {
            Check::Done(running)
        } else {
            let seen: Vec<String> = machines
                .iter()
                .map(|m| {
                    format!("{} {} node={}", objects::name(m), m.data["status"]["phase"], m.data["status"]["nodeRef"])
                })
                .collect();
            Check::Pending(format!("{seen:?}"))
        })
    })
    .await
}

/// Every Node's providerID equals the LibvirtMachine's whose address it has.
async fn check_provider_ids(client: &Client, ns: &str, nodes: &[Node]) -> Result<()> {
    let lms = objects::list(client, ns, Kind::LibvirtMachine).await?;
    let by_id: BTreeMap<String, String> = lms
        .iter()
        .filter_map(|lm| Some((objects::str_at(lm, &["spec", "providerID"])?.to_string(), objects::name(lm))))
        .collect();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let id = node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        ensure!(
            by_id.contains_key(&id),
            "Node {name} has providerID {id:?}, which no LibvirtMachine of {ns} has (theirs: {:?})",
            by_id.keys().collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// Whether the Node's Ready condition is True.
pub(crate) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_names(nodes: &[Node]) -> Vec<String> {
    nodes.iter().filter_map(|n| n.metadata.name.clone()).collect()
}

fn is_control_plane(node: &Node) -> bool {
    node.metadata.labels.as_ref().is_some_and(|l| l.contains_key("node-role.kubernetes.io/control-plane"))
}

/// An HTTP server Pod (busybox httpd) on the control-plane node and a client Pod
/// (busybox nc) on a worker; returns what the client fetched.
async fn pod_to_pod(workload: &Client, nodes: &[Node]) -> Result<String> {
    let cp = nodes.iter().find(|n| is_control_plane(n)).context("no control-plane Node")?;
    let worker = nodes.iter().find(|n| !is_control_plane(n)).context("no worker Node")?;
    let cp_name = cp.metadata.name.clone().unwrap_or_default();
    let worker_name = worker.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    let marker = format!("capl-e2e-pong-from-{cp_name}");
    let server: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "capl-e2e-server" },
        "spec": {
            "nodeName": cp_name,
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{
                "name": "httpd", "image": NODE_TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    format!("mkdir -p /tmp/www && echo {marker} > /tmp/www/index.html && exec busybox httpd -f -p 8080 -h /tmp/www")],
                "ports": [{ "containerPort": 8080 }]
            }]
        }
    }))?;
    create_pod(&pods, &server).await?;
    let server_ip = until("the server Pod to run with an IP", SETTLE, || async {
        let pod = pods.get("capl-e2e-server").await.answered("reading Pod capl-e2e-server")?;
        let status = pod.status.clone().unwrap_or_default();
        Ok(match (status.phase.as_deref(), status.pod_ip.clone()) {
            (Some("Running"), Some(ip)) => Check::Done(ip),
            _ => Check::Pending(pod_state(&pod)),
        })
    })
    .await?;
    say(ID, format!("server Pod on {cp_name} at {server_ip}"));
    let client_pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "capl-e2e-client" },
        "spec": {
            "nodeName": worker_name,
            "restartPolicy": "OnFailure",
            "containers": [{
                // busybox nc, not wget: Debian's static busybox crashes in wget (glibc's
                // NSS cannot load in a static binary when wget looks up the service).
                "name": "client", "image": NODE_TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 {server_ip} 8080")]
            }]
        }
    }))?;
    create_pod(&pods, &client_pod).await?;
    until("the client Pod on the worker to fetch the server's page", SETTLE, || async {
        let pod = pods.get("capl-e2e-client").await.answered("reading Pod capl-e2e-client")?;
        Ok(match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Check::Done(()),
            _ => Check::Pending(pod_state(&pod)),
        })
    })
    .await?;
    let reply = until("the client Pod's log", SETTLE, || async {
        let log = pods.logs("capl-e2e-client", &LogParams::default()).await.answered("reading the client Pod's log")?;
        Ok(Check::Done(log))
    })
    .await?;
    let reply = reply.lines().last().unwrap_or_default().to_string();
    ensure!(reply.contains(&marker), "the client Pod on {worker_name} printed {reply:?}, expected {marker:?}");
    for name in ["capl-e2e-client", "capl-e2e-server"] {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    say(ID, format!("Pod on {worker_name} fetched {:?} from {server_ip}", reply.trim()));
    Ok(reply.trim().to_string())
}

/// Creates `pod` in the workload cluster, repeating the request while the API server
/// does not answer; a Pod that a request without answer did create counts as created.
async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    until(&format!("Pod {name} to be created in the workload cluster"), SETTLE, || async {
        match pods.create(&PostParams::default(), pod).await {
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Check::Done(())),
            result => result.answered(&format!("creating Pod {name} in the workload cluster")).map(|_| Check::Done(())),
        }
    })
    .await
}

fn pod_state(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<String> = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{} restarts={} state={:?}", c.name, c.restart_count, c.state))
        .collect();
    format!("phase {:?}, {containers:?}", status.phase)
}

/// The domains of the namespace on the host.
pub(crate) fn domains(stack: &Stack, ns: &str) -> Result<Vec<String>> {
    stack.libvirt()?.domains_with_prefix(ns)
}

/// Fails if `domain`, a volume of it or its DHCP entry is still on the host.
fn check_nothing_of(stack: &Stack, domain: &str) -> Result<()> {
    let host = stack.libvirt()?;
    let volumes: Vec<String> = host
        .volumes(TEST_DISK_POOL)?
        .into_iter()
        .filter(|v| v.starts_with(domain) || v.starts_with(&format!("cloudinit-{domain}")))
        .collect();
    let reservations: Vec<String> =
        host.dhcp_hosts(TEST_NETWORK)?.into_iter().filter(|h| h.name == domain).map(|h| h.ip).collect();
    ensure!(
        volumes.is_empty() && reservations.is_empty(),
        "the removed machine {domain} left volumes {volumes:?} and DHCP reservations {reservations:?}"
    );
    Ok(())
}

/// On failure: what the workload cluster says about its Nodes and Pods, if it answers.
pub(crate) async fn report_workload(client: &Client, ns: &str) {
    let lookup = async {
        let workload = tokio::time::timeout(Duration::from_secs(20), workload_client(client, ns)).await??;
        let nodes = tokio::time::timeout(
            Duration::from_secs(30),
            Api::<Node>::all(workload.clone()).list(&ListParams::default()),
        )
        .await??;
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
        let pods =
            tokio::time::timeout(Duration::from_secs(30), Api::<Pod>::all(workload).list(&ListParams::default()))
                .await??;
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

/// Waits for the first LibvirtMachine of `ns` to run with an address (the control-plane
/// machine: workers wait for its bootstrap data) and checks its domain on the host.
async fn control_plane_vm(stack: &Stack, client: &Client, ns: &str) -> Result<Running> {
    let cp = until("the control-plane LibvirtMachine to run with an address", VM_STARTED, || async {
        let lms = objects::list(client, ns, Kind::LibvirtMachine).await?;
        let running: Vec<Running> = lms.iter().filter_map(running_facts).collect();
        Ok(match running.into_iter().next() {
            Some(run) => Check::Done(run),
            None => Check::Pending(lms.iter().map(crate::scenarios::describe).collect::<Vec<_>>().join("; ")),
        })
    })
    .await?;
    check_on_host(stack, &cp).await?;
    Ok(cp)
}

/// The DNS host entries of the test network that carry the host name `name`
/// (the provider names an endpoint's entry `capl-endpoint-<LibvirtCluster UID>`).
/// Only this cluster's entry is looked at: the network may be shared with other
/// clusters, whose entries are theirs.
fn endpoint_dns_hosts(stack: &Stack, name: &str) -> Result<Vec<(String, Vec<String>)>> {
    Ok(stack
        .libvirt()?
        .dns_hosts(TEST_NETWORK)?
        .into_iter()
        .filter(|(_, names)| names.iter().any(|n| n == name))
        .collect())
}

/// Waits for the provider to allocate the control-plane endpoint of the
/// allocated-endpoint flavor and checks it as an admin would: an address of the
/// test network outside its DHCP range, in the LibvirtCluster and copied by CAPI
/// into the Cluster, and on the host a DNS host entry for it named after the
/// LibvirtCluster's UID, and no other entry of the network holding the same address.
/// Returns the address and the entry's host name.
async fn allocated_endpoint(stack: &Stack, client: &Client, ns: &str) -> Result<(String, String)> {
    use testenv::test_host::{DHCP_LAST, SUBNET_PREFIX};
    let (host, uid) = until(&format!("LibvirtCluster {ns}/{CLUSTER} to be given an endpoint"), VM_STARTED, || async {
        let lc = objects::get(client, ns, Kind::LibvirtCluster, CLUSTER).await?;
        Ok(match lc {
            Some(lc) => match lc.data["spec"]["controlPlaneEndpoint"]["host"].as_str() {
                Some(host) => Check::Done((host.to_string(), lc.uid().unwrap_or_default())),
                None => Check::Pending(format!("status {}", compact(&lc.data["status"]))),
            },
            None => Check::Pending("no LibvirtCluster".into()),
        })
    })
    .await?;
    let host_number: Option<u8> = host.strip_prefix(&format!("{SUBNET_PREFIX}.")).and_then(|n| n.parse().ok());
    ensure!(
        host_number.is_some_and(|n| n > DHCP_LAST && n < 255),
        "the allocated endpoint {host} is not an address of {SUBNET_PREFIX}.0/24 outside the DHCP range (.2-.{DHCP_LAST})"
    );
    until(&format!("Cluster {ns}/{CLUSTER} to take the endpoint {host}"), SETTLE, || async {
        let cluster = objects::get(client, ns, Kind::Cluster, CLUSTER).await?.context("the Cluster is gone")?;
        let seen = &cluster.data["spec"]["controlPlaneEndpoint"];
        Ok(if seen["host"] == host.as_str() && seen["port"] == 6443 {
            Check::Done(())
        } else {
            Check::Pending(format!("spec.controlPlaneEndpoint {}", compact(seen)))
        })
    })
    .await?;
    let name = format!("capl-endpoint-{uid}");
    let entries = endpoint_dns_hosts(stack, &name)?;
    let expected = (host.clone(), vec![name.clone()]);
    ensure!(
        entries == [expected.clone()],
        "network {TEST_NETWORK} must hold exactly one DNS host entry for this cluster's endpoint, {expected:?}; found {entries:?}"
    );
    let sharing: Vec<_> = stack
        .libvirt()?
        .dns_hosts(TEST_NETWORK)?
        .into_iter()
        .filter(|(ip, names)| *ip == host && *names != expected.1)
        .collect();
    ensure!(sharing.is_empty(), "the allocated endpoint {host} is also held by other DNS host entries: {sharing:?}");
    Ok((host, name))
}

/// Fails with kubeadm's own error when the control-plane machine's console shows
/// that `kubeadm init` failed (see [`kubeadm_failure`]).
fn fail_if_kubeadm_failed(stack: &Stack, cp: &Running) -> Result<()> {
    if let Some(failure) = kubeadm_failure(&stack.console_log(&cp.domain)) {
        bail!("kubeadm failed on the control-plane machine {} (domain {}):\n{failure}", cp.name, cp.domain);
    }
    Ok(())
}

/// Waits for the KubeadmControlPlane `name` to be Available. While it is not, the
/// timeout error says why in KCP's words: its `Available` and `EtcdClusterHealthy`
/// messages and each control-plane Machine's `EtcdMemberHealthy` message (which
/// carries the etcd client's error).
async fn kcp_available(client: &Client, ns: &str, kcp_api: &Api<kube::api::DynamicObject>, name: &str) -> Result<()> {
    until(&format!("KubeadmControlPlane {name} to be Available"), SETTLE, || async {
        let kcp = kcp_api.get_opt(name).await?.context("the KubeadmControlPlane is gone")?;
        if let Some(("True", _)) = objects::condition(&kcp, "Available") {
            return Ok(Check::Done(()));
        }
        let mut seen = vec![
            format!("Available {}", condition_text(&kcp, "Available")),
            format!("EtcdClusterHealthy {}", condition_text(&kcp, "EtcdClusterHealthy")),
        ];
        for machine in objects::list(client, ns, Kind::Machine).await? {
            if machine.labels().contains_key("cluster.x-k8s.io/control-plane") {
                seen.push(format!(
                    "Machine {} EtcdMemberHealthy {}",
                    machine.name_any(),
                    condition_text(&machine, "EtcdMemberHealthy")
                ));
            }
        }
        Ok(Check::Pending(seen.join("; ")))
    })
    .await
}

/// `status reason: message` of the condition `type_` in `object`'s `status.conditions`.
fn condition_text(object: &kube::api::DynamicObject, type_: &str) -> String {
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

/// kubeadm's own error when a serial console shows that `kubeadm init` or `join`
/// failed (cloud-init prints kubeadm's output there): the lines from its
/// `error execution phase` on, at most 20. `None` while nothing failed.
pub(crate) fn kubeadm_failure(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let first = lines.iter().position(|l| l.contains("error execution phase"))?;
    let start = first.saturating_sub(3);
    Some(lines[start..].iter().take(20).map(|l| l.trim_end()).collect::<Vec<_>>().join("\n"))
}

/// On failure: keeps the CAPI managers' logs (KCP's says why it found the control plane
/// unavailable) beside the guests' consoles.
fn keep_capi_logs(stack: &Stack, ns: &str) {
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

fn compact(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 600 { format!("{}...", &text[..600]) } else { text }
}

#[cfg(test)]
mod tests {
    use super::kubeadm_failure;

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
