//! The e2e scenarios: real CAPI Machines become real VMs. Each runs in a
//! namespace of its own, on a running [`crate::harness::stack::Stack`], and
//! checks from the outside: API objects, `virsh`, and the guest's serial
//! console log. [`machine`] holds the machine scenarios; the others have files
//! of their own: [`init`] (the offline `clusterctl init`), [`deployed`] (the
//! provider's Pod as an operator checks it), [`workload`] (real Kubernetes
//! clusters), [`multihost`] (one cluster over two hosts with IPAM),
//! [`clusterctl_move`] (`clusterctl move` of a running cluster), [`upgrade`]
//! (`clusterctl upgrade` from the previous release).
//! [`catalog`] lists them all with what each needs of the stack; [`suite`]
//! runs them.

pub mod catalog;
pub mod clusterctl_move;
pub mod deployed;
pub mod init;
pub mod machine;
pub mod multihost;
pub mod suite;
pub mod upgrade;
pub mod workload;
