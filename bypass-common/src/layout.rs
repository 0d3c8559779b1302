//! What the agent fixes at load time in the programs' read-only globals: where the
//! kernel fields the programs read lie (from the running kernel's BTF,
//! `/sys/kernel/btf/vmlinux`), which optional reads are on, and the host's network
//! namespace. The verifier treats a frozen read-only global as a constant, so a typed
//! load at `socket + OFFSET` is checked against the kernel's own type: a wrong offset
//! fails the load instead of reading the wrong field.

/// Names of the read-only globals (`.rodata`) the kernel object declares.
pub mod globals {
    /// [`super::KernelLayout::sk_rcvlowat`].
    pub const OFF_SK_RCVLOWAT: &str = "BYPASS_OFF_SK_RCVLOWAT";
    /// [`super::KernelLayout::sk_peek_off`].
    pub const OFF_SK_PEEK_OFF: &str = "BYPASS_OFF_SK_PEEK_OFF";
    /// [`super::KernelLayout::icsk_ulp_ops`].
    pub const OFF_ICSK_ULP_OPS: &str = "BYPASS_OFF_ICSK_ULP_OPS";
    /// [`super::KernelLayout::tcp_write_seq`].
    pub const OFF_TCP_WRITE_SEQ: &str = "BYPASS_OFF_TCP_WRITE_SEQ";
    /// [`super::KernelLayout::tcp_fastopen_req`].
    pub const OFF_TCP_FASTOPEN_REQ: &str = "BYPASS_OFF_TCP_FASTOPEN_REQ";
    /// [`super::KernelLayout::tcp_copied_seq`].
    pub const OFF_TCP_COPIED_SEQ: &str = "BYPASS_OFF_TCP_COPIED_SEQ";
    /// [`super::KernelLayout::sk_rcvbuf`].
    pub const OFF_SK_RCVBUF: &str = "BYPASS_OFF_SK_RCVBUF";
    /// [`super::KernelLayout::sk_userlocks`].
    pub const OFF_SK_USERLOCKS: &str = "BYPASS_OFF_SK_USERLOCKS";
    /// [`super::KernelLayout::socket_sk`].
    pub const OFF_SOCKET_SK: &str = "BYPASS_OFF_SOCKET_SK";
    /// [`super::KernelLayout::sk_flags`].
    pub const OFF_SK_FLAGS: &str = "BYPASS_OFF_SK_FLAGS";
    /// [`super::KernelLayout::sock_zerocopy`].
    pub const SOCK_ZEROCOPY: &str = "BYPASS_SOCK_ZEROCOPY";
    /// [`super::KernelLayout::msg_cost`].
    pub const MSG_COST: &str = "BYPASS_MSG_COST";
    /// [`super::KernelLayout::sk_prot`].
    pub const OFF_SK_PROT: &str = "BYPASS_OFF_SK_PROT";
    /// [`super::KernelLayout::proto_memory_allocated`].
    pub const OFF_PROTO_MEMORY_ALLOCATED: &str = "BYPASS_OFF_PROTO_MEMORY_ALLOCATED";
    /// [`super::KernelLayout::sk_user_data`].
    pub const OFF_SK_USER_DATA: &str = "BYPASS_OFF_SK_USER_DATA";
    /// [`super::KernelLayout::sk_backlog`].
    pub const OFF_SK_BACKLOG: &str = "BYPASS_OFF_SK_BACKLOG";
    /// [`super::KernelLayout::tcp_rcv_nxt`].
    pub const OFF_TCP_RCV_NXT: &str = "BYPASS_OFF_TCP_RCV_NXT";
    /// [`super::KernelLayout::tcp_urg_data`].
    pub const OFF_TCP_URG_DATA: &str = "BYPASS_OFF_TCP_URG_DATA";
    /// [`super::KernelLayout::tcp_urg_seq`].
    pub const OFF_TCP_URG_SEQ: &str = "BYPASS_OFF_TCP_URG_SEQ";
    /// [`super::KernelLayout::sock_done`].
    pub const SOCK_DONE: &str = "BYPASS_SOCK_DONE";
    /// [`super::KernelLayout::sock_urginline`].
    pub const SOCK_URGINLINE: &str = "BYPASS_SOCK_URGINLINE";
    /// The build's number, for [`crate::control::SLOT_HOOKS_OWNER`]: [`super::build_id`] of
    /// the object's fingerprint.
    pub const BUILD: &str = "BYPASS_BUILD";
    /// [`Features`](super::features) bits.
    pub const FEATURES: &str = "BYPASS_FEATURES";
    /// Cookie of the host's network namespace (the agent's own): sockets there (the
    /// node's processes, hostNetwork pods) are never touched.
    pub const HOST_NETNS: &str = "BYPASS_HOST_NETNS";
}

