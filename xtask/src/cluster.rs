//! `cargo xtask cluster up|down`: the one-node Kubernetes of [`kube_testenv::cluster`],
//! with setup's cluster packages first.

use std::time::Instant;

use anyhow::Result;
use kube_testenv::cluster::{
    config::{Layout, NODE_NAME},
    down, up,
};

use crate::setup;

/// Options of `cargo xtask cluster`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Action {
    /// Build what is missing, start the node, wait until it is Ready; prints the admin
    /// kubeconfig path.
    Up,
    /// Stop every daemon and pod and take back every change made to the host.
    Down,
}

/// `cargo xtask cluster up|down`.
pub fn run(action: &Action) -> Result<()> {
    let layout = Layout::default();
    match action {
        Action::Up => {
            setup::ensure_cluster()?;
            let started = Instant::now();
            let kubeconfig = up(&layout)?;
            eprintln!(
                "cluster: node {NODE_NAME} Ready in {:.0?}",
                started.elapsed()
            );
            println!("{}", kubeconfig.display());
            Ok(())
        }
        Action::Down => down(&layout),
    }
}
