//! `LibvirtCluster.spec.credentialsRef` end to end on the private libvirtd,
//! with the local kube-apiserver: the URIs name no files,
//! the credentials are only in Secrets, and the manager runs with its default
//! URI policy (no `--allow-unsafe-uris`).
//!
//! - A cluster over `qemu+tls://127.0.0.1:<TLS_PORT>/system` (a client
//!   certificate of the daemon's test CA) and one over
//!   `qemu+libssh://root@127.0.0.1:<port>/system` (the private sshd, key-only)
//!   each provision a machine.
//! - Refused credentials (a CA that did not sign the daemon, a client
//!   certificate the daemon does not trust, a `known_hosts` without the
//!   host's key) give `HostAuthenticationFailed` with the fix on the cluster,
//!   and on a machine that tries anyway, and nothing is created.
//! - Rotating the TLS Secret to a new client certificate opens a new
//!   connection at once, and the sweep closes the old one.
//!
//! Needs `cargo xtask host up` (with its TLS listener) and the local control
//! plane; run as root.

use std::collections::BTreeMap;
use std::sync::Arc;

use capl::api::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl::controller::UriPolicy;
use capl_host::hypervisor::Hypervisor;
use capl_host::hypervisor::connections::{Connections, DEFAULT_MAX_CALLS_PER_HOST};
use capl_host::hypervisor::libvirt::LibvirtConnector;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::json;
use testenv::ScratchDir;
use testenv::remote_access::{Pki, TestSshd, host_ca, ssh_keygen};
use testenv::test_host::TLS_PORT;

use crate::api_support::{
    Manager, World, cloud_config, cluster_conditions, cluster_json, condition, create_bootstrap_secret, has,
    libvirt_cluster_json, libvirt_machine_json, machine_conditions, machine_json,
};
use capl_host_test_support::host::{Fixture, ensure_base_image};
use capl_host_test_support::real_host::{CleanUp, connect_checked, fixture, ours_on_host};

fn secret_json(name: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let data: BTreeMap<&str, &str> = data.iter().copied().collect();
    json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": name }, "type": "Opaque", "stringData": data })
}

fn tls_secret(name: &str, ca_pem: &str, signer: &Pki) -> serde_json::Value {
    let (cert, key) = signer.client_cert("capl-test-cluster", "capl-test").unwrap();
    secret_json(name, &[("ca.crt", ca_pem), ("tls.crt", &cert), ("tls.key", &key)])
}

/// A Cluster (infrastructure marked provisioned, as CAPI core would once the
/// LibvirtCluster is) with its LibvirtCluster at `uri`, credentials in `secret`.
async fn cluster(w: &World, fx: &Fixture, name: &str, uri: &str, secret: &str, provisioned: bool) {
    let c: Cluster = w.apply(cluster_json(name, name, true)).await;
    let mut lc = libvirt_cluster_json(name, uri, Some((name, &c.uid().unwrap())));
    lc["spec"]["network"] = json!(fx.network);
    lc["spec"]["basePool"] = json!(fx.base_pool);
    lc["spec"]["domainPool"] = json!(fx.domain_pool);
    lc["spec"]["credentialsRef"] = json!({ "name": secret });
    let _: LibvirtCluster = w.apply(lc).await;
    if provisioned {
        let _: Cluster = w.patch_status(name, json!({ "initialization": { "infrastructureProvisioned": true } })).await;
    }
}

async fn machine(w: &World, fx: &Fixture, cluster: &str, name: &str) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let m: Machine = w.apply(machine_json(name, cluster, name, Some(&secret))).await;
    let mut lm = libvirt_machine_json(name, cluster, Some((name, &m.uid().unwrap())));
    lm["spec"]["image"] = json!(fx.image);
    lm["spec"]["memoryMiB"] = json!(256);
    lm["metadata"]["labels"] = json!({ CLUSTER_NAME_LABEL: cluster });
    let _: LibvirtMachine = w.apply(lm).await;
}

