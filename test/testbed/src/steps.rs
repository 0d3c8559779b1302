//! Step files: a test and the tools it runs in the pods signal each other by creating
//! files in a directory both see.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

/// How long a tool in a pod waits for the test's next step file: a net for a test that
/// died without killing its tools (they are killed when the test drops them), never a
/// pace. Under emulation (kernel 6.1, one TCG thread) the setup between two steps of
/// `restart::sigkill_mid_100_streams_then_restart_adopts` took over a minute.
pub const STEP_WAIT: Duration = Duration::from_secs(600);

pub use kube_testenv::NET;

/// How long the suite's clients let their connections go without a byte either way
/// before they give up (Go's `-idle`, curl's `--speed-time`, ab's `-s`, HAProxy's
/// inactivity timeouts): a stall, never a pace.
pub const NO_PROGRESS: Duration = Duration::from_secs(180);

/// A server's ready file, removed when dropped (when the test fails too).
#[derive(Debug)]
pub struct ReadyFile(pub std::path::PathBuf);

impl Drop for ReadyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Waits at most `within` until `path` exists.
pub fn wait_file(path: &Path, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear within {within:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_a_file_and_names_a_missing_one() {
        let dir = std::env::temp_dir().join(format!("steps-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let there = dir.join("there");
        std::fs::write(&there, b"").unwrap();
        assert!(wait_file(&there, Duration::ZERO).is_ok());
        let err = wait_file(&dir.join("never"), Duration::from_millis(20))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("never") && err.contains("did not appear"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
