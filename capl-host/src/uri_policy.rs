//! Which libvirt URIs a LibvirtCluster may name.
//!
//! Opening a connection runs libvirt's client inside the manager process, and
//! some URIs make that client do more than talk to a daemon: the `ext`
//! transport and the `command=` parameter run a program, `netcat=` names a
//! program run on the remote host, `socket=` connects to any local socket,
//! `pkipath=`, `keyfile=` and `known_hosts=` read files, `test:///<path>`
//! parses a file, and `name=` hands another URI to the remote daemon. Anyone
//! who may create a LibvirtCluster could otherwise make the manager run
//! programs as its user or read its files (and see error text about them in a
//! condition). So, unless the manager is started with `--allow-unsafe-uris`:
//!
//! - the `ext` transport is refused;
//! - each query parameter must be on the allow-list of the URI's transport
//!   ([`allowed_parameters`]); any other parameter (`command`, `socket`,
//!   `name`, `netcat`, or one libvirt may learn later) is refused by name;
//! - `pkipath=`, `keyfile=` and `known_hosts=` must be absolute paths inside
//!   one of the credentials directories (`--credentials-dir`, default
//!   [`DEFAULT_CREDENTIALS_DIR`]), with no `..`, that the LibvirtCluster's
//!   namespace may use: the files there are the operator's, so each directory
//!   names its namespaces (`--credentials-dir DIR=team-a,team-b`, or `DIR=*`
//!   for every namespace) and one named without any is usable by none;
//! - `no_verify` (other than `0`) and `known_hosts_verify` (other than
//!   `normal`), which turn off the server's identity check, are refused;
//! - the test driver is allowed only as `test:///default` (in memory).
//!
//! libvirt reads a URI loosely, and the policy reads it the same way: the
//! scheme and parameter names are compared without regard to case
//! (`?Command=` is `command=`), names and values are percent-decoded first
//! (`%6Eo_verify=1` is `no_verify=1`), and parameters are split at `&` and
//! `;`.

use std::path::{Component, Path, PathBuf};

/// Where operators mount host credentials by default (the book's credentials page).
pub const DEFAULT_CREDENTIALS_DIR: &str = "/etc/capl";

/// The rules a URI is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriPolicy {
    /// `--allow-unsafe-uris`: accept every URI libvirt accepts.
    pub allow_unsafe: bool,
    /// Directories that file parameters may point into, each with the
    /// namespaces whose LibvirtClusters may do so.
    pub credentials_dirs: Vec<CredentialsDir>,
}

impl Default for UriPolicy {
    /// [`DEFAULT_CREDENTIALS_DIR`], usable by no namespace until the operator names some.
    fn default() -> Self {
        Self {
            allow_unsafe: false,
            credentials_dirs: vec![CredentialsDir::new(DEFAULT_CREDENTIALS_DIR, Namespaces::None)],
        }
    }
}

/// A directory of credential files the operator mounted into the manager
/// (`--credentials-dir DIR[=NAMESPACES]`), and who may name files in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialsDir {
    pub path: PathBuf,
    pub namespaces: Namespaces,
}

/// The namespaces whose LibvirtClusters may name a credentials directory's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// `DIR` alone: none (the directory is mounted, but no tenant was granted it).
    None,
    /// `DIR=*`: every namespace.
    All,
    /// `DIR=a,b`: these.
    Only(Vec<String>),
}

impl CredentialsDir {
    pub fn new(path: impl Into<PathBuf>, namespaces: Namespaces) -> Self {
        Self { path: path.into(), namespaces }
    }

