//! *overhead*: 20 machines on the private libvirtd, one after another. For
//! each, the time from its bootstrap Secret being created (the bootstrap
//! data available) to its LibvirtMachine having `spec.providerID` (the
//! domain started and the status written), the manager's own time of each
//! create step (`capl_create_step_duration_seconds`), and beside it the
//! floor: the same steps done with virsh in the same run (an overlay disk
//! on the same base image, the same seed ISO bytes, a DHCP host entry, the
//! same domain XML under another name, autostart, start). Guest boot is
//! excluded; each machine is deleted before the next one, so at most one
//! guest runs at a time. Also: libvirt connections the manager opened
//! (target: one for the whole run).
//!
//! A virsh command opens its own connection; the cost of that (`virsh
//! version`, measured in the same run) is printed too, and subtracted in the
//! "floor without connect" column.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::report::{fmt, print_table, write_json};
use super::stack::{BenchStack, NAME_PREFIX};
use crate::harness::host_view::HostView;
use crate::harness::objects::{self, Kind, Placement};
use crate::harness::stack::{TEST_BASE_POOL, TEST_DISK_POOL, TEST_NETWORK};

const CLUSTER: &str = "bench";
/// The floor's DHCP hosts use addresses from here up, outside the test network's DHCP range.
const FLOOR_FIRST_HOST: u8 = 200;
/// The steps, as the manager's metric names them, in order.
const STEPS: [&str; 7] = ["disk", "iso_volume", "iso_upload", "reservation", "define", "autostart", "start"];

pub struct Args {
    pub uri: String,
    pub guest_image: PathBuf,
    pub provider_binary: PathBuf,
    pub machines: usize,
    pub out: PathBuf,
}

pub async fn run(args: &Args) -> Result<bool> {
    let host = HostView::new(&args.uri);
    host.virsh(&["version"]).context("the private libvirtd does not answer: run `cargo xtask host up`")?;
    let image = crate::harness::stack::upload_base_image(&host, &args.guest_image, "guest", "cargo xtask guest-image")?;
    let mut provider_args = vec!["--domain-type=qemu".to_string()];
    if capl_host::uri_policy::UriPolicy::refused_by_default(&args.uri) {
        provider_args.push("--allow-unsafe-uris".into());
    }
    let stack = BenchStack::start(&args.provider_binary, provider_args).await?;
    let result = measure(&stack, &host, &image, args).await;
    drop(stack);
    let swept = crate::harness::stack::sweep_prefix(&host, NAME_PREFIX);
    if !swept.is_empty() {
        eprintln!("removed from the host after the run: {}", swept.join(", "));
    }
    let ok = result?;
    if !swept.is_empty() {
        bail!("the run left {} objects on the host: {}", swept.len(), swept.join(", "));
    }
    Ok(ok)
}

/// Seconds `virsh <args>` took; fails when it failed.
fn timed_virsh(host: &HostView, args: &[&str]) -> Result<f64> {
    let started = Instant::now();
    host.virsh(args)?;
    Ok(started.elapsed().as_secs_f64())
}

/// The same steps as the manager's create, with virsh, for a copy of
/// `domain` named `floor`, its disk backed by the base volume at `base_path`
/// (virsh takes a path for a volume of another pool: a bare name only finds
/// one in the target pool); returns each step's seconds. Removes the copy.
fn floor(
    host: &HostView,
    domain: &str,
    floor: &str,
    base_path: &str,
    ip_host: u8,
    work: &Path,
) -> Result<BTreeMap<String, f64>> {
    let disk = format!("{floor}.qcow2");
    let iso = format!("cloudinit-{floor}.iso");
    let iso_file = work.join("seed.iso");
    host.virsh(&[
        "vol-download",
        "--pool",
        TEST_DISK_POOL,
        &format!("cloudinit-{domain}.iso"),
        &iso_file.display().to_string(),
    ])?;
    let iso_size = std::fs::metadata(&iso_file)?.len();
    let xml = host.virsh(&["dumpxml", domain])?;
    let provider_mac = xml
        .split("<mac address='")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .context("the manager's domain has no MAC")?
        .to_string();
    let floor_mac = format!("52:54:00:fe:00:{ip_host:02x}");
    let floor_xml: String = xml
        .replace(domain, floor)
        .replace(&provider_mac, &floor_mac)
        .lines()
        .filter(|l| !l.trim_start().starts_with("<uuid>"))
        .map(|l| format!("{l}\n"))
        .collect();
    let xml_file = work.join("floor.xml");
    std::fs::write(&xml_file, floor_xml)?;
    let ip = format!("{}.{ip_host}", testenv::test_host::SUBNET_PREFIX);
    let dhcp = format!("<host mac='{floor_mac}' name='{floor}' ip='{ip}'/>");
    let mut took = BTreeMap::new();
    took.insert(
        "disk".to_string(),
        timed_virsh(
            host,
            &[
                "vol-create-as",
                TEST_DISK_POOL,
                &disk,
                "2G",
                "--format",
                "qcow2",
                "--backing-vol",
                base_path,
                "--backing-vol-format",
                "qcow2",
            ],
        )?,
    );
    took.insert(
        "iso_volume".into(),
        timed_virsh(host, &["vol-create-as", TEST_DISK_POOL, &iso, &format!("{iso_size}b"), "--format", "raw"])?,
    );
    took.insert(
        "iso_upload".into(),
        timed_virsh(host, &["vol-upload", "--pool", TEST_DISK_POOL, &iso, &iso_file.display().to_string()])?,
    );
    took.insert(
        "reservation".into(),
        timed_virsh(host, &["net-update", TEST_NETWORK, "add-last", "ip-dhcp-host", &dhcp, "--live", "--config"])?,
    );
    took.insert("define".into(), timed_virsh(host, &["define", &xml_file.display().to_string()])?);
    took.insert("autostart".into(), timed_virsh(host, &["autostart", floor])?);
    took.insert("start".into(), timed_virsh(host, &["start", floor])?);
    // Not timed: removing the copy.
    let _ = host.virsh(&["destroy", floor]);
    host.virsh(&["undefine", floor])?;
    host.virsh(&["vol-delete", "--pool", TEST_DISK_POOL, &disk])?;
    host.virsh(&["vol-delete", "--pool", TEST_DISK_POOL, &iso])?;
    host.virsh(&["net-update", TEST_NETWORK, "delete", "ip-dhcp-host", &dhcp, "--live", "--config"])?;
    Ok(took)
}

