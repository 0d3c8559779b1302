//! `uninstall`: removes what is pinned, says what went, and (`--wait`) stays until told
//! to stop.

use crate::{cli::UninstallOpts, datapath, error::AgentError};

/// Removes the pins under `--pin-dir` and prints each one removed.
pub fn uninstall(opts: &UninstallOpts) -> Result<(), AgentError> {
    let removed = datapath::uninstall(&opts.pins.pin_dir)?;
    for path in &removed {
        println!("removed {}", path.display());
    }
    if removed.is_empty() {
        println!("nothing pinned under {}", opts.pins.pin_dir.display());
    }
    if opts.wait {
        wait_for_termination();
    }
    Ok(())
}

/// Blocks until SIGTERM or SIGINT (`uninstall --wait`).
fn wait_for_termination() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if set.thread_block().is_ok() {
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let _ = set.wait();
    }
}