/// The layout of every pinned map (names, kinds, key and value types, sizes, the
/// meaning of each control slot, counter and state bit) and of what the tracing programs
/// do: a build replaces the programs of a pinned datapath of another build in place only
/// when both have this number (its sk_msg, sock_ops and setsockopt programs; the tracing
/// programs stay the ones that loaded the layout). Bumped with any change that an older
/// build's programs, still running on established sockets, would misread, and with any
/// change a program relies on in the tracing programs; CHANGELOG.md says which releases
/// share one. v0.1.0 had none (1 here); 3 added the per-pod counts
/// ([`crate::names::MAP_POD_COUNTS`]); 4 the drain before TCP (sk_msg relies on the read
/// guard's `state::rx::DRAINED`, the leave on `state::link_state::CUT`).
pub const LAYOUT_VERSION: u32 = 4;

/// The number a build's tracing programs compare with
/// [`crate::control::SLOT_HOOKS_OWNER`], from its object's 64-bit fingerprint: never 0
/// (0 in the slot means no build's programs act).
pub const fn build_id(fingerprint: u64) -> u32 {
    let id = (fingerprint ^ (fingerprint >> 32)) as u32;
    if id == 0 { 1 } else { id }
}

/// Where the value of a [`KernelLayout`] field comes from in the running kernel's BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The byte offset of `member` in `struct strukt` (looking into anonymous structs
    /// and unions, as C does); where that struct has no such member, the offset of the
    /// `or` pair's.
    Member {
        /// The struct.
        strukt: &'static str,
        /// The member.
        member: &'static str,
        /// Where the member lies on other kernels.
        or: Option<(&'static str, &'static str)>,
    },
    /// The value of enumerator `value` of `enum name`, a bit number below 64.
    Bit {
        /// The enum.
        name: &'static str,
        /// The enumerator.
        value: &'static str,
    },
    /// [`message_cost`] of `struct strukt`'s size
    /// ([`crate::names::DEFAULT_MSG_COST`] where BTF lacks it).
    MessageCost {
        /// The struct.
        strukt: &'static str,
    },
}

impl Source {
    /// A member of a struct, found nowhere else.
    pub const fn member(strukt: &'static str, member: &'static str) -> Self {
        Self::Member {
            strukt,
            member,
            or: None,
        }
    }
}

/// One field of [`KernelLayout`], as the catalogue lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelField {
    /// Its name in [`KernelLayout`].
    pub name: &'static str,
    /// Whether every load needs it ([`KernelLayout::has_required`]); an optional one
    /// that is missing turns off what needs it.
    pub required: bool,
    /// Where its value comes from.
    pub source: Source,
    /// The read-only global ([`globals`]) the agent loads it into; `None`: the programs
    /// do not read it.
    pub global: Option<&'static str>,
    /// Its doc comment, a line each.
    pub doc: &'static [&'static str],
}

