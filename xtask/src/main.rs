//! `cargo xtask`: the project's tasks. This file only parses the command line and hands
//! it to the module that does the task.

mod apps;
mod bench;
mod build;
mod cluster;
mod demo;
mod docs;
mod image;
mod render;
mod setup;
mod test;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask_lib::workspace;

/// Tasks of the bypass project (run as `cargo xtask <task>`).
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", version)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what is missing: toolchain, bpf-linker, Debian packages. Fast when present.
    Setup,
    /// Build the agent (setup's toolchain checks first); `--check` adds fmt and clippy.
    Build(build::Args),
    /// Unit tests, then the privileged integration tests (root) against the built agent.
    Test(test::Args),
    /// The demo: the bench at small scale (`bypass-bench demo`) against the built agent.
    Demo(demo::Args),
    /// The bench (root): bypass vs normal path vs Unix-socket floor; writes results/latest
    /// (`--scenario mesh|clusterip`: through a sidecar chain or a ClusterIP DNAT).
    Bench(bench::Args),
    /// The README's kernel table, from the `cargo xtask test --kernel NAME` results.
    KernelTable,
    /// The lists in the docs that a catalogue of bypass-common knows (status keys and
    /// counters, kernel needs and fields) and the agent's options as clap has them;
    /// `--check` fails if one is stale.
    Docs(docs::Args),
    /// A one-node Kubernetes on this machine (root): etcd, kube-apiserver, controllers,
    /// scheduler, kubelet, kube-proxy, containerd; `down` leaves nothing behind.
    Cluster {
        #[command(subcommand)]
        action: cluster::Action,
    },
    /// The agent and test images, assembled with no registry and loaded into the cluster.
    Image(image::Args),
    /// Write deploy/ from the Helm chart (`--check`: fail if it differs).
    RenderDeploy(render::Args),
    /// A real kube-apiserver and etcd on loopback (built once from the Go module proxy).
    KubeEnv {
        #[command(subcommand)]
        action: KubeEnvAction,
    },
}

#[derive(Debug, Subcommand)]
enum KubeEnvAction {
    /// Start them (state under target/kube-env) and print the admin kubeconfig path.
    Up,
    /// Stop them and remove the state.
    Down,
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build(args) => build::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Demo(args) => demo::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::KernelTable => kernel_matrix::table::run(),
        Task::Docs(args) => docs::run(&args),
        Task::Cluster { action } => cluster::run(&action),
        Task::Image(args) => image::run(&args),
        Task::RenderDeploy(args) => render::run(&args),
        Task::KubeEnv { action } => {
            let dir = kube_testenv::default_dir(workspace::root());
            match action {
                // Setup first: it finds or fetches the Go that builds the API server.
                KubeEnvAction::Up => setup::ensure(setup::Scope::All)
                    .and_then(|_| kube_testenv::up(&dir))
                    .map(|kc| println!("{}", kc.display())),
                KubeEnvAction::Down => kube_testenv::down(&dir),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
