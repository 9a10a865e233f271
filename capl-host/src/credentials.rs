//! Per-cluster host credentials (`LibvirtCluster.spec.credentialsRef`).
//!
//! libvirt's client reads credentials only from files named in the URI: a
//! TLS connection reads `cacert.pem`, `clientcert.pem` and `clientkey.pem`
//! from the directory `?pkipath=`, an SSH connection (libvirt's own libssh
//! and libssh2 transports) reads its private key from `?keyfile=` and the
//! host keys it trusts from `?known_hosts=`. So a Secret's content is written
//! as files, and the URI the manager opens is the LibvirtCluster's URI with
//! those parameters added.
//!
//! [`CredentialStore`] does that:
//! - the files go under one private directory (the manager's
//!   `--credentials-scratch-dir`, a memory-backed emptyDir in the Deployment,
//!   so they never reach a disk and the root filesystem stays read-only):
//!   `<root>/<namespace>/<secret>.<content hash>/`, the directories mode
//!   0700 and the files 0600, written to a temporary directory and renamed
//!   into place, so a connect never sees half a set;
//! - the directory name carries a hash of the content, so the URI changes
//!   when the Secret does: the connection cache, keyed by URI, opens a new
//!   connection with the new credentials, and the old one is closed by the
//!   manager's periodic sweep. The previous directory of that Secret is
//!   removed once the new one is in place;
//! - the content is never logged or put in a message; messages name the
//!   Secret, the missing keys and the fix.
//!
//! Which keys a Secret holds, by the URI's transport:
//!
//! | transport | Secret keys | files, URI parameters |
//! |---|---|---|
//! | `qemu+tls` | `ca.crt`, `tls.crt`, `tls.key` (a `kubernetes.io/tls` Secret with the CA, as cert-manager writes it) | `cacert.pem`, `clientcert.pem`, `clientkey.pem`; `pkipath=<dir>` |
//! | `qemu+libssh`, `qemu+libssh2` | `ssh-privatekey` (as in a `kubernetes.io/ssh-auth` Secret), `known_hosts` | `id`, `known_hosts`; `keyfile=`, `known_hosts=`, and `sshauth=privkey` unless the URI chooses |
//!
//! Other transports take no credentials from a Secret (`qemu+ssh` runs the
//! `ssh` program, which reads `~/.ssh`; `qemu+tcp` has none), and a URI that
//! already names `pkipath=`, `keyfile=` or `known_hosts=` cannot also have a
//! `credentialsRef`: both are refused with a message that says so.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// Where the manager writes credentials by default (a memory-backed emptyDir in the Deployment).
pub const DEFAULT_SCRATCH_DIR: &str = "/run/capl-credentials";

/// The Secret keys of a TLS client, and the file libvirt reads each from in `pkipath`.
pub const TLS_KEYS: [(&str, &str); 3] =
    [("ca.crt", "cacert.pem"), ("tls.crt", "clientcert.pem"), ("tls.key", "clientkey.pem")];
/// The Secret keys of an SSH client, and the file each is written to.
pub const SSH_KEYS: [(&str, &str); 2] = [("ssh-privatekey", "id"), ("known_hosts", "known_hosts")];

/// URI parameters the manager sets from a Secret; a URI with a `credentialsRef` must not set them itself.
const MANAGED_PARAMETERS: [&str; 3] = ["pkipath", "keyfile", "known_hosts"];

/// How a URI's transport takes credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tls,
    Ssh,
}

impl Transport {
    /// The transport of `uri` when it takes credentials from a Secret;
    /// otherwise what is wrong and the fix.
    pub fn of(uri: &str) -> Result<Self, String> {
        let transport = crate::uri_policy::transport(uri);
        match transport.as_deref() {
            Some("tls") => Ok(Transport::Tls),
            Some("libssh" | "libssh2") => Ok(Transport::Ssh),
            other => Err(format!(
                "credentialsRef works with qemu+tls://, qemu+libssh:// and qemu+libssh2:// URIs, and {uri} uses {}: \
                 use one of those transports (a new LibvirtCluster, since uri cannot be changed) or remove credentialsRef",
                match other {
                    Some(t) => format!("the {t} transport"),
                    None => "no network transport".to_string(),
                }
            )),
        }
    }

