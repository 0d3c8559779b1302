//! The Debian packages the tests and benches run, installed with apt-get when missing.

use std::process::Command;

use anyhow::{Result, bail};
use xtask_lib::cmd;

/// Each package the project needs, with what it is for.
pub const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip: namespaces, veth pairs, addresses"),
    ("iptables", "the NAT/filter rules of the testbed"),
    ("qperf", "TCP latency and bandwidth in the bench"),
    ("sockperf", "TCP ping-pong latency in the bench"),
    ("procps", "sysctl, ps"),
    ("util-linux", "nsenter, unshare, mount"),
    ("curl", "fetches Go from the module proxy when none is here"),
    ("unzip", "unpacks that Go"),
    ("ca-certificates", "HTTPS for those downloads"),
    (
        "openssl",
        "certificates of the Kubernetes tests' API server",
    ),
    (
        "qemu-system-x86",
        "the kernel matrix boots Debian kernels in qemu",
    ),
    ("kmod", "modprobe/depmod: the matrix kernels' modules"),
    ("busybox-static", "the matrix VMs' initramfs"),
    ("cpio", "packs that initramfs"),
    ("xz-utils", "Debian's package indexes and modules"),
];

/// The real applications of the `apps` tests (and the apps bench): Debian's own builds,
/// as a user runs them. Each test starts its own instance inside the pods; the system
/// services their postinst may start are stopped ([`SERVICES`]).
pub const APPS: &[(&str, &str)] = &[
    ("redis-server", "the apps tests' redis"),
    ("redis-tools", "redis-benchmark against it"),
    ("nginx", "HTTP and HTTPS downloads, keep-alive and not"),
    (
        "apache2-utils",
        "ab: HTTP requests by count, with and without keep-alive",
    ),
    ("wrk", "keep-alive HTTP load for the apps bench"),
    (
        "postgresql",
        "a private cluster (initdb, postgres) for pgbench",
    ),
    ("postgresql-contrib", "pgbench"),
    (
        "iperf3",
        "bulk, small-write, multi-stream and reverse TCP streams",
    ),
    ("haproxy", "a TCP proxy that splices socket to socket"),
    (
        "openjdk-17-jdk-headless",
        "javac and java: the Java NIO echo server",
    ),
    ("nodejs", "the Node.js server piping sockets"),
];

/// The system services [`APPS`]' postinst scripts may start: the tests never use them,
/// so setup stops and disables them right after installing.
pub const SERVICES: &[&str] = &["redis-server", "nginx", "postgresql", "haproxy", "iperf3"];

/// What `cargo xtask cluster` runs besides the Kubernetes binaries it builds: the
/// container runtime, the CNI plugins, and what makes the sandbox image.
pub const CLUSTER: &[(&str, &str)] = &[
    ("containerd", "the cluster's container runtime (1.6)"),
    ("runc", "containerd's OCI runtime"),
    (
        "containernetworking-plugins",
        "CNI bridge, host-local, loopback, portmap",
    ),
    ("gcc", "builds the static pause binary of the sandbox image"),
    ("libc6-dev", "the static libc that pause links"),
    (
        "conntrack",
        "kube-proxy clears stale Service conntrack entries",
    ),
];

/// What building for, and booting, another architecture takes, by Rust target: only
/// the kernel matrix's runs on that architecture install them.
pub const CROSS: &[(&str, &[(&str, &str)])] = &[(
    "aarch64-unknown-linux-gnu",
    &[
        (
            "gcc-aarch64-linux-gnu",
            "links arm64 binaries, compiles ring's C",
        ),
        (
            "libc6-dev-arm64-cross",
            "the arm64 libc they link and run against",
        ),
        (
            "qemu-system-arm",
            "qemu-system-aarch64 boots the arm64 kernels",
        ),
    ],
)];

/// The packages a cross build for `target` needs (none for an unknown target).
pub fn cross(target: &str) -> &'static [(&'static str, &'static str)] {
    CROSS
        .iter()
        .find(|(t, _)| *t == target)
        .map_or(&[], |(_, list)| *list)
}

/// Installs the missing packages (one `apt-get update` first); records it in `done`.
pub fn ensure(done: &mut Vec<String>) -> Result<()> {
    ensure_list(PACKAGES, done)
}

