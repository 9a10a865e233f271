//! Keys for cache directories and image tags.

/// A short key over `parts` for cache directories and image tags (FNV-1a, 64
/// bit, with separators): a cache key, not a security measure.
pub fn short_hash(parts: &[&str]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain([0u8]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")[..12].to_string()
}
