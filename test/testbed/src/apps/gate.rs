//! Holding one of the suite's own clients between connecting and its first send (its
//! `-connected-file` and `-go-file`): a client that sends before its server's end is
//! paired keeps that direction on TCP, by the datapath's design; a test that asserts
//! every byte was redirected opens the gate only once it saw the pairing.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::workdir::WorkDir;
use crate::spawn::PodChild;

/// The two step files, in a directory of their own.
#[derive(Debug)]
pub struct Gate {
    dir: WorkDir,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Result<Self> {
        Ok(Self {
            dir: WorkDir::new("gate")?,
        })
    }

    /// The client's arguments: `-connected-file PATH -go-file PATH`.
    pub fn args(&self) -> [String; 4] {
        [
            "-connected-file".to_owned(),
            self.dir.join("connected").display().to_string(),
            "-go-file".to_owned(),
            self.dir.join("go").display().to_string(),
        ]
    }

    /// Waits until `client` says it is connected, at most `timeout`; fails if it exits
    /// first.
    pub fn wait_connected(&self, client: &mut PodChild, timeout: Duration) -> Result<()> {
        let file = self.dir.join("connected");
        let deadline = Instant::now() + timeout;
        while !file.exists() {
            if let Some(st) = client.try_wait()? {
                bail!("the client exited ({st}) before it was connected");
            }
            if Instant::now() > deadline {
                bail!("the client did not connect within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Lets the client send.
    pub fn open(&self) -> Result<()> {
        self.dir.write("go", b"")?;
        Ok(())
    }
}
