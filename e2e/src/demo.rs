//! `cargo xtask demo`: the stack with a real Kubernetes cluster ([`run_workload`]),
//! or with one cluster and two plain machines (`--quick`, [`run`]), narrated.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::harness::objects::{self, Kind};
use crate::harness::stack::{Stack, StackConfig};

const MACHINES: [&str; 2] = ["demo-0", "demo-1"];
const CLUSTER: &str = "demo";

/// Runs the quick demo. Without `exit_after_ready` it waits for Ctrl-C once both
/// machines run; when they do not run with their addresses within
/// [`QUICK_BOUND`] it fails naming them. Either way it deletes the cluster and
/// stops everything.
pub async fn run(config: &StackConfig, exit_after_ready: bool) -> Result<()> {
    let started = Instant::now();
    let at = move || format!("[{:>5.1}s]", started.elapsed().as_secs_f64());
    println!(
        "{} starting: local kube-apiserver + etcd, CAPI core, the provider ({})",
        at(),
        match &config.backend {
            crate::harness::stack::Backend::Libvirt { uri } => format!("libvirt at {uri}"),
            crate::harness::stack::Backend::Container => "a containerized libvirtd over TLS".into(),
            crate::harness::stack::Backend::Sim => "embedded simulated libvirt host".into(),
        }
    );
    let mut stack = Stack::start(config).await?;
    let ns = stack.namespace("demo").await?;
    let client = stack.client();
    println!("{} {}; KUBECONFIG={}", at(), stack.management.describe(), stack.management.kubeconfig_path().display());
    println!("{} provider log: {}", at(), stack.provider.log_hint());
    let p = &stack.placement;
    println!(
        "{} creating Cluster {ns}/{CLUSTER}: host {}, network {}, pools {} / {}, image {}",
        at(),
        p.uri,
        p.network,
        p.base_pool,
        p.domain_pool,
        p.image
    );
    objects::create(&client, &ns, Kind::LibvirtCluster, objects::libvirt_cluster(&ns, CLUSTER, p)).await?;
    objects::create(&client, &ns, Kind::Cluster, objects::cluster(&ns, CLUSTER, false)).await?;
    let secret = format!("{CLUSTER}-bootstrap");
    objects::create(
        &client,
        &ns,
        Kind::Secret,
        objects::bootstrap_secret(&ns, &secret, CLUSTER, &objects::user_data(CLUSTER)),
    )
    .await?;
    for name in MACHINES {
        objects::create(
            &client,
            &ns,
            Kind::LibvirtMachine,
            objects::libvirt_machine(&ns, name, CLUSTER, &p.image, None),
        )
        .await?;
        objects::create(&client, &ns, Kind::Machine, objects::machine(&ns, name, CLUSTER, &secret)).await?;
        println!("{} created Machine + LibvirtMachine {name} (1 vCPU, 256 MiB)", at());
    }

    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut console_lines: BTreeMap<String, usize> = BTreeMap::new();
    let mut announced_ready = false;
    let mut failure = None;
    let waiting_since = Instant::now();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // SIGTERM (e.g. `timeout`, a CI runner) cleans up like Ctrl-C.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let mut ready = 0;
        let cluster = objects::get(&client, &ns, Kind::LibvirtCluster, CLUSTER).await?;
        if let Some(lc) = cluster {
            let line = format!(
                "LibvirtCluster {CLUSTER}: Ready={}",
                objects::condition(&lc, "Ready").map(|c| c.0).unwrap_or("-")
            );
            if shown.get("cluster") != Some(&line) {
                println!("{} {line}", at());
                shown.insert("cluster".into(), line);
            }
        }
        for name in MACHINES {
            let machine = objects::get(&client, &ns, Kind::Machine, name).await?;
            let lm = objects::get(&client, &ns, Kind::LibvirtMachine, name).await?;
            let phase =
                machine.as_ref().and_then(|m| objects::str_at(m, &["status", "phase"])).unwrap_or("-").to_string();
            let (state, ip, domain, is_ready, why) = match &lm {
                Some(lm) => (
                    objects::str_at(lm, &["status", "state"]).unwrap_or("-").to_string(),
                    objects::internal_ip(lm).unwrap_or_else(|| "-".into()),
                    objects::str_at(lm, &["status", "domainName"]).unwrap_or("-").to_string(),
                    objects::condition(lm, "Ready").map(|c| c.0) == Some("True"),
                    ready_message(lm),
                ),
                None => ("-".into(), "-".into(), "-".into(), false, String::new()),
            };
            if is_ready && ip != "-" {
                ready += 1;
            }
            let line =
                format!("machine {name:<7} phase={phase:<12} domain={domain} state={state} ip={ip} ready={is_ready}");
            if shown.get(name) != Some(&line) {
                println!("{} {line}", at());
                shown.insert(name.to_string(), line);
            }
            let why_key = format!("{name}/why");
            if !is_ready && !why.is_empty() && shown.get(&why_key) != Some(&why) {
                println!("{}   {name} not ready: {why}", at());
                shown.insert(why_key, why);
            }
            if domain != "-" {
                let log = stack.console_log(&domain);
                let guest: Vec<&str> = log.lines().filter(|l| l.starts_with("CAPL-GUEST")).collect();
                let seen = console_lines.entry(domain.clone()).or_default();
                for l in &guest[*seen..] {
                    println!("{}   {name} console: {}", at(), l.trim_start_matches("CAPL-GUEST "));
                }
                *seen = guest.len();
            }
        }
        if ready == MACHINES.len() && !announced_ready {
            announced_ready = true;
            println!("{} both machines run and have their addresses", at());
            if exit_after_ready {
                break;
            }
            println!(
                "{} leaving them running; try: kubectl --kubeconfig {} get clusters,machines,libvirtmachines -A",
                at(),
                stack.management.kubeconfig_path().display()
            );
            if let Some(host) = &stack.host {
                println!("{}   or: virsh -c '{}' list", at(), host.uri);
            }
            println!("{} press Ctrl-C to delete the cluster and stop everything", at());
        }
        if !announced_ready && waiting_since.elapsed() > QUICK_BOUND {
            let stuck: Vec<&str> = MACHINES
                .iter()
                .filter_map(|m| shown.get(*m))
                .map(String::as_str)
                .filter(|l| !l.ends_with("ready=true"))
                .collect();
            failure = Some(anyhow::anyhow!(
                "the machines did not all run with an address within {} min; not ready: {}",
                QUICK_BOUND.as_secs() / 60,
                stuck.join("; ")
            ));
            break;
        }
        if let Err(exited) = stack.provider.ensure_running() {
            failure = Some(exited);
            break;
        }
        tokio::select! {
            _ = &mut ctrl_c => { println!(); break; }
            _ = term.recv() => { println!(); break; }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    if let Some(err) = &failure {
        println!("{} the demo failed: {err:#}", at());
    }
    println!("{} deleting Cluster {CLUSTER}: CAPI deletes the Machines, the provider their domains", at());
    let leftovers = stack.shutdown().await?;
    if !leftovers.is_empty() {
        println!("{} removed what the provider left behind: {}", at(), leftovers.join(", "));
    }
    println!("{} done: everything stopped and removed", at());
    failure.map_or(Ok(()), Err)
}

/// The message of the Ready condition (why a machine is not ready yet).
fn ready_message(lm: &kube::api::DynamicObject) -> String {
    lm.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .replace('\n', " ")
}

/// How long the quick demo waits for both machines to run with their addresses.
const QUICK_BOUND: Duration = Duration::from_secs(10 * 60);

/// What ended the wait for the cluster.
enum Outcome<T> {
    Formed(Result<T>),
    Interrupted,
}

/// `cargo xtask demo`: a real Kubernetes cluster (one control-plane machine,
/// one worker) from the default template, formed by the steps the `workload`
/// scenario uses ([`crate::workload::formation`]), each with its bound.
/// Narrates machine phases, kubeadm progress and node readiness as they change
/// ([`narrate`]), then says how to use the workload cluster. A step that does not
/// finish within its bound fails the demo with the step named and what the
/// cluster showed; either way, and on Ctrl-C or SIGTERM, it deletes the cluster
/// and stops everything. `timeout_factor` multiplies every step's bound.
pub async fn run_workload(config: &StackConfig, exit_after_ready: bool, timeout_factor: f64) -> Result<()> {
    use crate::harness::objects::{self, Kind};
    use crate::workload::client::{node_names, workload_kubeconfig};
    use crate::workload::diagnose::{keep_capi_logs, report_guests, report_workload};
    use crate::workload::formation::{Bounds, Formation, KcpWatch};
    use crate::workload::render::Flavor;

    let started = Instant::now();
    let at = move || format!("[{:>6.1}s]", started.elapsed().as_secs_f64());
    println!(
        "{} starting: local kube-apiserver + etcd, CAPI core, kubeadm bootstrap and control plane, the provider",
        at()
    );
    let mut stack = Stack::start(config).await?;
    let ns = stack.namespace("demo").await?;
    println!("{} {}; KUBECONFIG={}", at(), stack.management.describe(), stack.management.kubeconfig_path().display());
    println!("{} provider log: {}", at(), stack.provider.log_hint());
    anyhow::ensure!(
        timeout_factor.is_finite() && timeout_factor > 0.0,
        "--timeout-factor {timeout_factor}: give a positive number, e.g. 2 on a slow machine"
    );
    let bounds = Bounds::DOCUMENTED.scaled(timeout_factor);
    println!(
        "{} under software emulation kubeadm init takes 3 to 8 minutes, a worker's join 3 to 20 more; \
         each step below has a bound",
        at()
    );
    let kubeconfig_path = stack.work_dir.join(format!("{}.kubeconfig", crate::workload::cluster::CLUSTER));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // SIGTERM (e.g. `timeout`, a CI runner) cleans up like Ctrl-C.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = {
        let (stack, ns, kubeconfig_path) = (&stack, ns.as_str(), &kubeconfig_path);
        let form = async move {
            let formation = Formation::apply(
                stack,
                ns,
                Flavor::AllocatedEndpoint,
                bounds,
                Box::new(move |m| println!("{} {m}", at())),
            )?;
            let cp = formation.control_plane().await?;
            let lc =
                objects::get(formation.client(), ns, Kind::LibvirtCluster, crate::workload::cluster::CLUSTER).await?;
            let endpoint = lc.as_ref().and_then(|lc| objects::str_at(lc, &["spec", "controlPlaneEndpoint", "host"]));
            println!(
                "{} the workload cluster answers at https://{}:6443 (the address the provider allocated)",
                at(),
                endpoint.unwrap_or("?")
            );
            // KCP must stay Available while the worker joins and serves.
            let watch = KcpWatch::start(&formation, &cp.kcp);
            let grown = formation.add_worker(&cp).await?;
            let served = formation.serve_across_nodes(&cp, &grown).await?;
            watch.finish("the worker joined and served a Service")?;
            println!("{} {served}", at());
            println!("{} {}", at(), formation.image().check_downloaded()?);
            let (_, text) = workload_kubeconfig(formation.client(), ns, Duration::from_secs(60)).await?;
            std::fs::write(kubeconfig_path, text).with_context(|| format!("writing {}", kubeconfig_path.display()))?;
            anyhow::Ok((grown, formation.table()))
        };
        tokio::select! {
            formed = form => Outcome::Formed(formed),
            never = narrate(stack, ns, at) => match never {},
            _ = &mut ctrl_c => Outcome::Interrupted,
            _ = term.recv() => Outcome::Interrupted,
        }
    };
    let result = match outcome {
        Outcome::Formed(Ok((grown, timings))) => {
            println!(
                "{} the workload cluster is ready: both Nodes are Ready ({})",
                at(),
                node_names(&grown.nodes).join(", ")
            );
            println!("{} its kubeconfig: {}", at(), kubeconfig_path.display());
            println!("{} the steps, in seconds since kubectl apply:\n{}", at(), timings);
            if !exit_after_ready {
                println!("{} try: kubectl --kubeconfig {} get nodes -o wide", at(), kubeconfig_path.display());
                println!(
                    "{}  or: kubectl --kubeconfig {} get clusters,machines,libvirtmachines -A",
                    at(),
                    stack.management.kubeconfig_path().display()
                );
                println!("{} press Ctrl-C to delete the cluster and stop everything", at());
                tokio::select! {
                    _ = &mut ctrl_c => {}
                    _ = term.recv() => {}
                }
                println!();
            }
            Ok(())
        }
        Outcome::Formed(Err(err)) => {
            println!("{} the demo failed: {err:#}", at());
            if let Err(exited) = stack.provider.ensure_running() {
                println!("{} {exited:#}", at());
            }
            report_workload(&stack.client(), &ns).await;
            report_guests(&stack, &ns);
            keep_capi_logs(&stack, &ns);
            Err(err)
        }
        Outcome::Interrupted => {
            println!();
            Ok(())
        }
    };
    println!(
        "{} deleting Cluster {}: KCP and CAPI delete the Machines, the provider their VMs",
        at(),
        crate::workload::cluster::CLUSTER
    );
    let leftovers = stack.shutdown().await?;
    if !leftovers.is_empty() {
        println!("{} removed what the provider left behind: {}", at(), leftovers.join(", "));
    }
    println!("{} done: everything stopped and removed", at());
    result
}

