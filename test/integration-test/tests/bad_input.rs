//! Bad input: each mistake gives a non-zero exit and one stderr line that names the
//! problem and the fix, and leaves nothing pinned or attached.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Output,
    time::Duration,
};

use anyhow::{Result, ensure};
use testbed::{
    Agent, AgentOpts, CgroupGuard,
    agent::run_agent,
    bpf::{TempBpffs, sockops_attached},
    cgroup::cgroup2_mount,
    names::{resource, unique_tag},
};

use crate::support::privileged;

/// A net for the agent to exit: it must exit with its one line, never retry; how fast is
/// the machine's.
const LIMIT: Duration = testbed::steps::NET;

/// A test cgroup and a pin directory name, unique to this call.
struct Place {
    cgroup: CgroupGuard,
    pin_dir: PathBuf,
    tag: String,
}

fn place() -> Result<Place> {
    let tag = unique_tag();
    Ok(Place {
        cgroup: CgroupGuard::create(&resource(&tag, "cg"))?,
        pin_dir: PathBuf::from("/sys/fs/bpf").join(resource(&tag, "pins")),
        tag,
    })
}

impl Place {
    fn cg(&self) -> String {
        self.cgroup.path().display().to_string()
    }

    fn pins(&self) -> String {
        self.pin_dir.display().to_string()
    }

    /// `run` with `extra` plus this place's cgroup and pin dir.
    fn run(&self, extra: &[&str]) -> Result<Output> {
        let (cg, pins) = (self.cg(), self.pins());
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        if !extra.contains(&"--cgroup") {
            args.extend(["--cgroup", &cg]);
        }
        if !extra.contains(&"--pin-dir") {
            args.extend(["--pin-dir", &pins]);
        }
        run_agent(&args, LIMIT)
    }

    /// No pin directory, nothing attached to the test cgroup.
    fn assert_nothing_left(&self) -> Result<()> {
        ensure!(
            !self.pin_dir.exists(),
            "{} was left behind",
            self.pin_dir.display()
        );
        let n = sockops_attached(self.cgroup.path())?;
        ensure!(
            n == 0,
            "{n} sock_ops programs left attached to {}",
            self.cg()
        );
        Ok(())
    }
}

/// Failed, with exactly one line mentioning an error, which contains every `needle`.
fn assert_one_clear_error(out: &Output, needles: &[&str]) -> Result<()> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "exit status {} for: {stderr}",
        out.status
    );
    ensure!(!stderr.contains("panicked"), "panicked: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("error"))
        .collect();
    ensure!(
        lines.len() == 1,
        "want one error line, got {}: {stderr}",
        lines.len()
    );
    for n in needles {
        ensure!(lines[0].contains(n), "error line lacks {n:?}: {}", lines[0]);
    }
    eprintln!("ok: {}", lines[0]);
    Ok(())
}

/// `run` with `extra` in a new [`Place`] is refused with one clear error holding every
/// one of `needles`, and leaves nothing behind.
fn refused(extra: &[&str], needles: &[&str]) -> Result<()> {
    let p = place()?;
    let out = p.run(extra)?;
    assert_one_clear_error(&out, needles)?;
    p.assert_nothing_left()
}

#[test]
fn cidr_with_host_bits() -> Result<()> {
    privileged!();
    refused(
        &["--pod-cidr", "10.0.0.1/24"],
        &["10.0.0.1/24", "host bits", "did you mean 10.0.0.0/24"],
    )
}

#[test]
fn cidr_prefix_too_long() -> Result<()> {
    privileged!();
    refused(
        &["--pod-cidr", "10.0.0.0/33"],
        &["10.0.0.0/33", "prefix length", "0..=32"],
    )
}

#[test]
fn cidr_not_a_cidr() -> Result<()> {
    privileged!();
    refused(
        &["--pod-cidr", "banana"],
        &["banana", "not a CIDR", "ADDRESS/PREFIX"],
    )
}

#[test]
fn cgroup_does_not_exist() -> Result<()> {
    privileged!();
    let p = place()?;
    let missing = cgroup2_mount()?.join(resource(&p.tag, "no-such-cg"));
    let missing = missing.display().to_string();
    let out = p.run(&["--pod-cidr", "10.0.0.0/24", "--cgroup", &missing])?;
    assert_one_clear_error(&out, &[&missing, "does not exist", "--cgroup"])?;
    ensure!(!Path::new(&missing).exists(), "the agent created {missing}");
    p.assert_nothing_left()
}

#[test]
fn cgroup_not_cgroup2() -> Result<()> {
    privileged!();
    let p = place()?;
    let tmp = std::env::temp_dir().join(resource(&p.tag, "not-a-cg"));
    std::fs::create_dir(&tmp)?;
    let tmp_s = tmp.display().to_string();
    let result = (|| -> Result<()> {
        for path in ["/proc", tmp_s.as_str()] {
            let out = p.run(&["--pod-cidr", "10.0.0.0/24", "--cgroup", path])?;
            assert_one_clear_error(&out, &[path, "not a cgroup v2 directory", "--cgroup"])?;
            p.assert_nothing_left()?;
        }
        Ok(())
    })();
    std::fs::remove_dir(&tmp)?;
    result
}

