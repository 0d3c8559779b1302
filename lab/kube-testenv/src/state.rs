//! `kube-env up|down`: an environment left running between commands, found again by
//! the pids recorded in its directory.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::KubeEnv;

/// State directory of `kube-env up`.
pub fn default_dir(workspace: &Path) -> PathBuf {
    workspace.join("target/kube-env")
}

/// `kube-env up`: starts the API server and etcd in `dir` and leaves them running;
/// returns the admin kubeconfig path.
pub fn up(dir: &Path) -> Result<PathBuf> {
    if dir.join("pids").exists() {
        down(dir)?;
    }
    let env = KubeEnv::start(dir)?;
    let kubeconfig = env.kubeconfig();
    let pids = env.leave_running();
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(dir.join("pids"), text)
        .with_context(|| format!("write {}/pids", dir.display()))?;
    Ok(kubeconfig)
}

/// `kube-env down`: stops what `up` started in `dir` and removes `dir`.
pub fn down(dir: &Path) -> Result<()> {
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        // Only our own processes: the pid must still run one of the two binaries.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name != "kube-apiserver" && name != "etcd" {
            continue;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    Ok(())
}
