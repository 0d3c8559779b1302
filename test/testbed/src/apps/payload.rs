//! Payloads the test serves and checks: random-looking bytes from a seed, and SHA-256.

/// `n` bytes from `seed` (xorshift64*: fast, and random enough that no compression or
/// deduplication along the way could help).
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// SHA-256 of `data`, lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where `got` first differs from `want` (or where one ends), for a failure message.
pub fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or_else(|| (got.len() != want.len()).then(|| got.len().min(want.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_digested_and_compared() {
        let a = random_bytes(7, 1000);
        assert_eq!(a, random_bytes(7, 1000));
        assert_ne!(a, random_bytes(8, 1000));
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a[..10], &a), Some(10));
        let mut b = a.clone();
        b[500] ^= 1;
        assert_eq!(first_difference(&b, &a), Some(500));
    }
}
