//! Builds the minimal reference datapath (`minimal-ebpf`, the bench's `Path::Minimal`)
//! for the BPF target into `OUT_DIR/bypass-minimal`, the way `bypass-agent/build.rs`
//! builds the real one.

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/minimal-ebpf");
    // SAFETY: the build script is single-threaded here.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    println!("cargo:rerun-if-env-changed=BYPASS_EBPF_TOOLCHAIN");
    let toolchain = std::env::var("BYPASS_EBPF_TOOLCHAIN").unwrap_or_else(|_| "1.95.0".into());
    aya_build::build_ebpf(
        [Package {
            name: "bypass-minimal-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}
