//! The node's TCP memory limit, for the sk_msg program: from how many pages of TCP
//! memory on the node sends take the TCP path (`bypass_common::control::SLOT_TCP_MEM_TIGHT`).
//! A redirect charges the receiving socket; above `tcp_mem`'s first threshold, under
//! memory pressure, the kernel may refuse that charge and then fails the sender's
//! `send` with `ENOMEM` (net/ipv4/tcp_bpf.c, bpf_tcp_ingress), where TCP would make it
//! wait. `tcp_mem` is one setting for the whole node (not per network namespace); the
//! agent writes the threshold at every start and again at each heartbeat, so a change
//! of the sysctl applies within a heartbeat period.

use std::path::Path;

use bypass_common::control;

use super::maps::Control;
use crate::error::AgentError;

/// Where the kernel says `tcp_mem`: three numbers of pages (low, pressure, high).
pub const TCP_MEM: &str = "/proc/sys/net/ipv4/tcp_mem";

/// Where Linux ≥ 6.9 says how many pages of TCP memory each CPU may hold uncounted
/// (`net.core.mem_pcpu_rsv`; before, a fixed 1 MiB from 6.0 on, none before 6.0).
pub const MEM_PCPU_RSV: &str = "/proc/sys/net/core/mem_pcpu_rsv";

/// The first number of a sysctl's text (`tcp_mem`'s threshold under which TCP memory
/// is never refused), if it is one.
pub fn parse_low(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Reads `tcp_mem` and writes the threshold it gives into `control`; returns it.
pub fn refresh(control: &mut Control) -> Result<u32, AgentError> {
    let text = std::fs::read_to_string(TCP_MEM).map_err(|source| AgentError::Io {
        action: "read the node's TCP memory limits",
        path: Path::new(TCP_MEM).to_path_buf(),
        source,
    })?;
    let low = parse_low(&text).ok_or_else(|| AgentError::Io {
        action: "read the node's TCP memory limits (not three numbers of pages)",
        path: Path::new(TCP_MEM).to_path_buf(),
        source: std::io::Error::other(format!("{:?}", text.trim())),
    })?;
    let threshold = control::tcp_mem_tight(low, cpus(), pcpu_reserve());
    control.set_tcp_mem_tight(threshold)?;
    Ok(threshold)
}

/// Pages each CPU may hold uncounted: `net.core.mem_pcpu_rsv` where the kernel has it,
/// else its fixed 1 MiB (an overestimate before Linux 6.0, which holds none).
fn pcpu_reserve() -> u64 {
    std::fs::read_to_string(MEM_PCPU_RSV)
        .ok()
        .and_then(|t| parse_low(&t))
        .unwrap_or(control::PCPU_RESERVE_PAGES)
}

/// The node's CPUs (configured, online or not: each may hold TCP memory uncounted).
fn cpus() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_CONF)
        .ok()
        .flatten()
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_number_is_the_low_threshold() {
        assert_eq!(parse_low("287901\t383868\t575802\n"), Some(287_901));
        assert_eq!(parse_low("1 2 3"), Some(1));
        assert_eq!(parse_low(""), None);
        assert_eq!(parse_low("many pages"), None);
    }

    #[test]
    fn this_node_has_cpus_and_a_reserve() {
        assert!(cpus() >= 1);
        assert!(pcpu_reserve() >= 1);
    }

    #[test]
    fn this_nodes_tcp_mem_reads() {
        let text = std::fs::read_to_string(TCP_MEM).unwrap();
        let low = parse_low(&text).unwrap();
        assert!(low > 0, "{text}");
    }
}
