//! LibvirtMachines as the checks see them, shared by the scenarios and the
//! workload cluster's formation: a cluster's and a machine's objects made,
//! the facts of a running machine, what its domain must be on the host
//! (`virsh`, the guest's serial console), the waits for both, and the
//! namespace cleaned up.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Result, ensure};
use kube::api::DynamicObject;
use sha2::{Digest, Sha256};

use crate::harness::objects::{self, Kind};
use crate::harness::stack::{Stack, TEST_DISK_POOL, TEST_NETWORK, delete_all_clusters};
use crate::harness::wait::{Check, until};

/// How long a machine may take from creation to a running guest with an
/// address (TCG on a loaded 2-core machine is slow; this is a ceiling, not
/// an expectation).
pub(crate) const MACHINE_READY: Duration = Duration::from_secs(480);
/// How long the guest may take to print its seed and lease after the domain runs.
const GUEST_BOOT: Duration = Duration::from_secs(300);

/// Creates Cluster, LibvirtCluster and the bootstrap Secret `<cluster>-bootstrap`,
/// and waits until the LibvirtCluster is provisioned.
pub(crate) async fn create_cluster(stack: &Stack, ns: &str, cluster: &str) -> Result<()> {
    let client = stack.client();
    objects::create(&client, ns, Kind::LibvirtCluster, objects::libvirt_cluster(ns, cluster, &stack.placement)).await?;
    objects::create(&client, ns, Kind::Cluster, objects::cluster(ns, cluster, false)).await?;
    let secret = format!("{cluster}-bootstrap");
    objects::create(
        &client,
        ns,
        Kind::Secret,
        objects::bootstrap_secret(ns, &secret, cluster, &objects::user_data(cluster)),
    )
    .await?;
    until(&format!("LibvirtCluster {ns}/{cluster} to be provisioned"), Duration::from_secs(180), || async {
        let lc = objects::get(&client, ns, Kind::LibvirtCluster, cluster).await?;
        Ok(match lc {
            Some(lc) if lc.data["status"]["initialization"]["provisioned"] == true => Check::Done(()),
            Some(lc) => Check::Pending(format!("conditions {}", lc.data["status"]["conditions"])),
            None => Check::Pending("no LibvirtCluster".into()),
        })
    })
    .await
}

/// Creates Machine `name` with LibvirtMachine `name` (CAPI sets the owner reference).
pub(crate) async fn create_machine(stack: &Stack, ns: &str, cluster: &str, name: &str) -> Result<()> {
    let client = stack.client();
    let secret = format!("{cluster}-bootstrap");
    objects::create(
        &client,
        ns,
        Kind::LibvirtMachine,
        objects::libvirt_machine(ns, name, cluster, &stack.placement.image, None),
    )
    .await?;
    objects::create(&client, ns, Kind::Machine, objects::machine(ns, name, cluster, &secret)).await?;
    Ok(())
}

/// Creates LibvirtMachineTemplate `<md>-tmpl` and MachineDeployment `md` of
/// `replicas` machines in cluster `cluster` (made by [`create_cluster`]).
pub(crate) async fn create_machine_deployment(
    stack: &Stack,
    ns: &str,
    cluster: &str,
    md: &str,
    replicas: i64,
) -> Result<()> {
    let client = stack.client();
    let template = format!("{md}-tmpl");
    objects::create(
        &client,
        ns,
        Kind::LibvirtMachineTemplate,
        objects::libvirt_machine_template(ns, &template, cluster, &stack.placement.image),
    )
    .await?;
    objects::create(
        &client,
        ns,
        Kind::MachineDeployment,
        objects::machine_deployment(ns, md, cluster, replicas, &template, &format!("{cluster}-bootstrap")),
    )
    .await?;
    Ok(())
}

/// What a running machine looks like from its LibvirtMachine.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) domain: String,
    pub(crate) ip: String,
    pub(crate) mac: String,
}

pub(crate) fn running_facts(lm: &DynamicObject) -> Option<Running> {
    let ready = objects::condition(lm, "Ready").map(|c| c.0) == Some("True");
    let provider_id = lm.data["spec"]["providerID"].as_str()?;
    let uid = objects::uid(lm);
    if !ready || provider_id != format!("libvirt://{uid}") {
        return None;
    }
    Some(Running {
        name: objects::name(lm),
        uid,
        domain: objects::str_at(lm, &["status", "domainName"])?.to_string(),
        ip: objects::internal_ip(lm)?,
        mac: objects::str_at(lm, &["status", "macAddress"]).unwrap_or_default().to_ascii_lowercase(),
    })
}

pub(crate) fn describe(lm: &DynamicObject) -> String {
    format!(
        "{}: state={} ip={} providerID={} conditions={}",
        objects::name(lm),
        lm.data["status"]["state"],
        objects::internal_ip(lm).unwrap_or_default(),
        lm.data["spec"]["providerID"],
        lm.data["status"]["conditions"]
            .as_array()
            .map(|cs| cs
                .iter()
                .map(|c| format!(
                    "{}={}({})",
                    c["type"].as_str().unwrap_or(""),
                    c["status"].as_str().unwrap_or(""),
                    c["reason"].as_str().unwrap_or("")
                ))
                .collect::<Vec<_>>()
                .join(","))
            .unwrap_or_default()
    )
}

