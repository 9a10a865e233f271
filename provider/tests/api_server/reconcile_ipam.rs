//! Addresses from IPAM pools (CAPI's IPAM contract): a LibvirtMachine with
//! spec.addressesFromPools claims its address, waits for it, and gives it to
//! the guest in a cloud-init network-config, on a network onto a host bridge
//! where libvirt runs no DHCP; its claims go with it.

use crate::support::*;
use capl::api::ipam::{IPAddress, IPAddressClaim};
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl_host::hypervisor::Hypervisor;
use kube::ResourceExt;
use serde_json::json;

/// A network onto the host bridge `br-lab`: libvirt gives its guests no address.
const BRIDGED: &str = "lab-bridged";

fn add_bridged_network(w: &World) {
    let conn = libvirt_sim::connect(&w.uri).unwrap();
    conn.network_define_xml(&format!(
        "<network><name>{BRIDGED}</name><forward mode='bridge'/><bridge name='br-lab'/></network>"
    ))
    .unwrap();
    conn.network_create(BRIDGED).unwrap();
}

fn pool_ref(name: &str) -> serde_json::Value {
    json!({ "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": name })
}

/// Machine + LibvirtMachine `name` of cluster `demo` with its address from `pool`.
pub async fn ipam_machine(w: &World, name: &str, pool: &str) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let m: capl::api::capi::Machine = w.apply(machine_json(name, "demo", name, Some(&secret))).await;
    let mut lm = libvirt_machine_json(name, "demo", Some((name, &m.uid().unwrap())));
    lm["spec"]["addressesFromPools"] = json!([pool_ref(pool)]);
    lm["spec"]["nameservers"] = json!(["10.77.0.2"]);
    let _: LibvirtMachine = w.apply(lm).await;
}

/// The cluster on the test's host, on the bridged network.
pub async fn bridged_cluster(w: &World) {
    add_bridged_network(w);
    let c: capl::api::capi::Cluster = w.apply(cluster_json("demo", "demo-lc", true)).await;
    let mut lc = libvirt_cluster_json("demo-lc", &w.uri, Some(("demo", &c.uid().unwrap())));
    lc["spec"]["network"] = json!(BRIDGED);
    let _: LibvirtCluster = w.apply(lc).await;
    let _: capl::api::capi::Cluster =
        w.patch_status("demo", json!({ "initialization": { "infrastructureProvisioned": true } })).await;
}

/// An InClusterIPPool `name` (prefix 24, gateway 10.77.0.1) of the in-cluster IPAM provider.
async fn create_pool(w: &World, name: &str, addresses: &str) {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("ipam.cluster.x-k8s.io", "v1alpha2", "InClusterIPPool"),
        "inclusterippools",
    );
    let pools: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(w.client.clone(), &w.ns, &resource);
    let pool: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
        "metadata": { "name": name },
        "spec": { "addresses": [addresses], "prefix": 24, "gateway": "10.77.0.1" },
    }))
    .unwrap();
    pools.create(&Default::default(), &pool).await.unwrap_or_else(|e| panic!("creating InClusterIPPool {name}: {e}"));
}

/// CAPI core and the in-cluster IPAM provider, for as long as the value lives, watching
/// only the test's namespace (the API server is shared with the other tests, among them
/// one that plays the IPAM provider itself).
async fn start_ipam(w: &World) -> testenv::CapiManager {
    w.env
        .start_capi(testenv::CapiOptions::new().without_core_webhooks().with_ipam_in_cluster().watch_namespace(&w.ns))
        .await
        .unwrap_or_else(|e| panic!("starting CAPI core and the in-cluster IPAM provider: {e:#}"))
}

fn internal_ips(lm: &LibvirtMachine) -> Vec<String> {
    let addresses = lm.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default();
    addresses.into_iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address).collect()
}

/// The seed ISO's network-config of the machine's domain, and the MAC of its interface.
pub fn seed_network_config(w: &World, domain: &str) -> (Option<String>, String) {
    let hv = w.inspect();
    let xml = hv.domain_xml(domain).unwrap();
    let mac = xml.split("<mac address='").nth(1).and_then(|rest| rest.split('\'').next()).unwrap().to_string();
    let seed = format!("{}{domain}{}", capl_host::naming::SEED_VOLUME_PREFIX, capl_host::naming::SEED_VOLUME_SUFFIX);
    let bytes = hv.volume_download(DOMAIN_POOL, &seed).unwrap();
    let text = capl_host::cloud_init::iso_file(&bytes, "network-config").map(|b| String::from_utf8(b).unwrap());
    (text, mac)
}

