//! The machine scenarios: one machine, a MachineDeployment scaled up and
//! down, a paused cluster, the provider restarted mid-create, a domain
//! stopped behind the provider's back, and a Cluster deleted with its machines.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::harness::machines::{
    HostObjects, MACHINE_READY, Running, check_on_host, clean_up, create_cluster, create_machine,
    create_machine_deployment, describe, host_objects, running_facts, wait_guest_console, wait_host_objects,
    wait_running,
};
use crate::harness::objects::{self, CLUSTER_NAME_LABEL, Kind};
use crate::harness::progress::say;
use crate::harness::stack::{Stack, TEST_NETWORK};
use crate::harness::wait::{Check, until};

pub(crate) async fn single_machine(stack: &mut Stack) -> Result<String> {
    let id = "single";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c1", "c1-m0");
    create_cluster(stack, &ns, cluster).await?;
    say(id, format!("LibvirtCluster {ns}/{cluster} provisioned; creating Machine {name}"));
    create_machine(stack, &ns, cluster, name).await?;
    let run = wait_running(stack, &ns, name).await?;
    say(id, format!("domain {} running, InternalIP {}", run.domain, run.ip));
    check_on_host(stack, &run).await?;
    wait_guest_console(stack, &run, &objects::user_data(cluster)).await?;
    say(id, "serial console: instance-id = UID, hostname, user-data hash and the reserved IP");

    let client = stack.client();
    let machine =
        until(&format!("Machine {ns}/{name} to carry providerID and InternalIP"), Duration::from_secs(120), || async {
            let m = objects::get(&client, &ns, Kind::Machine, name).await?.context("the Machine is gone")?;
            let provisioned = m.data["status"]["initialization"]["infrastructureProvisioned"] == true;
            let pid = m.data["spec"]["providerID"].as_str().unwrap_or_default().to_string();
            let ip = objects::internal_ip(&m);
            Ok(if provisioned && pid == format!("libvirt://{}", run.uid) && ip.as_deref() == Some(run.ip.as_str()) {
                Check::Done(m)
            } else {
                Check::Pending(format!("provisioned={provisioned} providerID={pid:?} InternalIP={ip:?}"))
            })
        })
        .await?;
    let lm = objects::get(&client, &ns, Kind::LibvirtMachine, name).await?.context("the LibvirtMachine is gone")?;
    for condition in ["InfrastructureReady", "MachineCreated", "DomainRunning", "Ready"] {
        let status = objects::condition(&lm, condition);
        ensure!(
            status.map(|c| c.0) == Some("True"),
            "LibvirtMachine condition {condition} is {status:?}, expected True"
        );
    }
    ensure!(
        lm.data["status"]["initialization"]["provisioned"] == true,
        "LibvirtMachine status.initialization.provisioned is not true"
    );
    ensure!(
        lm.metadata.labels.as_ref().and_then(|l| l.get(CLUSTER_NAME_LABEL)).map(String::as_str) == Some(cluster),
        "LibvirtMachine lacks the cluster-name label"
    );
    let phase = machine.data["status"]["phase"].as_str().unwrap_or_default().to_string();
    clean_up(stack, &ns).await?;
    Ok(format!("{} at {}, Machine phase {phase}", run.domain, run.ip))
}

