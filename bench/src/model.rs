//! What a bench run records: the configuration, the environment, every raw sample and
//! the agent probes; for a sweep ([`Results`]) or an apps run ([`AppsResults`], which adds
//! how the agent ran and the workloads). Serialized as-is to `bench.json`; the tables and
//! the plot are computed from it, so `bypass-bench report` can redo them from a saved
//! file ([`Saved`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::scenario::Scenario;

/// The message sizes of the sweep: 1 B to 16 KiB, ×4 apart.
pub const SIZES: [u32; 8] = [1, 4, 16, 64, 256, 1024, 4096, 16384];

/// The data path a sample went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Path {
    /// TCP between the pods with the bypass attached (agent running).
    Bypass,
    /// TCP between the pods over veth and bridge, the agent stopped.
    Default,
    /// TCP between the pods with the minimal reference redirect attached instead of the
    /// agent (`bench/minimal-ebpf`: the tuple from the message, one redirect).
    Minimal,
    /// A Unix-domain stream socket pair between two processes: the floor.
    Floor,
}

impl Path {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Path::Bypass => "bypass",
            Path::Default => "default",
            Path::Minimal => "minimal",
            Path::Floor => "floor",
        }
    }
}

/// What a sample measured (`--tests`, the floor's `--test`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Test {
    /// Ping-pong of one message each way; the value is the mean one-way latency in ns
    /// (round trip / 2), as qperf `tcp_lat` reports it.
    TcpLat,
    /// One-way stream of messages; the value is bytes per second received, as qperf
    /// `tcp_bw` reports it.
    TcpBw,
}

impl Test {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Test::TcpLat => "tcp_lat",
            Test::TcpBw => "tcp_bw",
        }
    }
}

/// Where client and server run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// `same-cpu` or `cross-cpu`.
    pub name: String,
    /// CPU of the client (qperf/sockperf client, floor client).
    pub client_cpu: usize,
    /// CPU of the server.
    pub server_cpu: usize,
}

impl Placement {
    /// Both ends on CPU 0: every message is a context switch on one CPU.
    pub fn same_cpu() -> Self {
        Self {
            name: "same-cpu".into(),
            client_cpu: 0,
            server_cpu: 0,
        }
    }

    /// Client on CPU 0, server on CPU 1: every wake-up crosses CPUs.
    pub fn cross_cpu() -> Self {
        Self {
            name: "cross-cpu".into(),
            client_cpu: 0,
            server_cpu: 1,
        }
    }

    /// `cross-cpu (client CPU 0, server CPU 1)`.
    pub fn describe(&self) -> String {
        format!(
            "{} (client CPU {}, server CPU {})",
            self.name, self.client_cpu, self.server_cpu
        )
    }
}

/// One qperf (or floor) measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Repetition, from 0.
    pub rep: u32,
    /// Placement name.
    pub placement: String,
    /// Data path.
    pub path: Path,
    /// Test.
    pub test: Test,
    /// Message size in bytes.
    pub size: u32,
    /// ns (latency) or bytes/s (throughput).
    pub value: f64,
    /// Bytes the pods put on the veths during the run (not for the floor): with the
    /// bypass this stays near zero, which shows the run really bypassed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_bytes: Option<u64>,
    /// Bytes the datapath redirected during the run (bypass only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirected_bytes: Option<u64>,
    /// Bytes the datapath let take TCP during the run (bypass only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_bytes: Option<u64>,
    /// Connections of the run that started to leave the SockHash, for any reason (a
    /// stream of small messages, a reader behind its bound for `--leave-after` bytes;
    /// bypass only; their bytes took TCP from then on, by design). Read before as
    /// `small_streams` (those that left as small-message streams only).
    #[serde(
        default,
        alias = "small_streams",
        skip_serializing_if = "Option::is_none"
    )]
    pub left: Option<u64>,
}

impl Sample {
    /// A sample with nothing observed around it (the floor's).
    pub fn bare(rep: u32, placement: &str, path: Path, test: Test, size: u32, value: f64) -> Self {
        Self {
            rep,
            placement: placement.to_owned(),
            path,
            test,
            size,
            value,
            wire_bytes: None,
            redirected_bytes: None,
            passed_bytes: None,
            left: None,
        }
    }

