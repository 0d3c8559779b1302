//! Reads the node's network namespaces: every one a process runs in
//! (`/proc/PID/ns/net`) or a runtime pinned (`/run/netns`, Docker's), entered in turn by
//! one thread of the agent (`setns` changes only the calling thread's namespace).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    net::IpAddr,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use nix::sched::{CloneFlags, setns};

use super::{Claim, netlink::Route};
use crate::{datapath::netns_cookie, error::AgentError};

/// Where container runtimes pin pod network namespaces: containerd and CRI-O (and
/// `ip netns`) under `/run/netns`, Docker under its own directory.
pub const PINNED_NETNS_DIRS: [&str; 3] = ["/run/netns", "/var/run/netns", "/var/run/docker/netns"];

/// `IFF_UP`: the interface is up (include/uapi/linux/if.h).
const IFF_UP: u32 = 0x1;
/// `IFF_LOWER_UP`: its carrier is (for a veth: its peer is up too).
const IFF_LOWER_UP: u32 = 0x1_0000;

/// The node's own network namespace: the agent's, opened when it starts.
pub struct HostNamespace {
    file: File,
    id: (u64, u64),
}

impl HostNamespace {
    /// The calling thread's network namespace (the agent runs in the node's).
    pub fn current() -> Result<Self, AgentError> {
        let path = Path::new("/proc/thread-self/ns/net");
        let file = File::open(path).map_err(|e| AgentError::Io {
            action: "open the node's network namespace",
            path: path.into(),
            source: e,
        })?;
        let meta = file.metadata().map_err(|e| AgentError::Io {
            action: "stat the node's network namespace",
            path: path.into(),
            source: e,
        })?;
        Ok(Self {
            file,
            id: (meta.dev(), meta.ino()),
        })
    }
}

/// What one scan found.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Addresses held on interfaces that reach the node's namespace.
    pub claims: Vec<Claim>,
    /// The addresses of the node's own namespace on interfaces that are up and not dummy
    /// devices (its bridge's, its own, a CNI's router or tunnel address): no pod owns one
    /// ([`super::resolve`]). `None` when they could not be read.
    pub node: Option<BTreeSet<IpAddr>>,
    /// Namespaces read (the node's own left out).
    pub namespaces: usize,
    /// Namespaces that could not be entered or read (gone meanwhile, or no right).
    pub unreadable: usize,
    /// The cookies of the namespaces read: those alive now.
    pub alive: BTreeSet<u64>,
}

/// Reads every network namespace it can find but the node's own.
pub fn scan(host: &HostNamespace) -> Result<Scan, AgentError> {
    // Stat first (cheap, follows the namespace link): most processes share a few
    // namespaces. Each is opened only when it is read, one at a time, through the first
    // of its paths that still leads to it (a process may exit meanwhile).
    let mut paths: BTreeMap<(u64, u64), Vec<PathBuf>> = BTreeMap::new();
    for path in candidates() {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let id = (meta.dev(), meta.ino());
        if id != host.id {
            paths.entry(id).or_default().push(path);
        }
    }
    let host_file = host.file.try_clone().map_err(|e| AgentError::Io {
        action: "duplicate the node's network namespace descriptor",
        path: "/proc/thread-self/ns/net".into(),
        source: e,
    })?;
    // A thread of its own: it leaves the node's namespace.
    std::thread::Builder::new()
        .name("netns-scan".into())
        .spawn(move || read_all(&host_file, &paths))
        .map_err(|e| AgentError::Io {
            action: "start the network namespace scan thread",
            path: PathBuf::new(),
            source: e,
        })?
        .join()
        .map_err(|_| AgentError::Io {
            action: "scan network namespaces (the thread panicked)",
            path: PathBuf::new(),
            source: std::io::Error::other("panicked"),
        })
}

/// Paths of network namespace files: pinned ones, then each process's.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in PINNED_NETNS_DIRS {
        if let Ok(entries) = std::fs::read_dir(dir) {
            out.extend(entries.filter_map(Result::ok).map(|e| e.path()));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name();
            if name
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            {
                out.push(e.path().join("ns/net"));
            }
        }
    }
    out
}

