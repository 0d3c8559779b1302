//! Rebuild the kernel object when bpf-linker changes (a new LLVM changes the output),
//! and let LLVM use 32-bit sub-registers (`alu32`): without them it has no fetching
//! atomic instructions, which `atomic.rs` needs (BPF ISA v3, Linux >= 5.12).
use which::which;

fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("bpf") {
        println!("cargo:rustc-link-arg-bins=--cpu-features=+alu32");
    }
}
