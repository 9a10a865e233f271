//! The names and identity table of the book's design page, one test per row.

use capl_host::MachineNames;
use capl_host::naming::{
    HASH_LEN, LEGACY_HASH_LEN, MAC_CANDIDATES, NameScheme, domain_name, domain_name_in, identity_from_provider_id,
    is_dns_label, mac_address, mac_candidates, name_hash, name_hash_in, provider_id,
};
use rstest::rstest;

const UID: &str = "5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10";
const OTHER: &str = "0b9e1c52-3f1d-4e8a-8c57-2a6f4d9e7b31";

#[test]
fn domain_name_is_namespace_name_hash() {
    let names = MachineNames::new("default", "libvirt-xd-0", UID);
    assert_eq!(names.domain, format!("default-libvirt-xd-0-{}", name_hash("default", "libvirt-xd-0", UID)));
    assert!(is_dns_label(&names.domain));
}

#[test]
fn hash_is_stable_across_releases() {
    // Pinned (checked with `printf default/libvirt-xd-0/<UID> | sha256sum`):
    // changing the hash would orphan every existing domain.
    assert_eq!(name_hash("default", "libvirt-xd-0", UID), "a722a489691e3f7d");
    assert_eq!(domain_name("default", "libvirt-xd-0", UID), "default-libvirt-xd-0-a722a489691e3f7d");
    // Machines named when the hash had 6 digits keep exactly those names.
    assert_eq!(name_hash_in(NameScheme::Legacy, "default", "libvirt-xd-0", UID), "a722a4");
    assert_eq!(domain_name_in(NameScheme::Legacy, "default", "libvirt-xd-0", UID), "default-libvirt-xd-0-a722a4");
    assert_eq!(mac_address("default-libvirt-xd-0-a00625"), "52:54:00:07:c6:a1");
}

#[test]
fn the_hash_has_64_bits_so_a_chosen_identity_cannot_be_searched_for_a_collision() {
    assert_eq!(HASH_LEN * 4, 64);
    assert_eq!(name_hash("ns", "worker-0", UID).len(), HASH_LEN);
    assert_eq!(
        MachineNames::new("ns", "worker-0", UID).domain,
        domain_name_in(NameScheme::Current, "ns", "worker-0", UID)
    );
    // An undecided scheme names like the current one until the host says otherwise.
    assert_eq!(
        MachineNames::in_scheme(NameScheme::Either, "ns", "worker-0", UID),
        MachineNames::new("ns", "worker-0", UID)
    );
}

#[test]
fn a_recorded_domain_name_tells_its_scheme() {
    let current = domain_name("ns", "worker-0", UID);
    let legacy = domain_name_in(NameScheme::Legacy, "ns", "worker-0", UID);
    assert_eq!(legacy.rsplit('-').next().unwrap().len(), LEGACY_HASH_LEN);
    assert_eq!(NameScheme::of_domain(&current, "ns", "worker-0", UID), Some(NameScheme::Current));
    assert_eq!(NameScheme::of_domain(&legacy, "ns", "worker-0", UID), Some(NameScheme::Legacy));
    // Another identity's name, or another machine's, is neither.
    assert_eq!(NameScheme::of_domain(&legacy, "ns", "worker-0", OTHER), None);
    assert_eq!(NameScheme::of_domain(&current, "ns", "worker-1", UID), None);
}

#[test]
fn hash_separates_names_that_print_alike() {
    // "a-b" + "c" and "a" + "b-c" both read "a-b-c".
    assert_ne!(domain_name("a-b", "c", UID), domain_name("a", "b-c", UID));
}

#[test]
fn every_name_is_bound_to_the_identity() {
    // The same namespace and name with another identity (a machine deleted without host
    // cleanup and created again, or one of another management cluster) shares nothing.
    let a = MachineNames::new("ns", "worker-0", UID);
    let b = MachineNames::new("ns", "worker-0", OTHER);
    assert_ne!(a.domain, b.domain);
    assert_ne!(a.overlay_volume(), b.overlay_volume());
    assert_ne!(a.cloud_init_volume(), b.cloud_init_volume());
    assert_ne!(a.derived_mac(), b.derived_mac());
    assert!(a.mac_candidates().iter().all(|mac| !b.mac_candidates().contains(mac)));
    assert_eq!(a.hostname(), b.hostname());
}

#[test]
fn the_identity_survives_a_move_through_the_provider_id() {
    // clusterctl move gives the LibvirtMachine a new UID but keeps spec.providerID.
    let identity = identity_from_provider_id(&provider_id(UID)).unwrap();
    assert_eq!(identity, UID);
    assert_eq!(MachineNames::new("ns", "worker-0", &identity), MachineNames::new("ns", "worker-0", UID));
    assert_eq!(identity_from_provider_id(&provider_id(&UID.to_uppercase())).unwrap(), UID);
}

#[rstest]
#[case::other_scheme("aws:///us-east-1a/i-0123")]
#[case::no_uuid("libvirt://worker-0")]
#[case::empty("")]
fn a_provider_id_the_provider_did_not_set_is_refused_with_the_fix(#[case] value: &str) {
    let message = identity_from_provider_id(value).unwrap_err();
    assert!(message.contains(&format!("{value:?}")) && message.contains("libvirt://<UUID>"), "{message}");
    assert!(message.contains("leave spec.providerID unset"), "{message}");
}