pub(crate) async fn machine_deployment(stack: &mut Stack) -> Result<String> {
    let id = "md";
    let ns = stack.namespace(id).await?;
    let (cluster, md) = ("c2", "c2-md");
    create_cluster(stack, &ns, cluster).await?;
    create_machine_deployment(stack, &ns, cluster, md, 1).await?;
    let client = stack.client();
    say(id, "MachineDeployment with 1 replica created");
    let one = wait_all_running(stack, &ns, 1).await?;
    say(id, format!("1 machine: {} {}", one[0].name, one[0].ip));
    objects::merge_patch(&client, &ns, Kind::MachineDeployment, md, json!({"spec": {"replicas": 3}})).await?;
    say(id, "scaled to 3");
    let three = wait_all_running(stack, &ns, 3).await?;
    let ips: BTreeSet<&str> = three.iter().map(|r| r.ip.as_str()).collect();
    ensure!(ips.len() == 3, "three machines must have three distinct IPs, got {ips:?}");
    for run in &three {
        check_on_host(stack, run).await?;
    }
    let domains: Vec<&str> = three.iter().map(|r| r.domain.as_str()).collect();
    wait_host_objects(stack, &ns, &domains).await?;
    say(id, format!("3 machines running at {ips:?}"));
    objects::merge_patch(&client, &ns, Kind::MachineDeployment, md, json!({"spec": {"replicas": 1}})).await?;
    say(id, "scaled to 1");
    let left = until(
        "the MachineDeployment to shrink to one Machine and one LibvirtMachine",
        Duration::from_secs(300),
        || async {
            let machines = objects::list(&client, &ns, Kind::Machine).await?;
            let lms = objects::list(&client, &ns, Kind::LibvirtMachine).await?;
            Ok(if machines.len() == 1 && lms.len() == 1 {
                Check::Done(lms.into_iter().next())
            } else {
                Check::Pending(format!("{} Machines, {} LibvirtMachines", machines.len(), lms.len()))
            })
        },
    )
    .await?
    .context("no LibvirtMachine left")?;
    let remaining =
        running_facts(&left).with_context(|| format!("the remaining machine is not running: {}", describe(&left)))?;
    wait_host_objects(stack, &ns, &[remaining.domain.as_str()]).await?;
    check_on_host(stack, &remaining).await?;
    clean_up(stack, &ns).await?;
    Ok(format!("IPs {ips:?}; after scale-down only {} is left on the host", remaining.domain))
}

/// Waits until the namespace has exactly `count` LibvirtMachines, all running.
pub(crate) async fn wait_all_running(stack: &Stack, ns: &str, count: usize) -> Result<Vec<Running>> {
    let client = stack.client();
    until(&format!("{count} running LibvirtMachines in {ns}"), MACHINE_READY, || async {
        stack.management.ensure_capi_running()?;
        let lms = objects::list(&client, ns, Kind::LibvirtMachine).await?;
        let running: Vec<Running> = lms.iter().filter_map(running_facts).collect();
        Ok(if lms.len() == count && running.len() == count {
            Check::Done(running)
        } else {
            Check::Pending(lms.iter().map(describe).collect::<Vec<_>>().join("; "))
        })
    })
    .await
}