/// The provider claims, waits (saying why: the pool does not exist), and once an IPAM provider
/// (played by the test: the IPAddress and the claim's status, as CAPI's
/// contract has them) binds an address, the guest gets it from its seed's
/// network-config, found by its MAC, with the pool's gateway and the
/// nameservers; no DHCP entry is made. Deleting the machine deletes its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_takes_its_address_from_an_ipam_claim() {
    let w = World::new("rc-ipam").await;
    let _manager = w.start_manager();
    bridged_cluster(&w).await;
    ipam_machine(&w, "m0", "lab-pool").await;

    let claim: IPAddressClaim =
        w.wait_for("m0-0", "the machine's claim", |c: &IPAddressClaim| c.metadata.uid.is_some()).await;
    assert_eq!(claim.spec.pool_ref.name, "lab-pool");
    assert_eq!(claim.spec.cluster_name.as_deref(), Some("demo"));
    let owner = &claim.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("LibvirtMachine", "m0", Some(true)));
    // No pool of that name exists (the test plays the IPAM provider): said, and waited for.
    let lm: LibvirtMachine = w
        .wait_for("m0", "IPAddressPoolNotFound", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("IPAddressPoolNotFound"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(message.contains("IPAddressClaim m0-0") && message.contains("InClusterIPPool lab-pool"), "{message}");
    assert_eq!(w.inspect().domain_list().unwrap().len(), 0, "nothing is created before the address is known");

    // The IPAM provider's part.
    let _: IPAddress = w
        .apply(json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
            "metadata": { "name": "m0-0" },
            "spec": { "address": "10.77.0.10", "prefix": 24, "gateway": "10.77.0.1",
                      "claimRef": { "name": "m0-0" }, "poolRef": pool_ref("lab-pool") },
        }))
        .await;
    let _: IPAddressClaim = w.patch_status("m0-0", json!({ "addressRef": { "name": "m0-0" } })).await;

    let lm: LibvirtMachine = w.wait_for("m0", "ready", machine_ready).await;
    assert_eq!(internal_ips(&lm), vec!["10.77.0.10".to_string()]);
    let domain = lm.status.as_ref().and_then(|s| s.domain_name.clone()).unwrap();
    let (config, mac) = seed_network_config(&w, &domain);
    let config = config.expect("the seed has a network-config");
    assert!(config.contains(&format!("macaddress: \"{mac}\"")), "{config}");
    assert!(config.contains("- \"10.77.0.10/24\""), "{config}");
    assert!(config.contains("via: \"10.77.0.1\""), "{config}");
    assert!(config.contains("- \"10.77.0.2\""), "{config}");
    assert!(config.contains("dhcp4: false"), "{config}");
    let hosts = w.inspect().network_xml(NETWORK).unwrap();
    assert!(!hosts.contains(&domain), "no DHCP entry on the cluster's other network: {hosts}");

    w.delete::<capl::api::capi::Machine>("m0").await;
    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    assert!(w.api::<IPAddressClaim>().get_opt("m0-0").await.unwrap().is_none(), "the claim goes with the machine");
    assert_eq!(w.inspect().domain_list().unwrap().len(), 0);
}