    /// What the agent counted over the run, where it was read (bypass).
    pub fn counted(&self) -> Option<Counted> {
        Some(Counted {
            redirected: self.redirected_bytes?,
            passed: self.passed_bytes.unwrap_or(0),
            left: self.left.unwrap_or(0),
        })
    }
}

/// What the agent counted (at one moment, or over a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// Bytes it redirected.
    pub redirected: u64,
    /// Bytes it let take TCP.
    pub passed: u64,
    /// Connections that started to leave the SockHash, for any reason (plain TCP from
    /// then on, by design: `--small-stream-bytes`, a reader behind its bound).
    pub left: u64,
}

impl Counted {
    /// What grew from `before` to `self`.
    pub fn since(self, before: Self) -> Self {
        Self {
            redirected: self.redirected.saturating_sub(before.redirected),
            passed: self.passed.saturating_sub(before.passed),
            left: self.left.saturating_sub(before.left),
        }
    }
}

/// One ping-pong run with latency percentiles (sockperf, or the floor's own).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PctSample {
    /// Repetition, from 0.
    pub rep: u32,
    /// Placement name.
    pub placement: String,
    /// Data path.
    pub path: Path,
    /// Message size in bytes.
    pub size: u32,
    /// Mean one-way latency, ns.
    pub avg_ns: f64,
    /// Median one-way latency, ns.
    pub p50_ns: f64,
    /// 99th percentile, ns.
    pub p99_ns: f64,
    /// 99.9th percentile, ns.
    pub p999_ns: f64,
    /// Round trips observed.
    pub observations: u64,
}

impl PctSample {
    /// The `latency` of one run at `rep`, `placement`, `path`, `size`.
    pub fn new(rep: u32, placement: &str, path: Path, size: u32, latency: Percentiles) -> Self {
        let Percentiles {
            avg_ns,
            p50_ns,
            p99_ns,
            p999_ns,
            observations,
        } = latency;
        Self {
            rep,
            placement: placement.to_owned(),
            path,
            size,
            avg_ns,
            p50_ns,
            p99_ns,
            p999_ns,
            observations,
        }
    }
}

/// One ping-pong run's one-way latencies, ns: sockperf's, or the floor's own (the
/// measured part of a [`PctSample`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Mean.
    pub avg_ns: f64,
    /// Median.
    pub p50_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
    /// Round trips observed.
    pub observations: u64,
}

/// When an agent probe was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbePhase {
    /// Right after the agent reported attached: loading and attaching cost.
    Started,
    /// After an idle period with no traffic.
    Idle,
    /// At the end of a block of bypassed measurements.
    Sweep,
}

/// The agent's memory and CPU at one moment, and the CPU it used since the previous
/// probe of the same agent process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentProbe {
    /// When.
    pub phase: ProbePhase,
    /// The agent's pid.
    pub pid: u32,
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// VmHWM (peak RSS), KiB.
    pub hwm_kib: u64,
    /// utime+stime since the previous probe of this process (since exec for `Started`), ms.
    pub cpu_ms: f64,
    /// Wall time since the previous probe of this process (since spawn for `Started`), ms.
    pub wall_ms: f64,
}

/// The agent's counters (`bypass-agent status --json`, every integer field) over one
/// bypassed block: how many connections of each hop kind were paired and how many
/// bytes each kind redirected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopSample {
    /// Repetition, from 0.
    pub rep: u32,
    /// Placement name.
    pub placement: String,
    /// Measured (data) connections the client opened in the block.
    pub connections: u64,
    /// Counter growth over the block, by `status --json` key.
    pub counters: BTreeMap<String, u64>,
}

/// Which program of a datapath a [`ProgSample`] measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prog {
    /// The sk_msg program: runs on every send of an inserted socket.
    SkMsg,
    /// The sock_ops program: runs on socket events of the cgroup.
    SockOps,
}

impl Prog {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Prog::SkMsg => "sk_msg",
            Prog::SockOps => "sock_ops",
        }
    }
}

/// A program's own cost over one block, from the kernel's `bpf_stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgSample {
    /// Repetition, from 0.
    pub rep: u32,
    /// Placement name.
    pub placement: String,
    /// [`Path::Bypass`] or [`Path::Minimal`].
    pub path: Path,
    /// Which program.
    pub prog: Prog,
    /// Runs in the block.
    pub runs: u64,
    /// Nanoseconds spent in it in the block.
    pub ns: u64,
}

