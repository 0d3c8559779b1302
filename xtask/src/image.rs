//! `cargo xtask image`: builds the agent (and the test tool) and hands them to
//! [`kube_testenv::image`], which assembles the images with no registry; loads them into
//! the cluster's containerd when it is up.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use kube_testenv::{
    cluster,
    image::{CrossAgent, IMAGES_DIR, agent_rootfs, build_all, test_rootfs},
};
use xtask_lib::workspace;

use crate::{build, setup};

/// Arguments of `cargo xtask image`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Only write the root filesystem of `agent` or `test` into DIR (what
    /// `deploy/Containerfile` copies into its image), e.g. `--rootfs agent DIR`.
    #[arg(long, num_args = 2, value_names = ["IMAGE", "DIR"])]
    pub rootfs: Option<Vec<String>>,
    /// Write the agent image for amd64 and arm64 (cross-built) as one OCI image index,
    /// each with an SPDX SBOM, into the OCI layout DIR (see `lab/kube-testenv/src/oci.rs`).
    #[arg(long, value_name = "DIR")]
    pub oci: Option<PathBuf>,
}

/// `cargo xtask image`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::Build)?;
    let agent = build::build_agent(&tools, &build::Options { debug: false })?;
    if let Some(v) = &args.rootfs {
        let (which, dir) = match v.as_slice() {
            [w, d] => (w.as_str(), PathBuf::from(d)),
            _ => bail!("--rootfs takes two values: agent|test and a directory"),
        };
        return match which {
            "agent" => agent_rootfs(&agent, &dir),
            "test" => test_rootfs(&build_test_tool(&tools)?, &dir),
            other => bail!("--rootfs {other}: the images are `agent` and `test`"),
        };
    }
    if let Some(dir) = &args.oci {
        return build_oci(&tools, &agent, dir);
    }
    let tarballs = build_images(&tools, &agent, None)?;
    let layout = cluster::config::Layout::default();
    if layout.containerd_socket().exists() {
        for t in &tarballs {
            cluster::import_image(&layout, t)?;
        }
        println!("image: loaded into the cluster's containerd");
    } else {
        println!(
            "image: the cluster is not up; `cargo xtask cluster up` then `cargo xtask image` loads them"
        );
    }
    Ok(())
}

/// Builds the test tool (`testbed`'s binary) in release: what the test image carries and
/// the bench's mesh scenario runs.
pub fn build_test_tool(tools: &setup::Tools) -> Result<PathBuf> {
    build::build_test_tool(tools, true)
}

/// The agent's image of `agent` (and of `earlier`, tagged apart) and the test image with
/// the test tool built here, as tarballs under the target directory's [`IMAGES_DIR`].
pub fn build_images(
    tools: &setup::Tools,
    agent: &Path,
    earlier: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let test_tool = build_test_tool(tools)?;
    let out = workspace::target_dir()?.join(IMAGES_DIR);
    build_all(agent, earlier, &test_tool, &out)
}

/// The agent as an OCI image index for amd64 (`agent`, built here) and arm64 (cross
/// built), each image with its SBOM, in the OCI layout `dir`.
pub fn build_oci(tools: &setup::Tools, agent: &Path, dir: &Path) -> Result<()> {
    use kernel_matrix::arch;
    let cross = arch::of("arm64")
        .and_then(|a| a.cross)
        .context("no arm64 cross toolchain described")?;
    setup::ensure_cross(cross.rust_target)?;
    let arm = build::build_cross(
        tools,
        &build::Options { debug: false },
        cross.rust_target,
        cross.gcc,
        &[(workspace::AGENT, workspace::AGENT)],
    )?;
    let arm = arm.first().context("the cross build made no agent")?;
    let loader_file = cross.loader_file();
    let arm = CrossAgent {
        binary: arm,
        rust_target: cross.rust_target,
        libdir: cross.libdir,
        loader: cross.loader,
        loader_file: &loader_file,
    };
    kube_testenv::image::build_oci(agent, &arm, dir)
}