/// Declares [`KernelLayout`] and its catalogue [`KernelLayout::FIELDS`] from one list
/// of `doc name { required: bool, source: Source, global: Option<&str> };`, in the
/// order the BTF is read and the load digested.
macro_rules! kernel_fields {
    ($( $(#[doc = $doc:expr])* $field:ident {
        required: $required:expr,
        source: $source:expr,
        global: $global:expr $(,)?
    }; )*) => {
        /// Byte offsets of the kernel fields the programs read, and the one kernel size
        /// they use. A `struct sock` sits at offset 0 of `struct tcp_sock` (inside
        /// `inet_connection_sock`, itself at offset 0), so the socket offsets are offsets
        /// into the TCP socket too. 0: unknown (not in this kernel's BTF).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct KernelLayout {
            $( $(#[doc = $doc])* pub $field: u32, )*
        }

        impl KernelLayout {
            /// Every field, in the catalogue's order.
            pub const FIELDS: [KernelField; [$(stringify!($field)),*].len()] = [$(
                KernelField {
                    name: stringify!($field),
                    required: $required,
                    source: $source,
                    global: $global,
                    doc: &[$($doc),*],
                },
            )*];

            /// The fields' values, in [`KernelLayout::FIELDS`] order.
            pub const fn values(&self) -> [u32; Self::FIELDS.len()] {
                [$(self.$field),*]
            }

            /// The fields themselves, in [`KernelLayout::FIELDS`] order.
            pub fn fields(&self) -> [&u32; Self::FIELDS.len()] {
                [$(&self.$field),*]
            }

            /// The fields, mutable, in [`KernelLayout::FIELDS`] order.
            pub fn fields_mut(&mut self) -> [&mut u32; Self::FIELDS.len()] {
                [$(&mut self.$field),*]
            }
        }
    };
}

kernel_fields! {
    /// `struct sock`, `sk_rcvlowat` (SO_RCVLOWAT), read typed at insertion.
    sk_rcvlowat {
        required: true,
        source: Source::member("sock", "sk_rcvlowat"),
        global: Some(globals::OFF_SK_RCVLOWAT),
    };
    /// `struct sock`, `sk_peek_off` (SO_PEEK_OFF; -1 when unset), read typed at
    /// insertion.
    sk_peek_off {
        required: true,
        source: Source::member("sock", "sk_peek_off"),
        global: Some(globals::OFF_SK_PEEK_OFF),
    };
    /// `struct inet_connection_sock`, `icsk_ulp_ops` (an upper-layer protocol such as
    /// MPTCP's subflow or kTLS), read typed at insertion and on every send.
    icsk_ulp_ops {
        required: true,
        source: Source::member("inet_connection_sock", "icsk_ulp_ops"),
        global: Some(globals::OFF_ICSK_ULP_OPS),
    };
    /// `struct tcp_sock`, `write_seq` (the end of what the application queued), read
    /// typed at insertion and on every send: a direction redirects only while its peer
    /// has read up to it.
    tcp_write_seq {
        required: true,
        source: Source::member("tcp_sock", "write_seq"),
        global: Some(globals::OFF_TCP_WRITE_SEQ),
    };
    /// `struct tcp_sock`, `fastopen_req`, read typed at insertion: set while a TCP Fast
    /// Open `sendto`/`write` connects, which then sends its data by plain TCP after the
    /// socket was inserted (net/ipv4/tcp.c, tcp_sendmsg_fastopen).
    tcp_fastopen_req {
        required: true,
        source: Source::member("tcp_sock", "fastopen_req"),
        global: Some(globals::OFF_TCP_FASTOPEN_REQ),
    };
    /// `struct tcp_sock`, `copied_seq` (how far the application has read what came by
    /// TCP), read typed when the last reader leaves `tcp_bpf_recvmsg`.
    tcp_copied_seq {
        required: true,
        source: Source::member("tcp_sock", "copied_seq"),
        global: Some(globals::OFF_TCP_COPIED_SEQ),
    };
    /// `struct sock`, `sk_rcvbuf`, read typed with [`KernelLayout::sk_userlocks`] for a
    /// reader's bound.
    sk_rcvbuf {
        required: true,
        source: Source::member("sock", "sk_rcvbuf"),
        global: Some(globals::OFF_SK_RCVBUF),
    };
    /// `struct sock`, `sk_userlocks` (a byte since Linux 6.x; 0 where it is a bitfield,
    /// and then a fixed receive buffer is not seen: the global bound applies).
    sk_userlocks {
        required: false,
        source: Source::member("sock", "sk_userlocks"),
        global: Some(globals::OFF_SK_USERLOCKS),
    };
    /// `struct socket`, `sk`: the read guard finds the socket of a file through it.
    socket_sk {
        required: true,
        source: Source::member("socket", "sk"),
        global: Some(globals::OFF_SOCKET_SK),
    };
    /// `struct sock`, `sk_user_data`, read typed by the FIONREAD compensation: its
    /// `SK_USER_DATA_PSOCK` bit (include/net/sock.h) says the socket has a psock now,
    /// so its FIONREAD went through sockmap's answer (0: the compensation is off).
    sk_user_data {
        required: false,
        source: Source::member("sock", "sk_user_data"),
        global: Some(globals::OFF_SK_USER_DATA),
    };
    /// `struct sock`, `sk_backlog`, whose first member is `rmem_alloc` (`sk_rmem_alloc`:
    /// what the socket's receive queues hold, redirected bytes counted at their size,
    /// net/ipv4/tcp_bpf.c, bpf_tcp_ingress), read typed by the FIONREAD compensation as
    /// a ceiling on the redirected bytes it adds: the accounting it starts from errs
    /// high for FIONREAD (an urgent byte TCP skips moves `copied_seq` with no read
    /// returning it).
    sk_backlog {
        required: false,
        source: Source::member("sock", "sk_backlog"),
        global: Some(globals::OFF_SK_BACKLOG),
    };
    /// `struct tcp_sock`, `rcv_nxt` (the end of what came by TCP), read typed by the
    /// FIONREAD compensation for the bytes waiting in the TCP receive queue.
    tcp_rcv_nxt {
        required: false,
        source: Source::member("tcp_sock", "rcv_nxt"),
        global: Some(globals::OFF_TCP_RCV_NXT),
    };
    /// `struct tcp_sock`, `urg_data` (an urgent byte pending), read typed by the
    /// FIONREAD compensation, which answers as `tcp_inq` does (include/net/tcp.h).
    tcp_urg_data {
        required: false,
        source: Source::member("tcp_sock", "urg_data"),
        global: Some(globals::OFF_TCP_URG_DATA),
    };
    /// `struct tcp_sock`, `urg_seq`, read typed by the FIONREAD compensation with
    /// [`KernelLayout::tcp_urg_data`].
    tcp_urg_seq {
        required: false,
        source: Source::member("tcp_sock", "urg_seq"),
        global: Some(globals::OFF_TCP_URG_SEQ),
    };
    /// Kernel memory a waiting message holds besides its bytes ([`message_cost`]).
    msg_cost {
        required: false,
        source: Source::MessageCost { strukt: "sk_msg" },
        global: Some(globals::MSG_COST),
    };
    /// `struct sock`, `sk_flags`, read typed at insertion for
    /// [`KernelLayout::sock_zerocopy`] (0: not read). It is `__sk_common.skc_flags`
    /// (struct sock_common, at offset 0 of struct sock) on recent kernels, a member of
    /// struct sock on older ones.
    sk_flags {
        required: false,
        source: Source::Member {
            strukt: "sock_common",
            member: "skc_flags",
            or: Some(("sock", "sk_flags")),
        },
        global: Some(globals::OFF_SK_FLAGS),
    };
    /// The bit of `SOCK_ZEROCOPY` in `sk_flags` (`enum sock_flags`): set by SO_ZEROCOPY
    /// and inherited by a listener's accepted sockets, which are then never inserted
    /// (a socket in a sockmap gives MSG_ZEROCOPY no completion notifications).
    sock_zerocopy {
        required: false,
        source: Source::Bit {
            name: "sock_flags",
            value: "SOCK_ZEROCOPY",
        },
        global: Some(globals::SOCK_ZEROCOPY),
    };
    /// `struct sock_common`, `skc_prot` (`sk_prot`: the socket's protocol, at offset 0
    /// of struct sock), read typed on every send for
    /// [`KernelLayout::proto_memory_allocated`] (0: not read).
    sk_prot {
        required: false,
        source: Source::member("sock_common", "skc_prot"),
        global: Some(globals::OFF_SK_PROT),
    };
    /// `struct proto`, `memory_allocated`: the pages TCP sockets hold on the node
    /// (`tcp_memory_allocated`, what `tcp_mem` limits), read typed on every send: near
    /// `tcp_mem`'s first threshold a redirect may be refused memory, and the kernel then
    /// fails the send (`crate::control::SLOT_TCP_MEM_TIGHT`). 0: not read, and sends
    /// redirect whatever the memory.
    proto_memory_allocated {
        required: false,
        source: Source::member("proto", "memory_allocated"),
        global: Some(globals::OFF_PROTO_MEMORY_ALLOCATED),
    };
    /// The bit of `SOCK_DONE` (a FIN came) in `sk_flags`, read by the FIONREAD
    /// compensation: `tcp_inq` does not count the FIN.
    sock_done {
        required: false,
        source: Source::Bit {
            name: "sock_flags",
            value: "SOCK_DONE",
        },
        global: Some(globals::SOCK_DONE),
    };
    /// The bit of `SOCK_URGINLINE` (SO_OOBINLINE) in `sk_flags`, read by the FIONREAD
    /// compensation as `tcp_inq` reads it.
    sock_urginline {
        required: false,
        source: Source::Bit {
            name: "sock_flags",
            value: "SOCK_URGINLINE",
        },
        global: Some(globals::SOCK_URGINLINE),
    };
}

impl KernelLayout {
    /// The fields every load needs ([`KernelField::required`]).
    pub const fn has_required(&self) -> bool {
        let values = self.values();
        let mut i = 0;
        while i < values.len() {
            if Self::FIELDS[i].required && values[i] == 0 {
                return false;
            }
            i += 1;
        }
        true
    }

    /// Whether the FIONREAD compensation can answer as `tcp_inq` does: every field it
    /// reads is known.
    pub const fn fionread_fields(&self) -> bool {
        self.sk_user_data != 0
            && self.sk_backlog != 0
            && self.tcp_rcv_nxt != 0
            && self.tcp_urg_data != 0
            && self.tcp_urg_seq != 0
            && self.sk_flags != 0
            && self.sock_done != 0
            && self.sock_urginline != 0
    }

    /// Each read-only global the programs read and the field loaded into it, in
    /// [`KernelLayout::FIELDS`] order.
    pub fn globals(&self) -> impl Iterator<Item = (&'static str, &u32)> {
        Self::FIELDS
            .iter()
            .zip(self.fields())
            .filter_map(|(f, v)| Some((f.global?, v)))
    }
}

/// What a waiting message is charged besides its bytes: its `struct sk_msg` of
/// `sk_msg_size` bytes, rounded up to its slab size, and a page: its bytes sit in the
/// sender's page fragment (`sk_msg_alloc`, net/core/skmsg.c), which a queued small
/// message keeps from being freed, so a stream of small messages interleaved with
/// larger writes elsewhere can pin a page (up to a 32 KiB compound page) per message.
pub const fn message_cost(sk_msg_size: u32) -> u32 {
    slab_size(sk_msg_size) + PAGE_COST
}

/// The page [`message_cost`] charges.
pub const PAGE_COST: u32 = 4096;

/// The slab size a kmalloc of `size` bytes takes (the kmalloc caches: powers of two
/// from 8, and 96 and 192), for [`KernelLayout::msg_cost`].
pub const fn slab_size(size: u32) -> u32 {
    if size <= 8 {
        return 8;
    }
    if size > 64 && size <= 96 {
        return 96;
    }
    if size > 128 && size <= 192 {
        return 192;
    }
    let mut s = 16;
    while s < size && s < (1 << 30) {
        s <<= 1;
    }
    s
}

/// Bits of the [`globals::FEATURES`] global and of the control slot `status` reads.
pub mod features {
    /// The kernel self-test found that FIONREAD on a socket with a psock misses the
    /// bytes waiting in its TCP receive queue (the sockmap "Fix FIONREAD" series without
    /// its later fix: it answers with the ingress queue alone), and the FIONREAD
    /// compensation adds them (`tcp_inq`).
    pub const FIONREAD_ADD_TCP: u32 = 2;
    /// Recorded for `status`: the read guard's checks run as fmod_ret programs on the
    /// kernel's `security_*` functions, where the kernel self-test saw no BPF LSM program
    /// run. The kernel skips a tracing program on a CPU where a preempted task is still
    /// inside it (kernel/bpf/trampoline.c, `__bpf_prog_enter_recur`), which a
    /// preemptible kernel (Linux 7's default, `PREEMPT_LAZY`) lets happen: a check on
    /// every read(2) of the node can be skipped for a splice (docs/limitations.md).
    pub const GUARD_FMOD_RET: u32 = 16;
    /// Recorded for `status`: the read guard's checks run as BPF LSM programs, which the
    /// kernel runs on every call from Linux 6.2 on (no recursion check:
    /// include/linux/bpf_verifier.h, `bpf_prog_check_recur`), where the kernel self-test
    /// saw them refuse.
    pub const GUARD_LSM: u32 = 512;
    /// The bits that say how the read guard's checks run (one at most).
    pub const GUARD_ATTACH: u32 = GUARD_FMOD_RET | GUARD_LSM;
    /// Recorded for `status` and the agent: no read guard on this kernel (it refuses
    /// BPF trampoline programs); a process seen splicing gets no redirected bytes from
    /// its next read on, but a socket read with recv and then spliced while redirected
    /// bytes wait can miss them.
    pub const NO_READ_GUARD: u32 = 32;
    /// The kernel honours `SO_PEEK_OFF` on TCP sockets (Linux ≥ 6.9): the setsockopt
    /// hook refuses it while redirected bytes wait unread. Without it the kernel
    /// itself refuses the option (`EOPNOTSUPP`), and so does the hook not.
    pub const TCP_PEEK_OFF: u32 = 64;
    /// The kernel self-test found that FIONREAD misses bytes redirected to the socket
    /// and not read yet (kernels before the sockmap "Fix FIONREAD" series, Linux 6.1:
    /// `tcp_ioctl` alone), and the FIONREAD compensation adds them.
    pub const FIONREAD_ADD_INGRESS: u32 = 128;
    /// The kernel self-test found FIONREAD wrong and no compensation could be loaded
    /// (`bpf_probe_write_user` refused: kernel lockdown, or no BPF trampolines).
    pub const FIONREAD_WRONG: u32 = 256;
    /// The bits the programs look at (sk_msg drains toward a reader that reads TCP only
    /// only where a read guard runs: [`NO_READ_GUARD`]).
    pub const PROGRAM_BITS: u32 =
        TCP_PEEK_OFF | FIONREAD_ADD_TCP | FIONREAD_ADD_INGRESS | NO_READ_GUARD;
}

/// A 64-bit digest of what a load fixed in the globals, so a restarted agent adopts a
/// pinned datapath only if it was loaded the same way.
pub const fn digest(layout: &KernelLayout, features: u32, host_netns: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    // Every field loaded into a global, in the catalogue's order, then the features
    // the programs look at and the host namespace.
    let values = layout.values();
    let mut i = 0;
    while i < values.len() {
        if KernelLayout::FIELDS[i].global.is_some() {
            h = fnv_word(h, values[i] as u64);
        }
        i += 1;
    }
    h = fnv_word(h, (features & features::PROGRAM_BITS) as u64);
    fnv_word(h, host_netns)
}

/// One 64-bit word into an FNV-1a-style digest (the word as one unit, not its bytes).
const fn fnv_word(h: u64, word: u64) -> u64 {
    (h ^ word).wrapping_mul(0x100_0000_01b3)
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn requirements() {
        let mut l = KernelLayout::default();
        assert!(!l.has_required());
        l.sk_rcvlowat = 1;
        l.sk_peek_off = 2;
        l.icsk_ulp_ops = 3;
        l.tcp_write_seq = 7;
        l.tcp_fastopen_req = 8;
        assert!(!l.has_required(), "no copied_seq, rcvbuf or socket->sk");
        l.tcp_copied_seq = 9;
        l.sk_rcvbuf = 10;
        l.socket_sk = 11;
        assert!(l.has_required(), "sk_userlocks is optional");
        assert!(!l.fionread_fields());
        l.sk_backlog = 11;
        l.sk_user_data = 12;
        l.tcp_rcv_nxt = 13;
        l.tcp_urg_data = 14;
        l.tcp_urg_seq = 15;
        l.sk_flags = 16;
        l.sock_done = 17;
        assert!(!l.fionread_fields(), "no SOCK_URGINLINE");
        l.sock_urginline = 18;
        assert!(l.fionread_fields());
    }

    #[test]
    fn slab_sizes() {
        assert_eq!(slab_size(712), 1024, "struct sk_msg on 6.18");
        assert_eq!(slab_size(1024), 1024);
        assert_eq!(slab_size(1025), 2048);
        assert_eq!(slab_size(90), 96);
        assert_eq!(slab_size(150), 192);
        assert_eq!(slab_size(1), 8);
        assert_eq!(slab_size(17), 32);
        assert_eq!(message_cost(712), 1024 + 4096, "a slab object and a page");
    }

    #[test]
    fn digest_is_stable() {
        // A restarted agent compares the digest with the one it pinned, so it must not
        // change with the code's shape (only with the fields and the feature bits the
        // programs see: this value since `NO_READ_GUARD` joined them).
        let l = KernelLayout {
            sk_rcvlowat: 1,
            sk_peek_off: 2,
            icsk_ulp_ops: 3,
            tcp_write_seq: 4,
            tcp_fastopen_req: 5,
            tcp_copied_seq: 6,
            sk_rcvbuf: 7,
            sk_userlocks: 8,
            socket_sk: 9,
            sk_user_data: 10,
            sk_backlog: 21,
            tcp_rcv_nxt: 11,
            tcp_urg_data: 12,
            tcp_urg_seq: 13,
            msg_cost: 14,
            sk_flags: 15,
            sock_zerocopy: 16,
            sk_prot: 17,
            proto_memory_allocated: 18,
            sock_done: 19,
            sock_urginline: 20,
        };
        assert_eq!(digest(&l, 0xff, 0x1234_5678_9abc), 0xd86f_8156_765b_3924);
    }

    #[test]
    fn catalogue_names_its_fields_and_globals() {
        let mut l = KernelLayout::default();
        for (i, v) in l.fields_mut().into_iter().enumerate() {
            *v = i as u32 + 1;
        }
        for (f, v) in KernelLayout::FIELDS.iter().zip(l.values()) {
            assert!(v != 0, "{}", f.name);
        }
        assert_eq!(l.sk_rcvlowat, 1);
        assert_eq!(KernelLayout::FIELDS[0].name, "sk_rcvlowat");
        assert_eq!(l.sock_urginline as usize, KernelLayout::FIELDS.len());
        let globals: std::vec::Vec<_> = l.globals().map(|(g, _)| g).collect();
        assert_eq!(globals.len(), KernelLayout::FIELDS.len(), "every field");
        assert!(globals.iter().all(|g| g.starts_with("BYPASS_")));
        assert!(!globals.contains(&globals::FEATURES));
    }

    #[test]
    fn digest_tells_loads_apart() {
        let l = KernelLayout::default();
        assert_eq!(digest(&l, 1, 7), digest(&l, 1, 7));
        assert_ne!(digest(&l, 1, 7), digest(&l, 1, 8));
        let other = KernelLayout {
            msg_cost: 1024,
            ..l
        };
        assert_ne!(digest(&l, 0, 7), digest(&other, 0, 7));
    }
}
