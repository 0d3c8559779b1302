//! Command-line options and subcommands.

use std::path::PathBuf;

use std::collections::BTreeSet;

use bypass_common::names::{
    DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_SOCKETS, DEFAULT_PIN_DIR, DEFAULT_SKIP_PORTS,
    DEFAULT_SMALL_STREAM_BYTES, MAX_SKIP_PORTS,
};
use bypass_common::size::{SizeError, parse_size};
use clap::{Args, Parser, Subcommand};

use crate::cidr::Cidr;

/// Same-node TCP bypass: pod-to-pod sockets talk socket to socket.
#[derive(Debug, Parser)]
#[command(name = "bypass-agent", version, about)]
pub struct Cli {
    /// Log as JSON lines instead of text (filter with RUST_LOG).
    #[arg(long, global = true)]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and attach the datapath and keep it until SIGINT/SIGTERM.
    Run(Box<RunOpts>),
    /// Print what the running datapath holds and has counted.
    Status(StatusOpts),
    /// Remove every pin a crashed agent left behind, and say what was removed.
    Uninstall(UninstallOpts),
    /// Say what this kernel gives the datapath (the read guard or not, how reads are
    /// seen) and whether `run` would bypass on it, without loading anything for good.
    Probe(ProbeOpts),
    /// Read-only preflight of this node: kernel features, BTF, the read guard, cgroup2,
    /// bpffs propagation, Pod Security, other sockmap owners, the metrics address.
    /// Loads and attaches nothing; exits non-zero when the agent cannot run here.
    Check(CheckOpts),
    /// Every node's status as its agent published it: bypassing (with which
    /// guarantees), off, or refused and why.
    Nodes(NodesOpts),
    /// The chart's init container: mount bpffs on the host if it is not (the one
    /// privileged step, so the agent's own container needs only capabilities).
    PrepareNode(PrepareNodeOpts),
    /// The chart's pre-install hook: label the release namespace for Pod Security
    /// `privileged` (what `helm install --create-namespace` cannot do).
    PrepareNamespace(PrepareNamespaceOpts),
}

