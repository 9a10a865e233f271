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

/// libvirt reads parameter names without regard to case or percent-encoding,
/// and the `ssh` transport runs `command=` as the ssh program: each spelling
/// is refused, naming the parameter, and its program never runs; under
/// `--allow-unsafe-uris` libvirt runs each one, so each is a spelling libvirt
/// honours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_parameter_in_any_case_or_encoding_is_refused_and_never_runs() {
    let w = World::new("rc-uri-case").await;
    let dir = w.env.scratch_dir().join(format!("uri-case-{}", w.ns));
    std::fs::create_dir_all(&dir).unwrap();
    let spellings = [("upper", "Command"), ("shout", "COMMAND"), ("encoded", "%43omm%61nd")];
    let programs: Vec<(&str, String, std::path::PathBuf)> = spellings
        .iter()
        .map(|(name, param)| {
            let marker = dir.join(format!("{name}-ran"));
            let script = dir.join(format!("{name}-ssh.sh"));
            std::fs::write(&script, format!("#!/bin/sh\ntouch {}\nexit 1\n", marker.display())).unwrap();
            std::process::Command::new("chmod").arg("+x").arg(&script).status().unwrap();
            (*name, format!("qemu+ssh://anyhost/system?{param}={}", script.display()), marker)
        })
        .collect();

    let manager =
        Manager::start_with_policy(w.client.clone(), &w.ns, Arc::new(Connections::libvirt()), UriPolicy::default());
    for (name, uri, _) in &programs {
        let c: Cluster = w.apply(cluster_json(name, name, true)).await;
        let _: LibvirtCluster = w.apply(libvirt_cluster_json(name, uri, Some((name, &c.uid().unwrap())))).await;
    }
    for (name, uri, marker) in &programs {
        let lc = w
            .wait_for::<LibvirtCluster>(name, "InfrastructureReady False with UriNotAllowed", |lc| {
                has(cluster_conditions(lc), "InfrastructureReady", "False", Some("UriNotAllowed"))
            })
            .await;
        let message = condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message.clone();
        assert!(message.contains(&format!("refuses URI {uri}")), "{message}");
        let script = uri.split_once('=').unwrap().1;
        assert!(message.contains(&format!("command={script} runs a program")), "{message}");
        w.wait_event(name, "Warning", "UriNotAllowed", &message).await;
        assert!(!marker.exists(), "the manager ran {script} although its policy refuses the URI");
    }
    manager.kill().await;

    let _manager =
        Manager::start_with_policy(w.client.clone(), &w.ns, Arc::new(Connections::libvirt()), UriPolicy::allow_all());
    let started = std::time::Instant::now();
    for (name, uri, marker) in &programs {
        while !marker.exists() {
            assert!(
                started.elapsed() < WAIT,
                "with --allow-unsafe-uris libvirt never ran the program of {name}: {uri}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The files under a credentials directory are the operator's: a
/// LibvirtCluster may name them only when the directory was granted to its
/// namespace. Another namespace's grant is refused with a condition and an
/// event that name the directory, the namespace and the flag; granted to its
/// own namespace, the same object gets past the policy to the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_files_are_usable_only_by_the_namespaces_granted_them() {
    use capl_host::uri_policy::CredentialsDir;
    let w = World::new("rc-uri-dir").await;
    // A TLS listener nobody runs: what matters is whether the manager tries it.
    let uri = "qemu+tls://127.0.0.1:1/system?pkipath=/etc/capl/kvm1/pki";
    let policy = |dirs: &[&str]| UriPolicy {
        credentials_dirs: dirs.iter().map(|d| CredentialsDir::parse(d).unwrap()).collect(),
        ..UriPolicy::default()
    };

    let manager = Manager::start_with_policy(
        w.client.clone(),
        &w.ns,
        Arc::new(Connections::libvirt()),
        policy(&["/etc/capl/kvm1=some-other-team", "/etc/capl/shared=*"]),
    );
    let c: Cluster = w.apply(cluster_json("files", "files", true)).await;
    let _: LibvirtCluster = w.apply(libvirt_cluster_json("files", uri, Some(("files", &c.uid().unwrap())))).await;
    let lc = w
        .wait_for::<LibvirtCluster>("files", "InfrastructureReady False with UriNotAllowed", |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some("UriNotAllowed"))
        })
        .await;
    let message = condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message.clone();
    let ns = &w.ns;
    assert!(
        message.contains(&format!(
            "pkipath=/etc/capl/kvm1/pki is in the credentials directory /etc/capl/kvm1, which the manager does not let \
             namespace {ns} use (its operator grants it with --credentials-dir /etc/capl/kvm1={ns})"
        )),
        "{message}"
    );
    w.wait_event("files", "Warning", "UriNotAllowed", &message).await;
    manager.kill().await;

    // Granted to this namespace: the policy lets the manager try the host.
    let _manager = Manager::start_with_policy(
        w.client.clone(),
        &w.ns,
        Arc::new(Connections::libvirt()),
        policy(&[&format!("/etc/capl/kvm1=some-other-team,{ns}")]),
    );
    let lc = w
        .wait_for::<LibvirtCluster>("files", "a reason other than UriNotAllowed", |lc| {
            condition(cluster_conditions(lc), "InfrastructureReady").is_some_and(|c| c.reason != "UriNotAllowed")
        })
        .await;
    let message = condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message.clone();
    assert!(!message.contains("credentials directory"), "{message}");
}
