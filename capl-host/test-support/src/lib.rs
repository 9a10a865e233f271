//! What the integration tests of `capl-host` and of the provider share about a
//! libvirt host, imported as a crate:
//! - [`host`]: the host objects a test uses ([`host::Fixture`]), the machine
//!   spec it makes, and what it checks on any backend (leftovers, DHCP
//!   entries, a machine made exactly once);
//! - [`real_host`]: the private test libvirtd (`cargo xtask host up`): a
//!   checked connection, what it holds of a test, the clean-up of a failed
//!   run, the bootable guest image as a volume;
//! - [`real_daemon`]: who uses that daemon in one test process (a test that
//!   kills it takes it alone), and the summaries the suites write.

pub mod host;
pub mod real_daemon;
pub mod real_host;
