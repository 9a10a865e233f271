//! *floor*: the scale benchmark's workload (one Cluster, `machines` Machines
//! with their LibvirtMachines and bootstrap Secrets, created at once) with no
//! manager running. The benchmark itself answers in the provider's place
//! with the least any infrastructure provider must write under the CAPI
//! contract: once CAPI set a LibvirtMachine's owner Machine, one PATCH of
//! `spec.providerID` and one status PATCH with `initialization.provisioned`,
//! an address and a Ready condition; the LibvirtCluster gets one status
//! PATCH. No finalizer, no host, no event.
//!
//! What this measures is what kube-apiserver, etcd and CAPI core cost on this
//! machine for the same machines: the time the scale benchmark could reach
//! with a provider that costs nothing. `scale` is read against it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use capl_api::{Initialization, LibvirtClusterStatus, LibvirtMachineStatus, MachineAddress, conditions};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Client;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::report::{fmt, print_table, ready_json, ready_rows, write_json};
use super::stack::{ControlPlane, NAME_PREFIX, cpu_breakdown};
use super::workload::{Workload, create_workload, delete_cluster, provisioned_ip, wait_each};
use crate::harness::objects::{self, Kind};

const CLUSTER: &str = "floor";

/// What `capl-e2e bench floor` takes.
#[derive(Debug, Clone)]
pub struct Args {
    pub machines: usize,
    /// Answers in flight at once (the manager's `--concurrency` in `scale`).
    pub concurrency: usize,
    /// Where the JSON goes.
    pub out: PathBuf,
}

pub async fn run(args: &Args) -> Result<bool> {
    let plane = ControlPlane::start().await?;
    let client = plane.client();
    let n = args.machines;
    let ns = format!("{NAME_PREFIX}floor");
    plane.env.create_namespace(&ns).await?;

    let answers = Answers::default();
    let responder = tokio::spawn(respond(client.clone(), ns.clone(), args.concurrency, answers.clone()));

    let api0 = plane.api_requests().await?;
    let cpu0 = plane.cpu_seconds(&[]);
    eprintln!("creating {n} machines (Secret, LibvirtMachine, Machine each) and one Cluster at once; no manager runs");
    let Workload { started, created_s, objects: own_creates } =
        create_workload(&client, &ns, CLUSTER, &super::scale::placement(), n).await?;
    eprintln!("created in {created_s:.1} s; answering each LibvirtMachine and waiting for every address");
    let waited =
        wait_each(&client, &ns, n, started, Duration::from_secs(1800), |lm| provisioned_ip(lm).is_some()).await;
    let (ready, lists) = match waited {
        Ok(done) => done,
        Err(err) if responder.is_finished() => bail!("{err:#}; the responder stopped: {:?}", responder.await),
        Err(err) => return Err(err),
    };
    let api = plane.api_requests().await?.since(&api0);
    let (cpu_text, cpu_used) = cpu_breakdown(&plane.cpu_seconds(&[]), &cpu0);
    let writes = answers.writes.load(Ordering::Relaxed);
    let failed = answers.failed.load(Ordering::Relaxed);
    // This benchmark's requests: the creates, the watch (a list and a watch each
    // time it starts) and the answers (the responder's own watches aside).
    let own_requests = (own_creates + 2 * lists + writes + failed) as f64;

    eprintln!("deleting the Cluster (CAPI deletes the Machines and, with them, the LibvirtMachines)");
    let deleting = Instant::now();
    delete_cluster(&client, &ns, CLUSTER).await?;
    let deleted_s = deleting.elapsed().as_secs_f64();
    responder.abort();

    let capi_requests = api.total() - own_requests;
    let mut rows = vec![
        ("machines".to_string(), n.to_string()),
        ("answers in flight at once".into(), args.concurrency.to_string()),
        ("objects created (s)".into(), fmt(created_s, 1)),
    ];
    rows.extend(ready_rows(&ready));
    rows.extend([
        ("answer writes (failed)".into(), format!("{writes} ({failed})")),
        ("API requests per machine (all clients)".into(), fmt(api.total() / n as f64, 1)),
        ("API requests per machine (without the benchmark's)".into(), fmt(capi_requests / n as f64, 1)),
        ("API requests, largest (all clients)".into(), api.top(6)),
        ("CPU while provisioning, every process (s)".into(), cpu_text),
        ("delete: all gone (s)".into(), fmt(deleted_s, 1)),
    ]);
    let title = format!("floor: {n} machines, the benchmark answering in the provider's place");
    print_table(&title, &rows);
    let report = json!({
        "table": super::report::table_json(&title, &rows),
        "benchmark": "floor",
        "machines": n,
        "concurrency": args.concurrency,
        "created_s": created_s,
        "ready_s": ready_json(&ready),
        "answer_writes": writes,
        "answer_writes_failed": failed,
        "api_requests": api.to_json(),
        "api_requests_total": api.total(),
        "api_requests_benchmark_own": own_requests,
        "cpu_s_provisioning_by_process": cpu_used,
        "delete_s": deleted_s,
    });
    let path = write_json(&args.out, "floor", &report)?;
    println!("wrote {}", path.display());
    Ok(true)
}

/// What the responder did, shared with the measuring side.
#[derive(Debug, Clone, Default)]
struct Answers {
    /// LibvirtMachines answered or being answered.
    taken: Arc<Mutex<HashSet<String>>>,
    /// Successful PATCHes.
    writes: Arc<AtomicUsize>,
    /// Failed PATCHes (the machine is answered again on its next event).
    failed: Arc<AtomicUsize>,
    /// Addresses handed out so far.
    next_address: Arc<AtomicUsize>,
}

