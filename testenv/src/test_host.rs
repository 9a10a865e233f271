//! The test host contract: what `cargo xtask host up` provides and what the
//! tests, the e2e harness and the demo expect of it.
//!
//! This file is the single source of these facts for every side: `cargo xtask
//! host` (which includes it with `#[path]`, so it uses `std` only), the
//! provider's integration tests and the `e2e` crate (through the `testenv`
//! crate). Changing a name here changes it everywhere.
//!
//! The host is a private libvirtd with:
//! - the NAT network [`NETWORK`] on the bridge [`BRIDGE`], subnet
//!   [`SUBNET_PREFIX`]`.0/24`, gateway `.1`, DHCP range
//!   `.`[`DHCP_FIRST`]`-.`[`DHCP_LAST`] (addresses above are free for
//!   control-plane endpoints);
//! - the dir pools [`BASE_POOL`] (base images) and [`DISK_POOL`] (machine disks
//!   and seed ISOs);
//! - its URI written to [`URI_FILE`] and printed as `export
//!   `[`URI_ENV`]`=<uri>`.

/// The environment variable that names the test libvirtd's URI.
pub const URI_ENV: &str = "CAPL_TEST_LIBVIRT_URI";
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_addresses_are_outside_the_dhcp_range() {
        assert_eq!(static_address(250), format!("{SUBNET_PREFIX}.250"));
        assert!(std::panic::catch_unwind(|| static_address(DHCP_LAST)).is_err());
        const { assert!(DHCP_FIRST > 1, "the gateway is .1") };
    }
}
