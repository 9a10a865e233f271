//! libvirt's errors as the provider sees them: [`HypervisorError`] keeps
//! libvirt's number and message, and [`kind_of`] is the one table that
//! classifies the numbers into the [`ErrorKind`]s the provider branches on.
//! Both backends use it: the real one with the `virErrorNumber` and error
//! domain libvirt reports, the simulator with the same numbers
//! (`libvirt_sim::ErrorCode` carries them). Where one number covers cases the
//! provider must tell apart, the message predicates below do it, here and
//! nowhere else.

use std::fmt;

/// A libvirt error class, with libvirt's numeric code kept alongside.
///
/// The variants are the classes the provider branches on; anything else is
/// `Other`. Codes follow `virErrorNumber` in libvirt's `virterror.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// VIR_ERR_NO_DOMAIN (42)
    NoDomain,
    /// VIR_ERR_NO_NETWORK (43)
    NoNetwork,
    /// VIR_ERR_NO_STORAGE_POOL (49)
    NoStoragePool,
    /// VIR_ERR_NO_STORAGE_VOL (50)
    NoStorageVol,
    /// VIR_ERR_NO_INTERFACE (57): no host interface of that name.
    NoInterface,
    /// VIR_ERR_NO_SUPPORT (3): the connection's driver does not implement the
    /// call (e.g. interface calls on a libvirtd without its interface driver).
    NoSupport,
    /// VIR_ERR_OPERATION_INVALID (55): e.g. starting a running domain, using an inactive pool.
    OperationInvalid,
    /// VIR_ERR_INVALID_ARG (8)
    InvalidArg,
    /// VIR_ERR_XML_ERROR (27) and VIR_ERR_XML_DETAIL (35): malformed or unacceptable XML.
    XmlError,
    /// VIR_ERR_OPERATION_FAILED (9): libvirt's class for "already exists" and similar.
    OperationFailed,
    /// VIR_ERR_DOM_EXIST (28): a define with a clashing name or UUID.
    DomainExists,
    /// VIR_ERR_STORAGE_VOL_EXIST (90)
    StorageVolExists,
    /// VIR_ERR_NO_CONNECT (5), VIR_ERR_RPC (39), VIR_ERR_SYSTEM_ERROR (38) on a
    /// broken connection: the caller should reconnect.
    ConnectionLost,
    /// Anything else.
    Other,
}

/// An error returned by a [`Hypervisor`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HypervisorError {
    pub kind: ErrorKind,
    /// libvirt's numeric `virErrorNumber`, 0 when not from libvirt.
    pub code: i32,
    /// libvirt's message (or the simulator's comparable one).
    pub message: String,
}

impl HypervisorError {
    pub fn new(kind: ErrorKind, code: i32, message: impl Into<String>) -> Self {
        Self { kind, code, message: message.into() }
    }

    /// The source of [`super::Hypervisor::volume_upload_from`] failed after
    /// `offset` bytes: kind `Other`, the message starting "reading the
    /// upload's source".
    pub fn upload_source_failed(pool: &str, name: &str, offset: u64, e: std::io::Error) -> Self {
        Self::new(
            ErrorKind::Other,
            0,
            format!("reading the upload's source for volume {name} in pool {pool} after {offset} bytes: {e}"),
        )
    }

    /// The source of [`super::Hypervisor::volume_upload_from`] gave `given`
    /// bytes (or more, when past), not the `length` announced.
    pub fn upload_length_mismatch(pool: &str, name: &str, length: u64, given: u64, past: bool) -> Self {
        let what = if past {
            format!("more than the {length} bytes announced (the rest was not sent)")
        } else {
            format!("{given} of the {length} bytes announced")
        };
        Self::new(
            ErrorKind::Other,
            0,
            format!("upload to volume {name} in pool {pool}: its source gave {what}; the stream was aborted"),
        )
    }

    /// True for the "no such object" classes, which delete paths tolerate.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::NoDomain | ErrorKind::NoNetwork | ErrorKind::NoStoragePool | ErrorKind::NoStorageVol
        )
    }
}

impl fmt::Display for HypervisorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (libvirt error {})", self.message, self.code)
    }
}

impl std::error::Error for HypervisorError {}

pub type Result<T, E = HypervisorError> = std::result::Result<T, E>;

/// libvirt's `virErrorNumber` values the table below names.
mod code {
    pub const INTERNAL_ERROR: i32 = 1;
    pub const NO_SUPPORT: i32 = 3;
    pub const NO_CONNECT: i32 = 5;
    pub const INVALID_CONN: i32 = 6;
    pub const INVALID_ARG: i32 = 8;
    pub const OPERATION_FAILED: i32 = 9;
    pub const XML_ERROR: i32 = 27;
    pub const DOM_EXIST: i32 = 28;
    pub const XML_DETAIL: i32 = 35;
    pub const SYSTEM_ERROR: i32 = 38;
    pub const RPC: i32 = 39;
    pub const NO_DOMAIN: i32 = 42;
    pub const NO_NETWORK: i32 = 43;
    pub const NO_STORAGE_POOL: i32 = 49;
    pub const NO_STORAGE_VOL: i32 = 50;
    pub const OPERATION_INVALID: i32 = 55;
    pub const NO_INTERFACE: i32 = 57;
    pub const STORAGE_VOL_EXIST: i32 = 90;
}

