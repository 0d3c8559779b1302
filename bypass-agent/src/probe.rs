//! `probe`: what this kernel gives the datapath, found as `run` finds it, printed
//! without attaching anything.

use bypass_common::names::READ_HOOKS;
use serde::{Deserialize, Serialize};

use crate::{
    cli::ProbeOpts,
    datapath::{HostFacts, ReadGuard},
    error::AgentError,
};

/// What `probe` prints.
#[derive(Debug, Serialize, Deserialize)]
pub struct Probe {
    /// Whether splice and zero-copy receive of a bypassed socket are guarded (the
    /// kernel runs BPF trampolines).
    pub read_guard: bool,
    /// How a bypassed socket's reads are seen: `tracepoint` (sock_recv_length) or
    /// `trampolines` (tcp_bpf_recvmsg's entry and return).
    pub read_hook: String,
    /// Whether `run` bypasses on this kernel without `--allow-unguarded`.
    pub bypass_by_default: bool,
}

impl Probe {
    /// Detects this kernel's support as `run` does.
    pub fn detect() -> Result<Self, AgentError> {
        Ok(Self::from_facts(&HostFacts::detect()?))
    }

    fn from_facts(facts: &HostFacts) -> Self {
        let read_guard = facts.hooks.guard == ReadGuard::Guard;
        Self {
            read_guard,
            read_hook: if facts.hooks.read == READ_HOOKS.as_slice() {
                "tracepoint"
            } else {
                "trampolines"
            }
            .to_owned(),
            bypass_by_default: read_guard,
        }
    }
}

/// Detects the kernel's support as `run` does and prints it.
pub fn probe(opts: &ProbeOpts) -> Result<(), AgentError> {
    let found = Probe::detect()?;
    if opts.json {
        return crate::print_json(&found, "the probe");
    }
    println!("read guard:        {}", yes_no(found.read_guard));
    println!("reads seen by:     {}", found.read_hook);
    println!(
        "bypass by default: {}",
        if found.bypass_by_default {
            "yes"
        } else {
            "no (the kernel refuses BPF trampolines: `run --allow-unguarded` to bypass \
             workloads that never splice or map their sockets)"
        }
    );
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
