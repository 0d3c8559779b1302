//! The kernel object, built by `build.rs` and embedded so the binary needs nothing else.

/// The ELF object holding both programs and their maps.
pub static BYTES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bypass"));

/// Fingerprint of the embedded object: a restarted agent adopts pinned programs only
/// when they are its own build.
pub fn fingerprint() -> u64 {
    fnv1a64(BYTES)
}

/// 64-bit FNV-1a: stable across Rust versions, unlike `DefaultHasher`.
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fingerprint(), 0);
    }
}