/// Options of `probe`.
#[derive(Debug, Args)]
pub struct ProbeOpts {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Options of `prepare-node`.
#[derive(Debug, Args)]
pub struct PrepareNodeOpts {
    #[command(flatten)]
    pub pins: PinOpts,
}

/// Options of `prepare-namespace`.
#[derive(Debug, Args)]
pub struct PrepareNamespaceOpts {
    /// The namespace to label.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: String,
    /// kubeconfig [default: $KUBECONFIG, else the pod's service account].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// Options of `check`.
#[derive(Debug, Args)]
pub struct CheckOpts {
    /// The host's /sys/fs/cgroup as mounted into the container (as for `run`).
    #[arg(long, value_name = "PATH")]
    pub host_cgroupfs: Option<PathBuf>,
    /// Where bpffs is (or will be) mounted.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf")]
    pub bpffs: PathBuf,
    /// The addresses metrics would be served on (as for `run`).
    #[arg(long, value_name = "IP", value_delimiter = ',')]
    pub metrics_ip: Vec<std::net::IpAddr>,
    /// The port metrics would be served on (as for `run`).
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// The agent's namespace, whose Pod Security level is read (in a pod:
    /// POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// kubeconfig for reading the namespace [default: $KUBECONFIG, else the pod's
    /// service account].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Judge as `run --allow-unguarded` would (the chart's allowUnguarded): a node that
    /// bypasses only with it passes, with a warning.
    #[arg(long)]
    pub allow_unguarded: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Options of `nodes`.
#[derive(Debug, Args)]
pub struct NodesOpts {
    /// The agent's namespace.
    #[arg(
        long,
        short = 'n',
        env = "POD_NAMESPACE",
        value_name = "NAMESPACE",
        default_value = "bypass-system"
    )]
    pub namespace: String,
    /// kubeconfig [default: $KUBECONFIG, else the pod's service account].
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Which network namespace may use a pod address as its own (`--netns-owners`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetnsOwners {
    /// The namespace the agent observes holding it.
    Observe,
    /// Any namespace but the node's.
    Any,
}

/// Options of `run`.
#[derive(Debug, Args)]
pub struct RunOpts {
    /// A pod CIDR (repeatable): connections whose two ends are inside pod CIDRs or are
    /// pod addresses are bypassed. IPv4 and IPv6.
    #[arg(long = "pod-cidr", value_name = "CIDR")]
    pub pod_cidrs: Vec<Cidr>,
    /// A single pod address (repeatable).
    #[arg(long = "pod-ip", value_name = "ADDR")]
    pub pod_ips: Vec<std::net::IpAddr>,
    /// A Service ClusterIP range (repeatable): a pod's connection to an address inside
    /// it is watched, so that when kube-proxy's DNAT lands it on a pod of this node the
    /// two sockets are paired and bypassed.
    #[arg(long = "service-cidr", value_name = "CIDR")]
    pub service_cidrs: Vec<Cidr>,
    /// A Service address and port and one backend of it on this node's pods,
    /// `SERVICE_IP:PORT=POD_IP:PORT` (repeatable). A connection whose client dialled
    /// another address than its server's is paired across pods only to a backend of
    /// what it dialled: in Kubernetes mode the Services' EndpointSlices give them;
    /// standalone, list here every translation (DNAT) to a pod that should be
    /// bypassed.
    #[arg(long = "service-backend", value_name = "SVC=POD")]
    pub service_backends: Vec<crate::backend::Backend>,
    /// Ports whose connections are left alone (either end), comma-separated; `none` for
    /// none. The default is Istio's control ports.
    #[arg(long, value_name = "PORTS", default_value = DEFAULT_SKIP_PORTS_ARG,
        value_parser = parse_ports)]
    pub skip_ports: PortList,
    /// cgroup v2 directory to attach sock_ops to [default: the cgroup2 mount root; with
    /// --host-cgroupfs, the host's].
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// The host's /sys/fs/cgroup, mounted into the agent's container (e.g.
    /// /host/sys/fs/cgroup): without --cgroup, sock_ops attaches to the cgroup2
    /// hierarchy there: PATH itself on unified hosts, PATH/unified (or the child that is
    /// cgroup2) on hybrid ones. The container's own /sys/fs/cgroup is only its cgroup
    /// namespace's view.
    #[arg(long, value_name = "PATH")]
    pub host_cgroupfs: Option<PathBuf>,
    #[command(flatten)]
    pub pins: PinOpts,
    /// SockHash capacity in sockets (two per bypassed connection); when it is full,
    /// connections use the normal path.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SOCKETS)]
    pub max_sockets: u32,
    /// What may wait for a reader that did not fix its receive buffer (K, M suffixes):
    /// bytes redirected to it and not yet read, each message also charged the kernel
    /// memory it holds (a 1 KiB slab object and a page). Past it, the sender takes the normal TCP
    /// path (and TCP's backpressure) until the reader has caught up, then redirects
    /// again. `auto` (the default): what TCP lets a receive buffer grow to, the third
    /// value of net.ipv4.tcp_rmem. A reader that fixed SO_RCVBUF is held to that. 0
    /// turns the bound off: a peer that stops reading then lets the sender queue kernel
    /// memory without limit.
    #[arg(long, value_name = "BYTES|auto", default_value = "auto", value_parser = parse_bound)]
    pub max_queued_bytes: QueueBound,
    /// Sends smaller than this (K suffix allowed), made while the peer has not yet read
    /// what was redirected to it and what waits is messages smaller than this on average,
    /// 8 times in a row (a larger send, or one behind large messages, restarts the
    /// count), are a small-message stream: the connection leaves the SockHash and runs as
    /// plain TCP, which coalesces small writes. Request and response traffic, where the peer
    /// has read everything before it answers, keeps the redirect. 0 turns it off.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_SMALL_STREAM_BYTES,
        value_parser = parse_bytes)]
    pub small_stream_bytes: u32,
    /// Load the embedded programs even if this build is already pinned (by default a
    /// restarted agent adopts them, keeping maps, counters and the attachment).
    #[arg(long)]
    pub reset: bool,
    /// Bypass even where no read guard can run (kernels that refuse BPF trampoline
    /// programs): a process seen splicing then gets no redirected bytes from its next
    /// read on, but a socket that splices while redirected bytes wait for it (Go's
    /// io.Copy between connections, HAProxy's splice options) can miss them. Without
    /// it, such a kernel is not bypassed. `bypass-agent probe` says which kind of
    /// kernel this is.
    #[arg(long, env = "BYPASS_ALLOW_UNGUARDED", value_name = "BOOL", num_args = 0..=1,
        default_value_t = false, default_missing_value = "true",
        action = clap::ArgAction::Set)]
    pub allow_unguarded: bool,
    /// On exit, detach and remove the pins (`true`), or leave the datapath pinned and
    /// attached for the next agent to adopt (`false`, what a DaemonSet wants; remove it
    /// with `bypass-agent uninstall`).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub detach_on_exit: bool,
    /// Seconds the agent's heartbeat runs ahead of the clock: that long after the agent
    /// stops refreshing it (killed, hung, or gone with --detach-on-exit=false), sock_ops
    /// inserts nothing new, so new connections take the normal TCP path; established
    /// ones are left as they are. A rolling update's new agent adopts within it.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::datapath::DEFAULT_HEARTBEAT_SECS,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub heartbeat_seconds: u32,
    /// Which network namespace may use a pod address as its own. `observe`: only the
    /// one the agent sees holding it on an interface that reaches the node's namespace
    /// (a pod's veth, netkit or ipvlan end), so no other namespace can pose as a pod;
    /// the agent reads the node's namespaces when a link or an address changes and
    /// every second, and pods whose network reaches the node otherwise (none known) are
    /// not bypassed. `any`: every
    /// namespace but the node's own (a namespace holding a copy of a pod's address can
    /// then publish itself as that pod's client).
    #[arg(long, value_enum, value_name = "RULE", default_value_t = NetnsOwners::Observe)]
    pub netns_owners: NetnsOwners,
    #[command(flatten)]
    pub kube: KubeOpts,
}

