//! How the guest sees the host's root: over 9p (`-virtfs`, read-only in qemu) where the
//! kernel has 9p, else over virtiofs (a `virtiofsd` on the host serving a read-only bind
//! mount of `/`). Debian's `-cloud` kernels have no 9p (no `CONFIG_NET_9P`, no
//! `CONFIG_9P_FS`) but virtiofs built in (`CONFIG_VIRTIO_FS=y`); every other kernel of
//! the matrix has both and keeps 9p, as the matrix always ran.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::cmd;

/// The transport of the host's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// 9p over virtio (`9p`, `9pnet_virtio`).
    NineP,
    /// virtiofs, with `virtiofsd` on the host.
    VirtioFs,
}

/// The tag both transports give the host's root.
const TAG: &str = "hostroot";

/// qemu 7.2's virtiofsd (Debian's qemu-system-common).
pub const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";

/// Whether `config` (a kernel's `config-<release>`) sets `option` (`=y` or `=m`).
fn has(config: &str, option: &str) -> bool {
    config
        .lines()
        .filter_map(|l| l.strip_prefix(option))
        .any(|rest| rest == "=y" || rest == "=m")
}

impl Share {
    /// 9p where the kernel has it, else virtiofs; `None` for a kernel with neither.
    pub fn of_config(config: &str) -> Option<Self> {
        if has(config, "CONFIG_NET_9P_VIRTIO") && has(config, "CONFIG_9P_FS") {
            Some(Self::NineP)
        } else if has(config, "CONFIG_VIRTIO_FS") {
            Some(Self::VirtioFs)
        } else {
            None
        }
    }

    /// The modules `/init` loads for it (a built-in one needs nothing).
    pub fn modules(self) -> &'static [&'static str] {
        match self {
            Self::NineP => &["9p", "9pnet_virtio"],
            Self::VirtioFs => &["virtiofs"],
        }
    }

    /// `/init`'s line that mounts the host's root read-only at `/host`.
    pub fn mount(self) -> String {
        match self {
            Self::NineP => format!(
                "mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 {TAG} /host || \
                 echo \"9p mount failed\""
            ),
            Self::VirtioFs => {
                format!("mount -t virtiofs -o ro {TAG} /host || echo \"virtiofs mount failed\"")
            }
        }
    }

    /// qemu's arguments for it; virtiofs needs the guest's memory shared with
    /// `virtiofsd` (`mem_mib`, as `-m` gives it) and its socket.
    pub fn qemu_args(self, socket: &Path, mem_mib: u32) -> Vec<OsString> {
        match self {
            Self::NineP => vec![
                "-virtfs".into(),
                format!(
                    "local,path=/,mount_tag={TAG},security_model=none,readonly=on,multidevs=remap"
                )
                .into(),
            ],
            Self::VirtioFs => {
                let mut chardev = OsString::from("socket,id=vfs,path=");
                chardev.push(socket);
                vec![
                    "-chardev".into(),
                    chardev,
                    "-device".into(),
                    format!("vhost-user-fs-pci,chardev=vfs,tag={TAG}").into(),
                    "-object".into(),
                    format!("memory-backend-memfd,id=mem,size={mem_mib}M,share=on").into(),
                    "-numa".into(),
                    "node,memdev=mem".into(),
                ]
            }
        }
    }
}

/// A running `virtiofsd` serving `/` read-only; ended (and its socket removed) on drop,
/// also when the run fails.
pub struct Virtiofsd {
    child: Child,
    socket: PathBuf,
}

/// How long `virtiofsd` may take to create its socket: a net, it takes milliseconds.
const SOCKET_NET: Duration = Duration::from_secs(60);

impl Virtiofsd {
    /// Starts it in `dir` (its socket, the read-only view of `/` it serves, its log).
    /// qemu 7.2's virtiofsd has no read-only mode: it runs in a mount namespace of its
    /// own where what it serves is a read-only bind mount of `/` (not recursive: the
    /// guest mounts its own /proc, /sys, /dev, /tmp and /run), which ends with it.
    pub fn start(dir: &Path) -> Result<Self> {
        if !Path::new(VIRTIOFSD).is_file() {
            bail!(
                "{VIRTIOFSD} is missing (install qemu-system-common): a kernel without 9p \
                 boots with the host's root over virtiofs"
            );
        }
        let socket = dir.join("virtiofs.sock");
        let view = dir.join("virtiofs-root");
        let _ = std::fs::remove_file(&socket);
        std::fs::create_dir_all(&view).with_context(|| format!("create {}", view.display()))?;
        let log = std::fs::File::create(dir.join("virtiofsd.log"))
            .with_context(|| format!("create {}/virtiofsd.log", dir.display()))?;
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount --bind / \"$1\" && mount -o remount,bind,ro \"$1\" && \
                 exec \"$2\" --socket-path=\"$3\" -o source=\"$1\" -o cache=auto -o sandbox=namespace",
            )
            .arg("sh")
            .arg(&view)
            .arg(VIRTIOFSD)
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        cmd::echo(&c);
        let child = c.spawn().context("start virtiofsd (unshare, util-linux)")?;
        let mut me = Self { child, socket };
        let deadline = Instant::now() + SOCKET_NET;
        while !me.socket.exists() {
            if let Some(status) = me.child.try_wait()? {
                bail!(
                    "virtiofsd exited ({status}) before it listened: see {}/virtiofsd.log",
                    dir.display()
                );
            }
            if Instant::now() > deadline {
                bail!("virtiofsd made no socket within {SOCKET_NET:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(me)
    }

    /// Its socket, for qemu.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        // It exits when qemu goes; a run that failed before may leave it waiting.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nine_p_where_the_kernel_has_it_else_virtiofs() {
        let generic =
            "CONFIG_NET_9P=m\nCONFIG_NET_9P_VIRTIO=m\nCONFIG_9P_FS=m\nCONFIG_VIRTIO_FS=m\n";
        assert_eq!(Share::of_config(generic), Some(Share::NineP));
        let cloud = "# CONFIG_NET_9P is not set\nCONFIG_FUSE_FS=y\nCONFIG_VIRTIO_FS=y\n";
        assert_eq!(Share::of_config(cloud), Some(Share::VirtioFs));
        assert_eq!(Share::of_config("CONFIG_9P_FS_SECURITY=y\n"), None);
        assert_eq!(Share::VirtioFs.modules(), ["virtiofs"]);
    }

    #[test]
    fn virtiofs_shares_the_guests_memory() {
        let args = Share::VirtioFs.qemu_args(Path::new("/t/vm/x/virtiofs.sock"), 4096);
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(args.contains(&"socket,id=vfs,path=/t/vm/x/virtiofs.sock".to_owned()));
        assert!(args.contains(&"memory-backend-memfd,id=mem,size=4096M,share=on".to_owned()));
        assert!(
            Share::VirtioFs
                .mount()
                .contains("-t virtiofs -o ro hostroot /host")
        );
        let nine = Share::NineP.qemu_args(Path::new("/unused"), 4096);
        assert!(nine[1].to_string_lossy().contains("readonly=on"));
    }
}
