//! Real connections over libvirt's remote transports with credentials in
//! files, as a LibvirtCluster's `credentialsRef` Secret gives them, through the provider's own `Connections` and `LibvirtConnector`:
//!
//! - `qemu+tls://127.0.0.1:<TLS_PORT>/system?pkipath=<dir>` to the private
//!   libvirtd's TLS listener (`cargo xtask host up`), with client
//!   certificates signed by its test CA, or by another CA;
//! - `qemu+libssh://` and `qemu+libssh2://` through a private sshd on
//!   127.0.0.1 (`TestSshd`, key-only, root) that runs in the daemon's mount
//!   namespace, so the URIs need no `socket=`; libvirt's default `proxy=auto`
//!   (`virt-ssh-helper`) and `proxy=netcat` (`nc -U`) both reach the daemon.
//!
//! Every refused case must come back with libvirt's own reason, within the
//! connect timeout; the messages asserted here are what the provider shows in
//! its conditions (and the error codes, which all map to `ErrorKind::Other`).
//! Run as root (the test CA's key and the daemon's socket are
//! root's), with the private daemon up, under `flock -o /tmp/capl-libvirtd.lock`
//! when others share it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capl_host::hypervisor::HypervisorError;
use capl_host::hypervisor::connections::Connections;
use capl_host::hypervisor::libvirt::{KeepAlive, LibvirtConnector};
use testenv::ScratchDir;
use testenv::remote_access::{Pki, TestSshd, host_ca, ssh_keygen, write_client_pki, write_private};
use testenv::test_host::{DISK_POOL, NETWORK, libssh_uri, tls_uri};

/// The connect timeout of these tests: every refusal must come back sooner.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

fn connections() -> Arc<Connections> {
    Arc::new(
        Connections::new(Arc::new(LibvirtConnector::new(KeepAlive::default())), 4)
            .with_timeouts(Duration::from_secs(30), CONNECT_TIMEOUT),
    )
}

/// Opens `uri` on a fresh cache and asks whether the test network and disk
/// pool are active; returns the answer or the error, and asserts it came back
/// within the connect timeout (libvirt's own error, not "no answer").
async fn probe(uri: &str) -> Result<(bool, bool), HypervisorError> {
    let host = connections().host(uri);
    let started = Instant::now();
    let result =
        host.call(|h| Ok::<_, HypervisorError>((h.network_is_active(NETWORK)?, h.pool_is_active(DISK_POOL)?))).await;
    let took = started.elapsed();
    eprintln!("{uri}: {:?} after {took:.0?}", result.as_ref().map_err(|e| e.to_string()));
    assert!(took < CONNECT_TIMEOUT, "{uri} took {took:?}");
    if let Err(e) = &result {
        assert!(!e.message.starts_with("no answer from"), "{uri} hung until the timeout: {e}");
    }
    result
}

