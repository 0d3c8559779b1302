//! The images of `cargo xtask image`: the agent's image and the tests' test-tool image (also the
//! cluster bench's: it carries the host's qperf), assembled with
//! no registry: a root filesystem of the release binaries and exactly the shared
//! libraries they link (from `ldd`), packed as a docker-archive tarball (one layer,
//! fixed timestamps and owners) that `ctr images import` loads into the cluster's
//! containerd. `--rootfs` writes only the tree: `deploy/Containerfile` copies it into a
//! `scratch` image, so a registry build has the same files.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::{cmd, workspace};

use crate::oci;

/// The version the images are tagged with (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The agent image, as `deploy/kustomization.yaml` names it.
pub const AGENT_IMAGE: &str = "bypass-agent";
/// The tag of a second agent image (same binary, another image id): what the rolling
/// update test moves the DaemonSet to.
pub const ROLLOUT_TAG_SUFFIX: &str = "-rollout";
/// The tag of the agent image of an earlier build
/// ([`workspace::SAME_LAYOUT_AGENT_COMMIT`]): what the cluster's upgrade and rollback test
/// moves the DaemonSet from and back to.
pub const EARLIER_TAG_SUFFIX: &str = "-earlier";
/// The test-tool image of the cluster tests.
pub const TEST_IMAGE: &str = "bypass-test";
/// Where the test image carries the test tool ([`workspace::TEST_TOOL`]).
pub const TEST_TOOL_PATH: &str = "/usr/local/bin/bypass-test-tool";
/// Where the tarballs are written (under the target directory).
pub const IMAGES_DIR: &str = "images";
/// busybox applets linked in the test image (a shell and what the tests run in pods;
/// `taskset` pins the cluster bench's qperf to a CPU).
pub const BUSYBOX_APPLETS: [&str; 11] = [
    "sh", "cat", "sleep", "ls", "ps", "wget", "echo", "true", "ip", "nc", "taskset",
];
/// Host binaries copied into the test image at the same path, with the libraries they
/// link, and the package that installs each: the cluster bench runs qperf in pods.
pub const HOST_TOOLS: [(&str, &str); 1] = [("/usr/bin/qperf", "qperf")];

/// Writes the agent tarballs (and the rollout twin, and with `earlier` an earlier
/// build's agent, [`EARLIER_TAG_SUFFIX`]) and the test tarball (with `test_tool`) into
/// `out`; returns their paths.
pub fn build_all(
    agent: &Path,
    earlier: Option<&Path>,
    test_tool: &Path,
    out: &Path,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let mut tarballs = Vec::new();
    let staging = out.join("rootfs-agent");
    agent_rootfs(agent, &staging)?;
    let mut agents = vec![
        (staging.clone(), VERSION.to_owned(), "release"),
        (staging, format!("{VERSION}{ROLLOUT_TAG_SUFFIX}"), "rollout"),
    ];
    if let Some(earlier) = earlier {
        let staging = out.join("rootfs-agent-earlier");
        agent_rootfs(earlier, &staging)?;
        agents.push((staging, format!("{VERSION}{EARLIER_TAG_SUFFIX}"), "earlier"));
    }
    for (staging, tag, flavour) in agents {
        let spec = agent_spec(&tag, vec![("dev.bypass.flavour".into(), flavour.into())]);
        let tar = out.join(format!("{AGENT_IMAGE}-{tag}.tar"));
        docker_archive(&staging, &spec, &tar)?;
        println!("image: {} -> {}", spec.name, tar.display());
        tarballs.push(tar);
    }
    let staging = out.join("rootfs-test");
    test_rootfs(test_tool, &staging)?;
    let spec = ImageSpec {
        name: format!("{TEST_IMAGE}:{VERSION}"),
        entrypoint: vec![],
        cmd: vec!["/bin/sleep".into(), "infinity".into()],
        labels: vec![],
    };
    let tar = out.join(format!("{TEST_IMAGE}-{VERSION}.tar"));
    docker_archive(&staging, &spec, &tar)?;
    println!("image: {} -> {}", spec.name, tar.display());
    tarballs.push(tar);
    Ok(tarballs)
}

/// The agent's root filesystem: the binary, the libraries it links, CA certificates.
pub fn agent_rootfs(agent: &Path, dir: &Path) -> Result<()> {
    fresh_dir(dir)?;
    install_with_libs(agent, &dir.join("usr/local/bin/bypass-agent"), dir)?;
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.is_file() {
        copy(ca, &dir.join("etc/ssl/certs/ca-certificates.crt"))?;
    }
    std::fs::create_dir_all(dir.join("tmp"))?;
    Ok(())
}

