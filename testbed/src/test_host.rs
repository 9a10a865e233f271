//! The test host contract: what `cargo xtask host up` provides and what the
//! tests, the e2e harness and the demo expect of it.
//!
//! This file is the single source of these facts for every side: `cargo xtask
//! host`, the integration tests of capl-host and of the provider, and the
//! `e2e` crate. Changing a name here changes it everywhere.
//!
//! The host is a private libvirtd with:
//! - the NAT network [`NETWORK`] on the bridge [`BRIDGE`], subnet
//!   [`SUBNET_PREFIX`]`.0/24`, gateway `.1`, DHCP range
//!   `.`[`DHCP_FIRST`]`-.`[`DHCP_LAST`] (addresses above are free for
//!   control-plane endpoints);
//! - the dir pools [`BASE_POOL`] (base images) and [`DISK_POOL`] (machine disks
//!   and seed ISOs);
//! - its URI written to [`URI_FILE`] and printed as `export
//!   `[`URI_ENV`]`=<uri>`;
//! - a TLS listener on `127.0.0.1:`[`TLS_PORT`] with a server certificate for
//!   `127.0.0.1` and `localhost` signed by a test CA that `host up` generates
//!   once and keeps in [`PKI_DIR`]: [`TLS_CA_CERT`] and its key [`TLS_CA_KEY`]
//!   (root only), so tests can sign client certificates that the daemon
//!   accepts ([`tls_uri`] builds the URI). Remote SSH transports reach the same
//!   daemon through a test's own sshd that runs in the daemon's mount namespace
//!   ([`libssh_uri`], no `socket=` needed).

/// Persistent files of the private daemon: its config, its state, the pools, the PKI.
pub const STATE_DIR: &str = "/var/lib/capl-libvirt";
/// The private daemon's read-write unix socket (outside its mount namespace).
pub const SOCKET: &str = "/run/capl-libvirt/run/libvirt-sock";
/// The private daemon's pid file: a process that enters its mount namespace
/// (`/proc/<pid>/ns/mnt`) sees its socket at libvirt's default path,
/// `/run/libvirt/libvirt-sock`.
pub const LIBVIRTD_PID_FILE: &str = "/run/capl-libvirt/run/libvirtd.pid";
/// The TCP port the private daemon listens on for TLS, on 127.0.0.1 only
/// (libvirt's default is 16514; this one avoids a system libvirtd's).
pub const TLS_PORT: u16 = 16614;
/// The private daemon's PKI, generated once by `host up` and kept until `host down`.
pub const PKI_DIR: &str = "/var/lib/capl-libvirt/pki";
/// The test CA's certificate (PEM): it signs the daemon's server certificate
/// and every client certificate the daemon accepts.
pub const TLS_CA_CERT: &str = "/var/lib/capl-libvirt/pki/cacert.pem";
/// The test CA's private key (PEM, mode 0600): tests sign client certificates with it.
pub const TLS_CA_KEY: &str = "/var/lib/capl-libvirt/pki/cakey.pem";
/// The common name of the test CA (a CA is loaded back from its key and this name).
pub const TLS_CA_NAME: &str = "capl-test-libvirt-ca";

/// The environment variable that names the test libvirtd's URI.
pub const URI_ENV: &str = crate::env::TEST_LIBVIRT_URI;
/// Runtime files of the private daemon: sockets, pid files, the URI file.
pub const RUN_DIR: &str = "/run/capl-libvirt";
/// The file `cargo xtask host up` writes the URI to.
pub const URI_FILE: &str = "/run/capl-libvirt/uri";
/// The libvirt network of the test host.
pub const NETWORK: &str = "capl-test-net";
/// The Linux bridge of [`NETWORK`].
pub const BRIDGE: &str = "capltest0";
/// [`NETWORK`] is `<SUBNET_PREFIX>.0/24`.
pub const SUBNET_PREFIX: &str = "10.251.0";
/// First and last host number of [`NETWORK`]'s DHCP range.
pub const DHCP_FIRST: u8 = 2;
pub const DHCP_LAST: u8 = 99;
/// The storage pool that holds base images.
pub const BASE_POOL: &str = "capl-test-base";
/// The storage pool that holds machine disks and seed ISOs.
pub const DISK_POOL: &str = "capl-test-disks";
/// The command that starts the test host.
pub const UP_COMMAND: &str = "cargo xtask host up";
/// The pid file of the private virtlogd, as seen outside its mount namespace
/// (libvirtd's is [`LIBVIRTD_PID_FILE`]).
pub const VIRTLOGD_PID_FILE: &str = "/run/capl-libvirt/run/virtlogd.pid";
/// libvirtd's arguments, with the paths as seen inside the private mount
/// namespace (which virtlogd keeps alive): a test that killed libvirtd starts
/// it again with `nsenter --mount=/proc/<virtlogd>/ns/mnt libvirtd <these>`.
pub const LIBVIRTD_ARGS: [&str; 6] =
    ["-d", "--listen", "-f", "/etc/libvirt/libvirtd.conf", "-p", "/run/libvirt/libvirtd.pid"];

