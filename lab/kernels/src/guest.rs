//! Pure: what runs inside the VM. The initramfs's `/init` loads the 9p and overlay
//! modules, mounts the host's root read-only under a tmpfs overlay, and runs the run
//! script there; the run script mounts what the tests need and prints, between marker
//! lines the host reads off the serial console, the agent's status on this kernel and
//! the test binaries' output.

/// Marker: the guest is up, with its kernel release.
pub const UP: &str = "BYPASS-VM-UP";
/// Marker: one line of `bypass-agent status --json` on this kernel.
pub const STATUS: &str = "BYPASS-VM-STATUS";
/// Marker: the agent's exit code and its stderr, for a kernel it must refuse.
pub const REFUSAL: &str = "BYPASS-VM-REFUSAL";
/// Marker: the run script is done, with its exit code.
pub const EXIT: &str = "BYPASS-VM-EXIT";
/// Marker: the smoke test's one JSON line (a foreign architecture's run).
pub const SMOKE: &str = "BYPASS-VM-SMOKE";
/// Where the guest mounts its own fresh tmpfs over the host's shared root: a host path
/// below one of these is invisible to the guest.
pub const GUEST_TMPFS: [&str; 2] = ["/tmp", "/run"];

/// The initramfs's `/init` (busybox sh): modules from `/mods` in name order, the host's
/// root (tag `hostroot`, mounted by [`MOUNT_HOST`]'s line) under a tmpfs overlay, then
/// `bypass_cmd=` from the kernel command line run in it; powers off when it ends.
pub const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
CMD=$(sed -n 's/.*bypass_cmd=\([^ ]*\).*/\1/p' /proc/cmdline)
for m in /mods/*.ko; do insmod "$m" || echo "insmod $m failed"; done
MOUNT-HOST
mount -t tmpfs tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot || echo "overlay mount failed"
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
echo "BYPASS-VM-UP $(uname -r)"
exec chroot /newroot /bin/sh -c "$CMD; echo BYPASS-VM-EXIT \$?; echo o > /proc/sysrq-trigger; sleep 60"
"#;

/// Where [`INIT`] mounts the host's root, replaced by the transport's line.
const MOUNT_HOST: &str = "MOUNT-HOST";

/// How [`INIT`] starts the run script: with the host's shell.
const HOST_SHELL: &str = r#"exec chroot /newroot /bin/sh -c "$CMD;"#;

/// How a foreign architecture's `/init` starts it instead: the host's shell does not run
/// there, so the initramfs's busybox goes into the overlay and runs it, with its applets
/// first on PATH.
const FOREIGN_SHELL: &str = r#"mkdir -p /newroot/.vm/bin && cp /bin/busybox /newroot/.vm/bin/busybox
exec chroot /newroot /.vm/bin/busybox sh -c "/.vm/bin/busybox --install -s /.vm/bin; export PATH=/.vm/bin; sh $CMD;"#;

/// The `/init` for a guest of the host's architecture ([`INIT`]) or a foreign one,
/// mounting the host's root with `mount` (`crate::share::Share::mount`).
pub fn init(foreign: bool, mount: &str) -> String {
    let init = INIT.replace(MOUNT_HOST, mount);
    if foreign {
        init.replace(HOST_SHELL, FOREIGN_SHELL)
    } else {
        init
    }
}

/// What the smoke run does, on a foreign architecture.
#[derive(Debug, Clone)]
pub struct Smoke<'a> {
    /// The kernel's modules directory on the host (seen at the same path in the guest).
    pub modules: &'a str,
    /// The agent binary, built for the guest.
    pub agent: &'a str,
    /// The test tool (`bypass-test-tool`, whose `smoke` runs), built for the guest.
    pub tool: &'a str,
    /// The program interpreter the binaries name, and the file (of the host's cross
    /// libc) to link it to.
    pub loader: (&'a str, &'a str),
    /// The cross libc's directory.
    pub libdir: &'a str,
    /// Bytes each way.
    pub bytes: u64,
}

/// The smoke run's script (busybox sh): the guest's program interpreter linked to the
/// host's cross libc, then the test tool's `smoke`, whose JSON line goes out after
/// [`SMOKE`].
pub fn smoke_script(r: &Smoke<'_>) -> String {
    let mut s = preamble(r.modules);
    // The kernel's module requests (request_module) would start the host's modprobe,
    // which does not run here; busybox's reads the same modules.dep.
    s += "echo /.vm/bin/modprobe > /proc/sys/kernel/modprobe\nexport NO_COLOR=1\n";
    s += &format!(
        "ln -sf {} {}\nexport LD_LIBRARY_PATH={}\n",
        quote(r.loader.1),
        quote(r.loader.0),
        quote(r.libdir)
    );
    s += &format!("export BYPASS_AGENT_BIN={}\n", quote(r.agent));
    s += &format!(
        "{} smoke --bytes {} > /tmp/smoke.json\ncode=$?\n\
         echo \"{SMOKE} $(tr -d '\\n' < /tmp/smoke.json)\"\n\
         exit $code\n",
        quote(r.tool),
        r.bytes
    );
    s
}

/// What the run script does.
#[derive(Debug, Clone)]
pub struct Run<'a> {
    /// The kernel's modules directory on the host (seen at the same path in the guest).
    pub modules: &'a str,
    /// The agent binary.
    pub agent: &'a str,
    /// Refuse (only the agent's start is checked) or load (status, then the tests).
    pub refuses: bool,
    /// `(name, executable)` of each test binary to run (the privileged one).
    pub tests: &'a [(String, String)],
    /// Arguments for every test binary (a filter, `--nocapture`, ...).
    pub harness: &'a [String],
    /// Environment for the tests.
    pub env: &'a [(String, String)],
}

/// Single-quotes `s` for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The start of both scripts: the kernel's modules where modprobe looks, fresh /tmp and
/// /run, cgroup2, securityfs (where the agent reads the lockdown mode, mounted as a
/// host's init mounts it), loopback up.
fn preamble(modules: &str) -> String {
    let mut s =
        String::from("#!/bin/sh\n# Written by `cargo xtask test --kernel`: runs inside the VM.\n");
    s += &format!(
        "mkdir -p /lib/modules/$(uname -r)\nmount --bind {} /lib/modules/$(uname -r)\n",
        quote(modules)
    );
    for m in GUEST_TMPFS {
        s += &format!("mount -t tmpfs tmpfs {m}\n");
    }
    s += "mkdir -p /run/netns\n";
    s += "mount -t cgroup2 none /sys/fs/cgroup\n";
    s += "mount -t securityfs none /sys/kernel/security 2>/dev/null\n";
    s += "ip link set lo up\nexport HOME=/root\n";
    s
}

/// The run script.
pub fn script(r: &Run<'_>) -> String {
    let mut s = preamble(r.modules);
    s += "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n";
    // As many open files as the host gives root (the tests open thousands of sockets).
    s += "ulimit -n 1048576\n";
    for (k, v) in r.env {
        s += &format!("export {k}={}\n", quote(v));
    }
    let agent = quote(r.agent);
    s += &format!("export BYPASS_AGENT_BIN={agent}\n");
    if r.refuses {
        s += &format!(
            "out=$({agent} run --pod-cidr 10.250.0.0/24 --pin-dir /sys/fs/bpf/vmcheck 2>&1 >/dev/null)\n\
             code=$?\n\
             echo \"{REFUSAL} $code $(echo \"$out\" | wc -l) $(echo \"$out\" | tail -n 1)\"\n\
             exit 0\n"
        );
        return s;
    }
    s += &format!(
        "mkdir /sys/fs/cgroup/vmprobe\n\
         {agent} run --pod-cidr 10.250.0.0/24 --cgroup /sys/fs/cgroup/vmprobe \
         --pin-dir /sys/fs/bpf/vmprobe 2>/tmp/vmprobe.log &\n\
         pid=$!\n\
         i=0\n\
         while [ $i -lt 150 ]; do\n\
           st=$({agent} status --json --pin-dir /sys/fs/bpf/vmprobe 2>/dev/null)\n\
           echo \"$st\" | grep -q '\"attached\": true' && break\n\
           sleep 0.2; i=$((i+1))\n\
         done\n\
         echo \"{STATUS} $(echo \"$st\" | tr -d '\\n')\"\n\
         kill -TERM $pid; wait $pid\n\
         grep -E 'WARN|ERROR' /tmp/vmprobe.log\n\
         rmdir /sys/fs/cgroup/vmprobe\n"
    );
    s += "failed=0\n";
    for (name, exe) in r.tests {
        let harness: Vec<String> = r.harness.iter().map(|a| quote(a)).collect();
        s += &format!(
            "echo \"== {name}\"\n{} --test-threads=1 --color=never {} || failed=1\n",
            quote(exe),
            harness.join(" ")
        );
    }
    s += "exit $failed\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_run_status_then_every_test() {
        let tests = [
            ("datapath".to_owned(), "/t/datapath-1".to_owned()),
            ("isolation".to_owned(), "/t/iso'x".to_owned()),
        ];
        let harness = ["--exact".to_owned()];
        let env = [("CI".to_owned(), "true".to_owned())];
        let s = script(&Run {
            modules: "/c/lib/modules/6.1.0-50-amd64",
            agent: "/w/bypass-agent",
            refuses: false,
            tests: &tests,
            harness: &harness,
            env: &env,
        });
        assert!(
            s.contains("mount --bind '/c/lib/modules/6.1.0-50-amd64'"),
            "{s}"
        );
        assert!(s.contains(STATUS));
        assert!(s.contains("'/t/datapath-1' --test-threads=1 --color=never '--exact' || failed=1"));
        assert!(s.contains(r"'/t/iso'\''x'"), "quoted: {s}");
        assert!(s.contains("export CI='true'"));
        assert!(s.find(STATUS) < s.find("datapath-1"), "status first");
    }

    #[test]
    fn foreign_guests_run_their_own_busybox() {
        let mount = "mount -t 9p x /host";
        assert_eq!(init(false, mount), INIT.replace(MOUNT_HOST, mount));
        assert!(init(false, mount).contains("\nmount -t 9p x /host\n"));
        let foreign = init(true, mount);
        assert!(INIT.contains(HOST_SHELL));
        assert!(!foreign.contains("/bin/sh -c"), "{foreign}");
        assert!(foreign.contains("/.vm/bin/busybox sh -c") && foreign.contains("sh $CMD;"));
        assert!(foreign.ends_with("sleep 60\"\n"), "{foreign}");
    }

    #[test]
    fn smoke_links_the_loader_then_reports() {
        let s = smoke_script(&Smoke {
            modules: "/m",
            agent: "/t/aarch64/release/bypass-agent",
            tool: "/t/aarch64/release/bypass-test-tool",
            loader: (
                "/lib/ld-linux-aarch64.so.1",
                "/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1",
            ),
            libdir: "/usr/aarch64-linux-gnu/lib",
            bytes: 4096,
        });
        assert!(s.contains(
            "ln -sf '/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1' '/lib/ld-linux-aarch64.so.1'"
        ));
        assert!(s.contains("export BYPASS_AGENT_BIN='/t/aarch64/release/bypass-agent'"));
        assert!(s.contains(
            "'/t/aarch64/release/bypass-test-tool' smoke --bytes 4096 > /tmp/smoke.json"
        ));
        assert!(
            s.contains(&format!(
                "echo \"{SMOKE} $(tr -d '\\n' < /tmp/smoke.json)\""
            )),
            "{s}"
        );
        assert!(s.find("ln -sf") < s.find("bypass-test-tool' smoke"));
    }

    #[test]
    fn refusing_kernels_only_start_the_agent() {
        let s = script(&Run {
            modules: "/m",
            agent: "/a",
            refuses: true,
            tests: &[],
            harness: &[],
            env: &[],
        });
        assert!(s.contains(REFUSAL) && !s.contains(STATUS) && !s.contains("--test-threads"));
    }
}