/// Waits until LibvirtMachine `name` is Ready with a provider ID and an InternalIP.
pub(crate) async fn wait_running(stack: &Stack, ns: &str, name: &str) -> Result<Running> {
    let client = stack.client();
    until(&format!("LibvirtMachine {ns}/{name} to run with an address"), MACHINE_READY, || async {
        stack.management.ensure_capi_running()?;
        Ok(match objects::get(&client, ns, Kind::LibvirtMachine, name).await? {
            Some(lm) => match running_facts(&lm) {
                Some(r) => Check::Done(r),
                None => Check::Pending(describe(&lm)),
            },
            None => Check::Pending("no LibvirtMachine".into()),
        })
    })
    .await
}

/// The guest's console line with its seed, and its DHCP line.
pub(crate) async fn wait_guest_console(stack: &Stack, run: &Running, user_data: &str) -> Result<()> {
    let sha = hex(&Sha256::digest(user_data.as_bytes()));
    let seed_line = format!("CAPL-GUEST instance-id={} local-hostname={} user-data-sha256={sha}", run.uid, run.name);
    let dhcp_line = format!("CAPL-GUEST dhcp bound ip={}", run.ip);
    until(&format!("the serial console of {} to show the seed and the lease", run.domain), GUEST_BOOT, || async {
        let log = stack.console_log(&run.domain);
        let has_seed = log.lines().any(|l| l.trim_end() == seed_line);
        let has_dhcp = log.lines().any(|l| l.trim_end() == dhcp_line);
        Ok(if has_seed && has_dhcp {
            Check::Done(())
        } else {
            let ours: Vec<&str> = log.lines().filter(|l| l.contains("CAPL-GUEST")).collect();
            Check::Pending(format!("expected {seed_line:?} and {dhcp_line:?}; console has {ours:?}"))
        })
    })
    .await
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Host checks of a running machine: domain running with UUID = UID, one
/// DHCP host reserving the address, the lease holding it.
pub(crate) async fn check_on_host(stack: &Stack, run: &Running) -> Result<()> {
    let host = stack.libvirt()?;
    let state = host.domain_state(&run.domain)?;
    ensure!(state == "running", "domain {} is {state:?}, expected running", run.domain);
    let uuid = host.domain_uuid(&run.domain)?;
    ensure!(uuid == run.uid, "domain {} has UUID {uuid}, the LibvirtMachine UID is {}", run.domain, run.uid);
    let reserved: Vec<_> = host.dhcp_hosts(TEST_NETWORK)?.into_iter().filter(|h| h.name == run.domain).collect();
    ensure!(reserved.len() == 1, "expected one DHCP host named {} on {TEST_NETWORK}, found {reserved:?}", run.domain);
    ensure!(
        reserved[0].ip == run.ip,
        "reserved IP {} differs from the LibvirtMachine's InternalIP {}",
        reserved[0].ip,
        run.ip
    );
    ensure!(reserved[0].mac == run.mac, "reserved MAC {} differs from status.macAddress {}", reserved[0].mac, run.mac);
    let lease = until(&format!("a lease for {} on {TEST_NETWORK}", run.mac), Duration::from_secs(60), || async {
        let leases = host.leases(TEST_NETWORK)?;
        Ok(match leases.iter().find(|l| l.mac == run.mac) {
            Some(l) => Check::Done(l.clone()),
            None => Check::Pending(format!("{leases:?}")),
        })
    })
    .await?;
    ensure!(lease.ip == run.ip, "the lease of {} is {}, the reserved IP is {}", run.mac, lease.ip, run.ip);
    Ok(())
}

/// Domains, volumes and DHCP hosts on the host that belong to namespace `ns`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct HostObjects {
    pub(crate) domains: BTreeSet<String>,
    pub(crate) volumes: BTreeSet<String>,
    pub(crate) dhcp_hosts: BTreeSet<String>,
}

pub(crate) fn host_objects(stack: &Stack, ns: &str) -> Result<HostObjects> {
    let host = stack.libvirt()?;
    let prefix = format!("{ns}-");
    let iso_prefix = format!("cloudinit-{ns}-");
    Ok(HostObjects {
        domains: host.domains_with_prefix(&prefix)?.into_iter().collect(),
        volumes: host
            .volumes(TEST_DISK_POOL)?
            .into_iter()
            .filter(|v| v.starts_with(&prefix) || v.starts_with(&iso_prefix))
            .collect(),
        dhcp_hosts: host
            .dhcp_hosts(TEST_NETWORK)?
            .into_iter()
            .filter(|h| h.name.starts_with(&prefix))
            .map(|h| h.name)
            .collect(),
    })
}

/// What the host must hold for exactly these domains.
fn expected_objects(domains: &[&str]) -> HostObjects {
    HostObjects {
        domains: domains.iter().map(|d| d.to_string()).collect(),
        volumes: domains.iter().flat_map(|d| [format!("{d}.qcow2"), format!("cloudinit-{d}.iso")]).collect(),
        dhcp_hosts: domains.iter().map(|d| d.to_string()).collect(),
    }
}

pub(crate) async fn wait_host_objects(stack: &Stack, ns: &str, domains: &[&str]) -> Result<()> {
    let expected = expected_objects(domains);
    until(&format!("the host to hold exactly {expected:?}"), Duration::from_secs(120), || async {
        let found = host_objects(stack, ns)?;
        Ok(if found == expected { Check::Done(()) } else { Check::Pending(format!("{found:?}")) })
    })
    .await
}

/// Deletes the scenario's Clusters and waits for the provider to clean up.
pub(crate) async fn clean_up(stack: &Stack, ns: &str) -> Result<()> {
    delete_all_clusters(&stack.client(), ns).await?;
    if stack.host.is_some() {
        wait_host_objects(stack, ns, &[]).await?;
    }
    Ok(())
}