    /// Reads `--credentials-dir`'s value: `DIR`, `DIR=*` or `DIR=ns1,ns2`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (path, list) = match text.split_once('=') {
            Some((path, list)) => (path, Some(list)),
            None => (text, None),
        };
        if !Path::new(path).is_absolute() || path == "/" {
            return Err(format!(
                "--credentials-dir {text}: {path:?} is not an absolute directory other than /; give e.g. \
                 /etc/capl/kvm1=team-a"
            ));
        }
        let namespaces = match list.map(str::trim) {
            None => Namespaces::None,
            Some("*") => Namespaces::All,
            Some(list) => {
                let names: Vec<String> = list.split(',').map(|n| n.trim().to_string()).collect();
                if let Some(bad) = names.iter().find(|n| !is_namespace_name(n)) {
                    return Err(format!(
                        "--credentials-dir {text}: {bad:?} is not a namespace name; list namespaces separated by \
                         commas (DIR=team-a,team-b), or * for every namespace"
                    ));
                }
                Namespaces::Only(names)
            }
        };
        Ok(Self { path: PathBuf::from(path), namespaces })
    }

    /// Whether LibvirtClusters in `namespace` may name this directory's files.
    pub fn allows(&self, namespace: &str) -> bool {
        match &self.namespaces {
            Namespaces::None => false,
            Namespaces::All => true,
            Namespaces::Only(names) => names.iter().any(|n| n == namespace),
        }
    }

    /// Whether `path` is a file inside this directory.
    fn holds(&self, path: &Path) -> bool {
        path.starts_with(&self.path) && path != self.path.as_path()
    }
}

/// A Kubernetes namespace name: an RFC 1123 label.
fn is_namespace_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// One query parameter of a URI as libvirt reads it: the name lowercased,
/// name and value percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub value: String,
}

/// The query parameters of `uri`, as libvirt's client reads them.
pub fn parameters(uri: &str) -> Vec<Parameter> {
    let query = uri.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let query = query.split('#').next().unwrap_or_default();
    query
        .split(['&', ';'])
        .filter(|p| !p.is_empty())
        .map(|param| {
            let (name, value) = param.split_once('=').unwrap_or((param, ""));
            Parameter { name: percent_decode(name).to_ascii_lowercase(), value: percent_decode(value) }
        })
        .collect()
}

/// The lowercased transport of `uri` (`tls` for `qemu+TLS://`), `None` for a
/// local URI without one.
pub fn transport(uri: &str) -> Option<String> {
    let scheme = uri.split_once("://").map(|(s, _)| s).unwrap_or(uri);
    scheme.split_once('+').map(|(_, t)| t.to_ascii_lowercase())
}

/// The parameters a URI of `transport` may carry under the default policy.
/// What each is for, in libvirt's remote driver: `mode` picks the daemon
/// (modular or monolithic) and `proxy` how the remote end is reached
/// (`auto`, `native` or `netcat`), both naming no program; `no_tty` keeps ssh
/// from asking for a password; `pkipath`, `keyfile` and `known_hosts` name
/// credential files (checked against the credentials directories);
/// `no_verify`, `known_hosts_verify`, `sshauth` and `tls_priority` tune the
/// identity check and the authentication methods (values checked below).
pub fn allowed_parameters(transport: Option<&str>) -> &'static [&'static str] {
    match transport {
        None | Some("unix") | Some("tcp") => &["mode"],
        Some("tls") => &["mode", "pkipath", "no_verify", "tls_priority"],
        Some("ssh") => &["mode", "proxy", "keyfile", "known_hosts", "no_tty"],
        Some("libssh" | "libssh2") => &["mode", "proxy", "keyfile", "known_hosts", "known_hosts_verify", "sshauth"],
        Some(_) => &[],
    }
}

impl UriPolicy {
    /// A policy that accepts everything (`--allow-unsafe-uris`).
    pub fn allow_all() -> Self {
        Self { allow_unsafe: true, ..Self::default() }
    }

    /// Whether a manager started without flags refuses `uri`. The default
    /// policy grants no credentials directory, so the namespace a
    /// LibvirtCluster is in does not change its answer: this is the answer for
    /// all of them (tools that start a manager ask it to know whether they
    /// must pass `--allow-unsafe-uris`).
    pub fn refused_by_default(uri: &str) -> bool {
        UriPolicy::default().check(uri, "default").is_err()
    }

