//! `cargo xtask demo`: the stack with a real Kubernetes cluster ([`run_workload`]),
//! or with one cluster and two plain machines (`--quick`, [`run`]), narrated.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::objects::{self, Kind};
use crate::stack::{Stack, StackConfig};

const MACHINES: [&str; 2] = ["demo-0", "demo-1"];
const CLUSTER: &str = "demo";

/// Runs the demo. Without `exit_after_ready` it waits for Ctrl-C once both
/// machines run; either way it deletes the cluster and stops everything.
pub async fn run(config: &StackConfig, exit_after_ready: bool) -> Result<()> {
    let started = Instant::now();
    let at = move || format!("[{:>5.1}s]", started.elapsed().as_secs_f64());
    println!(
        "{} starting: local kube-apiserver + etcd, CAPI core, the provider ({})",
        at(),
        match &config.backend {
            crate::stack::Backend::Libvirt { uri } => format!("libvirt at {uri}"),
            crate::stack::Backend::Container => "a containerized libvirtd over TLS".into(),
            crate::stack::Backend::Sim => "embedded simulated libvirt host".into(),
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
        stack.provider.ensure_running()?;
        tokio::select! {
            _ = &mut ctrl_c => { println!(); break; }
            _ = term.recv() => { println!(); break; }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    println!("{} deleting Cluster {CLUSTER}: CAPI deletes the Machines, the provider their domains", at());
    let leftovers = stack.shutdown().await?;
    if !leftovers.is_empty() {
        println!("{} removed what the provider left behind: {}", at(), leftovers.join(", "));
    }
    println!("{} done: everything stopped and removed", at());
    Ok(())
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

/// `cargo xtask demo`: a real Kubernetes cluster (one control-plane machine,
/// one worker) from the default template, as the `workload` e2e scenario makes it.
/// Prints machine phases, kubeadm progress and node readiness as they change, then how
/// to use the workload cluster; Ctrl-C deletes it and stops everything.
pub async fn run_workload(config: &StackConfig, exit_after_ready: bool) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, ListParams};

    use crate::scenario_workload::{CLUSTER as WL, apply_cluster, kubeadm_control_plane, workload_kubeconfig};

    let started = Instant::now();
    let at = move || format!("[{:>6.1}s]", started.elapsed().as_secs_f64());
    println!(
        "{} starting: local kube-apiserver + etcd, CAPI core, kubeadm bootstrap and control plane, the provider",
        at()
    );
    let mut stack = Stack::start(config).await?;
    let ns = stack.namespace("demo").await?;
    let client = stack.client();
    println!("{} {}; KUBECONFIG={}", at(), stack.management.describe(), stack.management.kubeconfig_path().display());
    println!("{} provider log: {}", at(), stack.provider.log_hint());
    let result = async {
        apply_cluster(&stack, &ns, |m| println!("{} {m}", at()))?;
        println!("{} under software emulation kubeadm init takes 3 to 8 minutes, a worker's join about 3 more", at());
        let kcps: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kubeadm_control_plane());
        let kubeconfig_path = stack.work_dir.join(format!("{WL}.kubeconfig"));
        let mut workload: Option<kube::Client> = None;
        let mut shown: BTreeMap<String, String> = BTreeMap::new();
        let mut announced = false;
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut show = |key: &str, line: String| {
            if shown.get(key) != Some(&line) {
                println!("{} {line}", at());
                shown.insert(key.to_string(), line);
            }
        };
        loop {
            for machine in objects::list(&client, &ns, Kind::Machine).await? {
                let name = objects::name(&machine);
                let phase = objects::str_at(&machine, &["status", "phase"]).unwrap_or("-").to_string();
                let node = objects::str_at(&machine, &["status", "nodeRef", "name"]).unwrap_or("-").to_string();
                let ip = objects::internal_ip(&machine).unwrap_or_else(|| "-".into());
                show(&name, format!("machine {name}: phase={phase} ip={ip} node={node}"));
            }
            if let Some(kcp) = kcps.get_opt(&format!("{WL}-control-plane")).await? {
                let initialized = kcp.data["status"]["initialization"]["controlPlaneInitialized"] == true;
                let available = objects::condition(&kcp, "Available").map(|c| c.0).unwrap_or("-").to_string();
                show("kcp", format!("KubeadmControlPlane: initialized={initialized} Available={available}"));
                if initialized && workload.is_none() {
                    let (config, text) = workload_kubeconfig(&client, &ns).await?;
                    std::fs::write(&kubeconfig_path, text)?;
                    let mut config =
                        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
                            .await?;
                    config.connect_timeout = Some(Duration::from_secs(5));
                    config.read_timeout = Some(Duration::from_secs(10));
                    workload = Some(kube::Client::try_from(config)?);
                    println!(
                        "{} kubeadm init done; the workload cluster answers at https://{}:6443 (kubeconfig {})",
                        at(),
                        stack.placement.endpoint_host,
                        kubeconfig_path.display()
                    );
                }
            }
            let mut ready_nodes = 0;
            if let Some(workload) = &workload
                && let Ok(nodes) = Api::<Node>::all(workload.clone()).list(&ListParams::default()).await
            {
                for node in &nodes.items {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    let ready = crate::scenario_workload::node_ready(node);
                    ready_nodes += usize::from(ready);
                    show(&format!("node/{name}"), format!("node {name}: Ready={ready}"));
                }
            }
            if ready_nodes == 2 && !announced {
                announced = true;
                println!("{} the workload cluster is ready: both Nodes are Ready", at());
                if exit_after_ready {
                    break;
                }
                println!("{} try: kubectl --kubeconfig {} get nodes -o wide", at(), kubeconfig_path.display());
                println!(
                    "{}  or: kubectl --kubeconfig {} get clusters,machines,libvirtmachines -A",
                    at(),
                    stack.management.kubeconfig_path().display()
                );
                println!("{} press Ctrl-C to delete the cluster and stop everything", at());
            }
            if !announced {
                for domain in crate::scenario_workload::domains(&stack, &ns)? {
                    if let Some(failure) = crate::scenario_workload::kubeadm_failure(&stack.console_log(&domain)) {
                        anyhow::bail!("kubeadm failed in {domain}:\n{failure}");
                    }
                }
            }
            stack.provider.ensure_running()?;
            tokio::select! {
                _ = &mut ctrl_c => { println!(); break; }
                _ = term.recv() => { println!(); break; }
                _ = tokio::time::sleep(Duration::from_secs(3)) => {}
            }
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(err) = &result {
        println!("{} the demo failed: {err:#}", at());
        crate::scenario_workload::report_guests(&stack, &ns);
    }
    println!("{} deleting Cluster {WL}: KCP and CAPI delete the Machines, the provider their VMs", at());
    let leftovers = stack.shutdown().await?;
    if !leftovers.is_empty() {
        println!("{} removed what the provider left behind: {}", at(), leftovers.join(", "));
    }
    println!("{} done: everything stopped and removed", at());
    result
}
