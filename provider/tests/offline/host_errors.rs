//! Every host error names the object, the value and the fix, and maps to a
//! condition reason (the LibvirtMachine's, through the controller's mapping).

use capl::controller::host_failure::machine_reason;
use capl_host::hypervisor::{ErrorKind, HypervisorError};
use capl_host::{HostError, ObjectKind};

fn uri() -> String {
    "qemu+tcp://lab/system".into()
}

fn all_errors() -> Vec<HostError> {
    vec![
        HostError::NetworkMissing { network: "libvirt-lab".into(), uri: uri() },
        HostError::NetworkInactive { network: "libvirt-lab".into(), uri: uri() },
        HostError::PoolMissing { pool: "capi-vm-disks".into(), uri: uri() },
        HostError::PoolInactive { pool: "capi-vm-disks".into(), uri: uri() },
        HostError::ImageMissing { image: "noble.qcow2".into(), pool: "capi-base-images".into(), uri: uri() },
        HostError::DiskTooSmall {
            disk_gib: 2,
            image: "noble.qcow2".into(),
            image_bytes: 3_758_096_384,
            min_gib: 4,
        },
        HostError::NameserverNotAnAddress { value: "dns.lab".into() },
        HostError::HostnameTooLong { hostname: "w".repeat(70), length: 70, max: 64 },
        HostError::GuestHardwareContradiction {
            field: "spec.cpu.topology",
            detail: "2 sockets x 2 cores x 1 threads = 4 vCPUs but spec.vcpu is 2: make them equal".into(),
        },
        HostError::GuestHardwareUnavailable {
            setting: "spec.cpu.mode host-passthrough".into(),
            uri: uri(),
            reason: "the host's domain capabilities list <mode name='host-passthrough' supported='no'> for domain type qemu (no KVM: QEMU emulates the CPU and has no host CPU to pass through)".into(),
            fix: "use a mode the host supports (host-model, or custom with a model it lists), or a host with KVM",
        },
        HostError::ImageUnusable {
            image: "m1.qcow2".into(),
            pool: "capi-vm-disks".into(),
            why: "is an overlay backed by /var/lib/libvirt/images/noble.qcow2".into(),
        },
        HostError::PoolTypeUnsupported { pool: "vg0".into(), uri: uri(), pool_type: "logical".into() },
        HostError::NoIpv4 { network: "isolated".into(), uri: uri() },
        HostError::NoFreeAddress {
            network: "libvirt-lab".into(),
            uri: uri(),
            pool_description: "192.168.122.2-192.168.122.9".into(),
        },
        HostError::Collision {
            kind: ObjectKind::Domain,
            object: "default-worker-0-1a2b3c".into(),
            uri: uri(),
            detail: "it carries no cluster-api-provider-libvirt metadata".into(),
        },
        HostError::Libvirt {
            action: "define",
            kind: ObjectKind::Domain,
            object: "default-worker-0-1a2b3c".into(),
            uri: uri(),
            source: HypervisorError::new(ErrorKind::XmlError, 27, "XML error: bad memory"),
        },
        HostError::Libvirt {
            action: "read",
            kind: ObjectKind::Domain,
            object: "default-worker-0-1a2b3c".into(),
            uri: uri(),
            source: HypervisorError::new(ErrorKind::ConnectionLost, 39, "client socket is closed"),
        },
        HostError::ConsoleLogDirMissing {
            dir: "/var/log/capl".into(),
            uri: uri(),
            detail: "Unable to open file: /var/log/capl/default-worker-0-1a2b3c-console.log: No such file or directory (libvirt error 38)".into(),
        },
        HostError::BridgeMissing {
            network: "lab-lan".into(),
            device: "br-lab".into(),
            uri: uri(),
            detail: "Cannot get interface MTU on 'br-lab': No such device (libvirt error 38)".into(),
        },
        HostError::BridgeNotOnHost { network: "lab-lan".into(), device: "br-lab".into(), uri: uri() },
        HostError::NoEndpointAddress {
            network: "default".into(),
            uri: uri(),
            detail: "every address of 192.168.122.0/24 outside the DHCP ranges is the host's, reserved, leased or named in its DNS: narrow a <dhcp> <range> (virsh net-edit default) to leave addresses outside it, or take the endpoint from an IPAM pool (controlPlaneEndpointFrom.pool)".into(),
        },
        HostError::Unreachable {
            uri: uri(),
            source: HypervisorError::new(
                ErrorKind::ConnectionLost,
                38,
                "cannot open libvirt connection to qemu+tcp://lab/system: unable to connect to server at 'lab:16509': Connection refused",
            ),
        },
        HostError::NoAnswer { uri: uri(), within: "30 s".into(), note: String::new() },
        HostError::UnreadableXml {
            kind: ObjectKind::Network,
            object: "libvirt-lab".into(),
            uri: uri(),
            detail: "<ip> has no address attribute".into(),
        },
    ]
}

#[test]
fn messages_and_reasons() {
    let rendered: Vec<String> = all_errors().iter().map(|e| format!("[{}] {e}", machine_reason(e.kind()))).collect();
    insta::assert_yaml_snapshot!(rendered);
}

/// Found on a live stack: the URI printed twice in one message.
#[test]
fn each_message_names_the_host_once() {
    for e in all_errors() {
        let message = e.to_string();
        assert!(message.matches(&uri()).count() <= 1, "the URI is repeated: {message}");
    }
}

/// A fix the API server then refuses is no fix: the fields that cannot be changed
/// (CEL `self == oldSelf` in our CRDs) are never the advice, except to say so.
#[test]
fn no_message_advises_changing_an_immutable_field() {
    let mut immutable = Vec::new();
    for crd in capl::api::crds() {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for (field, prop) in spec.as_object().into_iter().flatten() {
            let rules = prop["x-kubernetes-validations"].as_array().cloned().unwrap_or_default();
            if rules.iter().any(|r| r["rule"] == "self == oldSelf") {
                immutable.push(field.clone());
            }
        }
    }
    for field in ["image", "diskGiB", "network", "basePool", "domainPool"] {
        assert!(immutable.iter().any(|f| f == field), "{field} is expected to be immutable: {immutable:?}");
    }
    for e in all_errors() {
        let message = e.to_string();
        for field in &immutable {
            for advice in [format!("fix the LibvirtMachine's spec.{field}"), format!("set spec.{field}")] {
                assert!(!message.contains(&advice), "advises changing immutable {field}: {message}");
            }
            if message.contains(&format!("spec.{field}")) {
                assert!(message.contains("cannot be changed"), "names immutable {field} without saying so: {message}");
            }
        }
    }
}

#[test]
fn only_a_lost_connection_or_a_host_that_does_not_answer_is_transient() {
    let transient: Vec<String> = all_errors().iter().filter(|e| e.is_transient()).map(|e| format!("{e:?}")).collect();
    assert_eq!(transient.len(), 3, "{transient:#?}");
    assert!(
        transient[0].contains("ConnectionLost")
            && transient[1].starts_with("Unreachable")
            && transient[2].starts_with("NoAnswer"),
        "{transient:#?}"
    );
}
