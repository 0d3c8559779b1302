//! `peek`: MSG_PEEK, then a read: the peeked bytes are read again.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    os::fd::AsRawFd,
};

use anyhow::{Context as _, Result};
use nix::sys::socket::{MsgFlags, recv};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{
    Common,
    sock::{sleep_ms, wait_closed, wait_readable},
};

pub fn server(s: TcpStream) -> Result<Value> {
    wait_readable(&s)?;
    sleep_ms(100);
    let mut peek = [0u8; 50];
    // What recv returned: -1 on an error.
    let pn = recv(s.as_raw_fd(), &mut peek, MsgFlags::MSG_PEEK).map_or(-1, |n| n as i64);
    let mut buf = [0u8; 100];
    let got = read_up_to(&s, &mut buf)?;
    let mut expect = [0u8; 100];
    Pattern::new(0, Direction::ClientToServer).fill(&mut expect);
    let peek_len = usize::try_from(pn).unwrap_or(0);
    Ok(
        json!({"peek_len": pn, "peek_matches": peek[..peek_len] == expect[..peek_len],
        "read_len": got, "read_matches": buf[..got] == expect[..got]}),
    )
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    p.fill(&mut buf[..100]);
    s.write_all(&buf[..100])?;
    wait_closed(&mut s)
}

/// peek-off-late, server: once the client's 100 bytes are all queued (peeked whole),
/// SO_PEEK_OFF 0 (Linux ≥ 6.9 on TCP), two 40-byte peeks (TCP: bytes 0..40, then
/// 40..80, the offset moving), then a read of the 100, verified.
pub fn late_offset_server(s: TcpStream) -> Result<Value> {
    let mut expect = [0u8; 100];
    Pattern::new(0, Direction::ClientToServer).fill(&mut expect);
    let mut whole = [0u8; 100];
    let deadline = std::time::Instant::now() + testbed::steps::NET;
    loop {
        wait_readable(&s)?;
        let n = recv(s.as_raw_fd(), &mut whole, MsgFlags::MSG_PEEK).context("peek")?;
        if n == whole.len() {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "only {n} of 100 bytes arrived"
        );
        sleep_ms(1);
    }
    let zero: libc::c_int = 0;
    // SAFETY: a valid socket and an int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            std::ptr::from_ref(&zero).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let set = if rc == 0 {
        "ok".to_owned()
    } else {
        super::sock::errno_name(&std::io::Error::last_os_error())
    };
    let mut p1 = [0u8; 40];
    let mut p2 = [0u8; 40];
    let n1 = recv(s.as_raw_fd(), &mut p1, MsgFlags::MSG_PEEK).context("first peek")?;
    let n2 = recv(s.as_raw_fd(), &mut p2, MsgFlags::MSG_PEEK).context("second peek")?;
    let mut buf = [0u8; 100];
    let got = read_up_to(&s, &mut buf)?;
    Ok(json!({
        "set_peek_off": set,
        "first_peek_from_start": n1 == 40 && p1 == expect[..40],
        "second_peek_follows": n2 == 40 && p2 == expect[40..80],
        "second_peek_repeats": n2 == 40 && p2 == expect[..40],
        "read_len": got,
        "read_matches": buf[..got] == expect[..got],
    }))
}

/// Reads until `buf` is full or the peer closes; how many bytes came.
fn read_up_to(mut s: &TcpStream, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(got)
}