pub(crate) async fn pause(stack: &mut Stack) -> Result<String> {
    let id = "pause";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c3", "c3-m0");
    create_cluster(stack, &ns, cluster).await?;
    let client = stack.client();
    // Everything a create needs is in place before the pause: CAPI does not
    // mark a paused Cluster's infrastructure provisioned.
    until(
        &format!("Cluster {ns}/{cluster} to have its infrastructure provisioned"),
        Duration::from_secs(120),
        || async {
            let c = objects::get(&client, &ns, Kind::Cluster, cluster).await?.context("the Cluster is gone")?;
            Ok(match c.data["status"]["initialization"]["infrastructureProvisioned"] == true {
                true => Check::Done(()),
                false => Check::Pending(format!("status {}", c.data["status"])),
            })
        },
    )
    .await?;
    objects::merge_patch(&client, &ns, Kind::Cluster, cluster, json!({"spec": {"paused": true}})).await?;
    say(id, "Cluster paused; creating a Machine and a LibvirtMachine owned by it");
    // The owner reference is set here, as CAPI would: CAPI itself does not
    // touch a paused cluster's Machines, and the provider must hold back
    // because of the pause, not because it lacks an owner.
    let machine = objects::create(
        &client,
        &ns,
        Kind::Machine,
        objects::machine(&ns, name, cluster, &format!("{cluster}-bootstrap")),
    )
    .await?;
    let uid = objects::uid(&machine);
    objects::create(
        &client,
        &ns,
        Kind::LibvirtMachine,
        objects::libvirt_machine(&ns, name, cluster, &stack.placement.image, Some((name, &uid))),
    )
    .await?;
    let by_cluster = "has spec.paused set";
    let by_annotation = "annotation";
    wait_paused_by(&client, &ns, name, by_cluster).await?;
    // Two reconciles the test can see, each after everything a create needs
    // was there: the pause moves from the Cluster to the machine's annotation
    // and back, and the Paused message follows. A provider that ignored the
    // pause would create in the first; reconciles of one object never overlap,
    // so by the second message such a create would have finished.
    objects::merge_patch(
        &client,
        &ns,
        Kind::LibvirtMachine,
        name,
        json!({"metadata": {"annotations": {capl_api::capi::PAUSED_ANNOTATION: ""}}}),
    )
    .await?;
    objects::merge_patch(&client, &ns, Kind::Cluster, cluster, json!({"spec": {"paused": false}})).await?;
    wait_paused_by(&client, &ns, name, by_annotation).await?;
    objects::merge_patch(&client, &ns, Kind::Cluster, cluster, json!({"spec": {"paused": true}})).await?;
    wait_paused_by(&client, &ns, name, by_cluster).await?;
    let found = host_objects(stack, &ns)?;
    ensure!(found == HostObjects::default(), "a paused cluster's machine was created on the host: {found:?}");
    let lm = objects::get(&client, &ns, Kind::LibvirtMachine, name).await?.context("the LibvirtMachine is gone")?;
    ensure!(lm.data["spec"]["providerID"].is_null(), "a paused machine got a providerID: {}", describe(&lm));
    say(id, "nothing on the host after two paused reconciles with everything in place; unpausing");
    objects::merge_patch(
        &client,
        &ns,
        Kind::LibvirtMachine,
        name,
        json!({"metadata": {"annotations": {capl_api::capi::PAUSED_ANNOTATION: null}}}),
    )
    .await?;
    objects::merge_patch(&client, &ns, Kind::Cluster, cluster, json!({"spec": {"paused": false}})).await?;
    let run = wait_running(stack, &ns, name).await?;
    check_on_host(stack, &run).await?;
    clean_up(stack, &ns).await?;
    Ok(format!("created only after unpause: {} at {}", run.domain, run.ip))
}

/// Waits until LibvirtMachine `name` reports Paused=True with a message containing `why`.
async fn wait_paused_by(client: &kube::Client, ns: &str, name: &str, why: &str) -> Result<()> {
    until(&format!("LibvirtMachine {ns}/{name} to report Paused=True ({why})"), Duration::from_secs(120), || async {
        let lm = objects::get(client, ns, Kind::LibvirtMachine, name).await?.context("the LibvirtMachine is gone")?;
        let paused = objects::condition_entry(&lm, "Paused");
        let message = paused.and_then(|c| c["message"].as_str()).unwrap_or("");
        Ok(match paused.and_then(|c| c["status"].as_str()) {
            Some("True") if message.contains(why) => Check::Done(()),
            _ => Check::Pending(describe(&lm)),
        })
    })
    .await
}

