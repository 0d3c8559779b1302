//! Rebuild the kernel object when bpf-linker changes (a new LLVM changes the output).
//!
//! No `alu32` (`--cpu-features=+alu32`): built with it (bpf-linker 0.13, LLVM of
//! rustc 1.95), sock_ops never took a loopback end for one inside a pod's namespace,
//! though the namespace map said so, and no loopback connection was paired
//! (tests/mesh/loopback.rs); built without it, the same source pairs them. The code it
//! generates was not pinned down further. `atomic.rs` uses 64-bit atomics, which need
//! no `alu32`.
use which::which;

fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
