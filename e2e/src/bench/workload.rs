//! The benchmarks' workload: a Cluster and its machines (bootstrap Secret,
//! LibvirtMachine, Machine each) created at once, watched until ready, and
//! deleted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::Client;
use serde_json::Value;

use crate::harness::objects::{self, Kind, Placement};

/// Creates in flight at once while a benchmark makes its objects.
const CREATE_CONCURRENCY: usize = 64;

/// Creates, at most [`CREATE_CONCURRENCY`] at a time, every object of
/// `objects` ((kind, document) in the namespace).
pub async fn create_all(client: &Client, ns: &str, objects: Vec<(Kind, Value)>) -> Result<()> {
    let results: Vec<Result<()>> = futures::stream::iter(objects)
        .map(|(kind, object)| {
            let client = client.clone();
            async move { objects::create(&client, ns, kind, object).await.map(|_| ()) }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deletes the Cluster `cluster` (CAPI deletes its Machines, their
/// infrastructure goes with them) and waits until no Cluster, Machine or
/// infrastructure object is left in `ns`.
pub async fn delete_cluster(client: &Client, ns: &str, cluster: &str) -> Result<()> {
    objects::delete(client, ns, Kind::Cluster, cluster).await?;
    crate::harness::wait::until("every object of the benchmark to be deleted", Duration::from_secs(1800), || async {
        let mut left = 0;
        for kind in [Kind::Cluster, Kind::LibvirtCluster, Kind::Machine, Kind::LibvirtMachine] {
            left += objects::list(client, ns, kind).await?.len();
        }
        Ok(if left == 0 {
            crate::harness::wait::Check::Done(())
        } else {
            crate::harness::wait::Check::Pending(format!("{left} left"))
        })
    })
    .await
}

/// The objects of `count` machines `m-0000`.. of `cluster`: for each a
/// bootstrap Secret, a LibvirtMachine and a Machine (CAPI sets the owner reference).
pub fn machine_objects(ns: &str, cluster: &str, image: &str, count: usize) -> Result<Vec<(Kind, Value)>> {
    let mut out = Vec::with_capacity(count * 3);
    for i in 0..count {
        let name = format!("m-{i:04}");
        let secret = format!("{name}-bootstrap");
        out.push((Kind::Secret, objects::bootstrap_secret(ns, &secret, cluster, &objects::user_data(cluster))));
        out.push((
            Kind::LibvirtMachine,
            objects::document(&objects::libvirt_machine(ns, &name, cluster, image, None))?,
        ));
        out.push((Kind::Machine, objects::machine(ns, &name, cluster, &secret)));
    }
    Ok(out)
}

/// The objects of [`create_workload`], just created.
pub struct Workload {
    /// When the first create went out.
    pub started: Instant,
    /// How long creating all of them took, seconds.
    pub created_s: f64,
    /// How many objects were created (the benchmark's own POSTs).
    pub objects: usize,
}

/// Creates, at once, the Cluster `cluster` on `placement` and `count`
/// machines of it (the workload of `scale` and `floor`).
pub async fn create_workload(
    client: &Client,
    ns: &str,
    cluster: &str,
    placement: &Placement,
    count: usize,
) -> Result<Workload> {
    let started = Instant::now();
    let mut all = cluster_objects(ns, cluster, placement)?;
    all.extend(machine_objects(ns, cluster, &placement.image, count)?);
    let objects = all.len();
    create_all(client, ns, all).await?;
    Ok(Workload { started, created_s: started.elapsed().as_secs_f64(), objects })
}

/// The Cluster and LibvirtCluster `cluster` on `placement`.
pub fn cluster_objects(ns: &str, cluster: &str, placement: &Placement) -> Result<Vec<(Kind, Value)>> {
    Ok(vec![
        (Kind::LibvirtCluster, objects::document(&objects::libvirt_cluster(ns, cluster, placement))?),
        (Kind::Cluster, objects::cluster(ns, cluster, false)),
    ])
}

/// How many InternalIPs of the namespace's provisioned LibvirtMachines repeat another's.
pub async fn duplicate_ips(client: &Client, ns: &str) -> Result<usize> {
    let items = objects::list(client, ns, Kind::LibvirtMachine).await?;
    let ips: Vec<String> = items.iter().filter_map(provisioned_ip).collect();
    let distinct: std::collections::HashSet<&String> = ips.iter().collect();
    Ok(ips.len() - distinct.len())
}

/// A LibvirtMachine that is provisioned and has its InternalIP.
pub fn provisioned_ip(lm: &kube::api::DynamicObject) -> Option<String> {
    let provisioned = lm.data["status"]["initialization"]["provisioned"] == true;
    if provisioned { objects::internal_ip(lm) } else { None }
}

/// Watches the namespace's LibvirtMachines until `count` of them satisfied
/// `ready` (or `timeout` since `since` passes); returns the time each first
/// did (seconds since `since`) and the lists the watch made (a watch, not
/// repeated lists, so that looking costs the API server little).
pub async fn wait_each(
    client: &Client,
    ns: &str,
    count: usize,
    since: Instant,
    timeout: Duration,
    ready: impl Fn(&kube::api::DynamicObject) -> bool,
) -> Result<(BTreeMap<String, f64>, usize)> {
    use kube::runtime::{WatchStreamExt, watcher};
    let api = Kind::LibvirtMachine.api(client, ns);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let deadline = tokio::time::Instant::from_std(since + timeout);
    let mut first_seen = BTreeMap::new();
    let mut lists = 0;
    while first_seen.len() < count {
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(event)) => event,
            Ok(None) => bail!("the watch of LibvirtMachines in {ns} ended"),
            Err(_) => bail!("after {timeout:?} only {} of {count} machines were ready", first_seen.len()),
        };
        match event {
            Ok(watcher::Event::Init) => lists += 1,
            Ok(watcher::Event::Apply(lm) | watcher::Event::InitApply(lm)) if ready(&lm) => {
                first_seen.entry(objects::name(&lm)).or_insert_with(|| since.elapsed().as_secs_f64());
            }
            Ok(_) => {}
            // The backoff retries; a watch that keeps failing ends at the deadline.
            Err(err) => eprintln!("watching LibvirtMachines: {err}"),
        }
    }
    Ok((first_seen, lists))
}
