//! A control-plane endpoint from the LibvirtCluster's libvirt network: the highest free
//! address outside the DHCP range, recorded on the host as a DNS host entry named after
//! the LibvirtCluster, one per cluster, never an address some other entry names; deleting
//! the LibvirtCluster deletes its entry and nothing else.

use crate::support::*;
use capl::api::{ENDPOINT_DNS_HOST_ANNOTATION, LibvirtCluster};
use capl_host::hypervisor::{Hypervisor, NetworkUpdateCommand};
use capl_host::network_xml::parse_network;
use kube::ResourceExt;
use serde_json::json;

/// The network's DNS host entries: (address, names).
fn dns_hosts(w: &World) -> Vec<(String, Vec<String>)> {
    let info = parse_network(&w.inspect().network_xml(NETWORK).unwrap()).unwrap();
    info.dns_hosts.into_iter().map(|h| (h.ip.unwrap().to_string(), h.hostnames)).collect()
}

async fn cluster_with_network_endpoint(w: &World, name: &str) {
    let lc_name = format!("{name}-lc");
    let c: capl::api::capi::Cluster = w.apply(cluster_json(name, &lc_name, false)).await;
    let mut lc = libvirt_cluster_json(&lc_name, &w.uri, Some((name, &c.uid().unwrap())));
    lc["spec"]["controlPlaneEndpointFrom"] = json!({ "network": {}, "port": 6443 });
    let _: LibvirtCluster = w.apply(lc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_get_endpoints_from_the_libvirt_network_and_give_them_back() {
    let w = World::new("rc-net-vip").await;
    // Someone else's entry holds the highest address: it is skipped and never touched.
    let foreign = "<host ip='192.168.122.254'><hostname>someone-else</hostname></host>";
    w.inspect().network_update_dns_host(NETWORK, NetworkUpdateCommand::AddLast, foreign).unwrap();
    let _manager = w.start_manager();
    for name in ["one", "two"] {
        cluster_with_network_endpoint(&w, name).await;
    }
    let mut endpoints = Vec::new();
    for name in ["one", "two"] {
        let lc: LibvirtCluster = w
            .wait_for(&format!("{name}-lc"), "an endpoint from the network", |lc: &LibvirtCluster| {
                has(cluster_conditions(lc), "ControlPlaneEndpointReady", "True", None)
            })
            .await;
        let endpoint = lc.spec.control_plane_endpoint.clone().unwrap();
        assert_eq!(endpoint.port, 6443);
        let dns_name =
            lc.annotations().get(ENDPOINT_DNS_HOST_ANNOTATION).cloned().expect("the entry's name is recorded");
        assert_eq!(dns_name, format!("capl-endpoint-{}", lc.uid().unwrap()));
        endpoints.push((endpoint.host, dns_name));
    }
    let mut hosts: Vec<&str> = endpoints.iter().map(|(h, _)| h.as_str()).collect();
    hosts.sort();
    assert_eq!(hosts, ["192.168.122.252", "192.168.122.253"], "outside the DHCP range .100-.199, below the taken .254");
    let mut expected = vec![("192.168.122.254".to_string(), vec!["someone-else".to_string()])];
    expected.extend(endpoints.iter().map(|(ip, name)| (ip.clone(), vec![name.clone()])));
    let mut on_host = dns_hosts(&w);
    on_host.sort();
    expected.sort();
    assert_eq!(on_host, expected);
    let events = w.events("one-lc").await;
    assert!(events.iter().any(|(_, r, n)| r == "EndpointAllocated" && n.contains(&endpoints[0].1)), "{events:?}");

    w.delete::<LibvirtCluster>("one-lc").await;
    w.wait_gone::<LibvirtCluster>("one-lc").await;
    let mut left = dns_hosts(&w);
    left.sort();
    let mut expected: Vec<(String, Vec<String>)> = vec![
        ("192.168.122.254".to_string(), vec!["someone-else".to_string()]),
        (endpoints[1].0.clone(), vec![endpoints[1].1.clone()]),
    ];
    expected.sort();
    assert_eq!(left, expected, "only one-lc's entry went");
}

/// The API server refuses an endpoint from the network on a LibvirtCluster of several
/// hosts (each host's network is its own), and pool and network at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_from_the_network_needs_one_host_and_one_source() {
    let w = World::new("rc-net-vip-cel").await;
    let mut lc = libvirt_cluster_json("several", &w.uri, None);
    lc["spec"].as_object_mut().unwrap().remove("uri");
    lc["spec"]["hosts"] = json!([{ "name": "a", "uri": w.uri }]);
    lc["spec"]["controlPlaneEndpointFrom"] = json!({ "network": {} });
    let refused = |object: serde_json::Value| {
        let api = w.api::<LibvirtCluster>();
        let object: LibvirtCluster = serde_json::from_value(object).unwrap();
        async move { api.create(&Default::default(), &object).await.unwrap_err().to_string() }
    };
    let err = refused(lc).await;
    assert!(err.contains("needs the one-host form"), "{err}");
    let mut lc = libvirt_cluster_json("both", &w.uri, None);
    lc["spec"]["controlPlaneEndpointFrom"] = json!({
        "network": {},
        "pool": { "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p" },
    });
    let err = refused(lc).await;
    assert!(err.contains("set pool (an IPAM pool) or network"), "{err}");
}

/// The simulator under the URI the user wrote: the manager adds `pkipath=`
/// with the Secret's files to a `qemu+tls` URI, and the simulated host
/// answers to the URI without it.
struct WithoutQuery;

impl capl_host::hypervisor::Connector for WithoutQuery {
    fn connect(&self, uri: &str) -> capl_host::hypervisor::Result<std::sync::Arc<dyn Hypervisor>> {
        let plain = uri.split('?').next().unwrap_or(uri);
        capl_host::hypervisor::sim::SimConnector.connect(plain)
    }
}

/// `kubectl delete -f` of a cluster's manifests deletes the credentials
/// Secret together with the LibvirtCluster: the endpoint's DNS host entry is
/// released with the credentials last read, and the LibvirtCluster goes,
/// instead of waiting for a Secret that will not come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_is_released_when_its_credentials_secret_goes_first() {
    let w = World::new("rc-net-vip-creds").await;
    let uri = format!("qemu+tls://sim-tls-{}/system", w.ns);
    let host = capl_host::sim_host::register(&uri).unwrap();
    let connections = std::sync::Arc::new(capl_host::hypervisor::connections::Connections::new(
        std::sync::Arc::new(WithoutQuery),
        capl_host::hypervisor::connections::DEFAULT_MAX_CALLS_PER_HOST,
    ));
    let _manager = Manager::start(w.client.clone(), &w.ns, connections);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "kvm-tls" },
        "stringData": { "ca.crt": "CA", "tls.crt": "CERT", "tls.key": "KEY" },
    });
    let _: k8s_openapi::api::core::v1::Secret = w.apply(secret).await;
    let c: capl::api::capi::Cluster = w.apply(cluster_json("creds", "creds-lc", false)).await;
    let lc = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtCluster",
        "metadata": {
            "name": "creds-lc",
            "ownerReferences": [{ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "creds", "uid": c.uid().unwrap() }],
        },
        "spec": {
            "uri": uri,
            "network": capl_host::sim_host::NETWORK,
            "basePool": capl_host::sim_host::BASE_POOL,
            "domainPool": capl_host::sim_host::DOMAIN_POOL,
            "credentialsRef": { "name": "kvm-tls" },
            "controlPlaneEndpointFrom": { "network": {}, "port": 6443 },
        },
    });
    let _: LibvirtCluster = w.apply(lc).await;
    w.wait_for::<LibvirtCluster>("creds-lc", "an endpoint from the network", |lc| {
        has(cluster_conditions(lc), "ControlPlaneEndpointReady", "True", None)
    })
    .await;
    let entries = || {
        let hv = capl_host::hypervisor::sim::SimHypervisor::connect(&uri).unwrap();
        parse_network(&hv.network_xml(capl_host::sim_host::NETWORK).unwrap()).unwrap().dns_hosts.len()
    };
    assert_eq!(entries(), 1, "the endpoint's entry is on the host");

    w.delete::<k8s_openapi::api::core::v1::Secret>("kvm-tls").await;
    w.wait_gone::<k8s_openapi::api::core::v1::Secret>("kvm-tls").await;
    w.delete::<LibvirtCluster>("creds-lc").await;
    w.wait_gone::<LibvirtCluster>("creds-lc").await;
    assert_eq!(entries(), 0, "the entry was released with the credentials last read");
    drop(host);
}
