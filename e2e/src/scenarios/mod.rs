//! The e2e scenarios: real CAPI Machines become real VMs. Each runs in a
//! namespace of its own, on a running [`crate::harness::stack::Stack`], and
//! checks from the outside: API objects, `virsh`, and the guest's serial
//! console log. [`machine`] holds the machine scenarios; the others have files
//! of their own: [`init`] (the offline `clusterctl init`), [`deployed`] (the
//! provider's Pod as an operator checks it), [`multihost`] (one cluster over two hosts with IPAM),
//! [`clusterctl_move`] (`clusterctl move` of a running cluster), [`upgrade`]
//! (`clusterctl upgrade` from the previous release).
//! [`catalog`] lists them all with what each needs of the stack; [`suite`]
//! runs them. A real Kubernetes cluster formed and used as a user does is
//! `cargo xtask demo` ([`crate::demo`]), which `cargo xtask test` runs, and
//! Cluster API's own specs (`cargo xtask e2e capi`).

pub mod catalog;
pub mod clusterctl_move;
pub mod deployed;
pub mod init;
pub mod machine;
pub mod multihost;
pub mod suite;
pub mod upgrade;