    /// `Ok` when the manager may open `uri` for a LibvirtCluster in
    /// `namespace`; otherwise what is refused and what to do instead, as one
    /// sentence for a condition.
    pub fn check(&self, uri: &str, namespace: &str) -> Result<(), String> {
        if self.allow_unsafe {
            return Ok(());
        }
        let refuse = |what: String| {
            Err(format!(
                "the manager refuses URI {uri}: {what}; this manager does not allow it (it starts without \
                 --allow-unsafe-uris), so create a new LibvirtCluster with a URI without it"
            ))
        };
        let Some((scheme, rest)) = uri.split_once("://") else {
            return refuse("it is not of the form driver[+transport]://[host]/path".into());
        };
        let scheme = scheme.to_ascii_lowercase();
        let driver = scheme.split('+').next().unwrap_or_default();
        let transport = transport(uri);
        if transport.as_deref() == Some("ext") {
            return refuse("the ext transport runs a program named in the URI".into());
        }
        let location = rest.split(['?', '#']).next().unwrap_or_default();
        if driver == "test" && percent_decode(location) != "/default" {
            return refuse(format!("the test driver reads the file {location}; only test:///default is allowed"));
        }
        let allowed = allowed_parameters(transport.as_deref());
        for Parameter { name, value } in parameters(uri) {
            if !allowed.contains(&name.as_str()) {
                let what = match name.as_str() {
                    "command" => format!("command={value} runs a program"),
                    "netcat" => format!("netcat={value} names a program run on the remote host"),
                    "socket" => format!("socket={value} connects to a local socket of the manager"),
                    "name" => format!("name={value} makes the daemon open another URI"),
                    _ => String::new(),
                };
                let scheme_text = match &transport {
                    Some(t) => format!("the {t} transport"),
                    None => "a local URI".to_string(),
                };
                let list = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
                let what = if what.is_empty() { format!("the parameter {name}= is not allowed") } else { what };
                return refuse(format!("{what} ({scheme_text} allows only these parameters: {list})"));
            }
            match name.as_str() {
                "no_verify" if value != "0" => {
                    return refuse(format!("no_verify={value} turns off the server certificate check"));
                }
                "known_hosts_verify" if value != "normal" => {
                    return refuse(format!("known_hosts_verify={value} accepts an unknown host key"));
                }
                "proxy" if !matches!(value.as_str(), "auto" | "native" | "netcat") => {
                    return refuse(format!("proxy={value} is not one of auto, native, netcat"));
                }
                "pkipath" | "keyfile" | "known_hosts" => {
                    let path = Path::new(&value);
                    let plain = path.is_absolute()
                        && path.components().all(|c| !matches!(c, Component::ParentDir | Component::CurDir));
                    let dirs: Vec<&CredentialsDir> =
                        self.credentials_dirs.iter().filter(|d| plain && d.holds(path)).collect();
                    if dirs.is_empty() {
                        return refuse(format!(
                            "{name}={value} is not inside the credentials directories ({}); put the files there",
                            self.dirs_text()
                        ));
                    }
                    if !dirs.iter().any(|d| d.allows(namespace)) {
                        let dir = dirs[0].path.display();
                        return refuse(format!(
                            "{name}={value} is in the credentials directory {dir}, which the manager does not let \
                             namespace {namespace} use (its operator grants it with --credentials-dir \
                             {dir}={namespace}); or give the LibvirtCluster a credentialsRef to a Secret in its \
                             own namespace"
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn dirs_text(&self) -> String {
        self.credentials_dirs.iter().map(|d| d.path.display().to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// `%XX` escapes decoded to bytes (invalid escapes kept as written), read as
/// UTF-8 with replacement.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("qemu:///system")]
    #[case("qemu+tcp://kvm1.lab/system")]
    #[case("qemu+tls://kvm1.lab/system")]
    #[case("qemu+tls://kvm1.lab/system?pkipath=/etc/capl/pki/kvm1")]
    #[case("qemu+tls://kvm1.lab/system?no_verify=0")]
    #[case("qemu+libssh://root@kvm1.lab/system?keyfile=/etc/capl/ssh/id_ed25519&known_hosts=/etc/capl/ssh/known_hosts")]
    #[case("qemu+libssh2://root@kvm1.lab/system?sshauth=privkey&known_hosts_verify=normal")]
    #[case("qemu+ssh://root@kvm1.lab/system")]
    #[case("test:///default")]
    #[case("qemu+ssh://root@kvm1.lab/system?no_tty=1&proxy=native")]
    #[case("qemu+tls://kvm1.lab/system?tls_priority=NORMAL&mode=direct")]
    #[case("QEMU+TLS://kvm1.lab/system?PkiPath=/etc/capl/pki/kvm1")]
    fn safe_uris_pass(#[case] uri: &str) {
        assert_eq!(granted("/etc/capl=lab").check(uri, "lab"), Ok(()));
    }

    #[test]
    fn a_manager_without_flags_refuses_a_socket_and_takes_a_plain_remote_uri() {
        assert!(UriPolicy::refused_by_default("qemu+unix:///system?socket=/run/capl-libvirt/run/libvirt-sock"));
        assert!(UriPolicy::refused_by_default("qemu+tls://kvm1.lab/system?pkipath=/etc/capl/pki/kvm1"));
        assert!(!UriPolicy::refused_by_default("qemu+tls://kvm1.lab/system"));
    }

    /// The default policy with one credentials directory, as `--credentials-dir` reads it.
    fn granted(flag: &str) -> UriPolicy {
        UriPolicy { credentials_dirs: vec![CredentialsDir::parse(flag).unwrap()], ..UriPolicy::default() }
    }

    #[rstest::rstest]
    #[case("qemu+ext:///system?command=/tmp/x.sh", "the ext transport runs a program")]
    #[case("qemu+ssh://h/system?command=/tmp/fake-ssh", "command=/tmp/fake-ssh runs a program")]
    #[case("qemu+unix:///system?socket=/run/other/sock", "socket=/run/other/sock connects")]
    #[case("qemu+tcp://h/system?name=test:///etc/shadow", "name=test:///etc/shadow")]
    #[case("qemu+tls://h/system?no_verify=1", "no_verify=1 turns off")]
    #[case("qemu+tls://h/system?%6Eo_verify=1", "no_verify=1 turns off")]
    #[case(
        "qemu+tls://h/system?pkipath=/etc/ssl",
        "pkipath=/etc/ssl is not inside the credentials directories (/etc/capl)"
    )]
    #[case("qemu+tls://h/system?pkipath=/etc/capl/../ssl", "pkipath=/etc/capl/../ssl is not inside")]
    #[case("qemu+tls://h/system?pkipath=%2Fetc%2Fcapl%2F..%2Froot", "pkipath=/etc/capl/../root is not inside")]
    #[case("qemu+libssh://h/system?keyfile=/root/.ssh/id_rsa", "keyfile=/root/.ssh/id_rsa is not inside")]
    #[case("qemu+libssh://h/system?mode=auto;known_hosts=/etc/passwd", "known_hosts=/etc/passwd is not inside")]
    #[case("qemu+libssh://h/system?known_hosts_verify=ignore", "known_hosts_verify=ignore accepts")]
    #[case("test:///etc/passwd", "the test driver reads the file /etc/passwd")]
    #[case("qemu+ssh://anyhost/system?Command=/tmp/x", "command=/tmp/x runs a program")]
    #[case("qemu+ssh://anyhost/system?COMMAND=/tmp/x", "command=/tmp/x runs a program")]
    #[case("qemu+ssh://anyhost/system?%43ommand=/tmp/x", "command=/tmp/x runs a program")]
    #[case("qemu+ssh://anyhost/system?%63%6f%6d%6d%61%6e%64=/tmp/x", "command=/tmp/x runs a program")]
    #[case("qemu+ssh://anyhost/system?no_tty=1;Command=/tmp/x", "command=/tmp/x runs a program")]
    #[case("qemu+ssh://h/system?netcat=/tmp/nc", "netcat=/tmp/nc names a program run on the remote host")]
    #[case("qemu+ssh://h/system?NetCat=/tmp/nc", "netcat=/tmp/nc names a program run on the remote host")]
    #[case("qemu+unix:///system?Socket=/run/other/sock", "socket=/run/other/sock connects")]
    #[case("qemu:///system?SOCKET=/run/other/sock", "socket=/run/other/sock connects")]
    #[case("qemu+tcp://h/system?Name=test:///etc/shadow", "name=test:///etc/shadow")]
    #[case("qemu+tls://h/system?No_Verify=1", "no_verify=1 turns off")]
    #[case("qemu+tls://h/system?NO_VERIFY=yes", "no_verify=yes turns off")]
    #[case("qemu+tls://h/system?PKIPATH=/etc/ssl", "pkipath=/etc/ssl is not inside")]
    #[case("qemu+libssh://h/system?Known_Hosts_Verify=Ignore", "known_hosts_verify=Ignore accepts")]
    #[case("qemu+libssh://h/system?KeyFile=/root/.ssh/id_rsa", "keyfile=/root/.ssh/id_rsa is not inside")]
    #[case("QEMU+EXT:///system?command=/tmp/x", "the ext transport runs a program")]
    #[case("qemu+Ext:///system", "the ext transport runs a program")]
    #[case("TEST:///etc/passwd", "the test driver reads the file /etc/passwd")]
    #[case("qemu+ssh://h/system?proxy=/tmp/x", "proxy=/tmp/x is not one of auto, native, netcat")]
    #[case(
        "qemu+tcp://h/system?pkipath=/etc/capl/pki",
        "the parameter pkipath= is not allowed (the tcp transport allows only these parameters: mode)"
    )]
    #[case(
        "qemu+tls://h/system?Future_Option=1",
        "the parameter future_option= is not allowed (the tls transport allows only these parameters: mode, pkipath, no_verify, tls_priority)"
    )]
    #[case(
        "qemu:///system?keyfile=/etc/capl/id",
        "the parameter keyfile= is not allowed (a local URI allows only these parameters: mode)"
    )]
    fn unsafe_uris_are_refused_with_the_reason(#[case] uri: &str, #[case] why: &str) {
        let message = granted("/etc/capl=*").check(uri, "lab").unwrap_err();
        assert!(message.contains(why), "{message}");
        assert!(message.contains(&format!("refuses URI {uri}")), "names the URI: {message}");
        assert!(message.contains("--allow-unsafe-uris") && message.contains("new LibvirtCluster"), "{message}");
        assert_eq!(UriPolicy::allow_all().check(uri, "lab"), Ok(()), "--allow-unsafe-uris accepts {uri}");
    }

    #[test]
    fn parameters_are_read_as_libvirt_reads_them() {
        let params = parameters("qemu+tls://h/system?PkiPath=%2Fetc%2Fcapl;No%5FVerify=0&&x#frag=1");
        let pairs: Vec<(&str, &str)> = params.iter().map(|p| (p.name.as_str(), p.value.as_str())).collect();
        assert_eq!(pairs, [("pkipath", "/etc/capl"), ("no_verify", "0"), ("x", "")]);
        assert_eq!(transport("qemu+TLS://h/system").as_deref(), Some("tls"));
        assert_eq!(transport("qemu:///system"), None);
    }

    #[test]
    fn other_credentials_directories_can_be_configured() {
        let policy = granted("/var/run/capl-credentials=*");
        assert_eq!(policy.check("qemu+tls://h/system?pkipath=/var/run/capl-credentials/ns/c", "lab"), Ok(()));
        assert!(policy.check("qemu+tls://h/system?pkipath=/etc/capl/pki", "lab").is_err());
        assert!(
            policy.check("qemu+tls://h/system?pkipath=/var/run/capl-credentials", "lab").is_err(),
            "the directory itself"
        );
        assert!(policy.check("qemu+tls://h/system?pkipath=var/run/capl-credentials/x", "lab").is_err(), "relative");
    }

    #[test]
    fn a_credentials_directory_names_the_namespaces_that_may_use_it() {
        assert_eq!(CredentialsDir::parse("/etc/capl").unwrap().namespaces, Namespaces::None);
        assert_eq!(CredentialsDir::parse("/etc/capl=*").unwrap().namespaces, Namespaces::All);
        assert_eq!(
            CredentialsDir::parse("/etc/capl/kvm1=team-a, team-b").unwrap(),
            CredentialsDir::new("/etc/capl/kvm1", Namespaces::Only(vec!["team-a".into(), "team-b".into()]))
        );
        for (bad, says) in [
            ("etc/capl=team-a", "not an absolute directory"),
            ("/=team-a", "not an absolute directory"),
            ("/etc/capl=Team_A", "\"Team_A\" is not a namespace name"),
            ("/etc/capl=team-a,,team-b", "\"\" is not a namespace name"),
            ("/etc/capl=", "\"\" is not a namespace name"),
        ] {
            let err = CredentialsDir::parse(bad).unwrap_err();
            assert!(err.contains(says) && err.contains(&format!("--credentials-dir {bad}")), "{bad}: {err}");
        }

        let uri = "qemu+tls://kvm1.lab/system?pkipath=/etc/capl/kvm1/pki";
        // The default: the directory is known, but no namespace was granted it.
        let message = UriPolicy::default().check(uri, "team-a").unwrap_err();
        assert!(
            message.contains(
                "pkipath=/etc/capl/kvm1/pki is in the credentials directory /etc/capl, which the manager does not \
                 let namespace team-a use (its operator grants it with --credentials-dir /etc/capl=team-a)"
            ),
            "{message}"
        );
        assert!(message.contains("credentialsRef"), "{message}");
        let policy = UriPolicy {
            credentials_dirs: vec![
                CredentialsDir::parse("/etc/capl/kvm1=team-a").unwrap(),
                CredentialsDir::parse("/etc/capl/kvm2=team-b,team-c").unwrap(),
                CredentialsDir::parse("/etc/capl/shared=*").unwrap(),
            ],
            ..UriPolicy::default()
        };
        assert_eq!(policy.check(uri, "team-a"), Ok(()));
        assert!(policy.check(uri, "team-b").unwrap_err().contains("namespace team-b"));
        assert!(policy.check(uri, "team-ab").is_err(), "a whole name, not a prefix");
        let kvm2 = "qemu+libssh://root@kvm2.lab/system?keyfile=/etc/capl/kvm2/id&known_hosts=/etc/capl/kvm2/kh";
        assert_eq!(policy.check(kvm2, "team-c"), Ok(()));
        assert!(policy.check(kvm2, "team-a").unwrap_err().contains("keyfile=/etc/capl/kvm2/id"));
        // One file of another tenant's directory is enough to refuse.
        let mixed = "qemu+libssh://root@kvm2.lab/system?keyfile=/etc/capl/shared/id&known_hosts=/etc/capl/kvm1/kh";
        assert!(policy.check(mixed, "team-b").unwrap_err().contains("known_hosts=/etc/capl/kvm1/kh"));
        assert_eq!(policy.check("qemu+tls://h/system?pkipath=/etc/capl/shared/pki", "anyone"), Ok(()));
        assert_eq!(UriPolicy::allow_all().check(uri, "team-b"), Ok(()), "--allow-unsafe-uris accepts it");
    }
}
