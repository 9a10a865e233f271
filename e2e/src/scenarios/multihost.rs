//! The e2e scenario `multihost`: one Cluster over two libvirt hosts on one
//! L2, addresses and the control-plane endpoint from CAPI's in-cluster IPAM provider.
//!
//! Two private libvirtd beside the test host (`testenv::lab`), each with the network
//! `lab-lan` in forward mode bridge onto one Linux bridge whose only address, the lab
//! gateway, is inside a network namespace of its own. The book's complete example
//! (`docs/src/several-hosts.md`) is applied as written, with its variables filled in; a
//! MachineDeployment of four with a plain bootstrap Secret follows. Checked from
//! outside: the endpoint is allocated; the machines land on both hosts (placement by
//! available memory), each with a distinct address of the pool; every guest's serial
//! console shows that address and pings of every other guest (so guests on different
//! hosts reach each other) and of the gateway; the lab namespace reaches them all.
//! Deleting the Cluster leaves nothing on either host and no IPAddress.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use testenv::lab::{ExtraLibvirtd, LabBridge};

use crate::harness::host_view::HostView;
use crate::harness::machines::MACHINE_READY;
use crate::harness::objects::{self, Kind};
use crate::harness::progress::say;
use crate::harness::stack::{Stack, upload_base_image_to};
use crate::harness::wait::{Check, until};

const ID: &str = "multihost";
/// The lab subnet; the machines' pool is `.10-.13`, the endpoint `.250`.
const GATEWAY: &str = "10.79.0.1";
const MACHINES: [&str; 4] = ["10.79.0.10", "10.79.0.11", "10.79.0.12", "10.79.0.13"];
const VIP: &str = "10.79.0.250";
const NETWORK: &str = "lab-lan";
const BASE_POOL: &str = "capl-lab-base";
const DOMAIN_POOL: &str = "capl-lab-disks";
const HOSTS: [&str; 2] = ["rack1", "rack2"];
/// How long the guests may take to print their address and reach every peer.
const GUESTS_REACH: Duration = Duration::from_secs(420);

/// The book page that holds the complete example.
pub const EXAMPLE_PAGE: &str = "docs/src/several-hosts.md";

/// The page's YAML block that follows `<!-- e2e: multihost -->`.
pub fn documented_example(page: &str) -> Result<String> {
    let (_, after) = page
        .split_once("<!-- e2e: multihost -->")
        .with_context(|| format!("{EXAMPLE_PAGE} has no `<!-- e2e: multihost -->`"))?;
    let (_, block) = after.split_once("```yaml\n").context("no ```yaml block after `<!-- e2e: multihost -->`")?;
    let (yaml, _) = block.split_once("\n```").context("the multihost YAML block is not closed")?;
    Ok(format!("{yaml}\n"))
}

