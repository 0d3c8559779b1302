//! `urgent`: 4 KiB redirected and read; then the reader moves its peer to TCP
//! (SO_RCVLOWAT 2, then 1), and the writer sends 3 rounds of "ab", "c" with MSG_OOB, and
//! "de". TCP skips each urgent byte in the stream (it moves `copied_seq` past it: no read
//! returns it), so the reader reads "abde" a round; once every round is read, FIONREAD
//! must say 0, as on TCP, and SO_PEEK_OFF be accepted.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
    os::fd::AsRawFd,
};

use anyhow::{Context as _, Result, bail};
use nix::sys::socket::{MsgFlags, send, setsockopt};
use serde_json::{Value, json};

use super::sock::{RcvLowat, errno_name, fionread, wait_closed};

const ROUNDS: usize = 3;

pub fn server(mut s: TcpStream) -> Result<Value> {
    s.write_all(b"G")?;
    let mut first = vec![0u8; 4096];
    s.read_exact(&mut first).context("read 4 KiB")?;
    setsockopt(&s, RcvLowat, &2).context("SO_RCVLOWAT 2")?;
    setsockopt(&s, RcvLowat, &1).context("SO_RCVLOWAT 1")?;
    s.write_all(b"R")?;
    let mut stream = Vec::new();
    for _ in 0..ROUNDS {
        let want = stream.len() + 4;
        let mut buf = [0u8; 16];
        while stream.len() < want {
            let n = s.read(&mut buf).context("read a round")?;
            if n == 0 {
                bail!("end of stream within a round");
            }
            stream.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"N")?;
    }
    // Every byte sent ("de" came last) was read.
    let end = fionread(&s)?;
    let peek_off = peek_off(&s);
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({
        "stream": String::from_utf8_lossy(&stream),
        "fionread_end": end,
        "peek_off": peek_off,
    }))
}

pub fn client(mut s: TcpStream) -> Result<Value> {
    let mut one = [0u8; 1];
    s.read_exact(&mut one).context("the greeting")?;
    s.write_all(&[7u8; 4096])?;
    s.read_exact(&mut one).context("R")?;
    for _ in 0..ROUNDS {
        s.write_all(b"ab")?;
        let n = send(s.as_raw_fd(), b"c", MsgFlags::MSG_OOB).context("send MSG_OOB")?;
        if n != 1 {
            bail!("send(MSG_OOB) sent {n}");
        }
        s.write_all(b"de")?;
        s.read_exact(&mut one).context("N")?;
    }
    wait_closed(&mut s)
}

/// setsockopt(SO_PEEK_OFF, 0) then -1: "ok" or the errno's name.
fn peek_off(s: &TcpStream) -> String {
    for v in [0i32, -1] {
        // SAFETY: an int option of the right size on a valid socket.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEEK_OFF,
                std::ptr::from_ref(&v).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return errno_name(&std::io::Error::last_os_error());
        }
    }
    "ok".into()
}