/// The [`ErrorKind`] of libvirt error number `number` (`virErrorNumber`).
///
/// `transport` says whether the error came from the transport rather than a
/// driver: libvirt's RPC or remote error domain on a real connection, a
/// connection that is no longer alive on the simulator. A broken transport
/// shows up as `VIR_ERR_NO_CONNECT`, `VIR_ERR_INVALID_CONN` (a closed
/// connection object), `VIR_ERR_RPC`, or as `VIR_ERR_SYSTEM_ERROR` /
/// `VIR_ERR_INTERNAL_ERROR` raised by the transport ("client socket is
/// closed", "Cannot write data: Broken pipe"). The same two numbers from a
/// driver (a missing file in a pool, say) are not a lost connection.
pub fn kind_of(number: i32, transport: bool) -> ErrorKind {
    match number {
        code::NO_DOMAIN => ErrorKind::NoDomain,
        code::NO_NETWORK => ErrorKind::NoNetwork,
        code::NO_STORAGE_POOL => ErrorKind::NoStoragePool,
        code::NO_STORAGE_VOL => ErrorKind::NoStorageVol,
        code::NO_INTERFACE => ErrorKind::NoInterface,
        code::NO_SUPPORT => ErrorKind::NoSupport,
        code::OPERATION_INVALID => ErrorKind::OperationInvalid,
        code::INVALID_ARG => ErrorKind::InvalidArg,
        code::XML_ERROR | code::XML_DETAIL => ErrorKind::XmlError,
        code::OPERATION_FAILED => ErrorKind::OperationFailed,
        code::DOM_EXIST => ErrorKind::DomainExists,
        code::STORAGE_VOL_EXIST => ErrorKind::StorageVolExists,
        code::NO_CONNECT | code::INVALID_CONN | code::RPC => ErrorKind::ConnectionLost,
        code::SYSTEM_ERROR | code::INTERNAL_ERROR if transport => ErrorKind::ConnectionLost,
        _ => ErrorKind::Other,
    }
}

impl HypervisorError {
    /// A define refused because a domain with this name or UUID exists:
    /// `VIR_ERR_DOM_EXIST`, or `VIR_ERR_OPERATION_FAILED` "... already exists
    /// with uuid ..." (the QEMU and test drivers).
    pub fn is_domain_exists(&self) -> bool {
        self.kind == ErrorKind::DomainExists
            || (self.kind == ErrorKind::OperationFailed && self.message.contains("already exists"))
    }

    /// A connect refused because of the credentials, on either side: libvirt's
    /// authentication errors (`VIR_ERR_AUTH_FAILED` 45, `VIR_ERR_AUTH_CANCELLED`
    /// 79, `VIR_ERR_AUTH_UNAVAILABLE` 94), a certificate check on our side
    /// (reported as a system error, 38), a daemon that drops the TLS session
    /// after the handshake because it does not trust our certificate ("Unable
    /// to read TLS confirmation"), and the libssh/libssh2 transports' host key
    /// and key checks (`VIR_ERR_LIBSSH` 98, `VIR_ERR_SSH` 85).
    pub fn is_auth_failure(&self) -> bool {
        const AUTH: [i32; 3] = [45, 79, 94];
        let text = self.message.to_ascii_lowercase();
        AUTH.contains(&self.code)
            || text.contains("certificate")
            || text.contains("tls confirmation")
            || text.contains("host key")
            || text.contains("known_hosts")
            || text.contains("authenticat")
            || text.contains("private key")
    }

    /// A start refused because the domain already runs (`VIR_ERR_OPERATION_INVALID`
    /// "domain is already running").
    pub fn is_already_running(&self) -> bool {
        self.kind == ErrorKind::OperationInvalid && self.message.contains("already running")
    }

    /// A volume call refused because its pool is not active
    /// (`VIR_ERR_OPERATION_INVALID` "storage pool '...' is not active").
    pub fn is_pool_inactive(&self) -> bool {
        self.kind == ErrorKind::OperationInvalid && self.message.contains("not active")
    }

    /// A file libvirt (or virtlogd) had to open under `dir` does not exist:
    /// "Unable to open file: <dir>/...: No such file or directory".
    pub fn is_missing_file_in(&self, dir: &str) -> bool {
        let Some((_, rest)) = self.message.split_once("Unable to open file: ") else { return false };
        let Some((path, _)) = rest.split_once(": No such file or directory") else { return false };
        path.rsplit_once('/').is_some_and(|(parent, _)| parent.trim_end_matches('/') == dir.trim_end_matches('/'))
    }