/// The test image's root filesystem: busybox (a shell and a few applets), the test tool
/// (at [`TEST_TOOL_PATH`]) and the host's qperf ([`HOST_TOOLS`]), with their libraries.
pub fn test_rootfs(test_tool: &Path, dir: &Path) -> Result<()> {
    fresh_dir(dir)?;
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        bail!("/bin/busybox is missing: `cargo xtask setup` installs busybox-static");
    }
    copy(busybox, &dir.join("bin/busybox"))?;
    for applet in BUSYBOX_APPLETS {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(applet))
            .with_context(|| format!("link {applet}"))?;
    }
    install_with_libs(test_tool, &in_root(dir, TEST_TOOL_PATH), dir)?;
    for (tool, package) in HOST_TOOLS {
        let path = Path::new(tool);
        if !path.is_file() {
            bail!(
                "{tool} is missing: `apt-get install -y {package}` (the test image carries it for `cargo xtask bench --scenario cluster`)"
            );
        }
        install_with_libs(path, &in_root(dir, tool), dir)?;
    }
    std::fs::create_dir_all(dir.join("tmp"))?;
    Ok(())
}

/// An agent cross-built for arm64, with where the cross toolchain's run-time is (see
/// `kernel_matrix::arch::Cross`).
#[derive(Debug, Clone, Copy)]
pub struct CrossAgent<'a> {
    /// The cross-built binary.
    pub binary: &'a Path,
    /// The Rust target it was built for.
    pub rust_target: &'a str,
    /// Where Debian's cross libc is.
    pub libdir: &'a str,
    /// The program interpreter the binary names.
    pub loader: &'a str,
    /// The file in `libdir` the loader is.
    pub loader_file: &'a str,
}

/// The agent as an OCI image index for amd64 (`agent`, built on this host) and arm64
/// (`arm`, cross built), each image with its SBOM, in the OCI layout `dir`.
pub fn build_oci(agent: &Path, arm: &CrossAgent<'_>, dir: &Path) -> Result<()> {
    let layout = oci::Layout::create(dir)?;
    let work = workspace::target_dir()?.join(IMAGES_DIR).join("oci-work");
    let mut platforms = Vec::new();
    let host_triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    for (arch_name, triple) in [
        (oci_arch(), host_triple.as_str()),
        ("arm64", arm.rust_target),
    ] {
        let rootfs = work.join(format!("rootfs-{arch_name}"));
        let libs = if arch_name == "arm64" {
            cross_rootfs(arm.binary, arm.libdir, arm.loader_file, arm.loader, &rootfs)?
        } else {
            agent_rootfs(agent, &rootfs)?;
            let out = Command::new("ldd").arg(agent).output().context("run ldd")?;
            ldd_paths(&String::from_utf8_lossy(&out.stdout))?
        };
        let layer = work.join(format!("layer-{arch_name}.tar"));
        tar_layer(&rootfs, &layer)?;
        let diff_id = format!("sha256:{}", oci::sha256(&layer)?);
        cmd::output(Command::new("gzip").args(["-n", "-9", "-f"]).arg(&layer))?;
        let layer = layout.adopt(oci::LAYER_GZIP, &layer.with_extension("tar.gz"))?;
        let labels = vec![
            ("org.opencontainers.image.title".into(), AGENT_IMAGE.into()),
            ("org.opencontainers.image.version".into(), VERSION.into()),
        ];
        let config = oci::config(&agent_spec(VERSION, labels), arch_name, &diff_id);
        let config = layout.blob(oci::CONFIG, config.to_string().as_bytes())?;
        let image = layout.blob(
            oci::MANIFEST,
            oci::image_manifest(&config, &layer).to_string().as_bytes(),
        )?;
        let mut packages = oci::cargo_packages(&cmd::output(
            Command::new("cargo")
                .current_dir(workspace::root())
                .args(["tree", "--package", workspace::AGENT, "--edges", "normal"])
                .args(["--prefix", "none", "--target", triple]),
        )?);
        packages.extend(deb_packages(&libs, arch_name));
        let sbom_json = oci::spdx(&format!("{AGENT_IMAGE}:{VERSION}"), arch_name, &packages);
        let sbom = layout.blob(oci::SPDX, serde_json::to_vec(&sbom_json)?.as_slice())?;
        let empty = layout.blob(oci::EMPTY, b"{}")?;
        let sbom_manifest = layout.blob(
            oci::MANIFEST,
            oci::sbom_manifest(&sbom, &empty, &image)
                .to_string()
                .as_bytes(),
        )?;
        println!(
            "image: {AGENT_IMAGE}:{VERSION} {arch_name} {} ({} packages in its SBOM)",
            image.digest,
            packages.len()
        );
        platforms.push(oci::Platform {
            arch: arch_name.to_owned(),
            image,
            sbom: sbom_manifest,
        });
    }
    let index = oci::index(&platforms, VERSION);
    let index_bytes = serde_json::to_vec(&index)?;
    // The index's own digest, for the chart's image.digest once it is pushed as is.
    let index_blob = layout.blob(oci::INDEX, &index_bytes)?;
    let mut top = index.clone();
    top["manifests"] = serde_json::json!([{
        "mediaType": oci::INDEX,
        "digest": index_blob.digest,
        "size": index_blob.size,
        "annotations": {"org.opencontainers.image.ref.name": VERSION},
    }]);
    top.as_object_mut().map(|o| o.remove("annotations"));
    layout.finish(&top)?;
    println!(
        "image: OCI layout {} ({} platforms), index {}: push with `skopeo copy --all oci:{}:{VERSION} docker://REGISTRY/{AGENT_IMAGE}:{VERSION}`, pin with image.digest={}",
        dir.display(),
        platforms.len(),
        index_blob.digest,
        dir.display(),
        index_blob.digest
    );
    std::fs::remove_dir_all(&work).ok();
    Ok(())
}