fn read_all(host: &File, paths: &BTreeMap<(u64, u64), Vec<PathBuf>>) -> Scan {
    let mut out = Scan::default();
    // The node's own addresses, read first: the thread is still in its namespace.
    match node_addrs() {
        Ok(addrs) => out.node = Some(addrs),
        Err(e) => {
            tracing::warn!(error = %e, "the node's own addresses could not be read: until they are, a pod holding one of them inside the pod CIDRs may own it")
        }
    }
    for (id, paths) in paths {
        let f = match open_first(paths, *id) {
            Ok(Some(f)) => f,
            // Every path gone (its processes exited): so is the namespace, unless
            // something else holds it; a later scan finds it then.
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "a network namespace could not be opened");
                out.unreadable += 1;
                continue;
            }
        };
        match read_one(host, &f) {
            Ok((netns, claims)) => {
                out.namespaces += 1;
                out.alive.insert(netns);
                out.claims.extend(claims);
            }
            Err(e) => {
                tracing::debug!(error = %e, "a network namespace could not be read");
                out.unreadable += 1;
            }
        }
    }
    out
}

/// The longest reply read from the node's own namespace, in messages: IPVS binds every
/// Service address there, and no pod can send to the agent's socket there.
const NODE_MESSAGES: usize = 1 << 22;

/// The addresses of the calling thread's namespace (the node's) on interfaces that are
/// up and not dummy devices: not those IPVS binds Service addresses to (`kube-ipvs0`, a
/// dummy device kube-proxy never brings up), a Service's `externalIPs` among them, which
/// any tenant may set to a pod's address.
fn node_addrs() -> std::io::Result<BTreeSet<IpAddr>> {
    let mut route = Route::open()?.with_limit(NODE_MESSAGES);
    let serving: BTreeSet<u32> = route
        .links()?
        .into_iter()
        .filter(|l| !l.dummy && l.flags & IFF_UP != 0)
        .map(|l| l.index)
        .collect();
    Ok(route
        .addrs()?
        .into_iter()
        .filter(|a| serving.contains(&a.index))
        .map(|a| a.addr.to_canonical())
        .collect())
}

/// The namespace `id` through the first of `paths` that still leads to it; `None` when
/// none does any more (gone, or another namespace now: a process that exited and its
/// pid reused); an error when one exists and cannot be opened (no right).
fn open_first(paths: &[PathBuf], id: (u64, u64)) -> std::io::Result<Option<File>> {
    let mut refused = None;
    for path in paths {
        match File::open(path) {
            Ok(f) => {
                let m = f.metadata()?;
                if (m.dev(), m.ino()) == id {
                    return Ok(Some(f));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => refused = Some(e),
        }
    }
    refused.map_or(Ok(None), Err)
}

/// Enters `ns`: its cookie, and the addresses on its interfaces that are up and whose
/// peer or lower device is in `host`.
fn read_one(host: &File, ns: &File) -> std::io::Result<(u64, Vec<Claim>)> {
    setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
    let netns = netns_cookie().map_err(std::io::Error::other)?;
    Ok((netns, claims_of(host, netns)?))
}

/// The claims of namespace `netns`, which the calling thread is in.
fn claims_of(host: &File, netns: u64) -> std::io::Result<Vec<Claim>> {
    let mut route = Route::open()?;
    let Some(host_id) = route.nsid_of(host.as_fd())? else {
        // No interface of this namespace reaches the node's.
        return Ok(Vec::new());
    };
    let reaching: BTreeSet<u32> = route
        .links()?
        .into_iter()
        .filter(|l| {
            l.link_netnsid == Some(host_id)
                && l.flags & (IFF_UP | IFF_LOWER_UP) == IFF_UP | IFF_LOWER_UP
        })
        .map(|l| l.index)
        .collect();
    if reaching.is_empty() {
        return Ok(Vec::new());
    }
    Ok(route
        .addrs()?
        .into_iter()
        .filter(|a| reaching.contains(&a.index))
        .map(|a| Claim {
            netns,
            addr: a.addr.to_canonical(),
        })
        .collect())
}
