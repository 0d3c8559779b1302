//! The suite's Java NIO echo server (`testbed/apps/java/NioEcho.java`, compiled by
//! `cargo xtask test`), run by the JDK's `java`.

use std::{net::SocketAddr, process::Command};

use anyhow::{Context as _, Result};

use super::{
    READY_TIMEOUT,
    bins::{self, Needs},
    client::On,
    server::AppServer,
    workdir::WorkDir,
};

/// What the Java workload runs.
pub const NEEDS: Needs = Needs {
    system: &["java"],
    built: &["java/NioEcho.class", "go/streamcheck"],
};

/// A running `NioEcho`.
#[derive(Debug)]
pub struct NioEcho {
    server: AppServer,
    _dir: WorkDir,
    addr: SocketAddr,
}

impl NioEcho {
    /// Starts it on `on`, listening on `listen`; ready once it says it listens.
    pub fn start(on: On<'_>, listen: SocketAddr) -> Result<Self> {
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
        let server = AppServer::start(on, cmd, &dir.join("log"), "java NioEcho")?
            .wait_ready_file(&ready, READY_TIMEOUT)?;
        Ok(Self {
            server,
            _dir: dir,
            addr: listen,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process.
    pub fn server(&mut self) -> &mut AppServer {
        &mut self.server
    }
}
