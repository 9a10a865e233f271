//! Which URIs the manager opens, with real libvirt's client:
//! a LibvirtCluster whose URI would make the manager run a program is refused
//! with a condition and an event, and the program never runs; the same object
//! under a manager started with `--allow-unsafe-uris` does run it, which is
//! what the policy prevents.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use capl::api::LibvirtCluster;
use capl::api::capi::Cluster;
use capl::controller::UriPolicy;
use capl_host::hypervisor::connections::Connections;
use kube::ResourceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uri_that_runs_a_program_is_refused_and_the_program_never_runs() {
    let w = World::new("rc-uri").await;
    let dir = w.env.scratch_dir().join(format!("uri-policy-{}", w.ns));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("script-ran");
    let script = dir.join("transport.sh");
    std::fs::write(&script, format!("#!/bin/sh\ntouch {}\nexit 1\n", marker.display())).unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&script).status().unwrap();
    let uri = format!("qemu+ext:///system?command={}", script.display());

    let manager =
        Manager::start_with_policy(w.client.clone(), &w.ns, Arc::new(Connections::libvirt()), UriPolicy::default());
    let c: Cluster = w.apply(cluster_json("ext", "ext", true)).await;
    let _: LibvirtCluster = w.apply(libvirt_cluster_json("ext", &uri, Some(("ext", &c.uid().unwrap())))).await;
    let lc = w
        .wait_for::<LibvirtCluster>("ext", "InfrastructureReady False with UriNotAllowed", |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some("UriNotAllowed"))
        })
        .await;
    let message = condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message.clone();
    assert!(message.contains(&format!("refuses URI {uri}")), "{message}");
    assert!(message.contains("the ext transport runs a program"), "{message}");
    assert!(message.contains("--allow-unsafe-uris") && message.contains("new LibvirtCluster"), "{message}");
    w.wait_event("ext", "Warning", "UriNotAllowed", &message).await;
    assert!(!has(cluster_conditions(&lc), "Ready", "True", None));
    // A few more reconciles' worth of time: still never run.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!marker.exists(), "the manager ran {} although its policy refuses the URI", script.display());
    manager.kill().await;

    // The same object under a manager that allows unsafe URIs: libvirt runs the
    // program (which is not a libvirt daemon, so the check still fails).
    let _manager =
        Manager::start_with_policy(w.client.clone(), &w.ns, Arc::new(Connections::libvirt()), UriPolicy::allow_all());
    let started = std::time::Instant::now();
    while !marker.exists() {
        assert!(started.elapsed() < WAIT, "with --allow-unsafe-uris libvirt never ran {}", script.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    w.wait_for::<LibvirtCluster>("ext", "a reason other than UriNotAllowed", |lc| {
        condition(cluster_conditions(lc), "InfrastructureReady").is_some_and(|c| c.reason != "UriNotAllowed")
    })
    .await;
}
