//! Storage pools (type `dir`) and their volumes: definitions parsed from and formatted to
//! libvirt's pool and volume XML, and the bytes a volume holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::Uuid;
use crate::size_units::{Scaled, to_bytes};
use crate::sparse::SparseBytes;
use crate::xml_scan::{check_document, escape, serde_error};

#[derive(Deserialize)]
struct PoolDoc {
    #[serde(rename = "@type")]
    kind: Option<String>,
    name: Option<String>,
    uuid: Option<String>,
    capacity: Option<Scaled>,
    target: Option<TargetEl>,
}

#[derive(Deserialize)]
struct TargetEl {
    path: Option<String>,
    format: Option<FormatEl>,
}

#[derive(Deserialize)]
struct FormatEl {
    #[serde(rename = "@type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct VolumeDoc {
    name: Option<String>,
    capacity: Option<Scaled>,
    allocation: Option<Scaled>,
    target: Option<TargetEl>,
    #[serde(rename = "backingStore")]
    backing_store: Option<TargetEl>,
}

/// The default size the simulator gives a dir pool's filesystem (100 GiB, like the test driver).
pub const DEFAULT_POOL_CAPACITY: u64 = 100 << 30;

/// A storage pool definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDef {
    pub name: String,
    pub uuid: Uuid,
    pub kind: String,
    pub target_path: String,
    /// The size of the filesystem the pool lives on.
    pub capacity: u64,
}

impl PoolDef {
    /// Parses pool XML as `virStoragePoolDefineXML` does; only `type='dir'` is modeled.
    pub fn parse(xml: &str) -> Result<Self> {
        check_document(xml, "pool")?;
        let doc: PoolDoc = quick_xml::de::from_str(xml).map_err(|e| serde_error("pool", e))?;
        let kind = doc.kind.ok_or_else(|| Error::xml("storage pool type missing"))?;
        if kind != "dir" {
            return Err(Error::new(
                ErrorCode::OperationUnsupported,
                format!("libvirt-sim models only storage pools of type 'dir', not '{kind}'"),
            ));
        }
        let name = doc
            .name
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::xml("missing pool source name element"))?;
        let target_path = doc
            .target
            .and_then(|t| t.path)
            .map(|p| p.trim().trim_end_matches('/').to_string())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| Error::xml("missing storage pool target path"))?;
        let uuid = match doc.uuid {
            Some(u) => Uuid::parse(&u)?,
            None => Uuid::generate(),
        };
        let capacity = match doc.capacity {
            Some(c) => to_bytes(&c.value, c.unit.as_deref(), 1, "capacity")?,
            None => DEFAULT_POOL_CAPACITY,
        };
        Ok(PoolDef { name, uuid, kind, target_path, capacity })
    }

    /// The pool XML in libvirt's layout, with the given allocation.
    pub fn to_xml(&self, allocation: u64) -> String {
        let mut x = String::new();
        let _ = writeln!(x, "<pool type='{}'>", escape(&self.kind));
        let _ = writeln!(x, "  <name>{}</name>", escape(&self.name));
        let _ = writeln!(x, "  <uuid>{}</uuid>", self.uuid);
        let _ = writeln!(x, "  <capacity unit='bytes'>{}</capacity>", self.capacity);
        let _ = writeln!(x, "  <allocation unit='bytes'>{allocation}</allocation>");
        let _ = writeln!(x, "  <available unit='bytes'>{}</available>", self.capacity.saturating_sub(allocation));
        let _ = writeln!(x, "  <source>\n  </source>");
        let _ = writeln!(x, "  <target>\n    <path>{}</path>\n  </target>", escape(&self.target_path));
        x.push_str("</pool>\n");
        x
    }
}

/// A volume's backing store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingStore {
    pub path: String,
    pub format: Option<String>,
}

/// A volume definition plus the bytes it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub path: String,
    pub capacity: u64,
    pub allocation: u64,
    pub format: String,
    pub backing: Option<BackingStore>,
    /// What was uploaded (a raw volume reads back zero-padded to its capacity).
    pub content: SparseBytes,
}

/// What `virStorageVolCreateXML` reads from volume XML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolumeSpec {
    pub name: String,
    pub capacity: Option<u64>,
    pub allocation: Option<u64>,
    pub format: String,
    pub backing: Option<BackingStore>,
}

