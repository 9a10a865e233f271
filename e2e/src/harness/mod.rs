//! What every scenario, the demo and the benchmarks run on: a [`stack::Stack`]
//! (a libvirt host, a management cluster, the provider), the management
//! cluster's kinds ([`management`], [`kind_cluster`]), the provider as a
//! process or a Pod ([`provider`], [`provider_process`]), the host as `virsh`
//! sees it ([`host_view`]), clusterctl and the release as a local repository
//! ([`clusterctl`]) and clusterctl's inventory ([`inventory`]), a node image
//! served over HTTP ([`file_server`]), the objects
//! ([`objects`]), the machines as the checks see them ([`machines`]), bounded
//! waits ([`wait`]) and progress lines ([`progress`]).

pub mod clusterctl;
pub mod file_server;
pub mod github_release;
pub mod host_view;
pub mod inventory;
pub mod kind_cluster;
pub mod machines;
pub mod management;
pub mod objects;
pub mod progress;
pub mod provider;
pub mod provider_process;
pub mod stack;
pub mod wait;
