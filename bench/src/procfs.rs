//! The agent's cost from /proc: resident memory (VmRSS, VmHWM from `status`) and CPU
//! time (utime + stime from `stat`).

use anyhow::{Context as _, Result, anyhow};

/// A process's memory and cumulative CPU time at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcSnapshot {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// VmHWM, KiB.
    pub hwm_kib: u64,
    /// utime + stime, ms.
    pub cpu_ms: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn snapshot(pid: u32) -> Result<ProcSnapshot> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let (rss_kib, hwm_kib) = parse_status(&status)?;
    let ticks = parse_stat_cpu_ticks(&stat)?;
    Ok(ProcSnapshot {
        rss_kib,
        hwm_kib,
        cpu_ms: ticks as f64 * 1000.0 / clock_ticks_per_sec(),
    })
}

fn clock_ticks_per_sec() -> f64 {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// (VmRSS, VmHWM) in KiB from a `status` text.
pub fn parse_status(status: &str) -> Result<(u64, u64)> {
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc status"))
    };
    Ok((field("VmRSS")?, field("VmHWM")?))
}

/// utime + stime (fields 14 and 15, clock ticks) from a `stat` line. The command name
/// in parentheses may hold spaces, so fields are counted after the last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Result<u64> {
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("malformed /proc stat"))?;
    // After ")": field 3 (state) is index 0, so field N is index N - 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |n: usize| -> Result<u64> {
        f.get(n - 3)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("no field {n} in /proc stat"))
    };
    Ok(get(14)? + get(15)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let s =
            "Name:\tbypass-agent\nVmPeak:\t  20000 kB\nVmHWM:\t    9000 kB\nVmRSS:\t    8500 kB\n";
        assert_eq!(parse_status(s).unwrap(), (8500, 9000));
        assert!(parse_status("Name: x\n").is_err());
    }

    #[test]
    fn stat_cpu_with_spaces_in_name() {
        let s = "1234 (a b) S 1 1234 1234 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 1 0 100 1000 200";
        assert_eq!(parse_stat_cpu_ticks(s).unwrap(), 22);
    }

    #[test]
    fn own_process() {
        let snap = snapshot(std::process::id()).unwrap();
        assert!(snap.rss_kib > 0 && snap.hwm_kib >= snap.rss_kib);
    }
}
