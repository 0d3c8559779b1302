//! `mixed`: a reader with redirected and TCP bytes waiting at once, across a fallback to
//! TCP and back (the agent's bound at 16 KiB). Client: a 4 KiB write, then --bytes in
//! 4 KiB writes (past the bound: the rest by TCP), every byte acknowledged,
//! --mark-file; once --go-file exists, 4 KiB more (redirected again once the reader read
//! everything), acknowledged, the mark file's `.2`. Server (non-blocking, in an
//! edge-triggered epoll): at each mark what FIONREAD, poll and epoll say, then it reads
//! everything, verifying each byte, and says again.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

use super::{
    Common,
    sock::{fionread, poll_in, wait_acked},
    trust::{mark, wait_file},
};

/// What the first and last writes hold.
const EDGE: usize = 4096;

/// The second mark, beside the first.
fn second(mark_file: &Path) -> PathBuf {
    let mut p = mark_file.as_os_str().to_owned();
    p.push(".2");
    PathBuf::from(p)
}

fn files(c: &Common) -> Result<(&Path, &Path)> {
    match (c.mark_file.as_deref(), c.go_file.as_deref()) {
        (Some(m), Some(g)) => Ok((m, g)),
        _ => bail!("mixed needs --mark-file and --go-file"),
    }
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let (mark_file, go_file) = files(c)?;
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; EDGE];
    let bytes = usize::try_from(c.bytes)?;
    // Greeted, so both ends are paired before the first byte (the server writes first).
    let mut one = [0u8; 1];
    s.read_exact(&mut one).context("read the greeting")?;
    for n in std::iter::once(EDGE).chain(std::iter::repeat_n(EDGE, bytes.div_ceil(EDGE))) {
        p.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).context("write")?;
    }
    wait_acked(&s)?;
    mark(Some(mark_file))?;
    wait_file(go_file)?;
    p.fill(&mut buf);
    s.write_all(&buf).context("write")?;
    wait_acked(&s)?;
    mark(Some(&second(mark_file)))?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"sent": EDGE + bytes.div_ceil(EDGE) * EDGE + EDGE}))
}

pub fn server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let (mark_file, go_file) = files(c)?;
    let bytes = usize::try_from(c.bytes)?.div_ceil(EDGE) * EDGE;
    s.write_all(b"G").context("greet")?;
    s.set_nonblocking(true)?;
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).context("epoll_create1")?;
    ep.add(
        &s,
        EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, 0),
    )
    .context("epoll_ctl")?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    wait_file(mark_file)?;
    let before = look(&s, &ep)?;
    drain(&mut s, &ep, &mut v, EDGE + bytes)?;
    let drained = look(&s, &ep)?;
    mark(Some(go_file))?;
    wait_file(&second(mark_file))?;
    let back = look(&s, &ep)?;
    drain(&mut s, &ep, &mut v, EDGE)?;
    if let Some(m) = v.first_mismatch() {
        bail!("byte {} differs: {m:?}", m.offset);
    }
    Ok(json!({
        "fionread_waiting": before.0, "poll_waiting": before.1, "epoll_waiting": before.2,
        "fionread_drained": drained.0, "poll_drained": drained.1, "epoll_drained": drained.2,
        "fionread_back": back.0, "poll_back": back.1, "epoll_back": back.2,
        "received": v.offset(),
    }))
}

/// What FIONREAD, poll (at once) and the edge-triggered epoll (at once) say now.
fn look(s: &TcpStream, ep: &Epoll) -> Result<(u64, bool, bool)> {
    let mut ev = [EpollEvent::empty()];
    let n = ep.wait(&mut ev, EpollTimeout::ZERO).context("epoll_wait")?;
    Ok((fionread(s)?, poll_in(s, 0)?, n == 1))
}

/// Reads `n` bytes into `v`, waiting on the edge-triggered epoll each time a read finds
/// nothing (a net of [`testbed::steps::STEP_WAIT`] against a hang).
fn drain(s: &mut TcpStream, ep: &Epoll, v: &mut Verifier, n: usize) -> Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    let mut left = n;
    let net = EpollTimeout::try_from(testbed::steps::STEP_WAIT).unwrap_or(EpollTimeout::NONE);
    while left > 0 {
        match s.read(&mut buf[..left.min(64 << 10)]) {
            Ok(0) => bail!("end of stream with {left} bytes to come"),
            Ok(k) => {
                v.feed(&buf[..k]);
                left -= k;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut ev = [EpollEvent::empty()];
                if ep.wait(&mut ev, net).context("epoll_wait")? == 0 {
                    bail!("{left} bytes to come and no epoll event for them");
                }
            }
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(())
}