/// With CAPI's in-cluster IPAM provider itself: two machines get the two
/// addresses of a pool (each in its guest's network-config); a third waits,
/// saying the pool is exhausted, and a fourth names a pool that does not
/// exist; neither creates anything. Deleting a machine releases its address,
/// and the waiting machine gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_share_an_in_cluster_pool_and_wait_when_it_is_exhausted() {
    let w = World::new("rc-ipam-pool").await;
    let capi = start_ipam(&w).await;
    let _manager = w.start_manager();
    bridged_cluster(&w).await;
    create_pool(&w, "lab-pool", "10.77.0.10-10.77.0.11").await;

    ipam_machine(&w, "m0", "lab-pool").await;
    ipam_machine(&w, "m1", "lab-pool").await;
    let mut given = Vec::new();
    for name in ["m0", "m1"] {
        let lm: LibvirtMachine = w.wait_for_within(WAIT, name, "ready", machine_ready).await;
        let ips = internal_ips(&lm);
        assert_eq!(ips.len(), 1, "{name}: {ips:?}");
        let domain = lm.status.as_ref().and_then(|s| s.domain_name.clone()).unwrap();
        let config = seed_network_config(&w, &domain).0.expect("a network-config");
        assert!(config.contains(&format!("- \"{}/24\"", ips[0])), "{config}");
        given.push(ips[0].clone());
    }
    given.sort();
    assert_eq!(given, vec!["10.77.0.10".to_string(), "10.77.0.11".to_string()]);

    ipam_machine(&w, "m2", "lab-pool").await;
    ipam_machine(&w, "m3", "no-such-pool").await;
    let lm: LibvirtMachine = w
        .wait_for("m2", "IPAddressPoolExhausted", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("IPAddressPoolExhausted"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(message.contains("InClusterIPPool lab-pool") && message.contains("2 of 2 in use"), "{message}");
    let lm: LibvirtMachine = w
        .wait_for("m3", "IPAddressPoolNotFound", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("IPAddressPoolNotFound"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(message.contains("InClusterIPPool no-such-pool") && message.contains("does not exist"), "{message}");
    assert_eq!(w.inspect().domain_list().unwrap().len(), 2, "only m0 and m1 have domains");

    // m0 goes: its claim is deleted, the provider frees its address, m2 gets it.
    let freed = internal_ips(&w.api::<LibvirtMachine>().get("m0").await.unwrap())[0].clone();
    w.delete::<capl::api::capi::Machine>("m0").await;
    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    w.wait_gone::<IPAddressClaim>("m0-0").await;
    let lm: LibvirtMachine = w.wait_for("m2", "ready", machine_ready).await;
    assert_eq!(internal_ips(&lm), vec![freed]);
    capi.ensure_running().unwrap();
}

/// A LibvirtCluster with controlPlaneEndpointFrom and no endpoint anywhere
/// claims one from the pool (with the in-cluster IPAM provider) and writes it
/// into spec.controlPlaneEndpoint; a second cluster on the now empty pool
/// says so; deleting the first releases the address, and the second gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_gets_its_control_plane_endpoint_from_a_pool() {
    let w = World::new("rc-ipam-vip").await;
    let _capi = start_ipam(&w).await;
    let _manager = w.start_manager();
    create_pool(&w, "vip-pool", "10.77.0.5").await;

    for cluster in ["one", "two"] {
        let lc_name = format!("{cluster}-lc");
        let c: capl::api::capi::Cluster = w.apply(cluster_json(cluster, &lc_name, false)).await;
        let mut lc = libvirt_cluster_json(&lc_name, &w.uri, Some((cluster, &c.uid().unwrap())));
        lc["spec"]["controlPlaneEndpointFrom"] = json!({ "pool": pool_ref("vip-pool"), "port": 6443 });
        let _: LibvirtCluster = w.apply(lc).await;
        if cluster == "one" {
            let lc: LibvirtCluster = w
                .wait_for(&lc_name, "an allocated endpoint", |lc: &LibvirtCluster| {
                    has(cluster_conditions(lc), "ControlPlaneEndpointReady", "True", None)
                })
                .await;
            let endpoint = lc.spec.control_plane_endpoint.clone().unwrap();
            assert_eq!((endpoint.host.as_str(), endpoint.port), ("10.77.0.5", 6443));
            let claim: IPAddressClaim = w.api().get("one-lc-endpoint").await.unwrap();
            assert_eq!(claim.owner_references()[0].name, "one-lc");
        }
    }
    let lc: LibvirtCluster = w
        .wait_for("two-lc", "IPAddressPoolExhausted", |lc: &LibvirtCluster| {
            has(cluster_conditions(lc), "ControlPlaneEndpointReady", "False", Some("IPAddressPoolExhausted"))
        })
        .await;
    let message = &condition(cluster_conditions(&lc), "ControlPlaneEndpointReady").unwrap().message;
    assert!(message.contains("LibvirtCluster two-lc") && message.contains("InClusterIPPool vip-pool"), "{message}");
    assert!(lc.spec.control_plane_endpoint.is_none());

    w.delete::<LibvirtCluster>("one-lc").await;
    w.wait_gone::<LibvirtCluster>("one-lc").await;
    w.wait_gone::<IPAddressClaim>("one-lc-endpoint").await;
    let lc: LibvirtCluster = w
        .wait_for("two-lc", "the released endpoint", |lc: &LibvirtCluster| lc.spec.control_plane_endpoint.is_some())
        .await;
    assert_eq!(lc.spec.control_plane_endpoint.unwrap().host, "10.77.0.5");
}

/// Machine + LibvirtMachine `name` of cluster `demo` with `spec.additionalNetworks` = `nics`.
async fn machine_with_nics(w: &World, name: &str, nics: serde_json::Value) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let m: capl::api::capi::Machine = w.apply(machine_json(name, "demo", name, Some(&secret))).await;
    let mut lm = libvirt_machine_json(name, "demo", Some((name, &m.uid().unwrap())));
    lm["spec"]["additionalNetworks"] = nics;
    let _: LibvirtMachine = w.apply(lm).await;
}

/// Additional NICs, with CAPI's in-cluster IPAM provider: a machine on the
/// cluster's DHCP network gets a second NIC straight on a host bridge with its
/// address from a pool (claim `<machine>-nic1-0`) and a third on a libvirt
/// network asking DHCP. The domain has the three NICs, the seed's
/// network-config lists them (the first with DHCP and its reservation's MAC),
/// status.addresses has the leased address then the pool's. A machine whose
/// additional network does not exist creates nothing and says which NIC, the
/// network and the fix. Deleting the machine releases its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn additional_nics_take_their_addresses_from_a_pool_or_dhcp() {
    use capl_host::cloud_init::{GuestInterface, StaticAddress, network_config_for};
    let w = World::new("rc-ipam-nics").await;
    let capi = start_ipam(&w).await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    add_bridged_network(&w);
    create_pool(&w, "storage-pool", "10.77.0.40").await;

    machine_with_nics(
        &w,
        "m0",
        json!([{ "bridge": "br-storage", "addressesFromPools": [pool_ref("storage-pool")] }, { "network": BRIDGED }]),
    )
    .await;
    machine_with_nics(&w, "m1", json!([{ "network": "no-such-net" }])).await;

    let lm: LibvirtMachine = w.wait_for_within(WAIT, "m0", "ready", machine_ready).await;
    let claim: IPAddressClaim = w.api().get("m0-nic1-0").await.unwrap();
    assert_eq!(claim.owner_references()[0].name, "m0");
    let ips = internal_ips(&lm);
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert_eq!(ips[1], "10.77.0.40", "the pool's address comes after the leased one: {ips:?}");
    let domain = lm.status.as_ref().and_then(|s| s.domain_name.clone()).unwrap();
    let info = capl_host::domain_xml::parse_domain(&w.inspect().domain_xml(&domain).unwrap()).unwrap();
    let names = capl_host::MachineNames::new(&w.ns, "m0", &lm.uid().unwrap());
    let first = lm.status.as_ref().and_then(|s| s.mac_address.clone()).unwrap();
    assert_eq!(info.macs, vec![first.clone(), names.additional_mac(1), names.additional_mac(2)]);
    let hosts = w.inspect().network_xml(NETWORK).unwrap();
    assert!(hosts.contains(&format!("mac='{first}'")), "the first NIC holds the reservation: {hosts}");
    let config = seed_network_config(&w, &domain).0.expect("a network-config");
    let want = network_config_for(
        &[
            GuestInterface { mac: first, addresses: Vec::new(), dhcp: true },
            GuestInterface {
                mac: names.additional_mac(1),
                addresses: vec![StaticAddress {
                    address: "10.77.0.40".parse().unwrap(),
                    prefix: 24,
                    gateway: Some("10.77.0.1".parse().unwrap()),
                }],
                dhcp: false,
            },
            GuestInterface { mac: names.additional_mac(2), addresses: Vec::new(), dhcp: true },
        ],
        &[],
    );
    assert_eq!(config, want);

    let lm: LibvirtMachine = w
        .wait_for("m1", "InfrastructureMissing", |lm: &LibvirtMachine| {
            has(machine_conditions(lm), "DomainProvisioningReady", "False", Some("InfrastructureMissing"))
        })
        .await;
    let message = &condition(machine_conditions(&lm), "DomainProvisioningReady").unwrap().message;
    assert!(
        message.contains("spec.additionalNetworks[0]")
            && message.contains("network \"no-such-net\"")
            && message.contains("virsh net-define")
            && message.contains("nothing was created"),
        "{message}"
    );
    assert_eq!(w.inspect().domain_list().unwrap().len(), 1, "only m0 has a domain");

    w.delete::<capl::api::capi::Machine>("m0").await;
    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    w.wait_gone::<IPAddressClaim>("m0-nic1-0").await;
    capi.ensure_running().unwrap();
}
