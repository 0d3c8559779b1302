//! Where, inside kernel structures, the sk_msg program finds what it reads with
//! `bpf_probe_read_kernel`. The agent takes the offsets from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`) and writes them into control slots; 0 means unknown, and
//! turns off what needs it.

/// Byte offsets of the kernel fields the datapath reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    /// `struct sock`, `sk_user_data` (the `struct sk_psock *`, with flag bits).
    pub sk_user_data: u32,
    /// `struct sock`, `sk_write_pending` (senders waiting for memory).
    pub sk_write_pending: u32,
    /// `struct sk_psock`, `msg_tot_len` (bytes in the ingress queue; kernels with the
    /// sockmap FIONREAD fix, net/core/skmsg.c).
    pub psock_msg_tot_len: u32,
    /// `struct tcp_sock`, `copied_seq` (next byte the application reads from TCP).
    pub tcp_copied_seq: u32,
    /// `struct tcp_sock`, `write_seq` (next byte the application queues to TCP).
    pub tcp_write_seq: u32,
    /// `struct sock`, `sk_rcvlowat` (SO_RCVLOWAT).
    pub sk_rcvlowat: u32,
    /// `struct sock`, `sk_peek_off` (SO_PEEK_OFF; -1 when unset).
    pub sk_peek_off: u32,
}

impl KernelLayout {
    /// The peer's queue can be measured, so a bound can be enforced.
    pub const fn can_bound(&self) -> bool {
        self.sk_user_data != 0 && self.psock_msg_tot_len != 0
    }

    /// A socket that took the TCP path can tell when it may redirect again.
    pub const fn can_resume(&self) -> bool {
        self.sk_write_pending != 0 && self.tcp_copied_seq != 0 && self.tcp_write_seq != 0
    }

    /// The peer's receive options that the ingress queue ignores can be read.
    pub const fn can_check_options(&self) -> bool {
        self.sk_rcvlowat != 0 && self.sk_peek_off != 0
    }
}