/// What the run was asked to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// `--quick`.
    pub quick: bool,
    /// Repetitions of the interleaved qperf sweep.
    pub reps: u32,
    /// Repetitions of the sockperf runs (at most `reps`).
    pub sockperf_reps: u32,
    /// Seconds per qperf test.
    pub qperf_secs: u32,
    /// Seconds per sockperf run (sockperf spends 0.4 s of it warming up).
    pub sockperf_secs: u32,
    /// Seconds per floor test.
    pub floor_secs: f64,
    /// qperf and floor message sizes.
    pub sizes: Vec<u32>,
    /// sockperf message sizes (a small and a large one).
    pub sockperf_sizes: Vec<u32>,
    /// Placements measured.
    pub placements: Vec<Placement>,
    /// qperf tests run (both unless narrowed for research).
    #[serde(default = "both_tests")]
    pub tests: Vec<Test>,
    /// Seconds the agent sat idle for the idle probe.
    pub idle_secs: f64,
    /// Whether the minimal reference redirect was measured (`--no-minimal` turns it off).
    #[serde(default)]
    pub minimal: bool,
    /// Arguments added to the agent's command line (`--agent-arg`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_args: Vec<String>,
    /// The path between client and server (absent in a default run's JSON).
    #[serde(default, skip_serializing_if = "Scenario::is_default")]
    pub scenario: Scenario,
}

/// The machine and the tools.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// MemTotal, KiB.
    pub mem_total_kib: u64,
    /// `qperf --version`.
    pub qperf_version: String,
    /// `sockperf --version`, first line.
    pub sockperf_version: String,
    /// `bypass-agent --version`.
    pub agent_version: String,
    /// Agent binary used.
    pub agent_bin: String,
    /// `git rev-parse HEAD` of the work tree, `+dirty` when it has changes.
    pub git_commit: String,
    /// Load average when the run started (other work on the machine shows here).
    pub loadavg_start: String,
    /// Load average when the run ended.
    pub loadavg_end: String,
    /// Start, seconds since the Unix epoch.
    pub started_unix: u64,
    /// Wall time of the whole run, seconds.
    pub duration_secs: f64,
    /// The command line.
    pub command: String,
    /// Addresses the pods used (client pod → server pod).
    pub addresses: String,
}

/// Everything a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// Format version of this file.
    pub schema: u32,
    /// What was asked.
    pub config: Config,
    /// Where it ran.
    pub env: Environment,
    /// qperf and floor samples, in the order taken.
    pub samples: Vec<Sample>,
    /// sockperf and floor ping-pong percentile samples, in the order taken.
    pub percentiles: Vec<PctSample>,
    /// Agent probes, in the order taken.
    pub agent: Vec<AgentProbe>,
    /// The agent's counters over each bypassed block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hops: Vec<HopSample>,
    /// The programs' own cost per block (`bpf_stats`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub programs: Vec<ProgSample>,
    /// Things that looked wrong during the run (a bypassed run that put bytes on the
    /// wire, a tool that failed once, ...).
    pub warnings: Vec<String>,
}

impl Results {
    /// A run of `config` on `env` before its first sample, with the `warnings` of its
    /// setup.
    pub fn new(config: Config, env: Environment, warnings: Vec<String>) -> Self {
        Self {
            schema: SCHEMA,
            config,
            env,
            samples: Vec::new(),
            percentiles: Vec::new(),
            agent: Vec::new(),
            hops: Vec::new(),
            programs: Vec::new(),
            warnings,
        }
    }
}

fn both_tests() -> Vec<Test> {
    vec![Test::TcpLat, Test::TcpBw]
}

/// The current [`Results::schema`] and [`AppsResults::schema`].
pub const SCHEMA: u32 = 1;

/// The value of [`AppsResults::kind`]: tells an apps `bench.json` from a sweep's.
pub const KIND: &str = "apps";

