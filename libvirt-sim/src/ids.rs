//! UUIDs and MAC addresses: parsing them as libvirt accepts them, generating new ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, ErrorCode, Result};

static RNG_STATE: AtomicU64 = AtomicU64::new(0);

/// splitmix64 over a global counter seeded from the clock: unique enough for test objects.
fn next_random() -> u64 {
    if RNG_STATE.load(Ordering::Relaxed) == 0 {
        let seed = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
            ^ u64::from(std::process::id());
        let _ = RNG_STATE.compare_exchange(0, seed | 1, Ordering::Relaxed, Ordering::Relaxed);
    }
    let mut z = RNG_STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A UUID, kept as 16 bytes and printed in libvirt's lower-case dashed form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid([u8; 16]);

impl Uuid {
    /// A random (version 4) UUID.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&next_random().to_le_bytes());
        bytes[8..].copy_from_slice(&next_random().to_le_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Uuid(bytes)
    }

    /// Parses 32 hex digits, with or without dashes (libvirt's `virUUIDParse`).
    pub fn parse(text: &str) -> Result<Self> {
        let hex: Vec<u8> = text.trim().bytes().filter(|b| *b != b'-').collect();
        let valid = hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit);
        if !valid {
            return Err(Error::new(ErrorCode::XmlError, format!("malformed uuid element '{text}'")));
        }
        let mut bytes = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).unwrap_or("00");
            bytes[i] = u8::from_str_radix(s, 16).unwrap_or(0);
        }
        Ok(Uuid(bytes))
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A MAC address, printed lower-case with colons as libvirt prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac([u8; 6]);

impl Mac {
    /// A random address in QEMU's 52:54:00 prefix, as libvirt generates for interfaces.
    pub fn generate() -> Self {
        let r = next_random().to_le_bytes();
        Mac([0x52, 0x54, 0x00, r[0], r[1], r[2]])
    }

    /// Parses `aa:bb:cc:dd:ee:ff` (case-insensitive).
    pub fn parse(text: &str) -> Option<Self> {
        let parts: Vec<&str> = text.trim().split(':').collect();
        if parts.len() != 6 {
            return None;
        }
        let mut bytes = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            if p.is_empty() || p.len() > 2 {
                return None;
            }
            bytes[i] = u8::from_str_radix(p, 16).ok()?;
        }
        Some(Mac(bytes))
    }

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trips_with_and_without_dashes() {
        let u = Uuid::parse("11111111-2222-3333-4444-555555555555").unwrap();
        assert_eq!(u.to_string(), "11111111-2222-3333-4444-555555555555");
        assert_eq!(Uuid::parse("11111111222233334444555555555555").unwrap(), u);
        assert!(Uuid::parse("1111-zz").is_err());
        assert_ne!(Uuid::generate(), Uuid::generate());
    }

    #[test]
    fn mac_parses_case_insensitively() {
        let m = Mac::parse("52:54:00:AA:bb:0C").unwrap();
        assert_eq!(m.to_string(), "52:54:00:aa:bb:0c");
        assert!(Mac::parse("52:54:00:aa:bb").is_none());
        assert!(Mac::parse("01:00:00:00:00:00").unwrap().is_multicast());
    }
}
