//! What both `run` modes stand on: the single-threaded async runtime, and the signals
//! that stop the agent.

use std::future::Future;

use crate::error::AgentError;

/// A current-thread runtime with I/O and timers.
pub fn current_thread() -> Result<tokio::runtime::Runtime, AgentError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| AgentError::System {
            action: "start the runtime",
            source,
        })
}

/// Installs the SIGTERM handler now (so a SIGTERM while loading still unwinds cleanly)
/// and returns what resolves on SIGINT or SIGTERM with the signal's name.
pub async fn signals() -> Result<impl Future<Output = &'static str>, AgentError> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| AgentError::System {
            action: "install SIGTERM handler",
            source,
        })?;
    Ok(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    })
}