#[test]
fn pin_dir_not_on_bpffs() -> Result<()> {
    privileged!();
    let p = place()?;
    let pins = std::env::temp_dir().join(resource(&p.tag, "pins"));
    let pins_s = pins.display().to_string();
    let out = p.run(&["--pod-cidr", "10.0.0.0/24", "--pin-dir", &pins_s])?;
    let created = pins.exists();
    if created {
        std::fs::remove_dir_all(&pins)?;
    }
    assert_one_clear_error(&out, &[&pins_s, "not on a bpf file system", "--pin-dir"])?;
    ensure!(!created, "the agent created {pins_s}");
    p.assert_nothing_left()
}

/// `--pin-dir` at a bpffs mount's root would make the agent take the whole mount as its
/// own: restrict it to root and remove other tools' pins under `maps/`. On a bpffs
/// mounted for this test alone, with another tool's pin under `maps/`, `run` and
/// `uninstall` must refuse before touching anything.
#[test]
fn pin_dir_at_a_mount_root() -> Result<()> {
    privileged!();
    let p = place()?;
    let bpffs = TempBpffs::mount(&std::env::temp_dir().join(resource(&p.tag, "bpffs")))?;
    let root = bpffs.path().display().to_string();
    // Another tool's pin: bpffs holds directories, pins and symbolic links.
    let maps = bpffs.path().join("maps");
    std::fs::create_dir(&maps)?;
    let other = maps.join("other_tool_map");
    std::os::unix::fs::symlink("/other/tool/target", &other)?;
    let mode = |p: &Path| -> Result<u32> { Ok(std::fs::metadata(p)?.mode() & 0o7777) };
    let mode_before = mode(bpffs.path())?;
    for args in [
        &[
            "run",
            "--pod-cidr",
            "10.0.0.0/24",
            "--cgroup",
            &p.cg(),
            "--pin-dir",
            &root,
        ][..],
        &["uninstall", "--pin-dir", &root],
    ] {
        let out = run_agent(args, LIMIT);
        ensure!(
            other.symlink_metadata().is_ok(),
            "`{}` removed another tool's pin {}",
            args[0],
            other.display()
        );
        let mode_after = mode(bpffs.path())?;
        ensure!(
            mode_after == mode_before,
            "`{}` changed the mount root's mode {mode_before:o} -> {mode_after:o}",
            args[0]
        );
        assert_one_clear_error(
            &out?,
            &[
                &root,
                "root of a mounted file system",
                &format!("{root}/bypass"),
            ],
        )?;
    }
    ensure!(
        sockops_attached(p.cgroup.path())? == 0,
        "a sock_ops program was attached to {}",
        p.cg()
    );
    Ok(())
}

#[test]
fn no_pod_addresses() -> Result<()> {
    privileged!();
    // Names what is missing by the flags that supply it.
    refused(&[], &["--pod-cidr", "--pod-ip"])
}

#[test]
fn status_with_nothing_pinned() -> Result<()> {
    privileged!();
    let p = place()?;
    let pins = p.pins();
    for json in [false, true] {
        let mut args = vec!["status", "--pin-dir", &pins];
        if json {
            args.push("--json");
        }
        let out = run_agent(&args, LIMIT)?;
        assert_one_clear_error(&out, &[&pins, "no bypass datapath is pinned", "--pin-dir"])?;
        ensure!(
            out.stdout.is_empty(),
            "status printed to stdout: {:?}",
            out.stdout
        );
    }
    p.assert_nothing_left()
}

#[test]
fn second_agent_on_same_pin_dir() -> Result<()> {
    privileged!();
    let p = place()?;
    let opts = AgentOpts {
        pod_cidrs: vec!["10.0.0.0/24".into()],
        cgroup: p.cgroup.path().to_path_buf(),
        pin_dir: p.pin_dir.clone(),
        allow_unguarded: true,
        ..AgentOpts::default()
    };
    let mut first = Agent::start(&opts)?;
    let before = first.stats()?;
    let out = p.run(&["--pod-cidr", "10.1.0.0/24"])?;
    let pid = first.pid().to_string();
    assert_one_clear_error(
        &out,
        &["another bypass-agent", &pid, &p.pins(), "--pin-dir"],
    )?;
    // The first agent is untouched: still attached, same addresses, one program.
    let after = first.stats()?;
    ensure!(
        after.attached && after.pod_cidrs == before.pod_cidrs,
        "{before:?} -> {after:?}"
    );
    ensure!(
        sockops_attached(p.cgroup.path())? == 1,
        "attachments changed"
    );
    first.stop_cleanly("first agent")?;
    p.assert_nothing_left()
}
