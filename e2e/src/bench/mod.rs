//! `capl-e2e bench <name>`, started by `cargo xtask bench`: what the provider
//! costs at scale, measured through the real parts.
//!
//! - [`scale`]: 1,000 machines on the embedded simulated host, through the
//!   local kube-apiserver with CAPI core: created at once, then deleted.
//! - [`steady`]: the same 1,000 left alone: what they cost per minute.
//! - [`overhead`]: 20 machines on the private libvirtd, each create step
//!   beside the same step done with virsh.
//! - [`contention`]: 100 machines at once on one real network.
//! - [`floor`]: the scale workload with no manager, the benchmark answering
//!   each LibvirtMachine with the least a provider must write: what CAPI
//!   core and the API server alone cost, the floor under `scale`.
//! - [`faults`]: machines on the simulated host through failing calls,
//!   dropped connections and a daemon restart, and beside a hung host.
//!
//! What they share: [`stack`] (the control plane and the manager they run
//! on), [`workload`] (the objects they create and watch), [`metrics`] (what
//! they read off the manager, the API server and /proc) and [`report`] (the
//! tables and JSON they write).
//!
//! Each prints a table and writes `<out>/<name>.json`. Nothing here asserts a
//! time: the figures are printed; only correctness (leaks, duplicate
//! addresses) makes a run fail.

pub mod contention;
pub mod faults;
pub mod floor;
pub mod metrics;
pub mod overhead;
pub mod report;
pub mod scale;
pub mod stack;
pub mod steady;
pub mod workload;