pub(crate) async fn restart(stack: &mut Stack) -> Result<String> {
    let id = "restart";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c4", "c4-m0");
    create_cluster(stack, &ns, cluster).await?;
    create_machine(stack, &ns, cluster, name).await?;
    // Kill the provider at the first trace of the machine on the host.
    let deadline = Instant::now() + MACHINE_READY;
    let seen = loop {
        let found = host_objects(stack, &ns)?;
        if found != HostObjects::default() {
            break found;
        }
        ensure!(Instant::now() < deadline, "the machine never appeared on the host within {MACHINE_READY:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stack.provider.kill()?;
    let at_kill = host_objects(stack, &ns)?;
    let state =
        at_kill.domains.iter().next().map(|d| stack.libvirt().and_then(|h| h.domain_state(d)).unwrap_or_default());
    say(id, format!("provider killed; host had {seen:?}, right after the kill {at_kill:?}, domain state {state:?}"));
    stack.provider.restart().await?;
    say(id, "provider restarted");
    let run = wait_running(stack, &ns, name).await?;
    check_on_host(stack, &run).await?;
    wait_host_objects(stack, &ns, &[run.domain.as_str()]).await?;
    wait_guest_console(stack, &run, &objects::user_data(cluster)).await?;
    clean_up(stack, &ns).await?;
    let stage = if at_kill.domains.is_empty() {
        "before the domain was defined".to_string()
    } else {
        format!("with the domain {}", state.unwrap_or_default())
    };
    Ok(format!("killed {stage}; converged to one domain, two volumes, one DHCP host"))
}

pub(crate) async fn stopped_domain(stack: &mut Stack) -> Result<String> {
    let id = "stopped";
    let ns = stack.namespace(id).await?;
    let (cluster, name) = ("c5", "c5-m0");
    create_cluster(stack, &ns, cluster).await?;
    create_machine(stack, &ns, cluster, name).await?;
    let run = wait_running(stack, &ns, name).await?;
    let host = stack.libvirt()?.clone();
    host.destroy(&run.domain)?;
    say(id, format!("virsh destroy {}", run.domain));
    let started = Instant::now();
    until(&format!("domain {} to be started again by the provider", run.domain), Duration::from_secs(300), || async {
        let state = host.domain_state(&run.domain)?;
        Ok(if state == "running" { Check::Done(()) } else { Check::Pending(state) })
    })
    .await?;
    let again = wait_running(stack, &ns, name).await?;
    ensure!(
        again.uid == run.uid && again.domain == run.domain,
        "the machine was replaced instead of restarted: {again:?} vs {run:?}"
    );
    check_on_host(stack, &again).await?;
    wait_host_objects(stack, &ns, &[run.domain.as_str()]).await?;
    clean_up(stack, &ns).await?;
    Ok(format!("{} running again {:.0} s after the destroy", run.domain, started.elapsed().as_secs_f64()))
}

pub(crate) async fn cluster_deletion(stack: &mut Stack) -> Result<String> {
    let id = "delete";
    let ns = stack.namespace(id).await?;
    let cluster = "c6";
    create_cluster(stack, &ns, cluster).await?;
    for name in ["c6-m0", "c6-m1"] {
        create_machine(stack, &ns, cluster, name).await?;
    }
    let mut domains = Vec::new();
    for name in ["c6-m0", "c6-m1"] {
        domains.push(wait_running(stack, &ns, name).await?.domain);
    }
    let domain_refs: Vec<&str> = domains.iter().map(String::as_str).collect();
    wait_host_objects(stack, &ns, &domain_refs).await?;
    say(id, format!("two machines running ({domains:?}); deleting Cluster {cluster}"));
    let client = stack.client();
    objects::delete(&client, &ns, Kind::Cluster, cluster).await?;
    until(&format!("everything of Cluster {ns}/{cluster} to be deleted"), Duration::from_secs(300), || async {
        let mut left = Vec::new();
        for kind in [Kind::Cluster, Kind::LibvirtCluster, Kind::Machine, Kind::LibvirtMachine] {
            for o in objects::list(&client, &ns, kind).await? {
                left.push(format!("{kind:?} {}", objects::name(&o)));
            }
        }
        Ok(if left.is_empty() { Check::Done(()) } else { Check::Pending(left.join(", ")) })
    })
    .await?;
    let found = host_objects(stack, &ns)?;
    ensure!(found == HostObjects::default(), "after the Cluster was deleted the host still holds {found:?}");
    let host = stack.libvirt()?;
    ensure!(host.network_active(TEST_NETWORK), "network {TEST_NETWORK} is no longer active");
    for pool in [&stack.placement.base_pool, &stack.placement.domain_pool] {
        ensure!(host.pool_active(pool), "pool {pool} is no longer active");
    }
    if !host.volume_exists(&stack.placement.base_pool, &stack.placement.image) {
        bail!("the base image {} was removed from {}", stack.placement.image, stack.placement.base_pool);
    }
    Ok("domains, volumes, ISOs and DHCP hosts gone; network, pools and base image kept".into())
}