async fn refused(uri: &str) -> HypervisorError {
    match probe(uri).await {
        Ok(answer) => panic!("{uri} connected ({answer:?}) but must be refused"),
        Err(e) => e,
    }
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// A `pkipath` directory `dir/<name>` with `ca_pem` as `cacert.pem` and a
/// client certificate of `signer`.
fn pki_dir(dir: &Path, name: &str, ca_pem: &str, signer: &Pki) -> String {
    let (cert, key) = signer.client_cert("capl-test-cluster", "capl-test").unwrap();
    let pki = dir.join(name);
    write_client_pki(&pki, ca_pem, &cert, &key).unwrap();
    text(&pki)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_of_the_host_ca_connects() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let dir = ScratchDir::create().unwrap();
    let ca = host_ca().unwrap();
    let pki = pki_dir(dir.path(), "pki", ca.ca_pem(), &ca);
    assert_eq!(probe(&tls_uri(&pki)).await.unwrap(), (true, true));
    // The certificate names 127.0.0.1 and localhost alike.
    let localhost = tls_uri(&pki).replace("127.0.0.1", "localhost");
    assert_eq!(probe(&localhost).await.unwrap(), (true, true));
}

/// The three ways a certificate can be wrong, each refused at once with its
/// own message: the client's certificate is not of the CA it holds (libvirt
/// checks its own files before connecting), the server is not of the client's
/// CA, or the daemon does not know the client's CA. And missing files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_certificates_of_another_ca_are_refused_with_libvirts_reason() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let dir = ScratchDir::create().unwrap();
    let ca = host_ca().unwrap();
    let other = Pki::new_ca("capl-test-other-ca").unwrap();

    // A Secret whose ca.crt is the host's CA but whose tls.crt another CA signed.
    let pki = pki_dir(dir.path(), "client-of-other-ca", ca.ca_pem(), &other);
    let uri = tls_uri(&pki);
    let e = refused(&uri).await;
    assert_eq!(e.code, 38, "VIR_ERR_SYSTEM_ERROR: {e}");
    assert_eq!(
        e.message,
        format!(
            "cannot open libvirt connection to {uri}: Our own certificate {pki}/clientcert.pem failed validation \
             against {pki}/cacert.pem: The certificate hasn't got a known issuer."
        )
    );

    // A Secret entirely of another CA: the client refuses the daemon's certificate.
    let pki = pki_dir(dir.path(), "all-other-ca", other.ca_pem(), &other);
    let uri = tls_uri(&pki);
    let e = refused(&uri).await;
    assert_eq!(e.code, 45, "VIR_ERR_AUTH_FAILED: {e}");
    assert_eq!(
        e.message,
        format!("cannot open libvirt connection to {uri}: authentication failed: Failed to verify peer's certificate")
    );

    // The client trusts both CAs, its certificate is of the other one: the
    // daemon refuses it and closes the connection; the client only sees that.
    let pki = pki_dir(dir.path(), "daemon-refuses", &format!("{}{}", ca.ca_pem(), other.ca_pem()), &other);
    let uri = tls_uri(&pki);
    let e = refused(&uri).await;
    assert_eq!(e.code, 38, "VIR_ERR_SYSTEM_ERROR: {e}");
    assert_eq!(
        e.message,
        format!("cannot open libvirt connection to {uri}: Unable to read TLS confirmation: Input/output error")
    );

    // A pkipath without the files.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let uri = tls_uri(&text(&empty));
    let e = refused(&uri).await;
    assert_eq!(e.code, 38, "VIR_ERR_SYSTEM_ERROR: {e}");
    assert_eq!(
        e.message,
        format!(
            "cannot open libvirt connection to {uri}: Cannot read CA certificate '{}/cacert.pem': No such file or directory",
            text(&empty)
        )
    );
}

/// libvirt reads the pkipath files at every connect: rewriting them (as the
/// manager does when the Secret changes) changes what the next connection
/// uses, while a connection already open goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_are_read_again_at_each_connect() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let dir = ScratchDir::create().unwrap();
    let ca = host_ca().unwrap();
    let other = Pki::new_ca("capl-test-other-ca").unwrap();
    let pki = pki_dir(dir.path(), "pki", ca.ca_pem(), &ca);
    let uri = tls_uri(&pki);
    let open = connections().host(&uri);
    assert!(open.call(|h| h.network_is_active(NETWORK)).await.unwrap());

    pki_dir(dir.path(), "pki", ca.ca_pem(), &other);
    let e = refused(&uri).await;
    assert!(e.message.contains("failed validation against"), "{e}");
    assert!(open.call(|h| h.network_is_active(NETWORK)).await.unwrap(), "the open connection goes on");

    pki_dir(dir.path(), "pki", ca.ca_pem(), &ca);
    assert_eq!(probe(&uri).await.unwrap(), (true, true));
}

/// A client key, an sshd that lets it in, and a known_hosts file with the
/// sshd's host key.
struct SshSetup {
    sshd: TestSshd,
    key: String,
    known_hosts: String,
    dir: ScratchDir,
}

