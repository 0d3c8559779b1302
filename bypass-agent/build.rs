//! Builds the kernel object (`bypass-ebpf`) for the BPF target and leaves it in
//! `OUT_DIR/bypass`, where `datapath::object` embeds it.

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../bypass-ebpf");
    // The kernel crate needs `-Z build-std=core`. It is built by the pinned stable
    // toolchain (the LLVM that bpf-linker was built against, see `cargo xtask setup`),
    // with unstable flags allowed for that child build.
    // SAFETY: the build script is single-threaded here.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    println!("cargo:rerun-if-env-changed=BYPASS_EBPF_TOOLCHAIN");
    let toolchain = std::env::var("BYPASS_EBPF_TOOLCHAIN").unwrap_or_else(|_| "1.95.0".into());
    aya_build::build_ebpf(
        [Package {
            name: "bypass-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}
