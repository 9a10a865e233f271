//! Storage volume XML: the root-disk overlay and the cloud-init ISO we create,
//! and reading back what libvirt reports for a volume.

use super::xml_tree::{XmlElement, escape};

pub const GIB: u64 = 1024 * 1024 * 1024;

/// What the provider reads from a volume's XML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    /// `<target><path>`: where the volume lives on the host.
    pub path: String,
    /// `<target><format type=..>`, e.g. `qcow2`, `raw`, `iso`.
    pub format: Option<String>,
    /// `<capacity>` in bytes: the virtual size for qcow2.
    pub capacity: u64,
    pub backing: Option<BackingStore>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingStore {
    pub path: String,
    pub format: Option<String>,
}

/// The qcow2 overlay `<domain>.qcow2` on top of a base image, `capacity_bytes` large.
pub fn overlay_volume_xml(name: &str, capacity_bytes: u64, backing: &BackingStore) -> String {
    let backing_format = backing.format.as_deref().unwrap_or("qcow2");
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity_bytes}</capacity>\n  <target>\n    <format type='qcow2'/>\n  </target>\n  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n</volume>\n",
        escape(name),
        escape(&backing.path),
        escape(backing_format),
    )
}

/// An empty data disk of `capacity_bytes` in `format` (`qcow2` or `raw`;
/// a raw one sparse: nothing allocated until the guest writes).
pub fn data_volume_xml(name: &str, capacity_bytes: u64, format: &str) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity_bytes}</capacity>\n  <allocation unit='bytes'>0</allocation>\n  <target>\n    <format type='{}'/>\n  </target>\n</volume>\n",
        escape(name),
        escape(format),
    )
}

/// A raw volume exactly `size_bytes` large for the cloud-init ISO.
pub fn iso_volume_xml(name: &str, size_bytes: u64) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{size_bytes}</capacity>\n  <target>\n    <format type='raw'/>\n  </target>\n</volume>\n",
        escape(name)
    )
}

/// The volume a downloaded base image is streamed into: raw and exactly
/// `size_bytes` large (sparse), so that the upload fills it to the byte
/// whatever the image's format (a qcow2 file libvirt made would have its own
/// layout under the uploaded bytes).
pub fn image_volume_xml(name: &str, size_bytes: u64) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{size_bytes}</capacity>\n  <allocation unit='bytes'>0</allocation>\n  <target>\n    <format type='raw'/>\n  </target>\n</volume>\n",
        escape(name)
    )
}

/// Parses `virStorageVolGetXMLDesc` output.
pub fn parse_volume(xml: &str) -> Result<VolumeInfo, String> {
    let root = XmlElement::parse(xml)?;
    if root.name != "volume" {
        return Err(format!("expected <volume>, found <{}>", root.name));
    }
    let name = root.path_text(&["name"]).unwrap_or_default().to_string();
    let path = root.path_text(&["target", "path"]).unwrap_or_default().to_string();
    let format = root.path(&["target", "format"]).and_then(|f| f.attr("type")).map(str::to_string);
    let capacity = match root.child("capacity") {
        Some(capacity) => parse_size(capacity.text.trim(), capacity.attr("unit"))?,
        None => 0,
    };
    let backing = root.child("backingStore").and_then(|b| {
        let path = b.path_text(&["path"])?.to_string();
        let format = b.path(&["format"]).and_then(|f| f.attr("type")).map(str::to_string);
        (!path.is_empty()).then_some(BackingStore { path, format })
    });
    Ok(VolumeInfo { name, path, format, capacity, backing })
}

/// A libvirt scaled integer (`<capacity unit='..'>`) in bytes.
fn parse_size(value: &str, unit: Option<&str>) -> Result<u64, String> {
    let number: u64 = value.parse().map_err(|_| format!("capacity \"{value}\" is not a number"))?;
    let factor: u64 = match unit.unwrap_or("bytes") {
        "b" | "B" | "bytes" => 1,
        "KB" => 1_000,
        "k" | "K" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "m" | "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "g" | "G" | "GiB" => 1 << 30,
        "TB" => 1_000_000_000_000,
        "t" | "T" | "TiB" => 1 << 40,
        other => return Err(format!("capacity unit \"{other}\" is not known")),
    };
    number.checked_mul(factor).ok_or_else(|| format!("capacity {value} {factor} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_overlay_back() {
        let xml = "<volume type='file'><name>d.qcow2</name><key>/p/d.qcow2</key>
            <capacity unit='bytes'>21474836480</capacity><allocation unit='bytes'>200704</allocation>
            <target><path>/p/d.qcow2</path><format type='qcow2'/></target>
            <backingStore><path>/b/base.qcow2</path><format type='qcow2'/></backingStore></volume>";
        let v = parse_volume(xml).unwrap();
        assert_eq!(v.path, "/p/d.qcow2");
        assert_eq!(v.capacity, 20 * GIB);
        assert_eq!(v.format.as_deref(), Some("qcow2"));
        assert_eq!(v.backing, Some(BackingStore { path: "/b/base.qcow2".into(), format: Some("qcow2".into()) }));
    }

    #[test]
    fn understands_units() {
        assert_eq!(parse_size("2", Some("GiB")).unwrap(), 2 * GIB);
        assert_eq!(parse_size("3", None).unwrap(), 3);
        assert!(parse_size("3", Some("parsec")).is_err());
    }
}