impl VolumeSpec {
    pub fn parse(xml: &str) -> Result<Self> {
        check_document(xml, "volume")?;
        let doc: VolumeDoc = quick_xml::de::from_str(xml).map_err(|e| serde_error("volume", e))?;
        let name = doc
            .name
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::xml("missing volume name element"))?;
        if name.contains('/') {
            return Err(Error::new(ErrorCode::InvalidArg, format!("volume name '{name}' cannot contain '/'")));
        }
        let capacity = doc.capacity.map(|c| to_bytes(&c.value, c.unit.as_deref(), 1, "capacity")).transpose()?;
        let allocation = doc.allocation.map(|c| to_bytes(&c.value, c.unit.as_deref(), 1, "allocation")).transpose()?;
        let format = doc.target.and_then(|t| t.format).and_then(|f| f.kind).unwrap_or_else(|| "raw".to_string());
        let backing = match doc.backing_store {
            None => None,
            Some(b) => {
                let path = b
                    .path
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| Error::xml("missing volume backing store path"))?;
                Some(BackingStore { path, format: b.format.and_then(|f| f.kind) })
            }
        };
        if capacity.is_none() && backing.is_none() {
            return Err(Error::xml("missing capacity element"));
        }
        Ok(VolumeSpec { name, capacity, allocation, format, backing })
    }
}

impl Volume {
    /// The volume XML in libvirt's layout.
    pub fn to_xml(&self) -> String {
        let mut x = String::new();
        let _ = writeln!(x, "<volume type='file'>");
        let _ = writeln!(x, "  <name>{}</name>", escape(&self.name));
        let _ = writeln!(x, "  <key>{}</key>", escape(&self.path));
        let _ = writeln!(x, "  <capacity unit='bytes'>{}</capacity>", self.capacity);
        let _ = writeln!(x, "  <allocation unit='bytes'>{}</allocation>", self.allocation);
        let _ = writeln!(
            x,
            "  <target>\n    <path>{}</path>\n    <format type='{}'/>\n  </target>",
            escape(&self.path),
            escape(&self.format)
        );
        if let Some(b) = &self.backing {
            let _ = write!(x, "  <backingStore>\n    <path>{}</path>\n", escape(&b.path));
            if let Some(f) = &b.format {
                let _ = writeln!(x, "    <format type='{}'/>", escape(f));
            }
            let _ = writeln!(x, "  </backingStore>");
        }
        x.push_str("</volume>\n");
        x
    }

    /// The bytes `virStorageVolDownload` streams for `offset`/`length` (0 = to the end).
    pub fn read(&self, offset: u64, length: u64) -> Vec<u8> {
        let have = self.content.len();
        let size = if self.format == "raw" { self.capacity.max(have) } else { have };
        let start = offset.min(size);
        let end = if length == 0 { size } else { start.saturating_add(length).min(size) };
        let mut out = self.content.read(start, end);
        out.resize((end - start) as usize, 0);
        out
    }

    /// `virStorageVolUpload`: writes `bytes` at `offset` like a file write (no truncation).
    pub fn write(&mut self, offset: u64, bytes: &[u8]) {
        let end = offset + bytes.len() as u64;
        self.content.write(offset, bytes);
        if self.format == "raw" {
            self.capacity = self.capacity.max(end);
        }
        self.allocation = self.allocation.max(end);
    }
}

/// A pool on a host: definition, runtime state and volumes (by name).
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub def: PoolDef,
    pub active: bool,
    pub autostart: bool,
    pub volumes: BTreeMap<String, Volume>,
}

impl Pool {
    pub fn allocation(&self) -> u64 {
        self.volumes.values().map(|v| v.allocation).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_parses_and_formats() {
        let def =
            PoolDef::parse("<pool type='dir'><name>p</name><target><path>/var/p/</path></target></pool>").unwrap();
        assert_eq!(def.target_path, "/var/p");
        let xml = def.to_xml(0);
        assert!(xml.contains("<path>/var/p</path>"), "{xml}");
        assert_eq!(PoolDef::parse(&xml).unwrap(), def);
        let err = PoolDef::parse("<pool type='dir'><name>p</name></pool>").unwrap_err();
        assert_eq!(err.code(), ErrorCode::XmlError);
    }

    #[test]
    fn volume_with_backing_store_parses() {
        let spec = VolumeSpec::parse(
            "<volume><name>o.qcow2</name><capacity unit='MiB'>20</capacity><target><format type='qcow2'/></target>\
             <backingStore><path>/p/base.qcow2</path><format type='qcow2'/></backingStore></volume>",
        )
        .unwrap();
        assert_eq!(spec.capacity, Some(20 << 20));
        assert_eq!(spec.format, "qcow2");
        assert_eq!(spec.backing, Some(BackingStore { path: "/p/base.qcow2".into(), format: Some("qcow2".into()) }));
        assert_eq!(VolumeSpec::parse("<volume><name>x</name></volume>").unwrap_err().code(), ErrorCode::XmlError);
    }

    #[test]
    fn raw_volume_reads_back_zero_padded() {
        let mut v = Volume {
            name: "a".into(),
            path: "/p/a".into(),
            capacity: 8,
            allocation: 0,
            format: "raw".into(),
            backing: None,
            content: SparseBytes::default(),
        };
        v.write(0, b"abc");
        assert_eq!(v.read(0, 0), b"abc\0\0\0\0\0");
        assert_eq!(v.read(1, 2), b"bc");
        v.write(6, b"xyz");
        assert_eq!(v.capacity, 9);
    }
}