/// Prints what changes in the namespace's workload cluster, every 3 seconds
/// until dropped: each Machine's phase, address and Node; the
/// KubeadmControlPlane's state; each guest's kubeadm phases from its serial
/// console; each Node's readiness. A look-up that fails or takes longer than
/// 10 seconds is tried again at the next turn.
async fn narrate(stack: &Stack, ns: &str, at: impl Fn() -> String) -> std::convert::Infallible {
    use std::collections::BTreeSet;

    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, ListParams};

    use crate::workload::client::{node_ready, workload_client};
    use crate::workload::cluster::{domains, kubeadm_control_plane};
    use crate::workload::diagnose::{kubeadm_progress, redact};

    const LOOKUP: Duration = Duration::from_secs(10);
    let client = stack.client();
    let kcps: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &kubeadm_control_plane());
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut kubeadm_seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut workload: Option<kube::Client> = None;
    loop {
        let mut show = |key: String, line: String| {
            if shown.get(&key) != Some(&line) {
                println!("{} {line}", at());
                shown.insert(key, line);
            }
        };
        if let Ok(Ok(machines)) = tokio::time::timeout(LOOKUP, objects::list(&client, ns, Kind::Machine)).await {
            for machine in machines {
                let name = objects::name(&machine);
                let phase = objects::str_at(&machine, &["status", "phase"]).unwrap_or("-").to_string();
                let node = objects::str_at(&machine, &["status", "nodeRef", "name"]).unwrap_or("-").to_string();
                let ip = objects::internal_ip(&machine).unwrap_or_else(|| "-".into());
                show(format!("machine/{name}"), format!("machine {name}: phase={phase} ip={ip} node={node}"));
            }
        }
        let mut initialized = false;
        if let Ok(Ok(list)) = tokio::time::timeout(LOOKUP, kcps.list(&ListParams::default())).await {
            for kcp in list.items {
                initialized |= kcp.data["status"]["initialization"]["controlPlaneInitialized"] == true;
                let available = objects::condition(&kcp, "Available").map(|c| c.0).unwrap_or("-").to_string();
                show(
                    format!("kcp/{}", objects::name(&kcp)),
                    format!(
                        "KubeadmControlPlane {}: initialized={initialized} Available={available}",
                        objects::name(&kcp)
                    ),
                );
            }
        }
        if let Ok(domains) = domains(stack, ns) {
            for domain in domains {
                let console = stack.console_log(&domain);
                let seen = kubeadm_seen.entry(domain.clone()).or_default();
                for (key, said) in console.lines().filter_map(kubeadm_progress) {
                    if seen.insert(key.to_string()) {
                        let guest = domain.strip_prefix(&format!("{ns}-")).unwrap_or(&domain);
                        println!("{}   {guest}: kubeadm {}", at(), redact(said));
                    }
                }
            }
        }
        if initialized && workload.is_none() {
            workload = tokio::time::timeout(LOOKUP, workload_client(&client, ns, Duration::ZERO))
                .await
                .ok()
                .and_then(Result::ok);
        }
        if let Some(workload) = &workload
            && let Ok(Ok(nodes)) =
                tokio::time::timeout(LOOKUP, Api::<Node>::all(workload.clone()).list(&ListParams::default())).await
        {
            for node in &nodes.items {
                let name = node.metadata.name.clone().unwrap_or_default();
                show(format!("node/{name}"), format!("node {name}: Ready={}", node_ready(node)));
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}
