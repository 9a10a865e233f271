//! Reading the clusterctl templates under templates/ the way clusterctl does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every YAML file under templates/, sorted.
pub fn template_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// clusterctl's `${VAR}` and `${VAR:=default}` forms, with sample values for
/// the variables that have no default.
pub fn substitute(text: &str) -> (String, BTreeSet<String>) {
    let mut out = String::new();
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("unterminated ${") + start;
        let inner = &rest[start + 2..end];
        let (name, default) = match inner.split_once(":=") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        names.insert(name.to_string());
        out.push_str(&default.map(str::to_string).unwrap_or_else(|| sample_value(name)));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    (out, names)
}

fn sample_value(name: &str) -> String {
    match name {
        "CONTROL_PLANE_MACHINE_COUNT" | "WORKER_MACHINE_COUNT" => "1".into(),
        "KUBERNETES_VERSION" => "v1.34.1".into(),
        "CAPL_LIBVIRT_URI" => "qemu+tls://kvm1.lab/system".into(),
        "CAPL_IMAGE_URL" => "https://images.lab/ubuntu-2404-kube-v1.36.3.qcow2".into(),
        // A sha256 as sha256sum prints it (of the empty file).
        "CAPL_IMAGE_CHECKSUM" => "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
        // base64 of a PEM-looking placeholder ("-----BEGIN ...").
        n if (n.starts_with("CAPL_TLS_") || n.starts_with("CAPL_SSH_")) && n.ends_with("_B64") => {
            "LS0tLS1CRUdJTiBQTEFDRUhPTERFUi0tLS0tCg==".into()
        }
        "CAPL_CONTROL_PLANE_ENDPOINT_HOST" => "192.168.122.10".into(),
        "CAPL_IP_POOL_RANGE" => "10.77.0.10-10.77.0.99".into(),
        "CAPL_IP_POOL_GATEWAY" | "CAPL_NAMESERVER" => "10.77.0.1".into(),
        "NAMESPACE" => "default".into(),
        _ => "sample".into(),
    }
}

pub fn parse_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).expect("valid YAML"))
        .filter(|d| !d.is_null())
        .collect()
}
