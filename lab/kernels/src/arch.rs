//! Pure: what booting a kernel of each Debian architecture takes on this (amd64) host —
//! the emulator and its machine, the serial console, the modules the initramfs loads,
//! and for a foreign architecture the Rust target and Debian cross toolchain that build
//! the binaries it runs.

/// One guest architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// Debian's name (`amd64`, `arm64`), as in each kernel's `arch` in [`crate::KERNELS`].
    pub debian: &'static str,
    /// The emulator binary.
    pub qemu: &'static str,
    /// The Debian package that has it.
    pub qemu_package: &'static str,
    /// `-machine`.
    pub machine: &'static str,
    /// `-cpu` under TCG.
    pub tcg_cpu: &'static str,
    /// The serial console's device in the guest.
    pub console: &'static str,
    /// The modules `/init` loads, by name (dependencies are added), besides those of
    /// the host root's transport (`crate::share::Share::modules`).
    pub modules: &'static [&'static str],
    /// How to build for it when it is not the host's.
    pub cross: Option<Cross>,
}

/// A foreign architecture's build and run-time: its binaries run in the guest off the
/// host's root through Debian's cross libc (`/usr/<gnu triple>/lib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cross {
    /// The Rust target.
    pub rust_target: &'static str,
    /// The cross C compiler, also the linker.
    pub gcc: &'static str,
    /// Where Debian's cross libc is (seen at the same path in the guest).
    pub libdir: &'static str,
    /// The program interpreter the binaries name, and the file in `libdir` it is.
    pub loader: &'static str,
}

/// The modules every guest loads besides its transport's: overlay, and virtio over PCI.
const MODULES: &[&str] = &["overlay", "virtio_pci"];

/// Every architecture the matrix boots.
pub const ARCHES: &[Arch] = &[
    Arch {
        debian: "amd64",
        qemu: "qemu-system-x86_64",
        qemu_package: "qemu-system-x86",
        machine: "q35",
        tcg_cpu: "max",
        console: "ttyS0",
        modules: MODULES,
        cross: None,
    },
    Arch {
        debian: "arm64",
        qemu: "qemu-system-aarch64",
        qemu_package: "qemu-system-arm",
        // `virt` puts -virtfs on its PCIe host bridge (pci-host-generic, built into
        // Debian's arm64 kernel): virtio_pci, as on amd64; its console is the PL011.
        machine: "virt",
        // Pointer authentication with QEMU's cheap hash instead of the architected
        // QARMA: the same guest, several times faster under TCG.
        tcg_cpu: "max,pauth-impdef=on",
        console: "ttyAMA0",
        // The smoke test makes a veth pair, and the guest's request_module would start
        // the host's (amd64) modprobe: loaded up front instead.
        modules: &["overlay", "virtio_pci", "veth"],
        cross: Some(Cross {
            rust_target: "aarch64-unknown-linux-gnu",
            gcc: "aarch64-linux-gnu-gcc",
            libdir: "/usr/aarch64-linux-gnu/lib",
            loader: "/lib/ld-linux-aarch64.so.1",
        }),
    },
];

/// The architecture Debian calls `debian`.
pub fn of(debian: &str) -> Option<&'static Arch> {
    ARCHES.iter().find(|a| a.debian == debian)
}

impl Cross {
    /// The loader's file under [`Cross::libdir`].
    pub fn loader_file(&self) -> String {
        let name = self.loader.rsplit('/').next().unwrap_or(self.loader);
        format!("{}/{name}", self.libdir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::KERNELS;

    #[test]
    fn every_kernel_has_its_arch() {
        for k in KERNELS {
            assert!(of(k.arch).is_some(), "{}: {}", k.name, k.arch);
        }
        let arm = of("arm64").and_then(|a| a.cross).unwrap();
        assert_eq!(
            arm.loader_file(),
            "/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1"
        );
        assert!(of("amd64").is_some_and(|a| a.cross.is_none()));
    }
}
