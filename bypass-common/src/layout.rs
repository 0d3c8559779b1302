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
    /// [`super::KernelLayout::sk_user_data`].
    pub const OFF_SK_USER_DATA: &str = "BYPASS_OFF_SK_USER_DATA";
    /// [`super::KernelLayout::sk_cookie`].
    pub const OFF_SK_COOKIE: &str = "BYPASS_OFF_SK_COOKIE";
    /// [`super::KernelLayout::psock_msg_tot_len`].
    pub const OFF_PSOCK_MSG_TOT_LEN: &str = "BYPASS_OFF_PSOCK_MSG_TOT_LEN";
    /// [`super::Features`] bits.
    pub const FEATURES: &str = "BYPASS_FEATURES";
    /// Cookie of the host's network namespace (the agent's own): sockets there (the
    /// node's processes, hostNetwork pods) are never touched.
    pub const HOST_NETNS: &str = "BYPASS_HOST_NETNS";
}

/// Byte offsets of the kernel fields the programs read. A `struct sock` sits at offset
/// 0 of `struct tcp_sock` (inside `inet_connection_sock`, itself at offset 0), so these
/// are offsets into the TCP socket too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelLayout {
    /// `struct sock`, `sk_rcvlowat` (SO_RCVLOWAT), read typed at insertion.
    pub sk_rcvlowat: u32,
    /// `struct sock`, `sk_peek_off` (SO_PEEK_OFF; -1 when unset), read typed at
    /// insertion.
    pub sk_peek_off: u32,
    /// `struct inet_connection_sock`, `icsk_ulp_ops` (an upper-layer protocol such as
    /// MPTCP's subflow or kTLS), read typed at insertion.
    pub icsk_ulp_ops: u32,
    /// `struct tcp_sock`, `write_seq` (the end of what the application queued), read
    /// typed at insertion: bytes queued before the socket was inserted (a TCP Fast
    /// Open client's first write, held until the handshake ends) go by TCP, so the
    /// socket must not redirect after them.
    pub tcp_write_seq: u32,
    /// `struct tcp_sock`, `fastopen_req`, read typed at insertion: set while a TCP Fast
    /// Open `sendto`/`write` connects, which then sends its data by plain TCP after the
    /// socket was inserted (net/ipv4/tcp.c, tcp_sendmsg_fastopen).
    pub tcp_fastopen_req: u32,
    /// `struct sock`, `sk_user_data` (the `struct sk_psock *`, with flag bits), read
    /// with `bpf_probe_read_kernel` for the queue bound.
    pub sk_user_data: u32,
    /// `struct sock_common`, `skc_cookie` (the socket cookie), read with
    /// `bpf_probe_read_kernel` to check a peer's address still names the peer.
    pub sk_cookie: u32,
    /// `struct sk_psock`, `msg_tot_len` (bytes in the ingress queue; kernels with the
    /// sockmap FIONREAD fix, net/core/skmsg.c), read with `bpf_probe_read_kernel`.
    pub psock_msg_tot_len: u32,
}

impl KernelLayout {
    /// The fields every load needs: the insertion checks read them typed.
    pub const fn has_required(&self) -> bool {
        self.sk_rcvlowat != 0
            && self.sk_peek_off != 0
            && self.icsk_ulp_ops != 0
            && self.tcp_write_seq != 0
            && self.tcp_fastopen_req != 0
    }

    /// A peer's ingress queue can be measured, so a bound can be enforced (given
    /// `bpf_probe_read_kernel`).
    pub const fn can_bound(&self) -> bool {
        self.sk_user_data != 0 && self.sk_cookie != 0 && self.psock_msg_tot_len != 0
    }
}

/// Bits of the [`globals::FEATURES`] global.
pub mod features {
    /// The sk_msg program measures the peer's ingress queue (`bpf_probe_read_kernel`
    /// of `sk_psock.msg_tot_len`) to bound it. Off, that code is dead to the verifier,
    /// so the object loads where the helper is unavailable (kernel lockdown).
    pub const QUEUE_BOUND: u32 = 1;
    /// Recorded for `status`: no queue bound because the kernel's `struct sk_psock` has
    /// no `msg_tot_len` (before the sockmap FIONREAD fix; Debian 12's 6.1, for one).
    pub const NO_QUEUE_FIELD: u32 = 2;
    /// Recorded for `status`: no queue bound because `bpf_probe_read_kernel` is
    /// unavailable (kernel lockdown in confidentiality mode).
    pub const NO_PROBE_READ: u32 = 4;
    /// The bits the programs look at.
    pub const PROGRAM_BITS: u32 = QUEUE_BOUND;
}

/// A 64-bit digest of what a load fixed in the globals, so a restarted agent adopts a
/// pinned datapath only if it was loaded the same way.
pub const fn digest(layout: &KernelLayout, features: u32, host_netns: u64) -> u64 {
    let words = [
        layout.sk_rcvlowat as u64,
        layout.sk_peek_off as u64,
        layout.icsk_ulp_ops as u64,
        layout.tcp_write_seq as u64,
        layout.tcp_fastopen_req as u64,
        layout.sk_user_data as u64,
        layout.sk_cookie as u64,
        layout.psock_msg_tot_len as u64,
        (features & features::PROGRAM_BITS) as u64,
        host_netns,
    ];
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < words.len() {
        h = (h ^ words[i]).wrapping_mul(0x100_0000_01b3);
        i += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements() {
        let mut l = KernelLayout::default();
        assert!(!l.has_required() && !l.can_bound());
        l.sk_rcvlowat = 1;
        l.sk_peek_off = 2;
        l.icsk_ulp_ops = 3;
        assert!(!l.has_required());
        l.tcp_write_seq = 7;
        assert!(!l.has_required());
        l.tcp_fastopen_req = 8;
        assert!(l.has_required() && !l.can_bound());
        l.sk_user_data = 4;
        l.sk_cookie = 5;
        assert!(!l.can_bound(), "msg_tot_len missing (a 6.1 kernel)");
        l.psock_msg_tot_len = 6;
        assert!(l.can_bound());
    }

    #[test]
    fn digest_tells_loads_apart() {
        let l = KernelLayout::default();
        assert_eq!(digest(&l, 1, 7), digest(&l, 1, 7));
        assert_ne!(digest(&l, 1, 7), digest(&l, 0, 7));
        assert_ne!(digest(&l, 1, 7), digest(&l, 1, 8));
    }
}
