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

    /// Every read-only global the agent sets at load ([`bypass_common::KernelLayout`]'s
    /// catalogue, the features, the host namespace) is a symbol of the object: its name
    /// is in the object's string table.
    #[test]
    fn object_declares_every_global() {
        use bypass_common::{KernelLayout, layout::globals};
        let has = |name: &str| BYTES.windows(name.len()).any(|w| w == name.as_bytes());
        let layout = KernelLayout::default();
        for name in layout
            .globals()
            .map(|(g, _)| g)
            .chain([globals::FEATURES, globals::HOST_NETNS])
        {
            assert!(has(name), "global {name} is not in the object");
        }
    }

    /// The embedded object declares every map and program `bypass_common::names`
    /// names, each program of the type its use needs: a name changed on one side only
    /// fails here, not at load on a node. Parsing needs no privileges.
    #[test]
    fn object_declares_every_name() {
        use aya_obj::{Object, ProgramSection as S};
        use bypass_common::names::{self, HookKind};

        let obj = Object::parse(BYTES).unwrap();
        let named: Vec<&str> = names::PINNED_MAPS.to_vec();
        for map in &named {
            assert!(
                obj.maps.contains_key(*map),
                "map {map} is not in the object"
            );
        }
        // And the other way: every map of the object is named, but its globals and
        // the per-CPU scratch space only the programs know (bypass-ebpf/src/maps.rs).
        let scratch = ["BYPASS_BACKEND_KEY", "BYPASS_SCRATCH"];
        for map in obj.maps.keys().filter(|m| !m.starts_with('.')) {
            assert!(
                named.contains(&map.as_str()) || scratch.contains(&map.as_str()),
                "map {map} is in no names list"
            );
        }
        let section = |prog: &str| match obj.programs.get(prog) {
            Some(p) => &p.section,
            None => panic!("program {prog} is not in the object"),
        };
        assert!(matches!(section(names::PROG_SOCKOPS), S::SockOps));
        assert!(matches!(section(names::PROG_SKMSG), S::SkMsg));
        assert!(matches!(
            section(names::PROG_SOCKOPT),
            S::CgroupSockopt { .. }
        ));
        let mut hooked = Vec::new();
        for hook in names::all_hooks() {
            let s = section(hook.program);
            let fits = match hook.kind {
                HookKind::Entry => matches!(s, S::FEntry { .. }),
                HookKind::Exit => matches!(s, S::FExit { .. }),
                HookKind::Guard => matches!(s, S::Lsm { .. }),
                HookKind::TracePoint => matches!(s, S::BtfTracePoint),
                HookKind::Syscall => matches!(s, S::TracePoint),
            };
            assert!(
                fits,
                "program {} is {s:?}, not {:?}",
                hook.program, hook.kind
            );
            hooked.push(hook.program);
        }
        // Every PROG_* constant is one of the above.
        for prog in [
            names::PROG_READ,
            names::PROG_READ_ENTER,
            names::PROG_READ_EXIT,
            names::PROG_SPLICE_ENTER,
            names::PROG_SPLICE_EXIT,
            names::PROG_MMAP_ENTER,
            names::PROG_MMAP_EXIT,
            names::PROG_READ_GUARD,
            names::PROG_MMAP_GUARD,
            names::PROG_SPLICE_SEEN,
            names::PROG_FIONREAD,
            names::PROG_RECV_ENTER,
            names::PROG_RECV_EXIT,
            names::PROG_RECV_GUARD,
        ] {
            assert!(hooked.contains(&prog), "program {prog} is in no hook list");
        }
        for prog in obj.programs.keys() {
            assert!(
                hooked.contains(&prog.as_str())
                    || [names::PROG_SOCKOPS, names::PROG_SKMSG, names::PROG_SOCKOPT]
                        .contains(&prog.as_str()),
                "program {prog} of the object is in no names list"
            );
        }
    }
}
