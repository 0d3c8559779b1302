//! What an apps run records: the configuration, how the agent ran (guarded, or with
//! `--allow-unguarded` because it refused otherwise), the workloads as run, and every
//! raw sample. Serialized as-is to `bench.json`; the tables are computed from it, so
//! `bypass-bench report` can redo them from a saved file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{AgentProbe, Environment, Path, Placement};

/// The value of [`AppsResults::kind`]: tells an apps `bench.json` from a sweep's.
pub const KIND: &str = "apps";

/// The current [`AppsResults::schema`].
pub const SCHEMA: u32 = 1;

/// What the run was asked to do.
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

    /// Whether `json` (a parsed `bench.json`) is an apps run's.
    pub fn is_apps(json: &serde_json::Value) -> bool {
        json.get("kind").and_then(serde_json::Value::as_str) == Some(KIND)
    }
}
