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
//!   [`DEFAULT_CREDENTIALS_DIR`]), with no `..`;
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
    /// Directories that file parameters may point into.
    pub credentials_dirs: Vec<PathBuf>,
}

impl Default for UriPolicy {
    fn default() -> Self {
        Self { allow_unsafe: false, credentials_dirs: vec![PathBuf::from(DEFAULT_CREDENTIALS_DIR)] }
    }
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

    /// `Ok` when the manager may open `uri`; otherwise what is refused and
    /// what to do instead, as one sentence for a condition.
    pub fn check(&self, uri: &str) -> Result<(), String> {
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
                "pkipath" | "keyfile" | "known_hosts" if !self.inside_credentials_dirs(Path::new(&value)) => {
                    return refuse(format!(
                        "{name}={value} is not inside the credentials directories ({}); put the files there",
                        self.dirs_text()
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn inside_credentials_dirs(&self, path: &Path) -> bool {
        path.is_absolute()
            && path.components().all(|c| !matches!(c, Component::ParentDir | Component::CurDir))
            && self.credentials_dirs.iter().any(|dir| path.starts_with(dir) && path != dir.as_path())
    }

    fn dirs_text(&self) -> String {
        self.credentials_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
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
        assert_eq!(UriPolicy::default().check(uri), Ok(()));
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
        let message = UriPolicy::default().check(uri).unwrap_err();
        assert!(message.contains(why), "{message}");
        assert!(message.contains(&format!("refuses URI {uri}")), "names the URI: {message}");
        assert!(message.contains("--allow-unsafe-uris") && message.contains("new LibvirtCluster"), "{message}");
        assert_eq!(UriPolicy::allow_all().check(uri), Ok(()), "--allow-unsafe-uris accepts {uri}");
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
        let policy = UriPolicy { allow_unsafe: false, credentials_dirs: vec!["/var/run/capl-credentials".into()] };
        assert_eq!(policy.check("qemu+tls://h/system?pkipath=/var/run/capl-credentials/ns/c"), Ok(()));
        assert!(policy.check("qemu+tls://h/system?pkipath=/etc/capl/pki").is_err());
        assert!(policy.check("qemu+tls://h/system?pkipath=/var/run/capl-credentials").is_err(), "the directory itself");
        assert!(policy.check("qemu+tls://h/system?pkipath=var/run/capl-credentials/x").is_err(), "relative");
    }
}
