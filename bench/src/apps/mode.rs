//! How the agent runs in the bench. Before the run it is started once the way a user
//! starts it (no `--allow-unguarded`) and asked `status --json`: on a kernel with a read
//! guard it bypasses, and the bench runs it so; on a kernel without one (BPF
//! trampolines refused) it refuses to bypass, and the bench runs it with
//! `--allow-unguarded`, which the tables' header says.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use testbed::{
    AgentOpts, AgentStatus,
    agent::{agent_command, remove_pins, status_json},
};

use crate::model::{AgentMode, GuardStatus};

/// How long the probe waits for the agent to attach or refuse.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// The guard fields of a status report.
pub fn guard_status(s: &AgentStatus) -> GuardStatus {
    GuardStatus {
        attached: s.attached,
        read_guard: s.features.read_guard,
        refused: s.refused.clone(),
    }
}

/// Pure: how to run the agent given what it said when started as a user starts it:
/// with `--allow-unguarded` only when it refused without.
pub fn decide(as_user: GuardStatus) -> AgentMode {
    AgentMode {
        allow_unguarded: as_user.refused.is_some(),
        as_user,
        as_run: None,
        command: String::new(),
    }
}

/// Whether a status says the agent made up its mind: attached, or refused.
fn settled(s: &GuardStatus) -> bool {
    s.attached || s.refused.is_some()
}

/// Starts the agent with `opts` but never `--allow-unguarded`, waits until it attached
/// or refused, stops it (SIGTERM, its pins removed) and returns what it said.
pub fn probe(opts: &AgentOpts) -> Result<GuardStatus> {
    let opts = AgentOpts {
        allow_unguarded: false,
        ..opts.clone()
    };
    let mut child = agent_command()
        .args(opts.args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start bypass-agent to see whether it bypasses this kernel")?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let seen = loop {
        if let Some(st) = child.try_wait()? {
            bail!("bypass-agent run exited ({st}) before attaching or refusing");
        }
        let status = status_json(&opts.pin_dir)
            .ok()
            .and_then(|v| serde_json::from_value::<AgentStatus>(v).ok());
        if let Some(s) = status.as_ref().map(guard_status)
            && settled(&s)
        {
            break Ok(s);
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "bypass-agent neither attached nor refused within {PROBE_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Our own child, not yet reaped: the pid is still its own.
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let stop = Instant::now() + PROBE_TIMEOUT;
    while child.try_wait()?.is_none() {
        if Instant::now() > stop {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    remove_pins(&opts.pin_dir)?;
    seen
}

/// The header line: how the agent ran, and why.
pub fn describe(m: &AgentMode) -> String {
    let guard = |s: &GuardStatus| {
        format!(
            "features.read_guard {}, refused {}",
            s.read_guard,
            s.refused.as_deref().map_or("no", |_| "yes")
        )
    };
    let as_run = m.as_run.as_ref().map_or_else(String::new, |s| {
        format!("; as run: attached {}, {}", s.attached, guard(s))
    });
    if m.allow_unguarded {
        format!(
            "agent run WITH --allow-unguarded: this kernel has no read guard, and started as a user starts it the agent refused to bypass ({}){as_run}",
            guard(&m.as_user)
        )
    } else {
        format!(
            "agent run as a user runs it, without --allow-unguarded ({}){as_run}",
            guard(&m.as_user)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> GuardStatus {
        GuardStatus {
            attached: false,
            read_guard: false,
            refused: Some("no read guard on this kernel".into()),
        }
    }

    #[test]
    fn unguarded_only_when_refused() {
        let guarded = GuardStatus {
            attached: true,
            read_guard: true,
            refused: None,
        };
        assert!(!decide(guarded.clone()).allow_unguarded);
        assert!(decide(refused()).allow_unguarded);
        assert!(settled(&guarded) && settled(&refused()));
        assert!(!settled(&GuardStatus::default()));
    }

    #[test]
    fn header_says_which_mode() {
        let mut m = decide(refused());
        m.as_run = Some(GuardStatus {
            attached: true,
            read_guard: false,
            refused: None,
        });
        let line = describe(&m);
        assert!(
            line.starts_with("agent run WITH --allow-unguarded"),
            "{line}"
        );
        assert!(line.contains("refused yes"), "{line}");
        assert!(line.contains("as run: attached true"), "{line}");
        let guarded = decide(GuardStatus {
            attached: true,
            read_guard: true,
            refused: None,
        });
        assert!(describe(&guarded).contains("without --allow-unguarded (features.read_guard true"));
    }
}
