//! `oob`: MSG_OOB, one urgent byte between normal data.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
    os::fd::AsRawFd,
};

use anyhow::{Context as _, Result, bail};
use nix::sys::socket::{MsgFlags, recv, send};
use serde_json::{Value, json};

use super::sock::{errno_name, sleep_ms, wait_closed};

pub fn server(mut s: TcpStream) -> Result<Value> {
    // The client sends "ab", then "c" with MSG_OOB, then "de".
    sleep_ms(300);
    let mut oob = [0u8; 1];
    let oob_result = match recv(s.as_raw_fd(), &mut oob, MsgFlags::MSG_OOB) {
        Ok(1) => String::from_utf8_lossy(&oob).into_owned(),
        Ok(_) => errno_name(&std::io::Error::last_os_error()),
        Err(e) => errno_name(&std::io::Error::from(e)),
    };
    let mut inline = Vec::new();
    s.read_to_end(&mut inline)?;
    Ok(json!({"oob": oob_result, "inline": String::from_utf8_lossy(&inline)}))
}

pub fn client(mut s: TcpStream) -> Result<Value> {
    s.write_all(b"ab")?;
    sleep_ms(50);
    let r = send(s.as_raw_fd(), b"c", MsgFlags::MSG_OOB).context("send MSG_OOB")?;
    if r != 1 {
        bail!("send MSG_OOB sent {r} bytes");
    }
    sleep_ms(50);
    s.write_all(b"de")?;
    s.shutdown(Shutdown::Write)?;
    wait_closed(&mut s)
}
