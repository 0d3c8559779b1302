//! `cargo xtask render-deploy`: writes `deploy/` from the chart (`kube_testenv::chart`),
//! or with `--check` fails naming every file that differs.

use anyhow::{Result, bail};
use kube_testenv::{chart, cluster};
use xtask_lib::workspace;

/// Arguments of `cargo xtask render-deploy`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Compare instead of writing: fail if `deploy/` is not the chart rendered.
    #[arg(long)]
    pub check: bool,
}

/// `cargo xtask render-deploy`.
pub fn run(args: &Args) -> Result<()> {
    let repo = workspace::root();
    let helm = cluster::bins::ensure_helm()?;
    let want = chart::split(&chart::render(&helm, repo)?)?;
    let deploy = repo.join("deploy");
    let have = chart::rendered_files(&deploy)?;
    let drift = chart::drift(&have, &want);
    if args.check {
        if !drift.is_empty() {
            bail!(
                "deploy/ is not the chart rendered ({}): run `cargo xtask render-deploy`",
                drift.join(", ")
            );
        }
        println!("render-deploy: deploy/ is the chart rendered");
        return Ok(());
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        std::fs::remove_file(deploy.join(name))?;
    }
    for (name, text) in &want {
        std::fs::write(deploy.join(name), text)?;
        println!("render-deploy: wrote deploy/{name}");
    }
    Ok(())
}
