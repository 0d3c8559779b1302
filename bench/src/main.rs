//! `bypass-bench`: parses the command line and hands it to the library. `run` is the
//! bench (`cargo xtask bench` builds and starts it); `demo` is the bench at small scale
//! (`cargo xtask demo`); `apps` is its real-application
//! scenario (`cargo xtask bench --scenario apps`); `scale` is one agent against an API
//! server holding a large cluster's objects (`cargo xtask bench --scenario scale`);
//! `report` redoes the tables (and plot)
//! from a saved `bench.json` of either; `floor` and `floor-peer` are the Unix-socket
//! floor's two processes, started by `run`.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result, bail};
use bench::{
    apps, demo, driver,
    model::{Config, Placement, SIZES, Scenario, Test},
    report,
};
use clap::{Parser, Subcommand, ValueEnum};

/// Bench of the same-node TCP bypass against the normal path and the Unix-socket floor.
#[derive(Debug, Parser)]
#[command(name = "bypass-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Placements {
    /// Same-CPU and cross-CPU.
    Both,
    /// Client and server on CPU 0.
    Same,
    /// Client on CPU 0, server on CPU 1.
    Cross,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TestArg {
    #[value(name = "tcp_lat")]
    TcpLat,
    #[value(name = "tcp_bw")]
    TcpBw,
}

