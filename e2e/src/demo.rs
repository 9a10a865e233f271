//! `cargo xtask demo`: the stack with one cluster and two machines, narrated.

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
            crate::stack::Backend::Sim => "embedded simulated libvirt host".into(),
        }
    );
    let mut stack = Stack::start(config).await?;
    let ns = stack.namespace("demo").await?;
    let client = stack.client();
    println!("{} {}; KUBECONFIG={}", at(), stack.management.describe(), stack.management.kubeconfig_path().display());
    println!("{} provider log: {}", at(), stack.provider.log_path().display());
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