/// Answers every LibvirtCluster and LibvirtMachine of `ns`, at most
/// `concurrency` at once, until aborted.
async fn respond(client: Client, ns: String, concurrency: usize, answers: Answers) -> Result<()> {
    let watch = |kind: Kind| watcher(kind.api(&client, &ns), watcher::Config::default()).default_backoff().boxed();
    let mut events =
        futures::stream::select(watch(Kind::LibvirtCluster), watch(Kind::LibvirtMachine)).applied_objects().boxed();
    let permits = Arc::new(Semaphore::new(concurrency));
    while let Some(object) = events.next().await {
        let object = match object {
            Ok(object) => object,
            Err(err) => {
                eprintln!("responder watch: {err}");
                continue;
            }
        };
        let Some(kind) = to_answer(&object) else { continue };
        let name = objects::name(&object);
        if !answers.taken.lock().expect("not poisoned").insert(format!("{kind:?}/{name}")) {
            continue;
        }
        let permit = permits.clone().acquire_owned().await?;
        let (client, ns, answers) = (client.clone(), ns.clone(), answers.clone());
        tokio::spawn(async move {
            let result = answer(&client, &ns, kind, &object, &answers).await;
            drop(permit);
            if let Err(err) = result {
                answers.failed.fetch_add(1, Ordering::Relaxed);
                answers.taken.lock().expect("not poisoned").remove(&format!("{kind:?}/{name}"));
                eprintln!("answering {kind:?} {name}: {err:#}");
            }
        });
    }
    bail!("the responder's watches ended")
}

/// The kind to answer `object` as, when it still needs an answer: a
/// LibvirtCluster not yet provisioned, a LibvirtMachine with its owner
/// Machine and no providerID; nothing that is being deleted.
fn to_answer(object: &DynamicObject) -> Option<Kind> {
    if object.metadata.deletion_timestamp.is_some() {
        return None;
    }
    match object.types.as_ref()?.kind.as_str() {
        "LibvirtCluster" if object.data["status"]["initialization"]["provisioned"] != true => {
            Some(Kind::LibvirtCluster)
        }
        "LibvirtMachine" => {
            let owned = object.metadata.owner_references.iter().flatten().any(|o| o.kind == "Machine");
            (owned && object.data["spec"]["providerID"].is_null()).then_some(Kind::LibvirtMachine)
        }
        _ => None,
    }
}

async fn answer(client: &Client, ns: &str, kind: Kind, object: &DynamicObject, answers: &Answers) -> Result<()> {
    let api = kind.api(client, ns);
    let name = objects::name(object);
    let params = PatchParams::default();
    // A Time is written in whole seconds.
    let now = k8s_openapi::jiff::Timestamp::now();
    let ready = Some(vec![Condition {
        type_: conditions::READY.into(),
        status: "True".into(),
        reason: conditions::READY.into(),
        message: String::new(),
        last_transition_time: Time(now),
        observed_generation: object.metadata.generation,
    }]);
    let provisioned = Some(Initialization { provisioned: Some(true) });
    let status: Value = match kind {
        Kind::LibvirtCluster => {
            json!({"status": LibvirtClusterStatus { initialization: provisioned, conditions: ready, ..Default::default() }})
        }
        _ => {
            let spec = json!({"spec": {"providerID": format!("libvirt:///floor/{}", objects::uid(object))}});
            api.patch(&name, &params, &Patch::Merge(&spec)).await?;
            answers.writes.fetch_add(1, Ordering::Relaxed);
            let i = answers.next_address.fetch_add(1, Ordering::Relaxed);
            let address = format!("10.30.{}.{}", i / 250, i % 250 + 1);
            json!({"status": LibvirtMachineStatus {
                initialization: provisioned,
                addresses: Some(vec![MachineAddress::internal_ip(address)]),
                conditions: ready,
                ..Default::default()
            }})
        }
    };
    api.patch_status(&name, &params, &Patch::Merge(&status)).await?;
    answers.writes.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, extra: Value) -> DynamicObject {
        let mut document = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "m-0001", "namespace": "ns", "uid": "u1"},
            "spec": {},
        });
        merge(&mut document, extra);
        serde_json::from_value(document).unwrap()
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(into), Value::Object(from)) => {
                for (key, value) in from {
                    merge(into.entry(key).or_insert(Value::Null), value);
                }
            }
            (into, from) => *into = from,
        }
    }

    fn owned() -> Value {
        json!({"metadata": {"ownerReferences": [
            {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m-0001", "uid": "u0"}
        ]}})
    }

    #[test]
    fn answers_a_machine_once_capi_owns_it_and_only_until_it_has_a_provider_id() {
        assert_eq!(to_answer(&object("LibvirtMachine", json!({}))), None, "no owner Machine yet");
        assert_eq!(to_answer(&object("LibvirtMachine", owned())), Some(Kind::LibvirtMachine));
        let mut answered = owned();
        answered["spec"] = json!({"providerID": "libvirt:///floor/u1"});
        assert_eq!(to_answer(&object("LibvirtMachine", answered)), None, "already answered");
        let mut deleting = owned();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-12-04T00:00:00Z");
        assert_eq!(to_answer(&object("LibvirtMachine", deleting)), None, "being deleted");
    }

    #[test]
    fn answers_a_cluster_until_it_is_provisioned() {
        assert_eq!(to_answer(&object("LibvirtCluster", json!({}))), Some(Kind::LibvirtCluster));
        let provisioned = json!({"status": {"initialization": {"provisioned": true}}});
        assert_eq!(to_answer(&object("LibvirtCluster", provisioned)), None);
        assert_eq!(to_answer(&object("Machine", owned())), None, "not a kind it answers");
    }
}
