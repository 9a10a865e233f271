//! Odd or broken XML is refused with libvirt's XML error classes or read with the
//! unknown parts ignored; it never panics.

use libvirt_sim::{ErrorCode, Host, UpdateCommand, UpdateSection, connect, update_flags};

const DOMAIN: &str = "<domain type='qemu'><name>d</name><uuid>11111111-2222-3333-4444-555555555555</uuid>\
    <metadata><m:x xmlns:m='urn:m'>&amp;<![CDATA[<raw>]]></m:x></metadata><memory unit='MiB'>64</memory>\
    <os><type arch='x86_64'>hvm</type></os><!-- comment --><devices><disk type='file'><source file='/p/a'/></disk>\
    <interface type='network'><source network='n'/></interface><weird><deeper a='1'/></weird></devices></domain>";
const NETWORK: &str = "<network><name>n</name><ip address='10.1.0.1' prefix='24'><dhcp>\
    <range start='10.1.0.10' end='10.1.0.20'/><host mac='52:54:00:00:00:01' name='h' ip='10.1.0.5'/></dhcp></ip></network>";
const POOL: &str = "<pool type='dir'><name>p</name><target><path>/p</path></target></pool>";
const VOLUME: &str =
    "<volume><name>v.qcow2</name><capacity unit='MiB'>1</capacity><target><format type='qcow2'/></target></volume>";
const HOST: &str = "<host mac='52:54:00:00:00:02' name='g' ip='10.1.0.6'/>";

/// Every truncation of `doc`, and `doc` with each of a few characters inserted at every position.
fn mutations(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..=doc.len() {
        if !doc.is_char_boundary(i) {
            continue;
        }
        out.push(doc[..i].to_string());
        for c in ["<", ">", "'", "&", "/", "<x>"] {
            out.push(format!("{}{c}{}", &doc[..i], &doc[i..]));
        }
    }
    out
}

fn xml_class(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::XmlError
            | ErrorCode::XmlDetail
            | ErrorCode::NoName
            | ErrorCode::InvalidArg
            | ErrorCode::OperationFailed
    )
}

#[test]
fn mutated_documents_never_panic_and_fail_with_xml_classes() {
    let host = Host::builder("sim:///robustness").network(NETWORK, true).pool(POOL, true).build().unwrap();
    let conn = connect(host.uri()).unwrap();
    let flags = update_flags::AFFECT_LIVE | update_flags::AFFECT_CONFIG;
    let mut refused = 0;
    for doc in mutations(DOMAIN) {
        match conn.domain_define_xml(&doc) {
            Ok(name) => conn.domain_undefine_flags(&name, 0).unwrap(),
            Err(e) => {
                refused += 1;
                assert!(xml_class(e.code()) || e.code() == ErrorCode::ConfigUnsupported, "{doc}: {e}");
            }
        }
    }
    for doc in mutations(VOLUME) {
        match conn.storage_vol_create_xml("p", &doc) {
            Ok(name) => conn.storage_vol_delete("p", &name).unwrap(),
            Err(e) => assert!(xml_class(e.code()) || e.code() == ErrorCode::StorageVolExist, "{doc}: {e}"),
        }
    }
    for doc in mutations(HOST) {
        match conn.network_update("n", UpdateCommand::AddLast, UpdateSection::IpDhcpHost, -1, &doc, flags) {
            Ok(()) => {
                conn.network_update("n", UpdateCommand::Delete, UpdateSection::IpDhcpHost, -1, &doc, flags).unwrap()
            }
            Err(e) => assert!(xml_class(e.code()) || e.code() == ErrorCode::OperationInvalid, "{doc}: {e}"),
        }
    }
    for doc in mutations(NETWORK).into_iter().chain(mutations(POOL)) {
        let _ = conn.network_define_xml(&doc).map(|name| conn.network_undefine(&name));
        let _ = conn.storage_pool_define_xml(&doc).map(|name| conn.storage_pool_undefine(&name));
    }
    assert!(refused > 100, "most broken domain documents are refused");
}

#[test]
fn unknown_elements_are_kept_in_domain_xml() {
    let host = Host::builder("sim:///robustness-kept").build().unwrap();
    let conn = connect(host.uri()).unwrap();
    conn.domain_define_xml(DOMAIN).unwrap();
    let xml = conn.domain_get_xml_desc("d").unwrap();
    assert!(xml.contains("<weird><deeper a='1'/></weird>"), "{xml}");
    assert!(xml.contains("<![CDATA[<raw>]]>"), "{xml}");
    assert!(xml.contains("<os><type arch='x86_64'>hvm</type></os>"), "{xml}");
}