/// The test host's URI: [`URI_ENV`] when set, else the URI file a running
/// `cargo xtask host up` wrote. The error names the command that provides it.
pub fn uri() -> Result<String, String> {
    if let Ok(uri) = std::env::var(URI_ENV)
        && !uri.is_empty()
    {
        return Ok(uri);
    }
    match std::fs::read_to_string(URI_FILE) {
        Ok(uri) if !uri.trim().is_empty() => Ok(uri.trim().to_string()),
        _ => Err(format!(
            "no test libvirtd: {URI_ENV} is not set and {URI_FILE} does not exist. \
             Start the private libvirtd with `{UP_COMMAND}` (as root), or run everything with `cargo xtask test`"
        )),
    }
}

/// [`uri`], panicking with its message: for tests.
pub fn uri_or_panic() -> String {
    uri().unwrap_or_else(|message| panic!("{message}"))
}

/// An address of [`NETWORK`] outside its DHCP range (`.<host>`).
pub fn static_address(host: u8) -> String {
    assert!(host > DHCP_LAST, "{SUBNET_PREFIX}.{host} is inside the DHCP range");
    format!("{SUBNET_PREFIX}.{host}")
}

/// The XML of [`NETWORK`]: NAT, bridge [`BRIDGE`], `<SUBNET_PREFIX>.0/24` with
/// DHCP from `.DHCP_FIRST` to `.DHCP_LAST`. `cargo xtask host up` defines it on
/// the private daemon; the e2e stack on a containerized libvirtd defines the
/// same network there, so the scenarios see one layout on either host.
pub fn network_xml() -> String {
    let p = SUBNET_PREFIX;
    format!(
        "<network>\n  <name>{NETWORK}</name>\n  <forward mode='nat'/>\n  \
         <bridge name='{BRIDGE}' stp='on' delay='0'/>\n  \
         <ip address='{p}.1' netmask='255.255.255.0'>\n    <dhcp>\n      \
         <range start='{p}.{DHCP_FIRST}' end='{p}.{DHCP_LAST}'/>\n    </dhcp>\n  </ip>\n</network>\n"
    )
}

/// The XML of a directory storage pool `name` at `path`.
pub fn pool_xml(name: &str, path: &std::path::Path) -> String {
    format!(
        "<pool type='dir'>\n  <name>{name}</name>\n  <target>\n    <path>{}</path>\n  </target>\n</pool>\n",
        path.display()
    )
}

/// The TLS URI of the private daemon with the client PKI directory `pkipath`
/// (holding `cacert.pem`, `clientcert.pem` and `clientkey.pem`).
pub fn tls_uri(pkipath: &str) -> String {
    format!("qemu+tls://127.0.0.1:{TLS_PORT}/system?pkipath={pkipath}")
}

/// The URI of the private daemon through an sshd on `127.0.0.1:<ssh_port>` as
/// root, over `transport` (`libssh` or `libssh2`), with the private key
/// `keyfile` and the known hosts file `known_hosts`. The sshd must run in the
/// daemon's mount namespace (`testenv::remote_access::TestSshd` does), where
/// the daemon's socket is at libvirt's default path: libvirt's default
/// `proxy=auto` runs `virt-ssh-helper` there, which finds it (`nc -U` with
/// `&proxy=netcat` as well).
pub fn libssh_uri(transport: &str, ssh_port: u16, keyfile: &str, known_hosts: &str) -> String {
    format!(
        "qemu+{transport}://root@127.0.0.1:{ssh_port}/system?keyfile={keyfile}&known_hosts={known_hosts}&sshauth=privkey"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_are_in_the_run_directory() {
        for file in [LIBVIRTD_PID_FILE, VIRTLOGD_PID_FILE] {
            assert!(file.starts_with(&format!("{RUN_DIR}/run/")), "{file}");
        }
        assert!(LIBVIRTD_ARGS.contains(&"/run/libvirt/libvirtd.pid"));
    }

    #[test]
    fn static_addresses_are_outside_the_dhcp_range() {
        assert_eq!(static_address(250), format!("{SUBNET_PREFIX}.250"));
        assert!(std::panic::catch_unwind(|| static_address(DHCP_LAST)).is_err());
        const { assert!(DHCP_FIRST > 1, "the gateway is .1") };
    }

    #[test]
    fn paths_live_in_the_state_and_run_dirs() {
        for path in [PKI_DIR, TLS_CA_CERT, TLS_CA_KEY] {
            assert!(path.starts_with(STATE_DIR), "{path}");
        }
        assert!(TLS_CA_CERT.starts_with(PKI_DIR) && TLS_CA_KEY.starts_with(PKI_DIR));
        assert!(SOCKET.starts_with(RUN_DIR) && URI_FILE.starts_with(RUN_DIR) && LIBVIRTD_PID_FILE.starts_with(RUN_DIR));
        assert_eq!(tls_uri("/p"), "qemu+tls://127.0.0.1:16614/system?pkipath=/p");
        assert_eq!(
            libssh_uri("libssh", 2222, "/k/id", "/k/kh"),
            "qemu+libssh://root@127.0.0.1:2222/system?keyfile=/k/id&known_hosts=/k/kh&sshauth=privkey"
        );
    }
}
