//! The minimal same-node redirect, the bench's in-run reference (`Path::Minimal`): what
//! the archived reference bypass (istio-tcpip-bypass) does and nothing more. sock_ops
//! puts every established IPv4 socket of the cgroup into a SockHash under its 4-tuple
//! (an IPv6 socket by the low word of its addresses, so that a dual-stack listener's
//! v4-mapped sockets take part, as the bench's servers need);
//! sk_msg builds the peer's key from the message (the tuple mirrored) and redirects to
//! the peer's ingress queue. No ordering rule, no bound, no counters, no pairing proof,
//! no namespaces: it is only ever attached to the bench's two pods, and only to measure
//! what every guarantee of the real datapath costs on top of one redirect.
#![no_std]
#![no_main]

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{
        BPF_F_INGRESS, BPF_NOEXIST, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, sk_action::SK_PASS,
    },
    btf_maps::SockHash,
    macros::{btf_map, sk_msg, sock_ops},
    programs::{SkMsgContext, SockOpsContext},
};

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

/// A socket's 4-tuple, ports in host order.
#[repr(C)]
#[derive(Clone, Copy)]
struct Tuple {
    local_ip: u32,
    remote_ip: u32,
    local_port: u32,
    remote_port: u32,
}

#[btf_map]
static MINIMAL_SOCKETS: SockHash<Tuple, 65536> = SockHash::new();

/// Reads the tuple from a `bpf_sock_ops` or `sk_msg_md` (same field names), or `None`
/// for another family; the remote port is the big-endian word, the local one host
/// order. Every field is loaded before the branch (the verifier refuses a context load
/// through a pointer LLVM merged from two arms).
macro_rules! tuple_of {
    ($c:expr) => {{
        let c = $c;
        // SAFETY: context field loads.
        let (family, l4, r4, l6, r6, local_port, remote_port) = unsafe {
            (
                read_volatile(addr_of!((*c).family)),
                read_volatile(addr_of!((*c).local_ip4)),
                read_volatile(addr_of!((*c).remote_ip4)),
                read_volatile(addr_of!((*c).local_ip6[3])),
                read_volatile(addr_of!((*c).remote_ip6[3])),
                read_volatile(addr_of!((*c).local_port)),
                u32::from_be(read_volatile(addr_of!((*c).remote_port))),
            )
        };
        let ips = match family {
            AF_INET => Some((l4, r4)),
            AF_INET6 => Some((l6, r6)),
            _ => None,
        };
        ips.map(|(local_ip, remote_ip)| Tuple {
            local_ip,
            remote_ip,
            local_port,
            remote_port,
        })
    }};
}

#[sock_ops]
pub fn minimal_sockops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    if op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        return 0;
    }
    if let Some(mut tuple) = tuple_of!(ctx.ops) {
        // A full map or a duplicate leaves the socket on TCP.
        let _ = MINIMAL_SOCKETS.update(
            &mut tuple,
            // SAFETY: the program's context.
            unsafe { &mut *ctx.ops },
            BPF_NOEXIST.into(),
        );
    }
    0
}

#[sk_msg]
pub fn minimal_skmsg(ctx: SkMsgContext) -> u32 {
    if let Some(own) = tuple_of!(ctx.msg) {
        let mut peer = Tuple {
            local_ip: own.remote_ip,
            remote_ip: own.local_ip,
            local_port: own.remote_port,
            remote_port: own.local_port,
        };
        MINIMAL_SOCKETS.redirect_msg(&ctx, &mut peer, BPF_F_INGRESS.into());
    }
    SK_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