    /// The host network device a start needed and did not find: QEMU's driver says
    /// "Cannot get interface MTU on '<device>': No such device" when a network in forward
    /// mode bridge names a Linux bridge the host does not have (libvirt starts such a
    /// network without looking; only the guest's tap finds out).
    pub fn missing_device(&self) -> Option<&str> {
        let (before, _) = self.message.split_once("': No such device")?;
        let (_, device) = before.rsplit_once('\'')?;
        (!device.is_empty()).then_some(device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_bridge_is_named() {
        let e = HypervisorError {
            kind: ErrorKind::Other,
            code: 38,
            message: "Cannot get interface MTU on 'br-lab': No such device".into(),
        };
        assert_eq!(e.missing_device(), Some("br-lab"));
        let other = HypervisorError { message: "Unable to open file: /x/y: No such file or directory".into(), ..e };
        assert_eq!(other.missing_device(), None);
    }

    #[test]
    fn numbers_map_to_kinds() {
        let (driver, transport) = (false, true);
        assert_eq!(kind_of(42, driver), ErrorKind::NoDomain);
        assert_eq!(kind_of(43, driver), ErrorKind::NoNetwork);
        assert_eq!(kind_of(49, driver), ErrorKind::NoStoragePool);
        assert_eq!(kind_of(50, driver), ErrorKind::NoStorageVol);
        assert_eq!(kind_of(55, driver), ErrorKind::OperationInvalid);
        assert_eq!(kind_of(8, driver), ErrorKind::InvalidArg);
        assert_eq!(kind_of(27, driver), ErrorKind::XmlError);
        assert_eq!(kind_of(35, driver), ErrorKind::XmlError);
        assert_eq!(kind_of(9, driver), ErrorKind::OperationFailed);
        assert_eq!(kind_of(28, driver), ErrorKind::DomainExists);
        assert_eq!(kind_of(90, driver), ErrorKind::StorageVolExists);
        assert_eq!(kind_of(5, driver), ErrorKind::ConnectionLost);
        assert_eq!(kind_of(6, driver), ErrorKind::ConnectionLost);
        assert_eq!(kind_of(39, transport), ErrorKind::ConnectionLost);
        assert_eq!(kind_of(38, transport), ErrorKind::ConnectionLost);
        assert_eq!(kind_of(1, transport), ErrorKind::ConnectionLost);
        assert_eq!(kind_of(38, driver), ErrorKind::Other);
        assert_eq!(kind_of(1, driver), ErrorKind::Other);
        assert_eq!(kind_of(57, driver), ErrorKind::NoInterface);
        assert_eq!(kind_of(3, driver), ErrorKind::NoSupport);
        assert_eq!(kind_of(4, driver), ErrorKind::Other);
    }

    /// Messages the real libvirt 11.3 gave in the remote_credentials tests.
    #[rstest::rstest]
    #[case(
        38,
        "Our own certificate /d/clientcert.pem failed validation against /d/cacert.pem: The certificate hasn't got a known issuer.",
        true
    )]
    #[case(45, "authentication failed: Failed to verify peer's certificate", true)]
    #[case(38, "Unable to read TLS confirmation: Input/output error", true)]
    #[case(38, "Cannot read CA certificate '/d/cacert.pem': No such file or directory", true)]
    #[case(
        98,
        "libssh transport error: No user interaction callback provided: Can't verify the session host key",
        true
    )]
    #[case(85, "SSH transport error: No user interaction callback provided: Can't verify the session host key", true)]
    #[case(
        98,
        "libssh transport error: failed to authenticate: Access denied for 'publickey'. Authentication that can continue: publickey",
        true
    )]
    #[case(
        85,
        "SSH transport error: No user interaction callback provided: Can't retrieve private key passphrase",
        true
    )]
    #[case(98, "libssh transport error: Remote command terminated with non-zero code: -1", false)]
    #[case(38, "unable to connect to server at '127.0.0.1:16614': Connection refused", false)]
    #[case(1, "client socket is closed", false)]
    fn refused_credentials_are_told_from_an_unreachable_host(
        #[case] code: i32,
        #[case] message: &str,
        #[case] auth: bool,
    ) {
        assert_eq!(HypervisorError::new(ErrorKind::Other, code, message).is_auth_failure(), auth, "{message}");
    }

    #[test]
    fn message_predicates() {
        let e = |kind, message: &str| HypervisorError::new(kind, 0, message);
        assert!(e(ErrorKind::DomainExists, "x").is_domain_exists());
        assert!(e(ErrorKind::OperationFailed, "domain 'a' already exists with uuid u").is_domain_exists());
        assert!(!e(ErrorKind::OperationFailed, "something else").is_domain_exists());
        assert!(
            e(ErrorKind::OperationInvalid, "Requested operation is not valid: domain is already running")
                .is_already_running()
        );
        assert!(!e(ErrorKind::Other, "domain is already running").is_already_running());
        assert!(e(ErrorKind::OperationInvalid, "storage pool 'p' is not active").is_pool_inactive());
        let missing =
            e(ErrorKind::Other, "Unable to open file: /var/log/capl/d-console.log: No such file or directory");
        assert!(missing.is_missing_file_in("/var/log/capl"));
        assert!(!missing.is_missing_file_in("/var/log"));
    }
}
