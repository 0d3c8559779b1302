//! The kernel object, built by `build.rs` and embedded so the binary needs nothing else.

/// The ELF object holding both programs and their maps.
pub static BYTES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bypass"));
