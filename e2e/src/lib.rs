//! End-to-end tests, the demo and the benchmarks: real CAPI Machines become
//! real VMs.
//!
//! - [`harness`]: what everything runs on. A [`harness::stack::Stack`] is a
//!   libvirt host (the private libvirtd of `cargo xtask host up`, a
//!   containerized libvirtd reached over TLS, or the provider's simulator), a
//!   management cluster with CAPI's and our CRDs and the CAPI managers (the
//!   local control plane of the `testenv` crate, or a kind cluster made
//!   offline with everything installed by `clusterctl init`), and the provider
//!   (a local process, or the Pod of its Deployment in kind).
//! - [`scenarios`]: the checks, each in a namespace of its own, and
//!   [`scenarios::suite`], which runs those the stack can run and prints the
//!   summary.
//! - [`workload`]: a real Kubernetes cluster formed step by step, shared by the
//!   `workload` scenarios and the demo.
//! - [`demo`]: `cargo xtask demo`.
//! - [`bench`]: `cargo xtask bench`.
//!
//! Entry points: the `capl-e2e` binary (`capl-e2e run`, `capl-e2e demo`,
//! `capl-e2e bench`), started by `cargo xtask e2e`, `demo` and `bench`, and
//! `tests/e2e.rs`.

pub mod bench;
pub mod capi_specs;
pub mod demo;
pub mod harness;
pub mod scenarios;
pub mod workload;

/// The repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the repository")
        .to_path_buf()
}

/// A binary of the workspace in the target directory this process runs
/// from (`target/debug/` for `capl-e2e`, `target/debug/deps/..` for tests).
pub fn built_binary(name: &str) -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors().skip(1).take(2).map(|dir| dir.join(name)).find(|path| path.is_file())
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
