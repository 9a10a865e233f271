//! Tests that need the local control plane: a real kube-apiserver and etcd,
//! and for most also CAPI core (binaries built by `cargo xtask control-plane
//! build`, started per test process by the `testenv` crate). The libvirt host
//! is the simulator, embedded in the test or in the manager binary
//! (`--hypervisor sim`). Without the control plane every test fails naming
//! that command.

use capl_test_support::{api_server as support, clusterctl_template};

mod faults_at_scale;
mod kcp_failure_domains;
mod machine_health_check;
mod manager_binary;
mod manifests_on_api_server;
mod reconcile_bounded_state;
mod reconcile_cluster;
mod reconcile_credentials;
mod reconcile_deletion;
mod reconcile_domain_lost;
mod reconcile_events;
mod reconcile_gates;
mod reconcile_hosts;
mod reconcile_hung_host;
mod reconcile_image_url;
mod reconcile_ipam;
mod reconcile_machine;
mod reconcile_manager_binary;
mod reconcile_move;
mod reconcile_network_endpoint;
mod reconcile_remediation;
mod reconcile_restart;
mod reconcile_template;
mod reconcile_uri_policy;
