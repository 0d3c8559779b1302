//! Rebuild the kernel object when bpf-linker changes (a new LLVM changes the output).
use which::which;

fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
