//! What every scenario, the demo and the benchmarks run on: a [`stack::Stack`]
//! (a libvirt host, a management cluster, the provider), the management
//! cluster's kinds ([`management`], [`kind_cluster`]), the provider as a
//! process or a Pod ([`provider`], [`provider_process`]), the host as `virsh`
//! sees it ([`host_view`]), clusterctl and the release as a local repository
//! ([`clusterctl`]), objects as JSON ([`objects`]) and bounded waits ([`wait`]).

pub mod clusterctl;
pub mod host_view;
pub mod kind_cluster;
pub mod management;
pub mod objects;
pub mod provider;
pub mod provider_process;
pub mod stack;
pub mod wait;