fn ssh_setup() -> SshSetup {
    let dir = ScratchDir::create().unwrap();
    let key = dir.path().join("id_ed25519");
    let public = ssh_keygen(&key, "capl-test-client").unwrap();
    // A Secret gives the private key alone: libvirt must not need `<key>.pub`.
    std::fs::remove_file(dir.path().join("id_ed25519.pub")).unwrap();
    let sshd = TestSshd::start(&public).unwrap();
    let known_hosts = dir.path().join("known_hosts");
    write_private(&known_hosts, &format!("{}\n", sshd.known_hosts_line())).unwrap();
    SshSetup { key: text(&key), known_hosts: text(&known_hosts), sshd, dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libssh_and_libssh2_with_an_authorized_key_connect() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let s = ssh_setup();
    for transport in ["libssh", "libssh2"] {
        let uri = libssh_uri(transport, s.sshd.port(), &s.key, &s.known_hosts);
        let answer = probe(&uri).await;
        assert_eq!(answer.as_ref().ok(), Some(&(true, true)), "{answer:?}; sshd log:\n{}", s.sshd.log_tail(30));
        // nc -U on the far side (netcat-openbsd) reaches the socket as well.
        let netcat = format!("{uri}&proxy=netcat");
        assert_eq!(probe(&netcat).await.unwrap(), (true, true));
    }
}

/// A known_hosts without the server's key, or with another key for it: the
/// connection is refused before any key is offered. Without an auth callback
/// (the manager has none) an unknown host cannot be accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libssh_refuses_an_unknown_or_changed_host_key() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let s = ssh_setup();
    let port = s.sshd.port();
    let empty = s.dir.path().join("known_hosts_empty");
    write_private(&empty, "").unwrap();
    let other_key = ssh_keygen(&s.dir.path().join("other_host_key"), "other").unwrap();
    let changed = s.dir.path().join("known_hosts_changed");
    let mut fields = other_key.split_whitespace();
    let (kind, key) = (fields.next().unwrap(), fields.next().unwrap());
    write_private(&changed, &format!("[127.0.0.1]:{port} {kind} {key}\n")).unwrap();

    // (transport, libvirt's prefix for its transport errors, the error code:
    // VIR_ERR_LIBSSH 98 / VIR_ERR_SSH 85)
    for (transport, prefix, code) in [("libssh", "libssh transport error", 98), ("libssh2", "SSH transport error", 85)]
    {
        let uri = libssh_uri(transport, port, &s.key, &text(&empty));
        let e = refused(&uri).await;
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                code,
                format!(
                    "cannot open libvirt connection to {uri}: {prefix}: No user interaction callback provided: \
                     Can't verify the session host key"
                )
                .as_str()
            )
        );

        let uri = libssh_uri(transport, port, &s.key, &text(&changed));
        let e = refused(&uri).await;
        // VIR_ERR_AUTH_FAILED; the message names the new key (libssh: its
        // SHA-256 in hex, libssh2: its base64) and the file.
        assert_eq!(e.code, 45, "{e}");
        let head = format!(
            "cannot open libvirt connection to {uri}: authentication failed: !!! SSH HOST KEY VERIFICATION \
             FAILED !!!: Identity of host '127.0.0.1:{port}' differs from stored identity. Please verify the new \
             host key '"
        );
        let tail = format!("' to avoid possible man in the middle attack. The key is stored in '{}'.", text(&changed));
        assert!(e.message.starts_with(&head) && e.message.ends_with(&tail), "{e}");
    }
    assert!(!s.sshd.log_tail(200).contains("Accepted publickey"), "{}", s.sshd.log_tail(40));
}

/// A key the server does not know, or no key file at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libssh_refuses_a_key_the_server_does_not_know() {
    // The daemon_faults test kills the shared libvirtd: not while this one runs.
    let _daemon = crate::share_real_daemon().await;
    let s = ssh_setup();
    let port = s.sshd.port();
    let other = text(&s.dir.path().join("id_other"));
    ssh_keygen(Path::new(&other), "not-authorized").unwrap();
    std::fs::remove_file(format!("{other}.pub")).unwrap();
    let missing = text(&s.dir.path().join("missing"));

    let uri = libssh_uri("libssh", port, &other, &s.known_hosts);
    let e = refused(&uri).await;
    assert_eq!(
        (e.code, e.message),
        (
            98,
            format!(
                "cannot open libvirt connection to {uri}: libssh transport error: failed to authenticate: \
                 Access denied for 'publickey'. Authentication that can continue: publickey"
            )
        )
    );
    let uri = libssh_uri("libssh2", port, &other, &s.known_hosts);
    let e = refused(&uri).await;
    assert_eq!(
        (e.code, e.message),
        (
            45,
            format!(
                "cannot open libvirt connection to {uri}: authentication failed: authentication with private key \
                 '{other}' has failed: Username/PublicKey combination invalid"
            )
        )
    );

    let uri = libssh_uri("libssh", port, &missing, &s.known_hosts);
    let e = refused(&uri).await;
    assert_eq!(
        (e.code, e.message),
        (
            45,
            format!(
                "cannot open libvirt connection to {uri}: authentication failed: error while reading private key '{missing}'"
            )
        )
    );
    // libssh2 reports a key file it cannot read as a passphrase it cannot ask for.
    let uri = libssh_uri("libssh2", port, &missing, &s.known_hosts);
    let e = refused(&uri).await;
    assert_eq!(
        (e.code, e.message),
        (
            85,
            format!(
                "cannot open libvirt connection to {uri}: SSH transport error: No user interaction callback \
                 provided: Can't retrieve private key passphrase"
            )
        )
    );
}
