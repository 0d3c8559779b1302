//! What the datapath needs of the kernel, listed once ([`NEEDS`]): each map type,
//! program type, helper and BTF, how the agent probes it and the upstream release that
//! brought it; from them the oldest upstream kernel with everything ([`MIN_KERNEL`]; the
//! agent probes the features themselves, so a kernel with them backported runs it too),
//! and the words of the refusal, stated once for the agent and the tests that expect a
//! refusal. The kernel fields the programs read are [`crate::KernelLayout::FIELDS`].

use core::fmt;

/// A kernel's `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What the agent's refusal of a kernel says, whatever it lacks (the kernel matrix
/// looks for it).
pub const REFUSAL: &str = "lacks what the datapath needs";

/// A map type the datapath creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// `BPF_MAP_TYPE_SOCKHASH`.
    SockHash,
    /// `BPF_MAP_TYPE_SK_STORAGE`.
    SkStorage,
    /// `BPF_MAP_TYPE_LRU_HASH`.
    LruHash,
    /// `BPF_MAP_TYPE_LPM_TRIE`.
    LpmTrie,
}

/// A program type the datapath loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    /// `BPF_PROG_TYPE_SOCK_OPS`.
    SockOps,
    /// `BPF_PROG_TYPE_SK_MSG`.
    SkMsg,
    /// `BPF_PROG_TYPE_CGROUP_SOCKOPT`.
    CgroupSockopt,
}

/// A helper a program calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    /// `bpf_get_netns_cookie`.
    GetNetnsCookie,
    /// `bpf_sk_storage_get`.
    SkStorageGet,
    /// `bpf_skc_to_tcp_sock`.
    SkcToTcpSock,
    /// `bpf_sock_hash_update`.
    SockHashUpdate,
    /// `bpf_ktime_get_ns`.
    KtimeGetNs,
    /// `bpf_msg_redirect_hash`.
    MsgRedirectHash,
}

impl Helper {
    /// Its name in the kernel (`bpf_...`).
    pub const fn name(self) -> &'static str {
        match self {
            Helper::GetNetnsCookie => "bpf_get_netns_cookie",
            Helper::SkStorageGet => "bpf_sk_storage_get",
            Helper::SkcToTcpSock => "bpf_skc_to_tcp_sock",
            Helper::SockHashUpdate => "bpf_sock_hash_update",
            Helper::KtimeGetNs => "bpf_ktime_get_ns",
            Helper::MsgRedirectHash => "bpf_msg_redirect_hash",
        }
    }
}

/// How a need is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `/sys/kernel/btf/vmlinux` exists.
    Btf,
    /// A map of this type can be created.
    Map(MapKind),
    /// A program of this type can be loaded.
    Program(ProgramKind),
    /// A program of this type may call this helper.
    Helper(ProgramKind, Helper),
    /// A bypassed socket's reads can be seen: the kernel's BTF has a
    /// `tcp_bpf_recvmsg` that takes its flags fourth (for BPF trampolines), or the
    /// `sock_recv_length` tracepoint.
    ReadHook,
}

/// One thing the datapath needs from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// What it is, as the refusal names it.
    pub what: &'static str,
    /// What the datapath does with it.
    pub why: &'static str,
    /// How it is probed.
    pub probe: Probe,
    /// The upstream release that brought it, where recorded (bcc's
    /// docs/kernel-versions.md and the kernel's own history; `sock_ops_func_proto` in
    /// net/core/filter.c for what sock_ops may call).
    pub since: Option<KernelVersion>,
}

const fn v(major: u32, minor: u32) -> Option<KernelVersion> {
    Some(KernelVersion { major, minor })
}

