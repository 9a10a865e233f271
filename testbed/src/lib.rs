//! What `cargo xtask` (which builds and starts things), `testenv` (which runs
//! them for the tests), the e2e suite and the integration tests share, so that
//! each fact has one place:
//! - [`control_plane_versions`]: the pinned versions of the local control
//!   plane, CAPI, the node image's parts, and where they are cached;
//! - [`test_host`]: the private libvirtd's contract (its network, pools,
//!   directories, TLS listener) between `cargo xtask host up` and the tests;
//! - [`env`]: the environment variables through which the tasks hand built
//!   artifacts to the tests and the e2e runner;
//! - [`certificates`]: the test PKI (a CA and the certificates it signs);
//! - [`wait`]: the one bounded wait (blocking, and async with the `tokio`
//!   feature) of the tests, the e2e suite and the benchmarks.
//! - [`private_libvirtd`]: the one launcher of a private libvirtd (the test
//!   host's, the lab's) and the one `qemu.conf` of every private libvirtd,
//!   the containerized one included.
//!
//! It depends on `std`, `anyhow` and `rcgen` only (and `tokio` for the async
//! wait, a feature xtask leaves off), so that xtask builds it in seconds
//! before it builds anything else.

pub mod certificates;
pub mod control_plane_versions;
pub mod env;
pub mod private_libvirtd;
pub mod test_host;
pub mod wait;