#[rstest]
#[case::long_namespace(&"n".repeat(63), "worker")]
#[case::long_name(&"default", &"w".repeat(253))]
#[case::both_long(&"x".repeat(63), &"y".repeat(253))]
#[case::dots_in_name("default", "worker.pool-a.0")]
#[case::dash_at_the_cut("default", &format!("{}-{}", "a".repeat(47), "b".repeat(20)))]
fn long_and_odd_names_stay_dns_labels(#[case] namespace: &str, #[case] name: &str) {
    let domain = domain_name(namespace, name, UID);
    assert!(is_dns_label(&domain), "{domain:?} is not a DNS label");
    assert!(domain.len() <= 63);
    assert!(domain.ends_with(&name_hash(namespace, name, UID)));
}

#[test]
fn truncated_names_stay_unique() {
    let base = "w".repeat(100);
    assert_ne!(domain_name("default", &format!("{base}-1"), UID), domain_name("default", &format!("{base}-2"), UID));
}

#[test]
fn guest_hostname_is_the_machine_name() {
    assert_eq!(MachineNames::new("ns", "worker-0", UID).hostname(), "worker-0");
}

#[test]
fn domain_uuid_and_instance_id_are_the_identity() {
    let names = MachineNames::new("ns", "worker-0", UID);
    assert_eq!(names.domain_uuid(), UID);
    assert_eq!(names.instance_id(), UID);
}

#[test]
fn provider_id_is_libvirt_identity() {
    assert_eq!(MachineNames::new("ns", "worker-0", UID).provider_id(), format!("libvirt://{UID}"));
}

#[test]
fn volumes_are_named_after_the_domain() {
    let names = MachineNames::new("ns", "worker-0", UID);
    assert_eq!(names.overlay_volume(), format!("{}.qcow2", names.domain));
    assert_eq!(names.cloud_init_volume(), format!("cloudinit-{}.iso", names.domain));
}

#[rstest]
#[case("default", "libvirt-xd-0")]
#[case("kube-system", "cp-0")]
#[case(&"n".repeat(63), &"m".repeat(253))]
fn every_mac_candidate_has_the_qemu_prefix_and_six_octets(#[case] namespace: &str, #[case] name: &str) {
    for mac in MachineNames::new(namespace, name, UID).mac_candidates() {
        let octets: Vec<&str> = mac.split(':').collect();
        assert_eq!(octets.len(), 6, "{mac}");
        assert_eq!(&octets[..3], &["52", "54", "00"]);
        assert!(
            octets.iter().all(|o| o.len() == 2 && o.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())),
            "{mac}"
        );
    }
}

#[test]
fn mac_is_derived_from_the_domain_name() {
    let a = MachineNames::new("ns", "worker-0", UID);
    assert_eq!(a.derived_mac(), mac_address(&a.domain));
    assert_ne!(a.derived_mac(), MachineNames::new("ns", "worker-1", UID).derived_mac());
}

/// When the derived MAC is taken on the network the machine tries the next
/// candidate. The list must be the same in every release and process (a
/// machine finds its DHCP entry by it), start with the MAC earlier releases
/// derived (their machines keep working), and hold no MAC twice.
#[test]
fn mac_candidates_are_stable_distinct_and_start_with_the_derived_mac() {
    let domain = "default-libvirt-xd-0-a00625";
    let macs = mac_candidates(domain);
    assert_eq!(macs.len(), MAC_CANDIDATES);
    assert_eq!(macs[0], mac_address(domain), "the first candidate is what earlier releases used");
    // Pinned (`printf 'default-libvirt-xd-0-a00625#1' | sha256sum` and `#2`):
    // changing them would lose the DHCP entries of machines that took them.
    assert_eq!(&macs[..3], ["52:54:00:07:c6:a1", "52:54:00:4e:60:58", "52:54:00:4c:ae:3a"]);
    let distinct: std::collections::HashSet<&String> = macs.iter().collect();
    assert_eq!(distinct.len(), macs.len(), "{macs:?}");
    assert_eq!(mac_candidates(domain), macs, "the same list on every call");
    assert_eq!(
        MachineNames::new("ns", "worker-0", UID).mac_candidates(),
        mac_candidates(&domain_name("ns", "worker-0", UID))
    );
}

#[rstest]
#[case("abc", true)]
#[case("a-1", true)]
#[case("-a", false)]
#[case("a-", false)]
#[case("A", false)]
#[case("a.b", false)]
#[case("", false)]
fn dns_label_check(#[case] label: &str, #[case] valid: bool) {
    assert_eq!(is_dns_label(label), valid);
    assert!(!is_dns_label(&"a".repeat(64)));
}

#[test]
fn a_downloaded_image_is_named_after_its_checksum() {
    let sha256 = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08";
    let name = capl_host::naming::image_volume_name("sha256", sha256, "qcow2");
    assert_eq!(name, "capl-image-sha256-9f86d081884c7d659a2feaa0c55ad015.qcow2");
    assert!(capl_host::naming::is_image_volume_name(&name));
    assert!(capl_host::naming::is_image_volume_name(&capl_host::naming::image_volume_name(
        "sha512",
        &"a".repeat(128),
        "raw"
    )));
    for other in [
        "ubuntu-noble-base.qcow2",
        "capl-image-md5-9f86d081884c7d659a2feaa0c55ad015.qcow2",
        "capl-image-sha256-9f86.qcow2",
    ] {
        assert!(!capl_host::naming::is_image_volume_name(other), "{other}");
    }
}
