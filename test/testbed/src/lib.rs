//! `testbed`: a same-node testbed for the bypass datapath, and the tools the privileged
//! tests (`integration-test`) and the bench (the demo among its runs) use: this crate's
//! one binary, `bypass-test-tool` (`src/bin/bypass-test-tool/`), with subcommands
//! `peer`, `probe`, `proxy` and `smoke` ([`tools`] finds it).
//!
//! Two network namespaces ("pods") on a bridge, each in its own child cgroup under a
//! parent test cgroup; the agent attached to the parent; processes started inside a
//! pod's cgroup and namespace; veth byte counters to tell bypassed bytes from bytes on
//! the wire. Every resource is a guard that undoes itself on drop, is named with the
//! `bt` prefix plus this process's id and a counter, and so never collides with a
//! parallel user. [`apps`] runs real applications (redis, nginx, PostgreSQL, iperf3,
//! HAProxy, and the suite's own Go, Java and Node.js programs in `apps/`) in the pods.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use testbed::{Agent, ClientArgs, PeerServer, TwoPods};
//! let pods = TwoPods::new()?;
//! let agent = Agent::start(&pods.agent_opts())?;
//! let server = PeerServer::start(&pods.b, pods.b.v4_addr(5000), 1)?;
//! let client = testbed::run_client(&pods.a, pods.b.v4_addr(5000), &ClientArgs::bulk(1 << 20))?;
//! let server = server.wait()?;
//! assert!(client.ok && server.ok);
//! println!("{}", agent.status()?);
//! # Ok(()) }
//! ```
//!
//! Needs root, `ip` (iproute2), a cgroup2 mount and bpffs. [`preflight`] checks them.

// Unit tests may unwrap: a panic is their failure report. Library code may not (the
// non-test build is linted with the workspace's deny).
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod apps;
pub mod bpf;
pub mod cgroup;
pub mod iptables;
pub mod link;
pub mod mapkeys;
pub mod names;
pub mod netns;
pub mod peer;
pub mod pod_peers;
pub mod proxy;
pub mod reap;
pub mod require;
pub mod spawn;
pub mod steps;
pub mod tools;
pub mod topology;

pub use agent::{Agent, AgentExit, AgentOpts, AgentStatus, KernelProbe, kernel_probe};
pub use cgroup::CgroupGuard;
pub use link::{Bridge, LinkCounters, Veth};
pub use netns::Netns;
pub use peer::Report;
pub use pod_peers::{ClientArgs, PeerClient, PeerServer, ServerArgs, run_client};
pub use proxy::{Proxy, ProxyOpts};
pub use require::preflight;
pub use spawn::{Place, PodChild, spawn_in, spawn_in_on_cpus};
pub use topology::{Pod, Sandbox, TwoPods};
