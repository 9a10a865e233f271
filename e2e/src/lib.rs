//! End-to-end harness: real CAPI Machines become real VMs.
//!
//! A [`stack::Stack`] is a libvirt host (the private libvirtd of `cargo xtask
//! host up`, a containerized libvirtd reached over TLS, or the provider's
//! simulator), a management cluster with CAPI's and our CRDs and the CAPI
//! managers (the local control plane of the `testenv` crate, or a kind
//! cluster made offline with everything installed by `clusterctl init`:
//! [`management`], [`kind_cluster`]), and the provider ([`provider`]: a local
//! process, or the Pod of its Deployment in kind). [`scenarios`] are the
//! checks of real CAPI Machines becoming real VMs, [`scenario_init`] the
//! offline `clusterctl init` and [`scenario_move`] the `clusterctl move` of a
//! running cluster (with [`clusterctl`]: the release as a local repository,
//! and clusterctl's inventory), [`scenario_deployed`] the provider's Pod as an
//! operator checks it; [`suite`] runs those the stack can run and prints the summary,
//! [`demo`] is `cargo xtask demo`.
//!
//! Entry points: the `capl-e2e` binary (`capl-e2e run`, `capl-e2e demo`),
//! started by `cargo xtask e2e` and `cargo xtask demo`, and `tests/e2e.rs`.

pub mod bench;
pub mod clusterctl;
pub mod demo;
pub mod host_view;
pub mod kind_cluster;
pub mod management;
pub mod objects;
pub mod provider;
pub mod provider_process;
pub mod scenario_deployed;
pub mod scenario_init;
pub mod scenario_move;
pub mod scenario_multihost;
pub mod scenario_workload;
pub mod scenarios;
pub mod stack;
pub mod suite;
pub mod wait;
pub mod workload;

/// The repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the repository")
        .to_path_buf()
}

/// Runs `f`, which blocks (kind, kubectl, testcontainers' own runtime), from
/// async code: on a worker of a multi-threaded runtime the worker leaves the
/// runtime for it (`block_in_place`), elsewhere `f` just runs.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