async fn refused_with(w: &World, name: &str, libvirt_says: &str, fix: &str) -> String {
    let lc = w
        .wait_for::<LibvirtCluster>(name, "InfrastructureReady False with HostAuthenticationFailed", |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some("HostAuthenticationFailed"))
        })
        .await;
    let message = condition(cluster_conditions(&lc), "InfrastructureReady").unwrap().message.clone();
    assert!(message.starts_with(&format!("LibvirtCluster {name}: libvirt at ")), "{message}");
    assert!(message.contains("refused the credentials") && message.contains(libvirt_says), "{message}");
    assert!(message.contains(fix) && message.contains("credentialsRef"), "the fix: {message}");
    assert!(!message.contains("pkipath=") && !message.contains("keyfile="), "the user's URI only: {message}");
    w.wait_event(name, "Warning", "HostAuthenticationFailed", &message).await;
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_connect_over_tls_and_libssh_with_credentials_from_secrets() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let (socket_uri, hv) = connect_checked();
    let fx = fixture("capl-host-tests-base.qcow2");
    ensure_base_image(&hv, &fx);
    let ca = host_ca().unwrap_or_else(|e| panic!("{e:#}"));
    let other_ca = Pki::new_ca("not-the-test-libvirt-ca").unwrap();
    let keys = ScratchDir::create().unwrap();
    let key_path = keys.path().join("id_ed25519");
    let public_key = ssh_keygen(&key_path, "capl-credentials-test").unwrap();
    let private_key = std::fs::read_to_string(&key_path).unwrap();
    let sshd = TestSshd::start(&public_key).unwrap_or_else(|e| panic!("{e:#}"));

    let w = World::new("real-creds").await;
    let _cleanup = CleanUp { uri: socket_uri.clone(), fx: fixture(&fx.image), tags: vec![w.ns.clone()] };
    let connections = Arc::new(Connections::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST));
    // The default policy: these URIs name no socket, no program and no files.
    let manager = Manager::start_with_policy(w.client.clone(), &w.ns, connections.clone(), UriPolicy::default());

    // TLS and libssh, each with one machine.
    let tls_uri = format!("qemu+tls://127.0.0.1:{TLS_PORT}/system");
    let ssh_uri = format!("qemu+libssh://root@127.0.0.1:{}/system", sshd.port());
    let _: Secret = w.apply(tls_secret("host-tls", ca.ca_pem(), &ca)).await;
    let ssh = [("ssh-privatekey", private_key.as_str()), ("known_hosts", &sshd.known_hosts_line())];
    let _: Secret = w.apply(secret_json("host-ssh", &ssh)).await;
    cluster(&w, &fx, "tls", &tls_uri, "host-tls", true).await;
    cluster(&w, &fx, "ssh", &ssh_uri, "host-ssh", true).await;
    machine(&w, &fx, "tls", "tls-0").await;
    machine(&w, &fx, "ssh", "ssh-0").await;
    for (cluster, machine, uri) in [("tls", "tls-0", &tls_uri), ("ssh", "ssh-0", &ssh_uri)] {
        w.wait_for::<LibvirtCluster>(cluster, "Ready True", |lc| has(cluster_conditions(lc), "Ready", "True", None))
            .await;
        let lm = w
            .wait_for::<LibvirtMachine>(machine, "its domain created through its Secret", |lm| {
                has(machine_conditions(lm), "MachineCreated", "True", None) && lm.spec.provider_id.is_some()
            })
            .await;
        let status = lm.status.unwrap();
        assert_eq!(status.host_uri.as_deref(), Some(uri.as_str()), "the status records the URI as the user wrote it");
        assert_eq!(status.credentials_ref.map(|r| r.name), Some(format!("host-{cluster}")));
        let domain = status.domain_name.unwrap();
        assert!(hv.domain_list().unwrap().contains(&domain), "{machine}: domain {domain} on the daemon");
    }
    assert_eq!(ours_on_host(&hv, &fx, &w.ns).len(), 2 * 4, "2 domains, 4 volumes, 2 DHCP entries");

    // Refused credentials: nothing is created, and the message says what to fix.
    let tls_fix = "ca.crt (cacert.pem) must be the CA that signed the host's server certificate";
    let ssh_fix = "known_hosts must hold the host's key";
    // A CA bundle that did not sign the daemon's certificate.
    let _: Secret = w.apply(tls_secret("wrong-ca", other_ca.ca_pem(), &other_ca)).await;
    cluster(&w, &fx, "wrong-ca", &tls_uri, "wrong-ca", false).await;
    refused_with(&w, "wrong-ca", "Failed to verify peer's certificate", tls_fix).await;
    // A client certificate the daemon does not trust (we trust both CAs).
    let both = format!("{}{}", ca.ca_pem(), other_ca.ca_pem());
    let _: Secret = w.apply(tls_secret("untrusted-client", &both, &other_ca)).await;
    cluster(&w, &fx, "untrusted", &tls_uri, "untrusted-client", true).await;
    refused_with(&w, "untrusted", "Unable to read TLS confirmation", tls_fix).await;
    // A known_hosts without the host's key (a line for another host only).
    let stranger = format!("[kvm9.lab.invalid]:{} {}", sshd.port(), public_key.trim());
    let _: Secret =
        w.apply(secret_json("unknown-host", &[("ssh-privatekey", &private_key), ("known_hosts", &stranger)])).await;
    cluster(&w, &fx, "unknown-host", &ssh_uri, "unknown-host", true).await;
    refused_with(&w, "unknown-host", "Can't verify the session host key", ssh_fix).await;
    // A machine that tries anyway (its Cluster says the infrastructure is
    // provisioned) reports the same and makes nothing.
    machine(&w, &fx, "untrusted", "untrusted-0").await;
    w.wait_for::<LibvirtMachine>("untrusted-0", "DomainProvisioningReady False with HostAuthenticationFailed", |lm| {
        has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("HostAuthenticationFailed"))
    })
    .await;
    let made = ours_on_host(&hv, &fx, &w.ns);
    assert_eq!(made.len(), 2 * 4, "refused credentials created nothing: {made:?}");

    // Rotation: a new client certificate in the TLS Secret. The watch on
    // Secrets brings the cluster back, which connects with the new files.
    let opened = connections.connections_opened();
    let uris_before = connections.host_uris();
    let _: Secret = w.apply(tls_secret("host-tls", ca.ca_pem(), &ca)).await;
    let started = std::time::Instant::now();
    while connections.connections_opened() == opened {
        assert!(started.elapsed() < crate::api_support::WAIT, "no new connection after the Secret changed");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let new_uris: Vec<String> = connections.host_uris().into_iter().filter(|u| !uris_before.contains(u)).collect();
    assert_eq!(new_uris.len(), 1, "one new connection, for the TLS host: {new_uris:?}");
    assert!(new_uris[0].starts_with(&format!("{tls_uri}?pkipath=")), "{new_uris:?}");
    w.wait_for::<LibvirtCluster>("tls", "Ready True with the new certificate", |lc| {
        has(cluster_conditions(lc), "Ready", "True", None)
    })
    .await;
    // The sweep closes the connection opened with the old certificate.
    let clusters: Vec<Arc<LibvirtCluster>> =
        w.api::<LibvirtCluster>().list(&Default::default()).await.unwrap().items.into_iter().map(Arc::new).collect();
    let machines: Vec<Arc<LibvirtMachine>> =
        w.api::<LibvirtMachine>().list(&Default::default()).await.unwrap().items.into_iter().map(Arc::new).collect();
    capl::controller::forget_unused(&manager.ctx, &clusters, &machines);
    let host_tls: Vec<String> = connections.host_uris().into_iter().filter(|u| u.contains("/host-tls.")).collect();
    assert_eq!(host_tls, new_uris, "of Secret host-tls only the connection with the current certificate is kept");

    // Everything deleted: nothing of ours is left. The machine whose host
    // refuses its credentials cannot look whether it left something there, so
    // it retries, saying why, until its Secret is fixed.
    for name in ["tls-0", "ssh-0", "untrusted-0"] {
        w.delete::<Machine>(name).await;
        w.delete::<LibvirtMachine>(name).await;
    }
    let lm = w
        .wait_for::<LibvirtMachine>("untrusted-0", "Ready False with DeletionRetrying", |lm| {
            has(machine_conditions(lm), "Ready", "False", Some("DeletionRetrying"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "Ready").unwrap().message;
    assert!(message.contains("refused the credentials"), "{message}");
    let _: Secret = w.apply(tls_secret("untrusted-client", ca.ca_pem(), &ca)).await;
    for name in ["tls-0", "ssh-0", "untrusted-0"] {
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    assert_eq!(ours_on_host(&hv, &fx, &w.ns), Vec::<String>::new(), "left on the daemon");
}
