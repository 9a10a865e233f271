//! libvirt's scaled integers (`<capacity unit='GiB'>10</capacity>`), as `virScaleInteger` reads them.

use serde::Deserialize;

use crate::error::{Error, ErrorCode, Result};

/// An element holding a scaled integer, e.g. `<memory unit='MiB'>2048</memory>`.
#[derive(Deserialize)]
pub(crate) struct Scaled {
    #[serde(rename = "@unit")]
    pub unit: Option<String>,
    #[serde(rename = "$text")]
    pub value: String,
}

/// Converts `value` in `unit` (or `default_unit` when absent) to bytes.
pub(crate) fn to_bytes(value: &str, unit: Option<&str>, default_unit: u64, what: &str) -> Result<u64> {
    let number: u64 = value
        .trim()
        .parse()
        .map_err(|_| Error::new(ErrorCode::XmlError, format!("malformed {what} value '{}'", value.trim())))?;
    let scale = match unit.map(str::trim) {
        None | Some("") => default_unit,
        Some(u) => scale_of(u).ok_or_else(|| Error::new(ErrorCode::InvalidArg, format!("unknown suffix '{u}'")))?,
    };
    number.checked_mul(scale).ok_or_else(|| {
        Error::new(ErrorCode::OperationFailed, format!("{what} value '{number}' {} is too large", unit.unwrap_or("")))
    })
}

fn scale_of(unit: &str) -> Option<u64> {
    const K: u64 = 1024;
    let scale = match unit {
        "b" | "B" | "byte" | "bytes" => 1,
        "k" | "K" | "KiB" => K,
        "KB" => 1000,
        "m" | "M" | "MiB" => K.pow(2),
        "MB" => 1000u64.pow(2),
        "g" | "G" | "GiB" => K.pow(3),
        "GB" => 1000u64.pow(3),
        "t" | "T" | "TiB" => K.pow(4),
        "TB" => 1000u64.pow(4),
        "p" | "P" | "PiB" => K.pow(5),
        "PB" => 1000u64.pow(5),
        "e" | "E" | "EiB" => K.pow(6),
        "EB" => 1000u64.pow(6),
        _ => return None,
    };
    Some(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_scale_like_libvirt() {
        assert_eq!(to_bytes("10", Some("MiB"), 1, "capacity").unwrap(), 10 << 20);
        assert_eq!(to_bytes("2", Some("GB"), 1, "capacity").unwrap(), 2_000_000_000);
        assert_eq!(to_bytes("64", None, 1024, "memory").unwrap(), 65536);
        assert_eq!(to_bytes("x", None, 1, "capacity").unwrap_err().code(), ErrorCode::XmlError);
        assert_eq!(to_bytes("1", Some("parsecs"), 1, "capacity").unwrap_err().code(), ErrorCode::InvalidArg);
    }
}
