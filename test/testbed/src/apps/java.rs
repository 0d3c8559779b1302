//! The suite's Java NIO echo server (`test/testbed/apps/java/NioEcho.java`, compiled by
//! `cargo xtask test`), run by the JDK's `java`.

use std::{net::SocketAddr, process::Command};

use anyhow::{Context as _, Result};

use super::{
    bins::{self, Needs},
    client::On,
    server::Listening,
    workdir::WorkDir,
};

/// What the Java workload runs.
pub const NEEDS: Needs = Needs {
    system: &["java"],
    built: &["java/NioEcho.class", "go/streamcheck"],
};

/// Starts `NioEcho` on `on`, listening on `listen`; ready once it says it listens.
pub fn nio_echo(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    let dir = WorkDir::new("java")?;
    let ready = dir.join("ready");
    let class = bins::built("java/NioEcho.class")?;
    let classpath = class.parent().context("the class file has no directory")?;
    let mut cmd = Command::new(bins::system("java")?);
    cmd.arg("-cp")
        .arg(classpath)
        .arg("NioEcho")
        .arg(listen.ip().to_string())
        .arg(listen.port().to_string())
        .arg(&ready);
    Listening::start_ready_file(on, cmd, dir, "java NioEcho", listen, &ready)
}