/// `${NAME}` and `${NAME:=default}` replaced from `vars` (a default when `NAME` is not
/// there); a variable with neither is an error naming it.
pub fn substitute(text: &str, vars: &BTreeMap<&str, String>) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').with_context(|| format!("unclosed ${{ in {:?}", &rest[start..]))? + start;
        let inner = &rest[start + 2..end];
        let (name, default) = match inner.split_once(":=") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        match (vars.get(name), default) {
            (Some(value), _) => out.push_str(value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => bail!("variable {name} has no value and no default"),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn ipam_resource(kind: &str, plural: &str, version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("ipam.cluster.x-k8s.io", version, kind), plural)
}

/// The names in an object's `status.failureDomains` (v1beta2 list form).
fn failure_domain_names(object: &DynamicObject) -> BTreeSet<String> {
    object.data["status"]["failureDomains"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

/// What one running machine of the scenario is.
struct Placed {
    name: String,
    host: String,
    domain: String,
    ip: String,
}

pub async fn multihost(stack: &mut Stack) -> Result<String> {
    let guest_image =
        stack.guest_image.clone().context("the multihost scenario needs the guest image (libvirt backend)")?;
    let ns = stack.namespace(ID).await?;
    let console_dir = stack.console_dir.clone().context("the multihost scenario needs a console log directory")?;
    let lab = LabBridge::create(&format!("mh{}", std::process::id() % 10_000), GATEWAY, 24)?;
    let mut daemons = Vec::new();
    let mut views = Vec::new();
    let mut image = String::new();
    for name in HOSTS {
        let daemon = ExtraLibvirtd::start(name)?;
        daemon.add_dir_pool(BASE_POOL)?;
        daemon.add_dir_pool(DOMAIN_POOL)?;
        daemon.add_bridged_network(NETWORK, lab.bridge())?;
        let view = HostView::new(daemon.uri());
        image = upload_base_image_to(&view, BASE_POOL, &guest_image, "guest", "cargo xtask guest-image")?;
        daemons.push(daemon);
        views.push(view);
    }
    say(ID, format!("two libvirtd ({}, {}) on bridge {} with network {NETWORK}", HOSTS[0], HOSTS[1], lab.bridge()));

    let page = std::fs::read_to_string(crate::repo_root().join(EXAMPLE_PAGE))
        .with_context(|| format!("reading {EXAMPLE_PAGE}"))?;
    let vars: BTreeMap<&str, String> = [
        ("CAPL_LAB_MACHINE_ADDRESSES", format!("{}-{}", MACHINES[0], MACHINES[3])),
        ("CAPL_LAB_GATEWAY", GATEWAY.to_string()),
        ("CAPL_LAB_VIP", VIP.to_string()),
        ("CAPL_BASE_POOL", BASE_POOL.to_string()),
        ("CAPL_DOMAIN_POOL", DOMAIN_POOL.to_string()),
        ("CAPL_RACK1_URI", daemons[0].uri().to_string()),
        ("CAPL_RACK2_URI", daemons[1].uri().to_string()),
        // The tiny test guest: four of them share two cores under TCG.
        ("CAPL_WORKER_VCPU", "1".to_string()),
        ("CAPL_WORKER_MEMORY_MIB", "256".to_string()),
        ("CAPL_WORKER_DISK_GIB", "1".to_string()),
        ("CAPL_IMAGE", image.clone()),
    ]
    .into_iter()
    .collect();
    let manifest = stack.work_dir.join("multihost.yaml");
    std::fs::write(&manifest, substitute(&documented_example(&page)?, &vars)?)?;
    crate::workload::render::kubectl_apply(stack, Some(&ns), &manifest)?;
    let client = stack.client();
    // Every guest pings all the pool's addresses (but its own) and the gateway.
    let user_data = format!("#cloud-config\n#capl-ping {} {GATEWAY}\n", MACHINES.join(" "));
    objects::create(&client, &ns, Kind::Secret, objects::bootstrap_secret(&ns, "lab-bootstrap", "lab", &user_data))
        .await?;
    objects::create(
        &client,
        &ns,
        Kind::MachineDeployment,
        objects::machine_deployment(&ns, "lab-md", "lab", MACHINES.len() as i64, "lab-workers", "lab-bootstrap"),
    )
    .await?;
    say(ID, "the book's example applied; MachineDeployment of 4 created");

    let result = check(&client, &ns, &views, &console_dir, &lab).await;
    let cleanup = clean_up(&client, &ns, &views).await;
    let summary = result?;
    cleanup?;
    Ok(summary)
}

async fn check(client: &Client, ns: &str, views: &[HostView], console_dir: &Path, lab: &LabBridge) -> Result<String> {
    let endpoint = until("the LibvirtCluster's allocated endpoint", Duration::from_secs(120), || async {
        let lc = objects::get(client, ns, Kind::LibvirtCluster, "lab").await?.context("LibvirtCluster lab is gone")?;
        Ok(match objects::str_at(&lc, &["spec", "controlPlaneEndpoint", "host"]) {
            Some(host) => Check::Done(host.to_string()),
            None => Check::Pending(format!("{:?}", objects::condition(&lc, "ControlPlaneEndpointReady"))),
        })
    })
    .await?;
    ensure!(endpoint == VIP, "the endpoint is {endpoint}, not {VIP} from pool lab-vips");
    let lc = objects::get(client, ns, Kind::LibvirtCluster, "lab").await?.context("LibvirtCluster lab")?;
    let domains = failure_domain_names(&lc);
    ensure!(domains == HOSTS.iter().map(|h| h.to_string()).collect(), "status.failureDomains: {domains:?}");
    // CAPI core copies them into the Cluster, where KubeadmControlPlane and MachineDeployments read them.
    let copied = until("CAPI to copy the failure domains into the Cluster", Duration::from_secs(120), || async {
        let cluster = objects::get(client, ns, Kind::Cluster, "lab").await?.context("Cluster lab is gone")?;
        let names = failure_domain_names(&cluster);
        Ok(if names == domains { Check::Done(names) } else { Check::Pending(format!("{names:?}")) })
    })
    .await?;
    say(ID, format!("endpoint {endpoint}; failure domains {domains:?}, in the Cluster too: {copied:?}"));

    let placed: Vec<Placed> = until("four LibvirtMachines ready with addresses", MACHINE_READY, || async {
        let lms = objects::list(client, ns, Kind::LibvirtMachine).await?;
        let ready: Vec<Placed> = lms
            .iter()
            .filter(|lm| objects::condition(lm, "Ready").map(|c| c.0) == Some("True"))
            .filter_map(|lm| {
                Some(Placed {
                    name: objects::name(lm),
                    host: objects::str_at(lm, &["status", "failureDomain"])?.to_string(),
                    domain: objects::str_at(lm, &["status", "domainName"])?.to_string(),
                    ip: objects::internal_ip(lm)?,
                })
            })
            .collect();
        Ok(if ready.len() == MACHINES.len() {
            Check::Done(ready)
        } else {
            let states: Vec<String> = lms
                .iter()
                .map(|lm| format!("{}: {:?}", objects::name(lm), objects::condition(lm, "DomainProvisioningReady")))
                .collect();
            Check::Pending(format!("{} of {} ready; {}", ready.len(), MACHINES.len(), states.join("; ")))
        })
    })
    .await?;
    let ips: BTreeSet<&str> = placed.iter().map(|p| p.ip.as_str()).collect();
    ensure!(ips == MACHINES.into_iter().collect(), "the machines' addresses {ips:?} are not the pool's {MACHINES:?}");
    let mut per_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &placed {
        let index = HOSTS.iter().position(|h| *h == p.host).with_context(|| format!("{} is on {}", p.name, p.host))?;
        let on_host = views[index].domains()?;
        ensure!(on_host.contains(&p.domain), "{} ({}) is not on {}: {on_host:?}", p.name, p.domain, p.host);
        per_host.entry(HOSTS[index]).or_default().push(&p.ip);
    }
    ensure!(per_host.len() == 2, "placement used one host only: {per_host:?}");
    // The contract: CAPI copies each LibvirtMachine's status.failureDomain into its Machine.
    until("each Machine's status.failureDomain to name its host", Duration::from_secs(120), || async {
        let mut wrong = Vec::new();
        for p in &placed {
            let lm = objects::get(client, ns, Kind::LibvirtMachine, &p.name).await?.context("LibvirtMachine gone")?;
            let owner =
                lm.metadata.owner_references.iter().flatten().find(|o| o.kind == "Machine").map(|o| o.name.clone());
            let machine = match owner {
                Some(name) => objects::get(client, ns, Kind::Machine, &name).await?,
                None => None,
            };
            let copied = machine.as_ref().and_then(|m| objects::str_at(m, &["status", "failureDomain"]));
            if copied != Some(p.host.as_str()) {
                wrong.push(format!("{}: {copied:?}, not {}", p.name, p.host));
            }
        }
        Ok(if wrong.is_empty() { Check::Done(()) } else { Check::Pending(wrong.join("; ")) })
    })
    .await?;
    say(ID, format!("placed {per_host:?}"));

    until("every guest to show its address and reach every other and the gateway", GUESTS_REACH, || async {
        let mut missing = Vec::new();
        for p in &placed {
            let log =
                std::fs::read_to_string(console_dir.join(format!("{}-console.log", p.domain))).unwrap_or_default();
            if log.contains("CAPL-GUEST ping") && log.contains(" failed") {
                bail!("guest {} could not reach a peer; its console:\n{log}", p.name);
            }
            let mut want = vec![format!("CAPL-GUEST static ip={} ", p.ip), format!("CAPL-GUEST ping {GATEWAY} ok")];
            want.extend(MACHINES.iter().filter(|m| **m != p.ip).map(|m| format!("CAPL-GUEST ping {m} ok")));
            missing.extend(want.into_iter().filter(|w| !log.contains(w)).map(|w| format!("{}: {w}", p.name)));
        }
        Ok(if missing.is_empty() { Check::Done(()) } else { Check::Pending(missing.join("; ")) })
    })
    .await?;
    for ip in MACHINES {
        ensure!(lab.ping(ip), "the lab namespace does not reach {ip}");
    }
    Ok(format!("endpoint {VIP}; {per_host:?}; every guest reached the other three and the gateway"))
}

/// Deletes the Cluster, then checks both hosts hold nothing of it and every address is free.
async fn clean_up(client: &Client, ns: &str, views: &[HostView]) -> Result<()> {
    crate::harness::stack::delete_all_clusters(client, ns).await?;
    for (view, host) in views.iter().zip(HOSTS) {
        let domains = view.domains()?;
        let volumes = view.volumes(DOMAIN_POOL)?;
        ensure!(domains.is_empty() && volumes.is_empty(), "left on {host}: domains {domains:?}, volumes {volumes:?}");
    }
    let addresses: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ipam_resource("IPAddress", "ipaddresses", "v1beta2"));
    until("every IPAddress of the namespace to be released", Duration::from_secs(120), || async {
        let left: Vec<String> = addresses.list(&Default::default()).await?.items.iter().map(objects::name).collect();
        Ok(if left.is_empty() { Check::Done(()) } else { Check::Pending(left.join(", ")) })
    })
    .await?;
    say(ID, "Cluster deleted: nothing left on either host, every address released");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_renders_with_every_variable() {
        let page = std::fs::read_to_string(crate::repo_root().join(EXAMPLE_PAGE)).unwrap();
        let yaml = documented_example(&page).unwrap();
        let vars: BTreeMap<&str, String> = [
            "CAPL_LAB_MACHINE_ADDRESSES",
            "CAPL_LAB_GATEWAY",
            "CAPL_LAB_VIP",
            "CAPL_RACK1_URI",
            "CAPL_RACK2_URI",
            "CAPL_IMAGE",
        ]
        .into_iter()
        .map(|n| (n, format!("<{n}>")))
        .collect();
        let text = substitute(&yaml, &vars).unwrap();
        assert!(!text.contains("${"), "{text}");
        assert!(text.contains("uri: <CAPL_RACK2_URI>") && text.contains("memoryMiB: 2048"), "{text}");
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(serde::Deserialize::deserialize)
            .collect::<Result<_, _>>()
            .unwrap();
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            ["InClusterIPPool", "InClusterIPPool", "Cluster", "LibvirtCluster", "LibvirtMachineTemplate"]
        );
        let missing = substitute("${NOPE}", &BTreeMap::new()).unwrap_err().to_string();
        assert!(missing.contains("NOPE"), "{missing}");
    }
}