    /// The Secret keys this transport needs, with the file each becomes.
    pub fn keys(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Transport::Tls => &TLS_KEYS,
            Transport::Ssh => &SSH_KEYS,
        }
    }
}

/// The most the files of one Secret may hold, by default: a CA, a client
/// certificate and key, or a private key and a `known_hosts` of a few
/// hundred hosts fit many times over.
pub const DEFAULT_MAX_SECRET_BYTES: u64 = 64 * 1024;

/// The most the files of all Secrets together may hold, by default: three
/// quarters of the shipped Deployment's 16 MiB memory-backed scratch
/// directory, leaving room for a Secret being replaced.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 12 * 1024 * 1024;

/// Why a Secret's credentials were not written: the message names the
/// Secret and the fix; `retry_later` when the same Secret may fit later
/// without anyone changing it (the directory is full of other Secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub message: String,
    pub retry_later: bool,
}

impl From<String> for Refused {
    fn from(message: String) -> Self {
        Self { message, retry_later: false }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the store remembers of one Secret: the directory holding its files
/// now, and how many bytes they hold.
#[derive(Debug, Clone)]
struct Written {
    dir: PathBuf,
    bytes: u64,
}

/// Credentials written as files for libvirt, per Secret; see the module docs.
#[derive(Debug)]
pub struct CredentialStore {
    root: PathBuf,
    current: Mutex<HashMap<(String, String), Written>>,
    writes: AtomicU64,
    max_secret_bytes: u64,
    max_total_bytes: u64,
}

impl CredentialStore {
    /// A store under `root` (created on first use, mode 0700), with the
    /// default bounds ([`DEFAULT_MAX_SECRET_BYTES`], [`DEFAULT_MAX_TOTAL_BYTES`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            current: Mutex::new(HashMap::new()),
            writes: AtomicU64::new(0),
            max_secret_bytes: DEFAULT_MAX_SECRET_BYTES,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
        }
    }

    /// Sets how many bytes the files of one Secret, and of all Secrets
    /// together, may hold.
    pub fn with_limits(mut self, per_secret: u64, total: u64) -> Self {
        self.max_secret_bytes = per_secret;
        self.max_total_bytes = total;
        self
    }

