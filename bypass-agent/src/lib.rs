//! The agent as a library: the pure cores (which addresses belong in the maps, what the
//! node label means, what to change), the datapath (load, pin, attach, typed map views),
//! the Kubernetes watchers that feed them, metrics and the subcommands. `main.rs` only
//! parses options, starts logging and calls [`execute`]; the fuzz targets and the
//! testbed use the modules directly.

mod apply;
pub mod backend;
pub mod cidr;
pub mod cli;
pub mod cmd;
pub mod datapath;
pub mod error;
pub mod k8s;
mod metrics;
mod other_programs;
pub mod owners;
pub mod report;
pub(crate) mod runtime;
pub mod sync;
pub mod toggle;

pub use cmd::execute;
pub use error::AgentError;
/// How many connections each metrics address serves at once.
pub use metrics::MAX_CONNECTIONS as MAX_METRICS_CONNECTIONS;
