//! Building a `SockKey` from a kernel context. sock_ops builds it once, at insertion,
//! and keeps it in the socket's storage; sk_msg and the read counter use that copy.
//!
//! Every context field is read with a volatile load straight from the context pointer:
//! the verifier rejects a load through a context pointer the compiler has offset and
//! kept for later ("dereference of modified ctx ptr").

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::bindings::bpf_sock_ops;
use bypass_common::{SockKey, key::remote_port_from_ctx, mapped_v4};

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

/// Reads the key fields of a context type (`bpf_sock_ops` and `sk_msg_md` name them
/// alike). Every field is loaded before any branch:
/// loads in two arms of a `match` get merged by LLVM into one load through a computed
/// context pointer, which the verifier refuses.
macro_rules! key_from_ctx {
    ($ctx:expr, $netns:expr) => {{
        let c = $ctx;
        // SAFETY: `c` is the program's context pointer; each field is a valid
        // 4-byte context load.
        let (family, local4, remote4, local6, remote6, local_port, remote_port) = unsafe {
            (
                read_volatile(addr_of!((*c).family)),
                read_volatile(addr_of!((*c).local_ip4)),
                read_volatile(addr_of!((*c).remote_ip4)),
                [
                    read_volatile(addr_of!((*c).local_ip6[0])),
                    read_volatile(addr_of!((*c).local_ip6[1])),
                    read_volatile(addr_of!((*c).local_ip6[2])),
                    read_volatile(addr_of!((*c).local_ip6[3])),
                ],
                [
                    read_volatile(addr_of!((*c).remote_ip6[0])),
                    read_volatile(addr_of!((*c).remote_ip6[1])),
                    read_volatile(addr_of!((*c).remote_ip6[2])),
                    read_volatile(addr_of!((*c).remote_ip6[3])),
                ],
                read_volatile(addr_of!((*c).local_port)),
                read_volatile(addr_of!((*c).remote_port)),
            )
        };
        let (local_ip, remote_ip) = match family {
            AF_INET => (mapped_v4(local4), mapped_v4(remote4)),
            // An AF_INET6 socket talking IPv4 already holds `::ffff:a.b.c.d`.
            AF_INET6 => (local6, remote6),
            _ => return None,
        };
        Some(SockKey::new(
            local_ip,
            remote_ip,
            local_port,
            remote_port_from_ctx(remote_port),
            $netns,
        ))
    }};
}

/// The socket's own key from a sock_ops context, in network namespace `netns` (its
/// cookie), or `None` for another family.
#[inline(always)]
pub(crate) fn from_sock_ops(ops: *const bpf_sock_ops, netns: u64) -> Option<SockKey> {
    key_from_ctx!(ops, netns)
}

/// `snd_nxt` and `rcv_nxt` of a sock_ops context's socket.
#[inline(always)]
pub(crate) fn sequence(ops: *const bpf_sock_ops) -> (u32, u32) {
    // SAFETY: `ops` is the program's context pointer; both are valid 4-byte loads.
    unsafe {
        (
            read_volatile(addr_of!((*ops).snd_nxt)),
            read_volatile(addr_of!((*ops).rcv_nxt)),
        )
    }
}