/// Options of `run` in Kubernetes mode, which `--node-name` (or `NODE_NAME`) turns on:
/// pod CIDRs from the Node, pod addresses from its Pods, on/off from a Node label.
#[derive(Debug, Args)]
#[command(next_help_heading = "Kubernetes mode")]
pub struct KubeOpts {
    /// This node's name; turns on Kubernetes mode (then --pod-cidr/--pod-ip are optional
    /// extras).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// kubeconfig file [default: $KUBECONFIG, else the pod's service account].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Node label that turns the bypass on ("true") and off ("false") while running.
    #[arg(long, value_name = "KEY", default_value = "bypass.dev/enabled")]
    pub node_label: String,
    /// Whether the bypass is on when the node has no such label.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub default_enabled: bool,
    /// Pod annotation that, set to "true", keeps the pod's addresses out of the bypass.
    #[arg(long, value_name = "KEY", default_value = "bypass.dev/exclude")]
    pub exclude_annotation: String,
    /// Namespace label that, set to "true", keeps every pod of the namespace out.
    #[arg(long, value_name = "KEY", default_value = "bypass.dev/exclude")]
    pub exclude_namespace_label: String,
    /// Namespace opt-in (a canary rollout): only pods of namespaces with this label
    /// set to "true" are bypassed (an opt-out still wins); the others are treated as
    /// opted out. Off unless given, e.g. --include-namespace-label=bypass.dev/include.
    #[arg(long, value_name = "KEY")]
    pub include_namespace_label: Option<String>,
    /// Serve /metrics, /healthz and /readyz here, e.g. `10.0.0.5:19464` or
    /// `[fd00::5]:19464` (`fd00::5:19464` is refused with both fixes named) [default in
    /// Kubernetes mode: --metrics-ip on --metrics-port; standalone: not served unless
    /// given].
    #[arg(long, value_name = "ADDR", value_parser = parse_socket_addr,
        conflicts_with_all = ["metrics_ip", "metrics_port"])]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The addresses to serve metrics on, IPv4 or IPv6 without brackets,
    /// comma-separated or repeated (a DaemonSet passes the downward API's
    /// status.hostIPs as it is: every address of the node) [default: 127.0.0.1].
    #[arg(long, value_name = "IP", value_delimiter = ',')]
    pub metrics_ip: Vec<std::net::IpAddr>,
    /// The port to serve metrics on [default: 19464; see docs/cli.md for why not 9464]. A
    /// failed bind is logged and retried every 5 s, never fatal.
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// This agent's pod (downward API metadata.name): with --pod-namespace, its node's
    /// status is published as a ConfigMap there, and at exit the agent removes its
    /// datapath if its DaemonSet is gone.
    #[arg(
        long,
        env = "POD_NAME",
        value_name = "NAME",
        requires = "pod_namespace"
    )]
    pub pod_name: Option<String>,
    /// This agent's namespace (downward API metadata.namespace).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        value_name = "NAMESPACE",
        requires = "pod_name"
    )]
    pub pod_namespace: Option<String>,
    /// Seconds between full reconcile passes that repair drift.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub resync_seconds: u64,
}