    /// Removes what an earlier process left under `root`: the directories
    /// of Secrets it wrote (`<namespace>/<secret>.<hash>`) and unfinished
    /// ones (`.staging-*`), then namespace directories left empty. Nothing
    /// else is touched. The manager calls it once at start, before any
    /// reconcile: a container restarted in the same Pod finds the files of
    /// its predecessor in the memory-backed directory, which would otherwise
    /// count against the Pod's memory for ever. Returns how many
    /// directories of Secrets were removed.
    pub fn remove_previous(root: &Path) -> std::io::Result<usize> {
        let mut removed = 0;
        let Ok(namespaces) = fs::read_dir(root) else { return Ok(0) };
        for namespace in namespaces.flatten() {
            if !namespace.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for entry in fs::read_dir(namespace.path())?.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with(".staging-")
                    || name
                        .rsplit_once('.')
                        .is_some_and(|(_, hash)| hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()));
                if ours && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    fs::remove_dir_all(entry.path())?;
                    removed += 1;
                }
            }
            let _ = fs::remove_dir(namespace.path()); // only when empty
        }
        Ok(removed)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes the credentials of Secret `namespace/secret` for `uri` (when
    /// not already written) and returns the URI to open: `uri` with the
    /// parameters that name the files. Err: what is wrong, naming the
    /// Secret and the fix (never its content).
    pub fn apply(
        &self,
        uri: &str,
        namespace: &str,
        secret: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<String, Refused> {
        let transport = Transport::of(uri)?;
        check_no_managed_parameters(uri)?;
        let missing: Vec<&str> =
            transport.keys().iter().map(|(k, _)| *k).filter(|k| data.get(*k).is_none_or(|v| v.is_empty())).collect();
        if !missing.is_empty() {
            let all: Vec<String> = transport.keys().iter().map(|(k, _)| format!("{k:?}")).collect();
            return Err(Refused::from(format!(
                "Secret {namespace}/{secret} has no non-empty {}: a {} URI needs the keys {} in it; add them to the Secret",
                missing.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", "),
                match transport {
                    Transport::Tls => "qemu+tls",
                    Transport::Ssh => "libssh",
                },
                all.join(", ")
            )));
        }
        let files: Vec<(&str, &[u8])> =
            transport.keys().iter().map(|(key, file)| (*file, data[*key].as_slice())).collect();
        let bytes: u64 = files.iter().map(|(_, content)| content.len() as u64).sum();
        if bytes > self.max_secret_bytes {
            return Err(Refused::from(format!(
                "Secret {namespace}/{secret} holds {bytes} bytes in {}, more than the {} the manager writes for one \
                 Secret: keep only the credentials of this host in it (a CA, a client certificate and key, or a key \
                 and the host's known_hosts lines)",
                transport.keys().iter().map(|(k, _)| format!("{k:?}")).collect::<Vec<_>>().join(", "),
                self.max_secret_bytes
            )));
        }
        let others: u64 = {
            let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            current.iter().filter(|((ns, name), _)| !(ns == namespace && name == secret)).map(|(_, w)| w.bytes).sum()
        };
        if others + bytes > self.max_total_bytes {
            return Err(Refused {
                message: format!(
                    "the credentials of Secret {namespace}/{secret} ({bytes} bytes) do not fit: the Secrets the manager \
                 has written hold {others} bytes, and all together may hold {} (its memory-backed \
                 --credentials-scratch-dir); remove the LibvirtClusters no longer used, or ask the operator to \
                 raise the limit",
                    self.max_total_bytes
                ),
                retry_later: true,
            });
        }
        let dir = self.write(namespace, secret, &files, bytes).map_err(|e| {
            format!(
                "cannot write the credentials of Secret {namespace}/{secret} under {}: {e}; the manager needs a writable --credentials-scratch-dir",
                self.root.display()
            )
        })?;
        Ok(uri_with_files(uri, transport, &dir))
    }

    /// The URI to open with the credentials last written for Secret
    /// `namespace/secret`, when they are still on disk: for deleting a
    /// machine after its Secret is gone.
    pub fn last(&self, uri: &str, namespace: &str, secret: &str) -> Option<String> {
        let transport = Transport::of(uri).ok()?;
        check_no_managed_parameters(uri).ok()?;
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let written = current.get(&(namespace.to_string(), secret.to_string()))?;
        written.dir.is_dir().then(|| uri_with_files(uri, transport, &written.dir))
    }

    /// Whether `uri` names credential files this store holds now (a URI of
    /// an older content of a Secret does not).
    pub fn is_current(&self, uri: &str) -> bool {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.values().any(|w| {
            let named = format!("={}", w.dir.display());
            uri.match_indices(&named).any(|(at, _)| {
                matches!(uri[at + named.len()..].chars().next(), None | Some('/') | Some('&') | Some(';'))
            })
        })
    }

    /// Removes the files of every Secret `keep(namespace, name)` rejects.
    /// Returns how many Secrets were forgotten.
    pub fn forget(&self, keep: impl Fn(&str, &str) -> bool) -> usize {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let before = current.len();
        current.retain(|(ns, name), written| {
            let kept = keep(ns, name);
            if !kept {
                let _ = fs::remove_dir_all(&written.dir);
            }
            kept
        });
        before - current.len()
    }

    /// Secrets whose files the store holds.
    pub fn secrets(&self) -> Vec<(String, String)> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    /// How many times files were written (a Secret seen for the first time, or changed).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// `<root>/<namespace>/<secret>.<hash>/` holding `files`; written only
    /// when not there yet. The previous directory of the Secret is removed.
    fn write(&self, namespace: &str, secret: &str, files: &[(&str, &[u8])], bytes: u64) -> std::io::Result<PathBuf> {
        let parent = self.root.join(namespace);
        let dir = parent.join(format!("{secret}.{}", content_hash(files)));
        let key = (namespace.to_string(), secret.to_string());
        if !dir.is_dir() {
            scratch_root(&self.root)?;
            private_dir(&parent)?;
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let staging = parent.join(format!(
                ".staging-{secret}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = fs::remove_dir_all(&staging);
            fs::DirBuilder::new().mode(0o700).create(&staging)?;
            for (name, content) in files {
                let mut file =
                    fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(staging.join(name))?;
                file.write_all(content)?;
                file.sync_all()?;
            }
            if let Err(e) = fs::rename(&staging, &dir) {
                let _ = fs::remove_dir_all(&staging);
                // Another reconcile put the same content in place first.
                if !dir.is_dir() {
                    return Err(e);
                }
            } else {
                self.writes.fetch_add(1, Ordering::SeqCst);
            }
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = current.insert(key, Written { dir: dir.clone(), bytes })
            && old.dir != dir
        {
            let _ = fs::remove_dir_all(&old.dir);
        }
        Ok(dir)
    }
}

/// Creates the scratch directory (mode 0700) if needed. When it is a mount
/// point this user does not own (an emptyDir is root's, mode 0777, and the
/// manager runs as non-root), it cannot be made 0700 (EPERM) and need not be:
/// the per-namespace directories below it are this user's and 0700.
fn scratch_root(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    match fs::set_permissions(dir, fs::Permissions::from_mode(0o700)) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
        other => other,
    }
}

/// Creates `dir` (mode 0700) if needed and makes sure no one else may read it.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// The first 16 hex digits of a SHA-256 over the files' names and contents.
fn content_hash(files: &[(&str, &[u8])]) -> String {
    let mut hasher = Sha256::new();
    for (name, content) in files {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(content);
    }
    hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Refuses a URI that sets a file parameter the manager sets from the Secret,
/// in any case or encoding libvirt would read (`PKIPATH=`, `%70kipath=`).
fn check_no_managed_parameters(uri: &str) -> Result<(), String> {
    for crate::uri_policy::Parameter { name, .. } in crate::uri_policy::parameters(uri) {
        if MANAGED_PARAMETERS.contains(&name.as_str()) {
            return Err(format!(
                "{uri} sets {name}= itself, and with credentialsRef the manager sets it from the Secret: \
                 use a URI without {name}= (a new LibvirtCluster, since uri cannot be changed) or remove credentialsRef"
            ));
        }
    }
    Ok(())
}

fn uri_with_files(uri: &str, transport: Transport, dir: &Path) -> String {
    let dir = dir.display();
    let params = match transport {
        Transport::Tls => format!("pkipath={dir}"),
        Transport::Ssh => {
            let auth = if crate::uri_policy::parameters(uri).iter().any(|p| p.name == "sshauth") {
                ""
            } else {
                "&sshauth=privkey"
            };
            format!("keyfile={dir}/id&known_hosts={dir}/known_hosts{auth}")
        }
    };
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{separator}{params}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_data() -> BTreeMap<String, Vec<u8>> {
        [("ca.crt", "CA"), ("tls.crt", "CERT"), ("tls.key", "KEY"), ("other", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn scratch() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "capl-credentials-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn tls_files_are_private_and_named_in_the_uri() {
        let root = scratch();
        let store = CredentialStore::new(&root);
        let uri = store.apply("qemu+tls://kvm1.lab/system", "ns1", "kvm1-tls", &tls_data()).unwrap();
        let dir = uri.strip_prefix("qemu+tls://kvm1.lab/system?pkipath=").expect(&uri);
        assert!(dir.starts_with(&format!("{}/ns1/kvm1-tls.", root.display())), "{dir}");
        for (file, content) in [("cacert.pem", "CA"), ("clientcert.pem", "CERT"), ("clientkey.pem", "KEY")] {
            let path = Path::new(dir).join(file);
            assert_eq!(fs::read_to_string(&path).unwrap(), content);
            assert_eq!(mode(&path), 0o600, "{file}");
        }
        assert_eq!(fs::read_dir(dir).unwrap().count(), 3, "only the three files libvirt reads");
        assert_eq!(mode(Path::new(dir)), 0o700);
        assert_eq!(mode(&root.join("ns1")), 0o700);
        assert_eq!(mode(&root), 0o700);
        assert!(store.is_current(&uri));
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn same_content_is_written_once_and_new_content_gets_a_new_uri() {
        let root = scratch();
        let store = CredentialStore::new(&root);
        let first = store.apply("qemu+tls://h/system", "ns", "s", &tls_data()).unwrap();
        assert_eq!(store.apply("qemu+tls://h/system", "ns", "s", &tls_data()).unwrap(), first);
        assert_eq!(store.writes(), 1);
        let mut rotated = tls_data();
        rotated.insert("tls.crt".into(), b"CERT2".to_vec());
        let second = store.apply("qemu+tls://h/system", "ns", "s", &rotated).unwrap();
        assert_ne!(second, first, "rotated content, new URI, so a new connection");
        assert!(!store.is_current(&first) && store.is_current(&second));
        let old_dir = first.split_once("pkipath=").unwrap().1;
        assert!(!Path::new(old_dir).exists(), "the previous files are removed");
        assert_eq!(store.last("qemu+tls://h/system", "ns", "s").as_deref(), Some(second.as_str()));
        assert_eq!(store.forget(|_, _| false), 1);
        assert!(store.last("qemu+tls://h/system", "ns", "s").is_none());
        assert_eq!(fs::read_dir(root.join("ns")).unwrap().count(), 0, "forgotten Secrets leave no files");
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn ssh_uris_get_the_key_and_known_hosts() {
        let root = scratch();
        let store = CredentialStore::new(&root);
        let data: BTreeMap<String, Vec<u8>> =
            [("ssh-privatekey", "K"), ("known_hosts", "H")].map(|(k, v)| (k.to_string(), v.into())).into();
        let uri = store.apply("qemu+libssh://root@h:2222/system", "ns", "ssh", &data).unwrap();
        let dir = uri.split_once("keyfile=").unwrap().1.split_once("/id&").unwrap().0;
        assert_eq!(
            uri,
            format!("qemu+libssh://root@h:2222/system?keyfile={dir}/id&known_hosts={dir}/known_hosts&sshauth=privkey")
        );
        assert_eq!(fs::read_to_string(format!("{dir}/id")).unwrap(), "K");
        let chosen = store.apply("qemu+libssh2://root@h/system?sshauth=agent,privkey", "ns", "ssh", &data).unwrap();
        assert!(chosen.ends_with("/known_hosts") && chosen.contains("?sshauth=agent,privkey&keyfile="), "{chosen}");
        let upper = store.apply("qemu+LIBSSH://root@h/system?SSHAuth=agent", "ns", "ssh", &data).unwrap();
        assert!(upper.ends_with("/known_hosts") && !upper.contains("sshauth=privkey"), "the URI chose: {upper}");
        fs::remove_dir_all(root).unwrap();
    }

    #[rstest::rstest]
    #[case("qemu+tcp://h/system", "uses the tcp transport")]
    #[case("qemu+ssh://root@h/system", "uses the ssh transport")]
    #[case("qemu:///system", "uses no network transport")]
    #[case("qemu+tls://h/system?pkipath=/etc/capl/pki", "sets pkipath= itself")]
    #[case("qemu+libssh://h/system?known_hosts=/etc/capl/kh", "sets known_hosts= itself")]
    #[case("qemu+tls://h/system?PKIPATH=/etc/capl/pki", "sets pkipath= itself")]
    #[case("qemu+tls://h/system?%70kiPath=/etc/capl/pki", "sets pkipath= itself")]
    #[case("qemu+libssh://h/system?a=b;KeyFile=/etc/capl/id", "sets keyfile= itself")]
    #[case("qemu+libssh2://h/system?Known_Hosts=/etc/capl/kh", "sets known_hosts= itself")]
    #[case("qemu+TCP://h/system", "uses the tcp transport")]
    fn uris_that_cannot_take_a_secret_are_refused(#[case] uri: &str, #[case] why: &str) {
        let store = CredentialStore::new(scratch());
        let err = store.apply(uri, "ns", "s", &tls_data()).unwrap_err().message;
        assert!(err.contains(why) && err.contains(uri), "{err}");
        assert!(err.contains("remove credentialsRef"), "{err}");
        assert!(!store.root().exists(), "nothing written");
    }

    #[test]
    fn missing_keys_are_named_without_the_content() {
        let store = CredentialStore::new(scratch());
        let mut data = tls_data();
        data.remove("tls.key");
        data.insert("tls.crt".into(), Vec::new());
        let err = store.apply("qemu+tls://h/system", "ns", "s", &data).unwrap_err().message;
        assert_eq!(
            err,
            "Secret ns/s has no non-empty \"tls.crt\", \"tls.key\": a qemu+tls URI needs the keys \"ca.crt\", \
             \"tls.crt\", \"tls.key\" in it; add them to the Secret"
        );
        assert!(!err.contains("CA"), "no content in messages");
    }

    /// One Secret cannot hold more than its bound, and all Secrets together
    /// not more than theirs; each refusal names the Secret, the sizes and the
    /// fix, and writes nothing. Replacing a Secret's content does not count
    /// its old files.
    #[test]
    fn the_scratch_directory_is_bounded_per_secret_and_in_total() {
        let root = scratch();
        let store = CredentialStore::new(&root).with_limits(100, 250);
        let sized = |n: usize| -> BTreeMap<String, Vec<u8>> {
            [("ca.crt", n), ("tls.crt", 10), ("tls.key", 10)]
                .into_iter()
                .map(|(k, len)| (k.to_string(), vec![b'x'; len]))
                .collect()
        };
        let uri = "qemu+tls://h/system";
        let refused = store.apply(uri, "ns", "big", &sized(81)).unwrap_err();
        assert!(!refused.retry_later, "only a change of the Secret helps");
        let err = refused.message;
        assert!(
            err.starts_with("Secret ns/big holds 101 bytes in \"ca.crt\", \"tls.crt\", \"tls.key\", more than the 100"),
            "{err}"
        );
        assert!(!root.join("ns").exists(), "nothing written");

        store.apply(uri, "ns", "a", &sized(80)).unwrap();
        store.apply(uri, "ns", "b", &sized(80)).unwrap();
        let refused = store.apply(uri, "other", "c", &sized(80)).unwrap_err();
        assert!(refused.retry_later, "fits once other Secrets are gone");
        let err = refused.message;
        assert!(
            err.starts_with("the credentials of Secret other/c (100 bytes) do not fit: the Secrets the manager has written hold 200 bytes, and all together may hold 250"),
            "{err}"
        );
        assert!(!root.join("other").exists(), "nothing written");
        // A new content of a Secret replaces its old one in the count.
        store.apply(uri, "ns", "b", &sized(79)).unwrap();
        assert_eq!(store.forget(|_, name| name != "b"), 1);
        store.apply(uri, "other", "c", &sized(80)).expect("fits once b is forgotten");
        fs::remove_dir_all(root).unwrap();
    }

    /// What an earlier process wrote is removed at start; anything else in
    /// the directory is left alone.
    #[test]
    fn files_of_a_previous_process_are_removed_and_nothing_else() {
        let root = scratch();
        let store = CredentialStore::new(&root);
        store.apply("qemu+tls://h/system", "ns", "s", &tls_data()).unwrap();
        fs::create_dir_all(root.join("ns/.staging-s-1-0")).unwrap();
        fs::create_dir_all(root.join("keep/not-ours")).unwrap();
        fs::write(root.join("keep/file.0123456789abcdef"), "a file, not a directory").unwrap();
        drop(store);

        assert_eq!(CredentialStore::remove_previous(&root).unwrap(), 2);
        assert!(!root.join("ns").exists(), "the emptied namespace directory is removed");
        assert!(root.join("keep/not-ours").is_dir() && root.join("keep/file.0123456789abcdef").is_file());
        assert_eq!(CredentialStore::remove_previous(&root.join("missing")).unwrap(), 0);
        fs::remove_dir_all(root).unwrap();
    }
}
