//! Before anything is loaded: does this kernel have what the datapath uses? Each
//! facility is probed (the map and program types, the helpers each program calls, BTF),
//! not inferred from the version string, so a kernel with the features backported (RHEL
//! 9 and RHCOS: 5.14) runs the agent and one without them is refused in one line naming
//! what it lacks, before any verifier log.
//!
//! Upstream, everything is there from `bypass_common::MIN_KERNEL` on (sock_ops may call
//! `bpf_get_netns_cookie` from 5.15, `sock_ops_func_proto` in net/core/filter.c); the
//! rest is older: sockmap and sk_msg (4.17), socket-local storage (5.2), cgroup
//! setsockopt hooks (5.3), `bpf_skc_to_tcp_sock` (5.9).
//!
//! The probes are aya's (`BPF_MAP_CREATE`, and libbpf's helper probe: a two-instruction
//! program whose verifier log names an unknown helper); [`missing`] is the pure part.

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};

use crate::error::AgentError;

/// How a need is probed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Probe {
    /// `/sys/kernel/btf/vmlinux` exists.
    Btf,
    /// A map of this type can be created.
    Map(MapType),
    /// A program of this type can be loaded.
    Program(ProgramType),
    /// A program of this type may call this helper.
    Helper(ProgramType, BpfHelper),
}

/// One thing the datapath needs from the kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    /// What it is, as the refusal names it.
    pub what: &'static str,
    /// What the datapath does with it.
    pub why: &'static str,
    /// How it is probed.
    pub probe: Probe,
}

/// Everything the programs use, in the order a refusal lists it.
pub const NEEDS: [Need; 14] = [
    Need {
        what: "BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)",
        why: "the programs' reads of socket fields are checked against it",
        probe: Probe::Btf,
    },
    Need {
        what: "sockmap (BPF_MAP_TYPE_SOCKHASH, CONFIG_BPF_STREAM_PARSER)",
        why: "sockets are redirected through a SockHash",
        probe: Probe::Map(MapType::SockHash),
    },
    Need {
        what: "socket-local storage (BPF_MAP_TYPE_SK_STORAGE)",
        why: "each socket's state lives there",
        probe: Probe::Map(MapType::SkStorage),
    },
    Need {
        what: "LRU hash maps",
        why: "pairing entries and pod namespaces live there",
        probe: Probe::Map(MapType::LruHash),
    },
    Need {
        what: "LPM trie maps",
        why: "pod and Service CIDRs are matched there",
        probe: Probe::Map(MapType::LpmTrie),
    },
    Need {
        what: "sock_ops programs (CONFIG_CGROUP_BPF)",
        why: "established connections are inserted by one",
        probe: Probe::Program(ProgramType::SockOps),
    },
    Need {
        what: "sk_msg programs (CONFIG_NET_SOCK_MSG)",
        why: "every send of an inserted socket goes through one",
        probe: Probe::Program(ProgramType::SkMsg),
    },
    Need {
        what: "cgroup setsockopt programs",
        why: "TCP_ULP is refused and receive options recorded by one",
        probe: Probe::Program(ProgramType::CgroupSockopt),
    },
    Need {
        what: "bpf_get_netns_cookie in sock_ops (Linux 5.15, or backported)",
        why: "every bypass key carries the socket's network namespace",
        probe: Probe::Helper(ProgramType::SockOps, BpfHelper::BPF_FUNC_get_netns_cookie),
    },
    Need {
        what: "bpf_sk_storage_get in sock_ops",
        why: "an inserted socket's state is kept in its storage",
        probe: Probe::Helper(ProgramType::SockOps, BpfHelper::BPF_FUNC_sk_storage_get),
    },
    Need {
        what: "bpf_skc_to_tcp_sock in sock_ops (Linux 5.9)",
        why: "the socket's own fields are read typed at insertion",
        probe: Probe::Helper(ProgramType::SockOps, BpfHelper::BPF_FUNC_skc_to_tcp_sock),
    },
    Need {
        what: "bpf_sock_hash_update in sock_ops",
        why: "sockets are inserted with it",
        probe: Probe::Helper(ProgramType::SockOps, BpfHelper::BPF_FUNC_sock_hash_update),
    },
    Need {
        what: "bpf_ktime_get_ns in sock_ops",
        why: "the agent's heartbeat is checked against it",
        probe: Probe::Helper(ProgramType::SockOps, BpfHelper::BPF_FUNC_ktime_get_ns),
    },
    Need {
        what: "bpf_msg_redirect_hash in sk_msg",
        why: "messages are redirected with it",
        probe: Probe::Helper(ProgramType::SkMsg, BpfHelper::BPF_FUNC_msg_redirect_hash),
    },
];

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// There.
    Yes,
    /// Not there.
    No,
    /// The probe could not tell (no privilege, an unexpected error): the load will.
    Unknown(String),
}

