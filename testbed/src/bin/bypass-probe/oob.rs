//! `oob`: MSG_OOB, one urgent byte between normal data.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
    os::fd::AsRawFd,
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use crate::sock::{errno_name, sleep_ms, wait_closed};

pub fn server(mut s: TcpStream) -> Result<Value> {
    // The client sends "ab", then "c" with MSG_OOB, then "de".
    sleep_ms(300);
    let mut oob = [0u8; 1];
    // SAFETY: valid one-byte buffer.
    let on = unsafe { libc::recv(s.as_raw_fd(), oob.as_mut_ptr().cast(), 1, libc::MSG_OOB) };
    let oob_result = if on == 1 {
        String::from_utf8_lossy(&oob).into_owned()
    } else {
        errno_name(&std::io::Error::last_os_error())
    };
    let mut inline = Vec::new();
    s.read_to_end(&mut inline)?;
    Ok(json!({"oob": oob_result, "inline": String::from_utf8_lossy(&inline)}))
}

pub fn client(mut s: TcpStream) -> Result<Value> {
    s.write_all(b"ab")?;
    sleep_ms(50);
    // SAFETY: valid one-byte buffer.
    let r = unsafe { libc::send(s.as_raw_fd(), b"c".as_ptr().cast(), 1, libc::MSG_OOB) };
    if r != 1 {
        return Err(std::io::Error::last_os_error()).context("send MSG_OOB");
    }
    sleep_ms(50);
    s.write_all(b"de")?;
    s.shutdown(Shutdown::Write)?;
    wait_closed(&mut s)
}