async fn measure(stack: &BenchStack, host: &HostView, image: &str, args: &Args) -> Result<bool> {
    let client = stack.client();
    let ns = format!("{NAME_PREFIX}overhead");
    stack.plane.env.create_namespace(&ns).await?;
    let placement = Placement {
        uri: args.uri.clone(),
        network: TEST_NETWORK.into(),
        base_pool: TEST_BASE_POOL.into(),
        domain_pool: TEST_DISK_POOL.into(),
        image: image.to_string(),
        endpoint_host: testenv::test_host::static_address(250),
        credentials: None,
    };
    super::workload::create_all(&client, &ns, super::workload::cluster_objects(&ns, CLUSTER, &placement)?).await?;
    crate::harness::wait::until("the LibvirtCluster to be provisioned", Duration::from_secs(120), || async {
        let lc = objects::get(&client, &ns, Kind::LibvirtCluster, CLUSTER).await?;
        Ok(match lc {
            Some(lc) if lc.data["status"]["initialization"]["provisioned"] == true => {
                crate::harness::wait::Check::Done(())
            }
            _ => crate::harness::wait::Check::Pending("not provisioned".into()),
        })
    })
    .await?;
    // `virsh version`: what opening a connection costs each virsh command.
    let connect = (0..5).map(|_| timed_virsh(host, &["version"])).collect::<Result<Vec<f64>>>()?;
    let connect = connect.iter().sum::<f64>() / connect.len() as f64;

    // Looked up once, outside the timing: the floor's disks are backed by it.
    let (_, base_path) = host.volume_key_and_path(TEST_BASE_POOL, image)?;
    let mut end_to_end = Vec::new();
    let mut provider_steps: BTreeMap<String, f64> = BTreeMap::new();
    let mut floor_steps: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..args.machines {
        let name = format!("m-{i:04}");
        let secret = format!("{name}-bootstrap");
        objects::create(&client, &ns, Kind::LibvirtMachine, objects::libvirt_machine(&ns, &name, CLUSTER, image, None))
            .await?;
        objects::create(&client, &ns, Kind::Machine, objects::machine(&ns, &name, CLUSTER, &secret)).await?;
        // CAPI has linked them (owner reference) and the manager waits for the bootstrap data.
        crate::harness::wait::until("CAPI to own the LibvirtMachine", Duration::from_secs(60), || async {
            let lm = objects::get(&client, &ns, Kind::LibvirtMachine, &name).await?;
            Ok(match lm {
                Some(lm) if lm.metadata.owner_references.as_ref().is_some_and(|o| !o.is_empty()) => {
                    crate::harness::wait::Check::Done(())
                }
                _ => crate::harness::wait::Check::Pending("no owner".into()),
            })
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let m0 = stack.metrics().await?;
        let started = Instant::now();
        objects::create(
            &client,
            &ns,
            Kind::Secret,
            objects::bootstrap_secret(&ns, &secret, CLUSTER, &objects::user_data(CLUSTER)),
        )
        .await?;
        let mut provider_id_at = None;
        let (lm, provider_id_at) = loop {
            let lm =
                objects::get(&client, &ns, Kind::LibvirtMachine, &name).await?.context("the LibvirtMachine is gone")?;
            // spec.providerID and status.domainName are two writes; the
            // first marks the end of the create, the second follows at once.
            if lm.data["spec"]["providerID"].is_string() {
                let at = *provider_id_at.get_or_insert_with(|| started.elapsed());
                if lm.data["status"]["domainName"].is_string() {
                    break (lm, at);
                }
            }
            if started.elapsed() > Duration::from_secs(120) {
                bail!("{name} has no providerID and status.domainName after 120 s: {}", lm.data["status"]);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        end_to_end.push(provider_id_at.as_secs_f64());
        let m1 = stack.metrics().await?;
        for (step, took) in super::metrics::diff(&step_sums(&m1), &step_sums(&m0)) {
            *provider_steps.entry(step).or_default() += took;
        }
        let domain = objects::str_at(&lm, &["status", "domainName"]).context("no status.domainName")?.to_string();
        let work = stack.work_dir.clone();
        let floor_name = format!("{NAME_PREFIX}floor-{i:04}");
        let host2 = host.clone();
        let base = base_path.clone();
        let took = tokio::task::spawn_blocking(move || {
            floor(&host2, &domain, &floor_name, &base, FLOOR_FIRST_HOST + i as u8, &work)
        })
        .await??;
        for (step, t) in took {
            *floor_steps.entry(step).or_default() += t;
        }
        objects::delete(&client, &ns, Kind::Machine, &name).await?;
        crate::harness::wait::until("the machine to be deleted", Duration::from_secs(120), || async {
            Ok(match objects::get(&client, &ns, Kind::LibvirtMachine, &name).await? {
                None => crate::harness::wait::Check::Done(()),
                Some(_) => crate::harness::wait::Check::Pending("still there".into()),
            })
        })
        .await?;
        eprintln!("machine {}/{}: {:.2} s from bootstrap data to providerID", i + 1, args.machines, end_to_end[i]);
    }
    let n = args.machines as f64;
    let m = stack.metrics().await?;
    let connections = m.connections_opened();
    objects::delete(&client, &ns, Kind::Cluster, CLUSTER).await?;

    let mut rows = vec![
        ("machines (one after another)".to_string(), args.machines.to_string()),
        ("bootstrap data to providerID, mean (s)".into(), fmt(end_to_end.iter().sum::<f64>() / n, 3)),
        ("libvirt connections the manager opened".into(), fmt(connections, 0)),
        ("virsh connect (`virsh version`), mean (ms)".into(), fmt(connect * 1000.0, 1)),
    ];
    let mut total = (0.0, 0.0);
    let mut steps_json = serde_json::Map::new();
    rows.push(("step: manager / virsh / virsh without connect (ms)".into(), String::new()));
    for step in STEPS {
        let p = provider_steps.get(step).copied().unwrap_or(0.0) / n;
        let f = floor_steps.get(step).copied().unwrap_or(0.0) / n;
        total.0 += p;
        total.1 += f;
        rows.push((
            format!("  {step}"),
            format!("{:.1} / {:.1} / {:.1}", p * 1000.0, f * 1000.0, (f - connect).max(0.0) * 1000.0),
        ));
        steps_json.insert(
            step.into(),
            json!({"manager_s": p, "virsh_s": f, "virsh_without_connect_s": (f - connect).max(0.0)}),
        );
    }
    let floor_net = total.1 - connect * STEPS.len() as f64;
    rows.push((
        "  all steps".into(),
        format!("{:.1} / {:.1} / {:.1}", total.0 * 1000.0, total.1 * 1000.0, floor_net.max(0.0) * 1000.0),
    ));
    rows.push(("manager steps / virsh floor without connect".into(), fmt(total.0 / floor_net, 2)));
    let title = format!("overhead: {} machines on the private libvirtd", args.machines);
    print_table(&title, &rows);
    let value = json!({
        "table": super::report::table_json(&title, &rows),
        "benchmark": "overhead",
        "machines": args.machines,
        "end_to_end_s": end_to_end,
        "end_to_end_mean_s": end_to_end.iter().sum::<f64>() / n,
        "connections_opened": connections,
        "virsh_connect_s": connect,
        "steps": steps_json,
        "manager_steps_s": total.0,
        "virsh_steps_s": total.1,
        "virsh_steps_without_connect_s": floor_net,
    });
    let path = write_json(&args.out, "overhead", &value)?;
    println!("wrote {}", path.display());
    Ok(true)
}

/// `capl_create_step_duration_seconds_sum` by step.
fn step_sums(m: &super::metrics::Metrics) -> BTreeMap<String, f64> {
    m.by_label("capl_create_step_duration_seconds_sum", "step")
}