/// Runs one probe.
pub fn probe(p: Probe) -> Found {
    let answer = match p {
        Probe::Btf => Ok(std::path::Path::new(super::btf::VMLINUX_BTF).exists()),
        Probe::Map(t) => is_map_supported(t).map_err(|e| crate::error::chain(&e)),
        Probe::Program(t) => is_program_supported(t).map_err(|e| crate::error::chain(&e)),
        Probe::Helper(t, h) => is_helper_supported(t, h).map_err(|e| crate::error::chain(&e)),
    };
    match answer {
        Ok(true) => Found::Yes,
        Ok(false) => Found::No,
        Err(e) => Found::Unknown(e),
    }
}

/// Every need with what its probe found.
pub fn probe_all() -> Vec<(Need, Found)> {
    NEEDS.iter().map(|n| (*n, probe(n.probe))).collect()
}

/// The needs found missing (pure): a probe that could not tell is not a refusal.
pub fn missing(found: &[(Need, Found)]) -> Vec<Need> {
    found
        .iter()
        .filter(|(_, f)| *f == Found::No)
        .map(|(n, _)| *n)
        .collect()
}

/// The one-line refusal for `missing` on kernel `release` (pure), `None` if nothing is.
pub fn refusal(release: &str, missing: &[Need]) -> Option<AgentError> {
    let first = missing.first()?;
    Some(AgentError::KernelLacks {
        release: release.to_owned(),
        what: missing
            .iter()
            .map(|n| n.what)
            .collect::<Vec<_>>()
            .join(", "),
        why: first.why,
    })
}

/// Probes the running kernel; refuses it if anything the datapath needs is missing.
pub fn check(release: &str) -> Result<(), AgentError> {
    match refusal(release, &missing(&probe_all())) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_5_10_kernel_is_refused_for_what_it_lacks() {
        let found: Vec<(Need, Found)> = NEEDS
            .iter()
            .map(|n| {
                let f = match n.probe {
                    Probe::Helper(_, BpfHelper::BPF_FUNC_get_netns_cookie) => Found::No,
                    Probe::Btf => Found::Unknown("EPERM".into()),
                    _ => Found::Yes,
                };
                (*n, f)
            })
            .collect();
        let m = missing(&found);
        assert_eq!(m.len(), 1, "an unknown answer is not a refusal: {m:?}");
        let e = refusal("5.10.0-46-amd64", &m).unwrap().to_string();
        assert!(
            e.contains("5.10.0-46-amd64")
                && e.contains("bpf_get_netns_cookie")
                && e.contains(bypass_common::kernel::REFUSAL),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(refusal("6.18", &[]).is_none());
    }

    #[test]
    fn this_kernel_passes() {
        // The machines the tests run on have what the datapath needs.
        let found = probe_all();
        assert!(missing(&found).is_empty(), "{found:?}");
        check(&super::super::host::kernel_release()).unwrap();
    }
}
