//! The simulator's error: libvirt's `virErrorNumber` and a message worded like libvirt's.

use std::fmt;

/// The `virErrorNumber` values the simulator returns (numbers from libvirt's `virterror.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorCode {
    /// VIR_ERR_INTERNAL_ERROR: also what a closed client socket reports.
    InternalError = 1,
    /// VIR_ERR_NO_SUPPORT
    NoSupport = 3,
    /// VIR_ERR_NO_CONNECT
    NoConnect = 5,
    /// VIR_ERR_INVALID_ARG
    InvalidArg = 8,
    /// VIR_ERR_OPERATION_FAILED: libvirt's class for "already exists".
    OperationFailed = 9,
    /// VIR_ERR_NO_NAME
    NoName = 21,
    /// VIR_ERR_XML_ERROR
    XmlError = 27,
    /// VIR_ERR_DOM_EXIST
    DomExist = 28,
    /// VIR_ERR_XML_DETAIL: a malformed XML document.
    XmlDetail = 35,
    /// VIR_ERR_SYSTEM_ERROR: a failed system call (e.g. a missing file).
    SystemError = 38,
    /// VIR_ERR_NO_DOMAIN
    NoDomain = 42,
    /// VIR_ERR_NO_NETWORK
    NoNetwork = 43,
    /// VIR_ERR_NO_STORAGE_POOL
    NoStoragePool = 49,
    /// VIR_ERR_NO_STORAGE_VOL
    NoStorageVol = 50,
    /// VIR_ERR_OPERATION_INVALID
    OperationInvalid = 55,
    /// VIR_ERR_CONFIG_UNSUPPORTED
    ConfigUnsupported = 67,
    /// VIR_ERR_OPERATION_UNSUPPORTED
    OperationUnsupported = 84,
    /// VIR_ERR_STORAGE_VOL_EXIST
    StorageVolExist = 90,
}

impl ErrorCode {
    /// The numeric `virErrorNumber`.
    pub fn number(self) -> i32 {
        self as i32
    }

    /// The prefix libvirt puts before the detail for this code.
    fn prefix(self) -> &'static str {
        match self {
            ErrorCode::InternalError => "internal error: ",
            ErrorCode::NoSupport => "this function is not supported by the connection driver: ",
            ErrorCode::NoConnect => "no connection driver available for ",
            ErrorCode::InvalidArg => "invalid argument: ",
            ErrorCode::OperationFailed => "operation failed: ",
            ErrorCode::NoName => "",
            ErrorCode::XmlError => "XML error: ",
            ErrorCode::DomExist => "",
            ErrorCode::XmlDetail => "",
            ErrorCode::SystemError => "",
            ErrorCode::NoDomain => "Domain not found: ",
            ErrorCode::NoNetwork => "Network not found: ",
            ErrorCode::NoStoragePool => "Storage pool not found: ",
            ErrorCode::NoStorageVol => "Storage volume not found: ",
            ErrorCode::OperationInvalid => "Requested operation is not valid: ",
            ErrorCode::ConfigUnsupported => "unsupported configuration: ",
            ErrorCode::OperationUnsupported => "Operation not supported: ",
            ErrorCode::StorageVolExist => "",
        }
    }
}

/// An error from a simulated libvirt call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

impl Error {
    /// An error whose message is libvirt's prefix for `code` followed by `detail`,
    /// e.g. `Error::new(ErrorCode::NoDomain, "no domain with matching name 'x'")`
    /// reads "Domain not found: no domain with matching name 'x'".
    pub fn new(code: ErrorCode, detail: impl AsRef<str>) -> Self {
        let detail = detail.as_ref();
        let message = match code {
            ErrorCode::StorageVolExist => format!("storage volume {detail} exists already"),
            ErrorCode::DomExist => format!("domain {detail} exists already"),
            _ => format!("{}{detail}", code.prefix()),
        };
        Self { code, message }
    }

    /// An error with exactly this message (no prefix added).
    pub fn with_message(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// libvirt's numeric `virErrorNumber`.
    pub fn number(&self) -> i32 {
        self.code.number()
    }

    /// The whole message, as `virGetLastErrorMessage` would give it.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn no_domain(name: &str) -> Self {
        Self::new(ErrorCode::NoDomain, format!("no domain with matching name '{name}'"))
    }

    pub(crate) fn no_network(name: &str) -> Self {
        Self::new(ErrorCode::NoNetwork, format!("no network with matching name '{name}'"))
    }

    pub(crate) fn no_pool(name: &str) -> Self {
        Self::new(ErrorCode::NoStoragePool, format!("no storage pool with matching name '{name}'"))
    }

    pub(crate) fn no_volume(pool: &str, name: &str) -> Self {
        // libvirt's message names only the volume; the pool is implied by the lookup.
        let _ = pool;
        Self::new(ErrorCode::NoStorageVol, format!("no storage vol with matching name '{name}'"))
    }

    pub(crate) fn invalid(detail: impl AsRef<str>) -> Self {
        Self::new(ErrorCode::OperationInvalid, detail)
    }

    pub(crate) fn xml(detail: impl AsRef<str>) -> Self {
        Self::new(ErrorCode::XmlError, detail)
    }

    pub(crate) fn connection_closed() -> Self {
        Self::new(ErrorCode::InternalError, "client socket is closed")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (libvirt error {})", self.message, self.code.number())
    }
}

impl std::error::Error for Error {}

/// The simulator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