/// Options of `uninstall`.
#[derive(Debug, Args)]
pub struct UninstallOpts {
    #[command(flatten)]
    pub pins: PinOpts,
    /// After removing, stay until SIGTERM or SIGINT: the uninstall DaemonSet
    /// (`deploy/uninstall.yaml`) then has one Ready pod per node once that node is clean.
    #[arg(long)]
    pub wait: bool,
    /// Remove every bypass datapath pinned on the bpffs mount (--bpffs), whatever its
    /// pin directory, instead of --pin-dir's alone.
    #[arg(long)]
    pub all: bool,
    /// The bpffs mount searched by --all (and, without it, for a datapath pinned
    /// somewhere other than --pin-dir, which is then an error rather than a clean node).
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf")]
    pub bpffs: PathBuf,
}

/// Where the pins live.
#[derive(Debug, Args)]
pub struct PinOpts {
    /// bpffs directory holding the agent's pinned maps (`maps/`), programs (`progs/`)
    /// and links (`links/`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

/// The default of `--skip-ports`.
pub const DEFAULT_SKIP_PORTS_ARG: &str =
    "15000,15004,15010,15012,15014,15017,15020,15021,15053,15090";
const _: () = assert!(DEFAULT_SKIP_PORTS.len() == 10);

/// A set of TCP ports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortList(pub BTreeSet<u16>);

/// `none`, or comma-separated ports 1-65535.
pub fn parse_ports(s: &str) -> Result<PortList, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") || t.is_empty() {
        return Ok(PortList::default());
    }
    let mut set = BTreeSet::new();
    for part in t.split(',') {
        let p = part.trim();
        match p.parse::<u16>() {
            Ok(0) | Err(_) => {
                return Err(format!(
                    "'{p}' is not a port: write ports 1-65535 separated by commas, e.g. \
                     15000,15021, or `none`"
                ));
            }
            Ok(n) => {
                set.insert(n);
            }
        }
    }
    if set.len() > MAX_SKIP_PORTS as usize {
        return Err(format!("{} ports; at most {MAX_SKIP_PORTS}", set.len()));
    }
    Ok(PortList(set))
}