/// A cross-built agent's root filesystem: the binary, the libraries it needs (its
/// `NEEDED` entries, from the cross toolchain's `libdir`), the loader at `loader`,
/// CA certificates. Returns the libraries' source paths (for the SBOM).
fn cross_rootfs(
    agent: &Path,
    libdir: &str,
    loader_file: &str,
    loader: &str,
    dir: &Path,
) -> Result<Vec<PathBuf>> {
    fresh_dir(dir)?;
    copy(agent, &dir.join("usr/local/bin/bypass-agent"))?;
    let dynamic = cmd::output(Command::new("readelf").arg("-d").arg(agent))?;
    let mut libs = Vec::new();
    let multiarch = Path::new(libdir)
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("aarch64-linux-gnu");
    for name in needed(&dynamic) {
        let src = Path::new(libdir).join(&name);
        copy(&src, &dir.join("lib").join(multiarch).join(&name))?;
        libs.push(src);
    }
    copy(
        Path::new(loader_file),
        &dir.join(loader.trim_start_matches('/')),
    )?;
    libs.push(PathBuf::from(loader_file));
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.is_file() {
        copy(ca, &dir.join("etc/ssl/certs/ca-certificates.crt"))?;
    }
    std::fs::create_dir_all(dir.join("tmp"))?;
    Ok(libs)
}

/// The `NEEDED` libraries of `readelf -d` output (pure).
pub fn needed(dynamic: &str) -> Vec<String> {
    dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| {
            let start = l.find('[')? + 1;
            let end = l[start..].find(']')? + start;
            Some(l[start..end].to_owned())
        })
        .collect()
}

/// The Debian packages that ship `files`, for the SBOM.
fn deb_packages(files: &[PathBuf], arch: &str) -> Vec<oci::Package> {
    let mut out: Vec<oci::Package> = Vec::new();
    for f in files {
        let Ok(owner) = cmd::output(Command::new("dpkg").arg("-S").arg(f)) else {
            continue;
        };
        let Some(pkg) = owner.split(':').next().map(str::trim) else {
            continue;
        };
        let Ok(version) =
            cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Version}", pkg]))
        else {
            continue;
        };
        if out.iter().any(|p| p.name == pkg) {
            continue;
        }
        out.push(oci::Package {
            name: pkg.to_owned(),
            version: version.trim().to_owned(),
            purl: format!("pkg:deb/debian/{pkg}@{}?arch={arch}", version.trim()),
        });
    }
    out
}

/// `tar` writing the archive `out` with every entry owned by 0 at time 0 (the same
/// bytes from the same files), entries from `dir`.
fn reproducible_tar(out: &Path, dir: &Path) -> Command {
    let mut tar = Command::new("tar");
    tar.args([
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--mtime=@0",
        "-cf",
    ])
    .arg(out)
    .arg("-C")
    .arg(dir);
    tar
}

/// A reproducible layer tarball of `rootfs` (sorted, owner 0, time 0).
fn tar_layer(rootfs: &Path, out: &Path) -> Result<()> {
    cmd::output(reproducible_tar(out, rootfs).args(["--sort=name", "."])).map(drop)
}

fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clean {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Copies `binary` to `dest` and every library `ldd` says it loads to the same path
/// under `root`.
fn install_with_libs(binary: &Path, dest: &Path, root: &Path) -> Result<()> {
    copy(binary, dest)?;
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // A static binary: ldd says "not a dynamic executable" and fails.
    if out.status.success() {
        for lib in ldd_paths(&text)? {
            copy(&lib, &in_root(root, &lib))?;
        }
    }
    Ok(())
}

/// The absolute `path` under the root filesystem `root`.
fn in_root(root: &Path, path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The files of `ldd` output (pure): `name => /path (addr)` and `/path (addr)` lines;
/// the vDSO has no file. A library `ldd` cannot find is an error naming it.
pub fn ldd_paths(text: &str) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    bail!("ldd: {} not found: install the library", name.trim());
                }
                rest
            }
            None => line,
        };
        let file = target.split_whitespace().next().unwrap_or("");
        if file.starts_with('/') {
            paths.push(PathBuf::from(file));
        }
    }
    Ok(paths)
}

/// What an image's config says.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// `name:tag`.
    pub name: String,
    /// The entrypoint.
    pub entrypoint: Vec<String>,
    /// The command.
    pub cmd: Vec<String>,
    /// Labels (they make two images of the same files distinct).
    pub labels: Vec<(String, String)>,
}

/// The agent's image `AGENT_IMAGE:tag` with `labels`: it runs `bypass-agent run`.
fn agent_spec(tag: &str, labels: Vec<(String, String)>) -> ImageSpec {
    ImageSpec {
        name: format!("{AGENT_IMAGE}:{tag}"),
        entrypoint: vec!["/usr/local/bin/bypass-agent".into()],
        cmd: vec!["run".into()],
        labels,
    }
}

/// The OCI architecture name of this build's target.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The docker-archive `manifest.json` (pure).
pub fn manifest_json(name: &str, config_digest: &str, layer_digest: &str) -> String {
    serde_json::json!([{
        "Config": format!("{config_digest}.json"),
        "RepoTags": [name],
        "Layers": [format!("{layer_digest}/layer.tar")],
    }])
    .to_string()
}

/// Packs `rootfs` as one layer into a docker-archive tarball at `out`.
pub fn docker_archive(rootfs: &Path, spec: &ImageSpec, out: &Path) -> Result<()> {
    let work = out.with_extension("work");
    fresh_dir(&work)?;
    let layer = work.join("layer.tar");
    // Fixed order, owners and times: the same files make the same layer.
    tar_layer(rootfs, &layer)?;
    let layer_digest = oci::sha256(&layer)?;
    std::fs::create_dir_all(work.join(&layer_digest))?;
    std::fs::rename(&layer, work.join(&layer_digest).join("layer.tar"))?;
    let config = oci::config(spec, oci_arch(), &format!("sha256:{layer_digest}")).to_string();
    let config_path = work.join("config.json");
    std::fs::write(&config_path, &config)?;
    let config_digest = oci::sha256(&config_path)?;
    std::fs::rename(&config_path, work.join(format!("{config_digest}.json")))?;
    std::fs::write(
        work.join("manifest.json"),
        manifest_json(&spec.name, &config_digest, &layer_digest),
    )?;
    cmd::output(reproducible_tar(out, &work).args([
        "manifest.json".to_owned(),
        format!("{config_digest}.json"),
        format!("{layer_digest}/layer.tar"),
    ]))?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_libraries_of_a_cross_binary() {
        let d = " 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]\n 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n 0x000000000000000c (INIT)               0x1000\n";
        assert_eq!(needed(d), ["libgcc_s.so.1", "libc.so.6"]);
    }

    #[test]
    fn ldd_lines() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            ldd_paths(text).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        let err = ldd_paths("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(err.to_string().contains("libfoo.so.1"), "{err}");
    }

    #[test]
    fn containerfile_builds_the_same_tree_and_entrypoint() {
        let file = include_str!("../../../deploy/Containerfile");
        assert!(
            file.contains("cargo xtask image --rootfs agent /out/rootfs"),
            "{file}"
        );
        assert!(file.contains("FROM scratch"));
        assert!(file.contains("COPY --from=build /out/rootfs/ /"));
        assert!(file.contains("ENTRYPOINT [\"/usr/local/bin/bypass-agent\"]"));
        assert!(file.contains("CMD [\"run\"]"));
    }

    #[test]
    fn the_test_image_carries_the_test_tool_under_its_name() {
        assert_eq!(
            Path::new(TEST_TOOL_PATH).file_name(),
            Some(std::ffi::OsStr::new(workspace::TEST_TOOL))
        );
        assert_eq!(
            in_root(Path::new("/r"), TEST_TOOL_PATH),
            Path::new("/r/usr/local/bin/bypass-test-tool")
        );
    }

    #[test]
    fn manifest() {
        let m: serde_json::Value = serde_json::from_str(&manifest_json("x:1", "cd", "ab")).unwrap();
        assert_eq!(m[0]["Config"], "cd.json");
        assert_eq!(m[0]["Layers"][0], "ab/layer.tar");
        assert_eq!(m[0]["RepoTags"][0], "x:1");
    }
}
