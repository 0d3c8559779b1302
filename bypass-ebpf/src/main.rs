//! The bypass kernel object: `sockops` inserts each established socket whose two ends
//! are pod addresses into the SockHash, `skmsg` redirects each send to the peer socket's
//! ingress queue or lets it take the normal TCP path, `recv` publishes what each reader
//! has read (which bounds that queue and lets a direction come back from TCP),
//! `guard` keeps readers that cannot see the ingress queue (splice, zero-copy receive)
//! from missing a byte, `leave` takes connections that TCP serves better out of the
//! SockHash, `kernel` reads the few kernel fields those decisions need, `sockopt`
//! refuses upper-layer protocols on inserted sockets and records receive options their
//! peers must honour.
#![no_std]
#![no_main]
// Atomic read-modify-writes (`atomic`): the BPF target has no `core::sync::atomic`
// fetch operations (no compare-and-swap), so the intrinsics, on the pinned toolchain
// (built with RUSTC_BOOTSTRAP, bypass-agent/build.rs).
#![feature(core_intrinsics)]
#![allow(internal_features)]
// Keys and values are passed to map helpers by reference on purpose, everywhere: by value
// they would be copied onto the 512-byte BPF stack.
#![allow(clippy::needless_borrows_for_generic_args)]

mod atomic;
mod fionread;
mod guard;
mod kernel;
mod key;
mod leave;
mod maps;
mod recv;
mod skmsg;
mod sockops;
mod sockopt;
mod stats;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach a panic; this never runs.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
