//! Per-cluster credentials (`LibvirtCluster.spec.credentialsRef`), the parts
//! decided before any connection: a Secret that is missing, then incomplete,
//! then complete; a transport that takes no Secret. The conditions and events
//! name the Secret, the keys and the fix, and never the Secret's content.
//! (Real TLS and SSH connections with Secrets: the libvirtd tests.)

use std::collections::BTreeMap;

use crate::support::*;
use capl::api::LibvirtCluster;
use capl::api::capi::Cluster;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::json;

/// Distinctive Secret content that must never show in a condition or event.
const CONTENT: &str = "NOT-FOR-YOUR-EYES-";

fn secret_json(name: &str, keys: &[&str]) -> serde_json::Value {
    let data: BTreeMap<String, String> = keys.iter().map(|k| (k.to_string(), format!("{CONTENT}{k}"))).collect();
    json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": name }, "stringData": data })
}

async fn infrastructure_message(w: &World, name: &str, reason: &str) -> String {
    let lc = w
        .wait_for::<LibvirtCluster>(name, &format!("InfrastructureReady False with {reason}"), |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some(reason))
        })
        .await;
    condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_secret_is_checked_before_connecting_and_its_content_never_shown() {
    let w = World::new("rc-creds").await;
    let _manager = w.start_manager();
    let uri = "qemu+tls://kvm1.invalid/system";
    let c: Cluster = w.apply(cluster_json("tls", "tls", true)).await;
    let mut lc = libvirt_cluster_json("tls", uri, Some(("tls", &c.uid().unwrap())));
    lc["spec"]["credentialsRef"] = json!({ "name": "kvm1-tls" });
    let _: LibvirtCluster = w.apply(lc).await;

    // No Secret yet.
    let message = infrastructure_message(&w, "tls", "CredentialsNotFound").await;
    assert_eq!(
        message,
        format!(
            "LibvirtCluster tls: Secret {}/kvm1-tls named by credentialsRef does not exist: create it with the \
             credentials for {uri} (see the book, \"Credentials and the URI policy\")",
            w.ns
        )
    );
    w.wait_event("tls", "Warning", "CredentialsNotFound", &message).await;

    // A Secret without the client certificate and key: the watch on Secrets
    // brings the cluster back, and the keys are named.
    let _: Secret = w.apply(secret_json("kvm1-tls", &["ca.crt", "unrelated"])).await;
    let message = infrastructure_message(&w, "tls", "InvalidCredentials").await;
    assert_eq!(
        message,
        format!(
            "LibvirtCluster tls: Secret {}/kvm1-tls has no non-empty \"tls.crt\", \"tls.key\": a qemu+tls URI \
             needs the keys \"ca.crt\", \"tls.crt\", \"tls.key\" in it; add them to the Secret",
            w.ns
        )
    );
    w.wait_event("tls", "Warning", "InvalidCredentials", &message).await;

    // Complete: the manager connects with the files (this host does not
    // exist, so it fails there), and reports the URI as the user wrote it.
    let _: Secret = w.apply(secret_json("kvm1-tls", &["ca.crt", "tls.crt", "tls.key"])).await;
    let lc = w
        .wait_for::<LibvirtCluster>("tls", "a failure past the credentials check", |lc| {
            condition(cluster_conditions(lc), "InfrastructureReady")
                .is_some_and(|c| c.status == "False" && !c.reason.contains("Credentials"))
        })
        .await;
    let message = &condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message;
    assert!(message.contains(uri) && !message.contains("pkipath="), "the user's URI, not the files: {message}");

    // The files the manager wrote: private, and exactly the three libvirt reads.
    let scratch = std::env::temp_dir().join(format!("capl-credentials-{}", w.ns)).join(&w.ns);
    let dirs: Vec<_> = std::fs::read_dir(&scratch).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(dirs.len(), 1, "one directory for the Secret's current content: {dirs:?}");
    let mut files: Vec<String> =
        std::fs::read_dir(&dirs[0]).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    files.sort();
    assert_eq!(files, ["cacert.pem", "clientcert.pem", "clientkey.pem"]);
    assert_eq!(
        std::fs::read_to_string(dirs[0].join("clientkey.pem")).unwrap(),
        format!("{CONTENT}tls.key"),
        "the Secret's tls.key"
    );

    // A transport that takes no credentials from a Secret.
    let c: Cluster = w.apply(cluster_json("tcp", "tcp", true)).await;
    let mut lc = libvirt_cluster_json("tcp", "qemu+tcp://kvm1.invalid/system", Some(("tcp", &c.uid().unwrap())));
    lc["spec"]["credentialsRef"] = json!({ "name": "kvm1-tls" });
    let _: LibvirtCluster = w.apply(lc).await;
    let message = infrastructure_message(&w, "tcp", "InvalidCredentials").await;
    assert!(message.contains("uses the tcp transport") && message.contains("remove credentialsRef"), "{message}");

    // Nothing the manager reported shows what the Secret holds.
    for name in ["tls", "tcp"] {
        for (_, reason, note) in w.events(name).await {
            assert!(!note.contains(CONTENT), "event {reason} shows the Secret's content: {note}");
        }
        let lc = w.api::<LibvirtCluster>().get(name).await.unwrap();
        let status = serde_json::to_string(&lc.status).unwrap();
        assert!(!status.contains(CONTENT), "the status of {name} shows the Secret's content: {status}");
    }
}
