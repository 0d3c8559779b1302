//! The agent's error type: each variant names the object at fault and the fix.

use std::path::{Path, PathBuf};

use bypass_common::{MIN_KERNEL, kernel::REFUSAL};
use nix::errno::Errno;

/// A cause of any type, kept as the error's source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// `run` was given nothing to bypass.
    #[error(
        "nothing to bypass: pass --node-name NAME (or set NODE_NAME) for Kubernetes mode, or --pod-cidr CIDR / --pod-ip ADDR (repeatable) for standalone mode"
    )]
    NoPodAddresses,
    /// No cgroup2 mount in /proc/self/mountinfo.
    #[error(
        "no cgroup v2 hierarchy is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) or pass --cgroup PATH"
    )]
    NoCgroup2Mount,
    /// The cgroup path does not exist.
    #[error(
        "cgroup path {path} does not exist: pass an existing cgroup v2 directory with --cgroup"
    )]
    CgroupMissing {
        /// The path given.
        path: PathBuf,
    },
    /// The cgroup path is on another file system.
    #[error(
        "{path} is not a cgroup v2 directory (it is on a {found} file system): pass a directory under the cgroup2 mount with --cgroup"
    )]
    NotCgroup2 {
        /// The path given.
        path: PathBuf,
        /// What is there instead.
        found: &'static str,
    },
    /// bpffs could not be found or mounted.
    #[error(
        "bpffs is not mounted at {path} and mounting it failed ({source}): run `mount -t bpf bpf {path}` as root, or pass a --pin-dir on a bpffs"
    )]
    BpffsMount {
        /// The bpffs mount point.
        path: PathBuf,
        /// Why the mount failed.
        source: std::io::Error,
    },
    /// The pin directory is not on bpffs.
    #[error(
        "{path} is not on a bpf file system: pass a --pin-dir under a bpffs mount such as /sys/fs/bpf"
    )]
    NotBpffs {
        /// The pin directory.
        path: PathBuf,
    },
    /// The pin directory is the root of a mounted file system (a bpffs mount itself),
    /// which other tools pin in too.
    #[error(
        "--pin-dir {path} is the root of a mounted file system, where other tools pin too: pass a directory under it, such as {}",
        .path.join("bypass").display()
    )]
    PinDirIsMountRoot {
        /// The pin directory.
        path: PathBuf,
    },
    /// Another agent holds the pin directory.
    #[error(
        "another bypass-agent (pid {pid}) is running on {path}: stop it first, or pass a different --pin-dir"
    )]
    PinDirBusy {
        /// The pin directory.
        path: PathBuf,
        /// The holder, when it could be read.
        pid: String,
    },
    /// Nothing is pinned where status looks.
    #[error(
        "no bypass datapath is pinned under {path}: is the agent running? (its --pin-dir must match)"
    )]
    NotPinned {
        /// The pin directory.
        path: PathBuf,
    },
    /// Missing privileges.
    #[error(
        "the kernel refused to {action} ({source}): run as root, or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN"
    )]
    Permission {
        /// What was attempted.
        action: String,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// The kernel lacks something the datapath uses (found by probing it).
    #[error(
        "kernel {release} {REFUSAL}: it has no {what}, and {why}: run the agent on a kernel with them (Linux >= {MIN_KERNEL} upstream, or one that backports them, such as RHEL 9's 5.14), or keep it off this node (the chart's nodeSelector/affinity)"
    )]
    KernelLacks {
        /// `uname -r`.
        release: String,
        /// What is missing, comma-separated.
        what: String,
        /// What the datapath needs the first of them for.
        why: &'static str,
    },
    /// The kernel lacks a feature.
    #[error(
        "the kernel cannot {what} ({}): use a kernel >= {MIN_KERNEL} built with CONFIG_BPF_SYSCALL, CONFIG_CGROUP_BPF, CONFIG_BPF_STREAM_PARSER and CONFIG_DEBUG_INFO_BTF",
        chain(&**source)
    )]
    KernelSupport {
        /// The missing capability.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// A BPF operation failed.
    #[error("{action}: {}", chain(&**source))]
    Bpf {
        /// What was attempted.
        action: String,
        /// Why (aya's map, program or pin error, or the syscall's).
        #[source]
        source: BoxError,
    },
    /// A pinned datapath of this layout is not what this build loads: its programs are
    /// not replaced in place (the agent releases it instead).
    #[error(
        "replace the pinned datapath's programs in place: {what} differ, pinned {pinned}, this build's {ours}"
    )]
    PinnedDiffers {
        /// What differs.
        what: String,
        /// The pinned datapath's.
        pinned: String,
        /// This build's.
        ours: String,
    },
    /// A report could not be written as JSON.
    #[error("encode {what} as JSON: {source}")]
    Encode {
        /// The report.
        what: String,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// A map or program the agent looks up by name is not in the embedded object.
    #[error(
        "find {kind} {name}: not in the embedded object (build mismatch: rebuild with `cargo xtask build`)"
    )]
    NotInObject {
        /// `map` or `program`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The verifier rejected a program.
    #[error(
        "{action}: the kernel verifier rejected it ({source}); this kernel lacks something the program needs (kernel >= {MIN_KERNEL} with BTF), log:\n{log}"
    )]
    Verifier {
        /// What was attempted.
        action: String,
        /// The syscall error.
        #[source]
        source: std::io::Error,
        /// The verifier's log.
        log: String,
    },
    /// Kubernetes mode without a node name.
    #[error(
        "no node name: pass --node-name NAME or set NODE_NAME (in a DaemonSet, from the fieldRef spec.nodeName)"
    )]
    MissingNodeName,
    /// The kubeconfig could not be read or used.
    #[error(
        "cannot use the kubeconfig {path}: {}: check that the file exists, is readable and is valid, or pass another --kubeconfig",
        one_line(&chain(source))
    )]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster service account.
    #[error(
        "no kubeconfig given and not running in a pod with a service account ({}): pass --kubeconfig PATH or set KUBECONFIG",
        chain(source)
    )]
    NoKubeConfig {
        /// Why the in-cluster configuration failed.
        #[source]
        source: kube::config::InClusterError,
    },
    /// The node named does not exist.
    #[error(
        "node {node} does not exist in the API server: check --node-name / NODE_NAME against `kubectl get nodes`"
    )]
    NodeNotFound {
        /// The node name given.
        node: String,
    },
    /// RBAC forbids something the agent needs.
    #[error(
        "the API server forbids the agent to {verb} {resource} ({detail}): apply deploy/rbac.yaml, or grant get, list and watch on nodes, pods and namespaces to the agent's service account"
    )]
    Forbidden {
        /// get, list or watch.
        verb: &'static str,
        /// nodes, pods or namespaces.
        resource: &'static str,
        /// The API server's message.
        detail: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The credentials were rejected.
    #[error(
        "the API server rejected the agent's credentials ({detail}): check the kubeconfig's user, or the service account token"
    )]
    Unauthorized {
        /// The API server's message.
        detail: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// Another API failure.
    #[error("{action}: {detail}")]
    Api {
        /// What was attempted.
        action: String,
        /// The API server's message, or the error chain.
        detail: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The watch streams ended, which they do not while the client lives.
    #[error("watch the node, pods, namespaces and ServiceCIDRs: the watch streams ended")]
    WatchEnded,
    /// The metrics address could not be bound.
    #[error(
        "cannot serve metrics on {addr} ({source}): another program holds the port; pass another --metrics-port (or --metrics-addr)"
    )]
    MetricsBind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// `check` found something that keeps the agent from running on this node.
    #[error("this node cannot run the agent: see the FAIL lines above for what and the fix")]
    CheckFailed,
    /// A system call with no file to name failed (the async runtime, a signal handler).
    #[error("{action}: {source}")]
    System {
        /// What was attempted.
        action: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was attempted.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl AgentError {
    /// A BPF failure, classified: a program the verifier refused becomes
    /// [`AgentError::Verifier`], EPERM [`AgentError::Permission`].
    pub fn bpf(action: impl Into<String>, err: impl Into<BoxError>) -> Self {
        use aya::programs::ProgramError;
        let (action, source) = (action.into(), err.into());
        let eperm = errno(&*source) == Some(Errno::EPERM as i32);
        match source.downcast::<ProgramError>().map(|e| *e) {
            // A verifier log says more than its errno (the verifier answers EPERM too,
            // e.g. for a program that may not attach where it was loaded for).
            Ok(ProgramError::LoadError {
                io_error,
                verifier_log,
            }) if !eperm || !verifier_log.to_string().trim().is_empty() => Self::Verifier {
                action,
                source: io_error,
                log: verifier_log.to_string(),
            },
            _ if eperm => Self::Permission {
                action,
                source: Errno::EPERM.into(),
            },
            Ok(other) => Self::Bpf {
                action,
                source: Box::new(other),
            },
            Err(source) => Self::Bpf { action, source },
        }
    }

    /// The embedded object has no `kind` (map, program, function) named `name`.
    pub fn missing(kind: &'static str, name: &str) -> Self {
        let name = name.to_owned();
        Self::NotInObject { kind, name }
    }

    /// Map `map` could not be opened (from its pin, or as the type its name says).
    pub fn open_map(map: &str, err: impl Into<BoxError>) -> Self {
        Self::bpf(format!("open map {map}"), err)
    }

    /// An entry of map `map` could not be read or written: `what` says which, and how.
    pub fn map(map: &str, what: impl std::fmt::Display, err: impl Into<BoxError>) -> Self {
        Self::bpf(format!("{what} in map {map}"), err)
    }

    /// Program `program` could not be loaded (or, not loaded, gives no fd).
    pub fn load(program: &str, err: impl Into<BoxError>) -> Self {
        Self::bpf(format!("load program {program}"), err)
    }

    /// Program `program` could not be attached to `to`.
    pub fn attach(program: &str, to: impl std::fmt::Display, err: impl Into<BoxError>) -> Self {
        Self::bpf(format!("attach program {program} to {to}"), err)
    }

    /// Program `program`'s link could not be taken (to pin it).
    pub fn link(program: &str, err: impl Into<BoxError>) -> Self {
        Self::bpf(format!("take the link of program {program}"), err)
    }

    /// `what` (a program, map or link) could not be pinned at `path`.
    pub fn pin(what: impl std::fmt::Display, path: &Path, err: impl Into<BoxError>) -> Self {
        Self::bpf(format!("pin {what} at {}", path.display()), err)
    }
}

/// The errno of the first system call error in `err`'s chain of sources.
fn errno(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    std::iter::successors(Some(err), |e| e.source())
        .find_map(|e| e.downcast_ref::<std::io::Error>()?.raw_os_error())
}

/// `text` with every run of white space (a parser's quoted lines) made one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An error and its sources on one line.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    for s in std::iter::successors(err.source(), |e| e.source()).map(ToString::to_string) {
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn bpf_keeps_its_cause() {
        let e = AgentError::bpf("open map x", std::io::Error::from(Errno::ENOENT));
        assert!(matches!(e, AgentError::Bpf { .. }), "{e:?}");
        assert!(e.source().is_some());
        assert!(e.to_string().starts_with("open map x: "), "{e}");
    }

    #[test]
    fn each_shape_names_its_object() {
        let e = || std::io::Error::from(Errno::ENOENT);
        let errors = [
            AgentError::open_map("M", e()),
            AgentError::map("M", "read slot 3", e()),
            AgentError::load("P", e()),
            AgentError::attach("P", "cgroup /c", e()),
            AgentError::pin("P", Path::new("/p"), e()),
            AgentError::link("P", e()),
        ];
        let actions = [
            "open map M",
            "read slot 3 in map M",
            "load program P",
            "attach program P to cgroup /c",
            "pin P at /p",
            "take the link of program P",
        ];
        for (e, want) in errors.into_iter().zip(actions) {
            assert!(
                matches!(&e, AgentError::Bpf { action, .. } if action == want),
                "{e}"
            );
        }
    }

    #[test]
    fn bpf_eperm_is_a_permission_error() {
        let e = AgentError::bpf("load", std::io::Error::from(Errno::EPERM));
        assert!(matches!(e, AgentError::Permission { .. }), "{e:?}");
    }

    #[test]
    fn system_errors_name_no_path() {
        let e = AgentError::System {
            action: "start the runtime",
            source: std::io::Error::from(Errno::EMFILE),
        };
        assert!(e.to_string().starts_with("start the runtime: "), "{e}");
        assert!(e.source().is_some());
    }
}