/// Installs the missing [`APPS`]; when it installed any, stops and disables the
/// [`SERVICES`] their postinst started (the tests run their own instances in the pods).
pub fn ensure_apps(done: &mut Vec<String>) -> Result<()> {
    let before = done.len();
    ensure_list(APPS, done)?;
    if done.len() > before {
        let stopped = stop_services();
        if !stopped.is_empty() {
            done.push(format!(
                "stopped and disabled the services {} (the apps tests start their own)",
                stopped.join(", ")
            ));
        }
    }
    Ok(())
}

/// Stops and disables each of [`SERVICES`] that is installed, through systemd when it
/// runs, else through its init script; returns those it stopped. Best effort: a service
/// that will not stop only costs a port in the host's namespace, which no test uses.
fn stop_services() -> Vec<String> {
    let systemd = std::path::Path::new("/run/systemd/system").is_dir();
    let quiet = |cmd: &mut Command| {
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    SERVICES
        .iter()
        .filter(|name| {
            if systemd {
                quiet(Command::new("systemctl").args(["disable", "--now", name]))
            } else if std::path::Path::new("/etc/init.d").join(name).is_file() {
                let stopped = quiet(Command::new("invoke-rc.d").args([name, "stop"]));
                quiet(Command::new("update-rc.d").args([name, "disable"])) || stopped
            } else {
                false
            }
        })
        .map(|name| (*name).to_owned())
        .collect()
}

/// [`ensure`] for the packages of `list`.
pub fn ensure_list(list: &[(&str, &str)], done: &mut Vec<String>) -> Result<()> {
    let names: Vec<&str> = list.iter().map(|(name, _)| *name).collect();
    if !cmd::on_path("dpkg-query") {
        bail!(
            "dpkg-query is not on PATH: this is not Debian; install these yourself: {}",
            names.join(" ")
        );
    }
    let missing = missing_packages(&names)?;
    if missing.is_empty() {
        return Ok(());
    }
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "missing Debian packages: {0}; run `cargo xtask setup` as root, or \
             `sudo apt-get install {0}`",
            missing.join(" ")
        );
    }
    eprintln!("setup: installing Debian packages {}", missing.join(" "));
    let apt = || {
        let mut cmd = Command::new("apt-get");
        // Other apt users (another engineer, unattended-upgrades) hold the lock briefly.
        cmd.env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=300", "-q"]);
        cmd
    };
    cmd::run_to_stderr(apt().arg("update"))?;
    cmd::run_to_stderr(
        apt()
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing),
    )?;
    let still = missing_packages(&names)?;
    if !still.is_empty() {
        bail!(
            "apt-get install succeeded but these are still not installed: {}",
            still.join(" ")
        );
    }
    done.push(format!("installed Debian packages {}", missing.join(" ")));
    Ok(())
}

/// The `names` that dpkg does not report as installed.
fn missing_packages(names: &[&str]) -> Result<Vec<String>> {
    // dpkg-query exits 1 and complains on stderr for never-seen packages; stdout still
    // lists the known ones, which is all we read.
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\\n"])
        .args(names)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(not_installed(&stdout, names))
}

/// Parses `dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n'`: `ii` means installed.
fn not_installed(status: &str, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|name| {
            !status.lines().any(|line| {
                let mut words = line.split_whitespace();
                let package = words.next().map(|p| p.split(':').next().unwrap_or(p));
                package == Some(**name) && words.next() == Some("ii")
            })
        })
        .map(|name| (*name).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ii_counts_as_installed() {
        let status = "iproute2 ii \nprocps rc \nutil-linux:amd64 ii \n";
        let names = ["iproute2", "procps", "util-linux", "qperf"];
        assert_eq!(not_installed(status, &names), ["procps", "qperf"]);
    }

    #[test]
    fn cross_packages_by_target() {
        let arm: Vec<&str> = cross("aarch64-unknown-linux-gnu")
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert!(arm.contains(&"gcc-aarch64-linux-gnu") && arm.contains(&"qemu-system-arm"));
        assert!(cross("x86_64-unknown-linux-gnu").is_empty());
    }
}