/// Everything the programs use, in the order a refusal lists it.
pub const NEEDS: [Need; 15] = [
    Need {
        what: "BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)",
        why: "the programs' reads of socket fields are checked against it",
        probe: Probe::Btf,
        since: None,
    },
    Need {
        what: "sockmap (BPF_MAP_TYPE_SOCKHASH, CONFIG_BPF_STREAM_PARSER)",
        why: "sockets are redirected through a SockHash",
        probe: Probe::Map(MapKind::SockHash),
        since: v(4, 18),
    },
    Need {
        what: "socket-local storage (BPF_MAP_TYPE_SK_STORAGE)",
        why: "each socket's state lives there",
        probe: Probe::Map(MapKind::SkStorage),
        since: v(5, 2),
    },
    Need {
        what: "LRU hash maps",
        why: "pairing entries and pod namespaces live there",
        probe: Probe::Map(MapKind::LruHash),
        since: v(4, 10),
    },
    Need {
        what: "LPM trie maps",
        why: "pod and Service CIDRs are matched there",
        probe: Probe::Map(MapKind::LpmTrie),
        since: v(4, 11),
    },
    Need {
        what: "sock_ops programs (CONFIG_CGROUP_BPF)",
        why: "established connections are inserted by one",
        probe: Probe::Program(ProgramKind::SockOps),
        since: v(4, 13),
    },
    Need {
        what: "sk_msg programs (CONFIG_NET_SOCK_MSG)",
        why: "every send of an inserted socket goes through one",
        probe: Probe::Program(ProgramKind::SkMsg),
        since: v(4, 17),
    },
    Need {
        what: "cgroup setsockopt programs",
        why: "TCP_ULP is refused and receive options recorded by one",
        probe: Probe::Program(ProgramKind::CgroupSockopt),
        since: v(5, 3),
    },
    Need {
        what: "bpf_get_netns_cookie in sock_ops (Linux 5.15, or backported)",
        why: "every bypass key carries the socket's network namespace",
        probe: Probe::Helper(ProgramKind::SockOps, Helper::GetNetnsCookie),
        since: v(5, 15),
    },
    Need {
        what: "bpf_sk_storage_get in sock_ops",
        why: "an inserted socket's state is kept in its storage",
        probe: Probe::Helper(ProgramKind::SockOps, Helper::SkStorageGet),
        since: None,
    },
    Need {
        what: "bpf_skc_to_tcp_sock in sock_ops (Linux 5.9)",
        why: "the socket's own fields are read typed at insertion",
        probe: Probe::Helper(ProgramKind::SockOps, Helper::SkcToTcpSock),
        since: v(5, 9),
    },
    Need {
        what: "bpf_sock_hash_update in sock_ops",
        why: "sockets are inserted with it",
        probe: Probe::Helper(ProgramKind::SockOps, Helper::SockHashUpdate),
        since: v(4, 18),
    },
    Need {
        what: "bpf_ktime_get_ns in sock_ops",
        why: "the agent's heartbeat is checked against it",
        probe: Probe::Helper(ProgramKind::SockOps, Helper::KtimeGetNs),
        since: None,
    },
    Need {
        what: "bpf_msg_redirect_hash in sk_msg",
        why: "messages are redirected with it",
        probe: Probe::Helper(ProgramKind::SkMsg, Helper::MsgRedirectHash),
        since: v(4, 18),
    },
    Need {
        what: "a tcp_bpf_recvmsg taking its flags fourth (Linux 5.19), for BPF trampolines, \
               or the sock_recv_length tracepoint (Linux 6.4)",
        why: "what each bypassed socket read is counted by its return, for the queue bound, \
              the read guard and leaving",
        probe: Probe::ReadHook,
        since: v(5, 19),
    },
];

/// Minimum kernel version: the newest release among [`NEEDS`] (5.19: `tcp_bpf_recvmsg`
/// takes its flags fourth from 5.19 on, where the read hooks' programs read them; before,
/// `nonblock`, net/ipv4/tcp_bpf.c).
pub const MIN_KERNEL: KernelVersion = newest(&NEEDS);

/// The newest `since` of `needs`.
const fn newest(needs: &[Need]) -> KernelVersion {
    let mut min = KernelVersion { major: 0, minor: 0 };
    let mut i = 0;
    while i < needs.len() {
        if let Some(v) = needs[i].since
            && (v.major > min.major || (v.major == min.major && v.minor > min.minor))
        {
            min = v;
        }
        i += 1;
    }
    min
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::format;

    use super::*;

    #[test]
    fn orders_and_prints() {
        assert!(
            KernelVersion {
                major: 5,
                minor: 10
            } < MIN_KERNEL
        );
        assert!(KernelVersion { major: 6, minor: 1 } > MIN_KERNEL);
        assert_eq!(format!("{MIN_KERNEL}"), "5.19");
    }

    #[test]
    fn needs_name_their_release_and_helper() {
        for n in NEEDS {
            // A release the refusal names is the one recorded.
            if let Some(at) = n.what.find("(Linux ") {
                let named = &n.what[at + "(Linux ".len()..];
                let since = n.since.map(|v| format!("{v}")).unwrap_or_default();
                assert!(
                    named.starts_with(&since) && !since.is_empty(),
                    "{}: {since}",
                    n.what
                );
            }
            if let Probe::Helper(_, h) = n.probe {
                assert!(n.what.starts_with(h.name()), "{}", n.what);
            }
            assert!(n.since.is_none_or(|v| v <= MIN_KERNEL));
        }
    }
}
