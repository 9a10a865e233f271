//! What the tests of the controllers on the private libvirtd share beyond
//! `capl_host_test_support::real_host`: a Cluster on the test host.

use capl::api::LibvirtCluster;
use capl::api::capi::Cluster;
use capl_host_test_support::host::Fixture;
use kube::ResourceExt;
use serde_json::json;

use crate::api_support::{World, cluster_json, libvirt_cluster_json};

/// Cluster `demo` with LibvirtCluster `demo-lc` at `uri` on the fixture's network and
/// pools, the Cluster marked infrastructure-provisioned as CAPI core would mark it.
pub async fn demo_cluster(w: &World, fx: &Fixture, uri: &str) {
    let c: Cluster = w.apply(cluster_json("demo", "demo-lc", true)).await;
    let mut lc = libvirt_cluster_json("demo-lc", uri, Some(("demo", &c.uid().unwrap())));
    lc["spec"]["network"] = json!(fx.network);
    lc["spec"]["basePool"] = json!(fx.base_pool);
    lc["spec"]["domainPool"] = json!(fx.domain_pool);
    let _: LibvirtCluster = w.apply(lc).await;
    let _: Cluster = w.patch_status("demo", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
}