impl From<TestArg> for Test {
    fn from(t: TestArg) -> Self {
        match t {
            TestArg::TcpLat => Test::TcpLat,
            TestArg::TcpBw => Test::TcpBw,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the bench (root): two pods, qperf and sockperf with the bypass attached and
    /// detached, the floor, the agent's cost. The agent binary is $BYPASS_AGENT_BIN or
    /// target/release/bypass-agent.
    Run {
        /// Under two minutes: one repetition, cross-CPU only, sockperf shortened.
        #[arg(long)]
        quick: bool,
        /// Interleaved repetitions [default: 5, quick: 1].
        #[arg(long)]
        reps: Option<u32>,
        /// Seconds per qperf test [default: 1].
        #[arg(long)]
        secs: Option<u32>,
        /// Placements [default: both, quick: cross].
        #[arg(long, value_enum)]
        placement: Option<Placements>,
        /// Message sizes, comma-separated [default: 1,4,16,64,256,1024,4096,16384].
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<u32>>,
        /// sockperf sizes, comma-separated; 0 to skip sockperf [default: 64,16384].
        #[arg(long, value_delimiter = ',')]
        sockperf_sizes: Option<Vec<u32>>,
        /// qperf tests, comma-separated [default: tcp_lat,tcp_bw].
        #[arg(long, value_enum, value_delimiter = ',')]
        tests: Option<Vec<TestArg>>,
        /// Skip the Unix-socket floor (always skipped in the mesh and clusterip
        /// scenarios: it has no chain to compare with, and the default run measures it).
        #[arg(long)]
        no_floor: bool,
        /// Skip the minimal reference redirect (`bench/minimal-ebpf`), measured by
        /// default in every scenario as a third path beside bypass and default.
        #[arg(long)]
        no_minimal: bool,
        /// One more argument for `bypass-agent run` (repeat it; e.g.
        /// `--agent-arg=--small-stream-bytes=0`), recorded in the JSON.
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// The path between client and server: default (pod to pod), mesh (through a
        /// sidecar proxy in each pod behind iptables REDIRECT), clusterip (a Service VIP
        /// DNATed by kube-proxy-shaped iptables chains), cluster (two real pods of the
        /// one-node cluster, the DaemonSet switched by the node label; qperf only: no
        /// sockperf, floor or minimal datapath; run it through `cargo xtask bench`).
        #[arg(long, value_enum, default_value = "default")]
        scenario: Scenario,
        /// Where the table, JSON and plot go [default: results/latest, or
        /// results/latest-<scenario>].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where raw tool output is appended (git-ignored).
        #[arg(long, default_value = "results/raw")]
        raw: PathBuf,
    },
    /// The demo (root; `cargo xtask demo`): the bench at small scale, as a first look.
    /// qperf at 64 B and 16 KiB and sockperf at 64 B between two pods, with the bypass
    /// and on the normal TCP path, same-CPU then cross-CPU, one repetition (about a
    /// minute); then what moved where. Fails when the bypass did not bypass.
    Demo {
        /// Where the table and JSON go.
        #[arg(long, default_value = "results/raw/demo")]
        out: PathBuf,
        /// Where raw tool output is appended (git-ignored).
        #[arg(long, default_value = "results/raw")]
        raw: PathBuf,
    },
    /// Run the real applications (root): each workload of `testbed::apps` (redis, nginx,
    /// PostgreSQL, iperf3, Go, HAProxy, Java, Node.js, gRPC) bypassed, on the normal path
    /// and through the minimal redirect, interleaved, same-CPU and cross-CPU. The agent is
    /// started as a user starts it, with --allow-unguarded only where it refuses without.
    /// The suite's own programs are found in $BYPASS_APPS_DIR or apps/ beside this binary.
    Apps {
        /// A smoke check: every workload once (one repetition), short, cross-CPU only.
        #[arg(long)]
        quick: bool,
        /// Interleaved repetitions [default: 3, quick: 1].
        #[arg(long)]
        reps: Option<u32>,
        /// Placements [default: both, quick: cross].
        #[arg(long, value_enum)]
        placement: Option<Placements>,
        /// Workloads by name, comma-separated [default: all].
        #[arg(long, value_delimiter = ',')]
        workloads: Vec<String>,
        /// Skip the minimal reference redirect.
        #[arg(long)]
        no_minimal: bool,
        /// One more argument for `bypass-agent run` (repeat it), recorded in the JSON.
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// Where the JSON and tables go [default: results/latest-apps].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where raw tool output is appended (git-ignored).
        #[arg(long, default_value = "results/raw")]
        raw: PathBuf,
    },
    /// One agent against a real API server (etcd and kube-apiserver, no kubelet) holding
    /// a large cluster's objects, created by the bench; an idle window, then churn of pod,
    /// EndpointSlice and NetworkPolicy updates (root: the agent loads its datapath). The
    /// agent's CPU, peak memory, reconcile passes, the latency of a change to one of its
    /// node's pods, and the watches it holds. Writes scale.json and scale.md.
    Scale {
        /// Nodes (one is the agent's).
        #[arg(long, default_value_t = 5_000)]
        nodes: u32,
        /// Pods in all.
        #[arg(long, default_value_t = 150_000)]
        pods: u32,
        /// Pods on the agent's node.
        #[arg(long, default_value_t = 100)]
        node_pods: u32,
        /// Namespaces.
        #[arg(long, default_value_t = 100)]
        namespaces: u32,
        /// Services (each with one EndpointSlice).
        #[arg(long, default_value_t = 10_000)]
        services: u32,
        /// NetworkPolicies.
        #[arg(long, default_value_t = 1_000)]
        policies: u32,
        /// Updates a second in the churn window.
        #[arg(long, default_value_t = 300)]
        churn_rate: u32,
        /// Seconds of churn.
        #[arg(long, default_value_t = 90)]
        churn_secs: u32,
        /// Seconds of the idle window before it.
        #[arg(long, default_value_t = 30)]
        idle_secs: u32,
        /// Requests in flight.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// The API server's and etcd's state (removed at the end).
        #[arg(long, default_value = "/dev/shm/bypass-scale")]
        state_dir: PathBuf,
        /// One more argument for `bypass-agent run` (repeat it).
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// What the run is called in its table.
        #[arg(long, default_value = "latest")]
        label: String,
        /// Where scale.json and scale.md go.
        #[arg(long, default_value = bench::scale::DEFAULT_OUT)]
        out: PathBuf,
    },
    /// Redo table.txt, table.md (plot.svg, readme-snippet.md) from a bench.json.
    Report {
        /// The bench.json.
        #[arg(long, default_value = "results/latest/bench.json")]
        from: PathBuf,
        /// Where to write [default: beside the JSON].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The floor's client (started by `run`): prints one JSON line.
    Floor {
        #[arg(long, value_enum)]
        test: TestArg,
        #[arg(long)]
        size: u32,
        #[arg(long)]
        secs: f64,
        #[arg(long)]
        client_cpu: usize,
        #[arg(long)]
        server_cpu: usize,
    },
    /// Research probe (root): TCP streams between the pods, bypass attached and
    /// detached; sleeps (wake-ups) and CPU per message on each side.
    Wakeups {
        /// Message sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64,256,4096")]
        sizes: Vec<u32>,
        /// Seconds per stream.
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
        /// Repetitions.
        #[arg(long, default_value_t = 3)]
        reps: u32,
        /// Placements.
        #[arg(long, value_enum, default_value = "both")]
        placement: Placements,
        /// Also write the samples as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The probe's receiver (started by `wakeups`).
    StreamRecv {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        size: u32,
    },
    /// The probe's sender (started by `wakeups`).
    StreamSend {
        #[arg(long)]
        connect: std::net::SocketAddr,
        #[arg(long)]
        size: u32,
        #[arg(long)]
        secs: f64,
    },
    /// The floor's peer (started by `floor`, socket on stdin).
    FloorPeer {
        #[arg(long, value_enum)]
        test: TestArg,
        #[arg(long)]
        size: u32,
        #[arg(long)]
        cpu: usize,
    },
}

fn placements_of(p: Placements) -> Vec<Placement> {
    match p {
        Placements::Both => vec![Placement::cross_cpu(), Placement::same_cpu()],
        Placements::Same => vec![Placement::same_cpu()],
        Placements::Cross => vec![Placement::cross_cpu()],
    }
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Our resource prefix on this machine: netns, bridge, veths, cgroups and pin
/// directories of the bench are named `bb...`.
const RESOURCE_PREFIX: &str = "bb";

fn real_main() -> Result<()> {
    testbed::names::set_prefix(RESOURCE_PREFIX).map_err(anyhow::Error::msg)?;
    match Cli::parse().command {
        Cmd::Run {
            quick,
            reps,
            secs,
            placement,
            sizes,
            sockperf_sizes,
            tests,
            no_floor,
            no_minimal,
            agent_args,
            scenario,
            out,
            raw,
        } => {
            let reps = reps.unwrap_or(if quick { 1 } else { 5 });
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            let placements = placements_of(placement.unwrap_or(if quick {
                Placements::Cross
            } else {
                Placements::Both
            }));
            let config = Config {
                quick,
                reps,
                sockperf_reps: reps.min(3),
                qperf_secs: secs.unwrap_or(1).max(1),
                sockperf_secs: if quick { 2 } else { 3 },
                floor_secs: if quick { 0.5 } else { 1.0 },
                sizes: sizes.unwrap_or_else(|| SIZES.to_vec()),
                sockperf_sizes: sockperf_sizes
                    .unwrap_or_else(|| vec![64, 16384])
                    .into_iter()
                    .filter(|&s| s > 0)
                    .collect(),
                placements,
                tests: tests.map_or_else(
                    || vec![Test::TcpLat, Test::TcpBw],
                    |t| t.into_iter().map(Test::from).collect(),
                ),
                idle_secs: if quick { 1.0 } else { 3.0 },
                minimal: !no_minimal,
                agent_args,
                scenario,
            };
            let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            let opts = driver::Options {
                config,
                raw_dir: raw,
                workspace,
                no_floor: no_floor || scenario != Scenario::Default,
            };
            let out = out.unwrap_or_else(|| scenario.default_out());
            let results = driver::run(&opts)?;
            let written = driver::write_outputs(&results, &out)?;
            println!("{}", report::render(&results));
            for w in written {
                println!("wrote {}", w.display());
            }
            Ok(())
        }
        Cmd::Demo { out, raw } => {
            let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            // The demo runs the agent with --allow-unguarded, as the tests do: it says
            // whether that mattered here, first and last.
            let guard = demo::guard_line(&testbed::kernel_probe()?);
            println!("{guard}");
            let results = demo::run(&workspace, &raw)?;
            let written = driver::write_outputs(&results, &out)?;
            println!("{}", report::render(&results));
            println!("{}", demo::moved(&results));
            for w in written {
                println!("wrote {}", w.display());
            }
            let problems = demo::problems(&results);
            if !problems.is_empty() {
                bail!(
                    "the bypass did not do its job in this run:\n  {}",
                    problems.join("\n  ")
                );
            }
            println!(
                "every run went the way its path says: the bypassed runs redirected their bytes, the TCP runs put theirs on the veths"
            );
            println!("{guard}");
            Ok(())
        }
        Cmd::Apps {
            quick,
            reps,
            placement,
            workloads,
            no_minimal,
            agent_args,
            out,
            raw,
        } => {
            let reps = reps.unwrap_or(if quick { 1 } else { 3 });
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            let opts = apps::Options {
                quick,
                reps,
                placements: placements_of(placement.unwrap_or(if quick {
                    Placements::Cross
                } else {
                    Placements::Both
                })),
                minimal: !no_minimal,
                agent_args,
                workloads,
                raw_dir: raw,
                workspace: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
            };
            let results = apps::run(&opts)?;
            let written = apps::write_outputs(&results, &out.unwrap_or_else(apps::default_out))?;
            println!("{}", apps::table::render(&results));
            for w in written {
                println!("wrote {}", w.display());
            }
            Ok(())
        }
        Cmd::Scale {
            nodes,
            pods,
            node_pods,
            namespaces,
            services,
            policies,
            churn_rate,
            churn_secs,
            idle_secs,
            concurrency,
            state_dir,
            agent_args,
            label,
            out,
        } => {
            let opts = bench::scale::Options {
                counts: bench::scale::objects::Counts {
                    nodes,
                    pods,
                    node_pods,
                    namespaces,
                    services,
                    policies,
                },
                churn_rate,
                churn_secs,
                idle_secs,
                concurrency: concurrency.max(1),
                state_dir,
                agent_args,
                label,
            };
            let results = bench::scale::run(&opts)?;
            let written = bench::scale::write_outputs(&results, &out)?;
            println!("{}", bench::scale::render(&results));
            for w in written {
                println!("wrote {}", w.display());
            }
            Ok(())
        }
        Cmd::Report { from, out } => {
            let text = std::fs::read_to_string(&from)
                .with_context(|| format!("read {}", from.display()))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).context("parse bench.json")?;
            let dir = out.unwrap_or_else(|| {
                from.parent()
                    .map_or_else(|| PathBuf::from("."), PathBuf::from)
            });
            if apps::model::AppsResults::is_apps(&json) {
                let results: apps::model::AppsResults =
                    serde_json::from_value(json).context("parse the apps bench.json")?;
                let written = apps::write_outputs(&results, &dir)?;
                println!("{}", apps::table::render(&results));
                for w in written {
                    println!("wrote {}", w.display());
                }
                return Ok(());
            }
            let results = serde_json::from_value(json).context("parse bench.json")?;
            let written = driver::write_outputs(&results, &dir)?;
            println!("{}", report::render(&results));
            for w in written {
                println!("wrote {}", w.display());
            }
            Ok(())
        }
        Cmd::Floor {
            test,
            size,
            secs,
            client_cpu,
            server_cpu,
        } => {
            let r = bench::floor::client(test.into(), size, secs, client_cpu, server_cpu)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
        Cmd::FloorPeer { test, size, cpu } => bench::floor::peer(test.into(), size, cpu),
        Cmd::Wakeups {
            sizes,
            secs,
            reps,
            placement,
            json,
        } => {
            let placements = placements_of(placement);
            let samples = bench::wakeups::run(&sizes, &placements, secs, reps)?;
            print!("{}", bench::wakeups::render(&samples, &placements, &sizes));
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&samples)?)
                    .with_context(|| format!("write {}", path.display()))?;
            }
            Ok(())
        }
        Cmd::StreamRecv { listen, size } => {
            let r = bench::wakeups::recv(listen, size)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
        Cmd::StreamSend {
            connect,
            size,
            secs,
        } => {
            let r = bench::wakeups::send(connect, size, secs)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
    }
}
