//! `cargo xtask cluster up|down`: the one-node Kubernetes of [`kube_testenv::cluster`],
//! with setup's cluster packages first.

use std::{path::Path, process::Command, time::Instant};

use anyhow::{Context as _, Result};
use kube_testenv::{
    KUBECONFIG_ENV, KUBECTL_ENV,
    cluster::{
        bins,
        config::{Layout, NODE_NAME},
        down, import_image, is_up, up,
    },
};

use crate::{image, setup};

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

/// Runs `work` with `command` against the one-node cluster (the caller is root): up if it
/// is not (and down afterwards, whatever `work`'s outcome), the images of `agent` (and
/// `earlier`) and the test image loaded, `kubectl` and the admin kubeconfig in
/// `command`'s environment.
pub fn with_cluster(
    tools: &setup::Tools,
    agent: &Path,
    earlier: Option<&Path>,
    command: &mut Command,
    work: impl FnOnce(&mut Command) -> Result<()>,
) -> Result<()> {
    setup::ensure_cluster()?;
    let layout = Layout::default();
    let started = Instant::now();
    let brought_up = !is_up(&layout);
    if brought_up {
        up(&layout)?;
        eprintln!("cluster: up in {:.0?}", started.elapsed());
    } else {
        eprintln!("cluster: up already; it stays up");
    }
    let result = (|| -> Result<()> {
        for t in image::build_images(tools, agent, earlier)? {
            import_image(&layout, &t)?;
        }
        command
            .env(KUBECONFIG_ENV, layout.admin_kubeconfig())
            .env(KUBECTL_ENV, bins::ensure()?.get("kubectl"));
        work(command)
    })();
    if brought_up {
        let down = down(&layout).context("take the cluster down");
        result?;
        return down;
    }
    result
}