/// What an apps run was asked to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppsConfig {
    /// `--quick`: every workload once, short.
    pub quick: bool,
    /// Interleaved repetitions.
    pub reps: u32,
    /// Placements measured.
    pub placements: Vec<Placement>,
    /// Whether the minimal reference redirect was measured.
    pub minimal: bool,
    /// Arguments added to the agent's command line (`--agent-arg`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_args: Vec<String>,
    /// The workloads run, by name, in the order of each block.
    pub workloads: Vec<String>,
}

/// What `bypass-agent status --json` said about the bypass on this kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardStatus {
    /// `attached`: sock_ops attached and redirects allowed.
    pub attached: bool,
    /// `features.read_guard`: a splice or zero-copy receive never misses a redirected
    /// byte.
    pub read_guard: bool,
    /// `refused`: why the agent does not bypass this node, when it refuses to.
    pub refused: Option<String>,
}

/// How the agent ran in the bench.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMode {
    /// The agent started as a user starts it (no `--allow-unguarded`), before the run.
    pub as_user: GuardStatus,
    /// Whether the bench added `--allow-unguarded` (only when `as_user` was refused).
    pub allow_unguarded: bool,
    /// The agent as run, read at the first bypassed block.
    pub as_run: Option<GuardStatus>,
    /// The command line of the bypassed blocks' agent.
    pub command: String,
}

/// One workload as run: its name, what it ran and where, and its unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadInfo {
    /// Its name in tables and on the command line.
    pub name: String,
    /// The programs and their parameters, client → server, each with its pod.
    pub what: String,
    /// The unit of its value (always a rate: higher is better).
    pub unit: String,
}

/// One run of one workload's client on one path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppSample {
    /// Repetition, from 0.
    pub rep: u32,
    /// Placement name.
    pub placement: String,
    /// Data path.
    pub path: Path,
    /// Workload name.
    pub workload: String,
    /// The rate in the workload's unit, as the tool reported it; `None` when the run
    /// failed (or was skipped after a hang).
    pub value: Option<f64>,
    /// Mean latency in microseconds, where the tool reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// Wall time of the client process, seconds.
    pub secs: f64,
    /// Why the run has no value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Not run: the same workload, placement and path hung until its client's timeout
    /// in an earlier repetition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// Bytes the pods put on their veths during the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_bytes: Option<u64>,
    /// The agent's counters' growth over the run (bypass only), by `status --json` key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

impl AppSample {
    /// A counter's growth over the run, if the agent reported it.
    pub fn counter(&self, key: &str) -> Option<u64> {
        self.counters.get(key).copied()
    }
}

/// Everything an apps run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppsResults {
    /// Format version of this file.
    pub schema: u32,
    /// Always [`KIND`].
    pub kind: String,
    /// What was asked.
    pub config: AppsConfig,
    /// Where it ran.
    pub env: Environment,
    /// How the agent ran.
    pub agent_mode: AgentMode,
    /// The workloads, in the order of `config.workloads`.
    pub workloads: Vec<WorkloadInfo>,
    /// Every run, in the order taken.
    pub samples: Vec<AppSample>,
    /// Agent probes (memory, CPU), in the order taken.
    pub agent: Vec<AgentProbe>,
    /// Things that looked wrong during the run.
    pub warnings: Vec<String>,
}

impl AppsResults {
    /// A run of `config` on `env` before its first sample.
    pub fn new(config: AppsConfig, env: Environment, workloads: Vec<WorkloadInfo>) -> Self {
        Self {
            schema: SCHEMA,
            kind: KIND.to_owned(),
            config,
            env,
            agent_mode: AgentMode::default(),
            workloads,
            samples: Vec::new(),
            agent: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

/// A saved `bench.json`: a sweep's or an apps run's (told apart by [`AppsResults::kind`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Saved {
    /// The qperf/sockperf sweep.
    Sweep(Results),
    /// The apps scenario.
    Apps(AppsResults),
}

impl Saved {
    /// Parses the text of a `bench.json`.
    pub fn parse(text: &str) -> serde_json::Result<Self> {
        let json: serde_json::Value = serde_json::from_str(text)?;
        if json.get("kind").and_then(serde_json::Value::as_str) == Some(KIND) {
            serde_json::from_value(json).map(Saved::Apps)
        } else {
            serde_json::from_value(json).map(Saved::Sweep)
        }
    }
}
