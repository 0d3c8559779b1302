//! The bypass kernel object: `sockops` inserts each established socket whose two ends
//! are pod addresses into the SockHash, `skmsg` redirects each send to the peer socket's
//! ingress queue or lets it take the normal TCP path (bounding that queue), `kernel`
//! reads the few kernel fields those decisions need, `sockopt` refuses upper-layer
//! protocols on inserted sockets and records receive options their peers must honour.
#![no_std]
#![no_main]

mod kernel;
mod key;
mod maps;
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