/// A socket address; an IPv6 one without brackets (`fd00::10:9464`, which could be an
/// address alone) gets a message naming the two ways to write it.
pub fn parse_socket_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        if s.parse::<std::net::Ipv6Addr>().is_ok() || s.matches(':').count() > 1 {
            format!(
                "'{s}' is not an address and port: write an IPv6 one in brackets, \
                 [fd00::10]:19464, or pass the address alone with --metrics-ip and the \
                 port with --metrics-port"
            )
        } else {
            format!("'{s}' is not an address and port, e.g. 10.0.0.5:19464")
        }
    })
}

/// `--max-queued-bytes`: a byte count, or what the host's TCP allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueBound {
    /// The third value of `net.ipv4.tcp_rmem`.
    Auto,
    /// This many bytes (0: no bound).
    Bytes(u32),
}

impl QueueBound {
    /// The bound in bytes, `auto` resolved with `tcp_rmem_max` (else
    /// [`DEFAULT_MAX_QUEUED_BYTES`]).
    pub fn resolve(self, tcp_rmem_max: Option<u32>) -> u32 {
        match self {
            QueueBound::Auto => tcp_rmem_max.unwrap_or(DEFAULT_MAX_QUEUED_BYTES),
            QueueBound::Bytes(n) => n,
        }
    }
}

/// Parses `--max-queued-bytes`: `auto` or [`parse_bytes`].
pub fn parse_bound(s: &str) -> Result<QueueBound, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(QueueBound::Auto);
    }
    parse_bytes(s).map(QueueBound::Bytes)
}

/// A byte count below 4 GiB: digits with an optional K, M or G suffix (powers of 1024;
/// [`parse_size`]).
pub fn parse_bytes(s: &str) -> Result<u32, String> {
    let n = parse_size(s).map_err(|e| match e {
        SizeError::TooLarge => format!("'{s}' is 4 GiB or more"),
        SizeError::NotANumber => {
            format!("'{s}' is not a byte count: write e.g. 4194304, 512K or 4M")
        }
        SizeError::UnknownUnit => format!("'{s}' {e}"),
    })?;
    u32::try_from(n).map_err(|_| format!("'{s}' is 4 GiB or more"))
}

/// Options of `status`.
#[derive(Debug, Args)]
pub struct StatusOpts {
    #[command(flatten)]
    pub pins: PinOpts,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_lists() {
        let default = parse_ports(DEFAULT_SKIP_PORTS_ARG).unwrap();
        assert_eq!(
            default.0,
            DEFAULT_SKIP_PORTS.iter().copied().collect::<BTreeSet<_>>()
        );
        assert!(parse_ports("none").unwrap().0.is_empty());
        assert_eq!(
            parse_ports(" 80, 443 ").unwrap().0,
            BTreeSet::from([80, 443])
        );
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("80,x").unwrap_err().contains("'x'"));
        assert!(parse_ports("65536").is_err());
    }

    #[test]
    fn socket_addresses_and_the_ipv6_trap() {
        assert_eq!(
            parse_socket_addr("[fd00::10]:9464").unwrap().to_string(),
            "[fd00::10]:9464"
        );
        assert!(parse_socket_addr("10.0.0.1:9464").is_ok());
        // What `$(HOST_IP):9464` becomes on an IPv6 node: an address, or address and
        // port? Refused, naming both fixes.
        let e = parse_socket_addr("fd00::10:9464").unwrap_err();
        assert!(
            e.contains("[fd00::10]:19464") && e.contains("--metrics-ip"),
            "{e}"
        );
        assert!(parse_socket_addr("10.0.0.1").is_err());
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("4194304"), Ok(4 << 20));
        assert_eq!(parse_bytes("512K"), Ok(512 << 10));
        assert_eq!(parse_bytes("4M"), Ok(4 << 20));
        assert_eq!(parse_bytes("16 kb"), Ok(16 << 10));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("4G").is_err());
        assert!(parse_bytes("3G").is_ok());
        assert!(parse_bytes("1T").is_err());
        assert!(parse_bytes("x").is_err());
        assert!(parse_bytes("99999999999999999999").is_err());
    }
}
