//! End-to-end harness: real CAPI Machines become real VMs.
//!
//! A [`stack::Stack`] is the private libvirtd of `cargo xtask host up` (or the
//! provider's simulator), a management cluster with CAPI's and our CRDs and
//! the CAPI core manager (the local control plane of the `testenv` crate, or
//! a kind cluster: [`management`]), and the provider binary as a process.
//! [`scenarios`] are the checks of issue 7, [`scenario_init`] the offline
//! `clusterctl init` and [`scenario_move`] the `clusterctl move` of issue 12
//! (with [`clusterctl`]: the release as a local repository, and clusterctl's
//! inventory), [`scenario_deployed`] the provider as a Pod of a kind cluster
//! (issue 14); [`suite`] runs them and prints
//! the summary, [`demo`] is `cargo xtask demo`.
//!
//! Entry points: the `capl-e2e` binary (`capl-e2e run`, `capl-e2e demo`),
//! started by `cargo xtask e2e` and `cargo xtask demo`, and `tests/e2e.rs`.

pub mod bench;
pub mod clusterctl;
pub mod demo;
pub mod host_view;
pub mod management;
pub mod objects;
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

/// The repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the repository")
        .to_path_buf()
}
