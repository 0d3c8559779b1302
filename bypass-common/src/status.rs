//! What the agent reports, as its JSON reads (`status --json`, `probe --json`): the
//! types the agent prints and every other reader (the testbed, the demo, the bench)
//! parses, with no Kubernetes client and no BPF library in between.

extern crate std;

use std::{net::IpAddr, string::String, vec::Vec};

use serde::{Deserialize, Serialize};

use crate::stats::Counters;

/// One key of a report as its JSON has it, listed with the type that declares it
/// (`reported!`), for the views generated from it (`cargo xtask docs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// Its name.
    pub name: &'static str,
    /// Its doc comment, a line each.
    pub doc: &'static [&'static str],
    /// Its own keys stand among its parent's (`#[serde(flatten)]`).
    pub flatten: bool,
    /// The keys of its value (an object), or of each of its entries ([`Key::each`]).
    pub keys: &'static [Key],
    /// Its value is an array of objects with [`Key::keys`].
    pub each: bool,
}

impl Key {
    /// Its doc comment as one line.
    pub fn text(&self) -> String {
        self.doc
            .iter()
            .map(|l| l.trim())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Declares a report type and its catalogue `KEYS` ([`Key`]) from one definition: each
/// field with its doc comment, its `#[serde]` attributes, and `#[keys(Type)]` when its
/// value is an object of `Type`'s keys or `#[each(Type)]` when it is an array of them
/// (those two are the catalogue's own and do not reach the type). `@flags` declares an
/// all-`bool` type and its `list()` of `(name, on)` pairs too.
macro_rules! reported {
    (@flags
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[doc = $doc:expr])* $(#[serde($($serde:tt)*)])* pub $field:ident: bool, )*
        }
    ) => {
        reported! {
            $(#[$meta])*
            pub struct $name {
                $( $(#[doc = $doc])* $(#[serde($($serde)*)])* pub $field: bool, )*
            }
        }

        impl $name {
            /// `(name, on)` pairs, in `KEYS` order, for text and metrics.
            pub fn list(&self) -> [(&'static str, bool); [$(stringify!($field)),*].len()] {
                [$((stringify!($field), self.$field)),*]
            }
        }
    };
    (@flatten) => { false };
    (@flatten flatten $($rest:tt)*) => { true };
    (@flatten $first:tt $($rest:tt)*) => { reported!(@flatten $($rest)*) };
    (@keys) => { &[] };
    (@keys $t:ident) => { $t::KEYS };
    (@some) => { false };
    (@some $t:ident) => { true };
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:expr])*
                $(#[serde($($serde:tt)*)])*
                $(#[keys($keys:ident)])?
                $(#[each($each:ident)])?
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[doc = $doc])*
                $(#[serde($($serde)*)])*
                pub $field: $ty,
            )*
        }

        impl $name {
            /// Its keys, in the order its JSON has them.
            pub const KEYS: &'static [Key] = &[$(
                Key {
                    name: stringify!($field),
                    doc: &[$($doc),*],
                    flatten: reported!(@flatten $($($serde)*)*),
                    keys: reported!(@keys $($keys)? $($each)?),
                    each: reported!(@some $($each)?),
                },
            )*];
        }
    };
}

reported! {
    /// The report, as printed (`status --json`), and as read back by the testbed. Fields
    /// missing from the input read as their defaults.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct Report {
        /// sock_ops attached and redirects allowed.
        pub attached: bool,
        /// Sockets in the SockHash now.
        pub sockets: usize,
        /// Connecting sockets waiting for their peer to pair (removed when paired or
        /// closed).
        pub connectors: usize,
        /// Paired connections (removed when the connecting socket closes).
        pub links: usize,
        /// Bound, in bytes, on a peer's ingress queue (0: none).
        pub max_queued_bytes: u32,
        /// Size under which a stream of sends takes the TCP path (0: never).
        pub small_stream_bytes: u32,
        /// The running kernel's release.
        pub kernel: String,
        /// What the loaded programs do on this kernel.
        #[keys(Features)]
        pub features: Features,
        /// The kernel self-test the agent ran before bypassing: each behaviour the
        /// guarantees rely on, checked on this kernel with the datapath's programs.
        #[serde(default)]
        #[each(KernelCheck)]
        pub kernel_checks: Vec<KernelCheck>,
        /// Why the queue bound is off, when it is.
        pub queue_bound_off: Option<String>,
        /// Counters.
        #[serde(flatten)]
        #[keys(Counters)]
        pub counters: Counters,
        /// Pod CIDRs in the trie.
        pub pod_cidrs: Vec<String>,
        /// Exact pod addresses.
        pub pod_addresses: Vec<IpAddr>,
        /// Addresses never treated as a pod's (opted out), whatever CIDR holds them.
        pub excluded_addresses: Vec<IpAddr>,
        /// Service (ClusterIP) CIDRs.
        pub service_cidrs: Vec<String>,
        /// Service backends on this node's pods, `SERVICE_IP:PORT=POD_IP:PORT`: the only
        /// servers a translated connection from another pod is paired with.
        #[serde(default)]
        pub service_backends: Vec<String>,
        /// Ports left alone.
        pub skip_ports: Vec<u16>,
        /// Kubernetes mode: where the on/off state came from (`label` or `default`); null
        /// in standalone mode, or before a valid decision.
        pub enabled_by: Option<EnabledBy>,
        /// Kubernetes mode: what the node label held (`absent`, `true`, `false`,
        /// `invalid`); null in standalone mode.
        pub label_value: Option<LabelValue>,
        /// The pin directory read.
        pub pin_dir: String,
        /// Other sock_ops/sk_msg programs loaded on this node (Merbridge, Kmesh, ...).
        pub other_programs: Vec<String>,
        /// Why `insert_failures` is not zero: a full SockHash, or another program holding
        /// the sockets in its own sockmap.
        pub insert_failures_cause: Option<String>,
        /// Why the agent does not bypass this node, when it refuses to.
        #[serde(default)]
        pub refused: Option<String>,
        /// SockHash capacity (`--max-sockets` of the loaded datapath).
        pub max_sockets: Option<u32>,
        /// Seconds until the heartbeat lapses and sock_ops stops inserting (0: lapsed: no
        /// agent tends this datapath).
        pub heartbeat_seconds_left: u64,
        /// Which namespace may use a pod address (`--netns-owners`): `observe` or `any`.
        pub netns_owners: String,
        /// Each pod address the agent observed with its owning network namespace.
        #[each(AddressOwner)]
        pub address_owners: Vec<AddressOwner>,
        /// Pod addresses that sockets were refused for, with how often, by kind.
        #[each(AddressRefusals)]
        pub refusals: Vec<AddressRefusals>,
    }
}

reported! {
    /// One behaviour of the kernel self-test (`bypass_common::checks::CHECKS`).
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct KernelCheck {
        /// Its name.
        pub name: String,
        /// `passed`, `failed` or `not run` (the read guard's checks where it is off).
        pub outcome: String,
        /// What it checks, as TCP answers it.
        pub what: String,
    }
}

impl KernelCheck {
    /// Every check of the catalogue with its outcome in `results`.
    pub fn list(results: crate::checks::Results) -> Vec<Self> {
        crate::checks::CHECKS
            .iter()
            .enumerate()
            .map(|(i, c)| Self {
                name: c.name.into(),
                outcome: results.get(i).name().into(),
                what: c.what.into(),
            })
            .collect()
    }
}

reported! {
    /// A pod address and the cookie of the network namespace that owns it.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct AddressOwner {
        /// The address.
        pub address: IpAddr,
        /// The namespace's cookie (`SO_NETNS_COOKIE`).
        pub netns: u64,
    }
}

reported! {
    /// How often sockets were refused for one pod address.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct AddressRefusals {
        /// The address.
        pub address: IpAddr,
        /// Sockets of another namespace that used it while a pod owned it.
        pub foreign_namespace: u64,
        /// Pairings refused: accepted sockets whose client on it had other sequence
        /// numbers, or accepted sockets on it that are no backend of the address their
        /// client dialled.
        pub pairing: u64,
    }
}

impl AddressRefusals {
    /// From the refusal map's counts, by [`crate::refusal`] kind.
    pub fn new(address: IpAddr, counts: [u64; crate::refusal::KINDS]) -> Self {
        Self {
            address,
            foreign_namespace: counts[crate::refusal::FOREIGN],
            pairing: counts[crate::refusal::PAIRING],
        }
    }

    /// `(kind, count)` pairs, named as [`crate::refusal::NAMES`] names them (its keys
    /// after `address`, as the metrics' `kind` label shows them).
    pub fn kinds(&self) -> [(&'static str, u64); crate::refusal::KINDS] {
        let mut out = crate::refusal::NAMES.map(|name| (name, 0));
        out[crate::refusal::FOREIGN].1 = self.foreign_namespace;
        out[crate::refusal::PAIRING].1 = self.pairing;
        out
    }
}

reported! {
    @flags
    /// What the loaded programs guarantee on this kernel. The read guard and FIONREAD hold
    /// where the kernel self-test found them holding (natively, or with the FIONREAD
    /// compensation); the others can be off only because a hook is not attached (after
    /// `uninstall`) or the bound was set to 0.
    #[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
    pub struct Features {
        /// What waits for a reader is bounded (`--max-queued-bytes`, or its own fixed
        /// receive buffer); past it, its peer sends by TCP until it has caught up.
        pub queue_bound: bool,
        /// A peer's SO_RCVLOWAT / SO_PEEK_OFF keep redirects away from it.
        pub receive_options: bool,
        /// `TCP_ULP` (kTLS) refused on bypassed sockets; MPTCP subflows never inserted.
        pub ulp_guard: bool,
        /// Bytes are read in the order they were sent: a direction goes back from TCP to
        /// redirects only once its peer has read every TCP byte with no reader inside.
        pub order: bool,
        /// The read guard is attached: a splice or zero-copy receive of a bypassed socket
        /// is refused while redirected bytes wait for it (see `read_guard_lsm` for the
        /// checks the kernel may skip).
        pub read_guard: bool,
        /// The read guard's checks run as BPF LSM programs, which the kernel runs on every
        /// call from Linux 6.2 on; false with the guard on: as fmod_ret programs (the BPF
        /// LSM does not run on this kernel), which a preemptible kernel can skip
        /// (docs/limitations.md).
        #[serde(default)]
        pub read_guard_lsm: bool,
        /// FIONREAD (`ioctl(SIOCINQ)`) counts every byte waiting, redirected and by TCP, as
        /// the kernel self-test saw it (`fionread_*` in `kernel_checks`), natively or
        /// through the agent's FIONREAD compensation.
        pub fionread: bool,
    }
}

impl Features {
    /// From the kernel self-test's results, whether the setsockopt hook and the read
    /// guard are attached, the feature bits the datapath was loaded with
    /// (`crate::layout::features`), and the bound in force.
    pub fn from_checks(
        checks: crate::checks::Results,
        sockopt_hook: bool,
        read_guard: bool,
        bits: u32,
        max_queued: u32,
    ) -> Self {
        Self {
            queue_bound: max_queued != 0,
            receive_options: sockopt_hook,
            ulp_guard: sockopt_hook,
            order: true,
            read_guard,
            read_guard_lsm: read_guard && bits & crate::layout::features::GUARD_LSM != 0,
            fionread: checks.all_passed(&crate::checks::FIONREAD),
        }
    }
}

/// Why the queue bound is off, when it is.
pub fn queue_bound_off_reason(max_queued: u32) -> Option<&'static str> {
    (max_queued == 0).then_some("--max-queued-bytes 0 (no bound)")
}

/// Where the on/off decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnabledBy {
    /// The node label, with a valid value.
    Label,
    /// `--default-enabled`: the node has no such label.
    Default,
}

/// What the node label held, as recorded for `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LabelValue {
    /// No such label on the node.
    Absent,
    /// `"true"`.
    True,
    /// `"false"`.
    False,
    /// Anything else (the value itself is in the log).
    Invalid,
}

/// What `probe` prints.
#[derive(Debug, Serialize, Deserialize)]
pub struct KernelProbe {
    /// Whether splice and zero-copy receive of a bypassed socket are guarded (the
    /// kernel runs BPF trampolines).
    pub read_guard: bool,
    /// How the read guard's checks run, as the self-test found they refuse: `lsm` (BPF
    /// LSM programs, run on every call), `fmod_ret` (the BPF LSM does not run here; a
    /// preemptible kernel can skip one), or `none`.
    #[serde(default)]
    pub read_guard_runs_as: String,
    /// How a bypassed socket's reads are seen: `tracepoint` (sock_recv_length) or
    /// `trampolines` (tcp_bpf_recvmsg's entry and return).
    pub read_hook: String,
    /// Whether `run` bypasses on this kernel without `--allow-unguarded`.
    pub bypass_by_default: bool,
    /// The kernel self-test, run now with the datapath's own programs.
    #[serde(default)]
    pub kernel_checks: Vec<KernelCheck>,
    /// The FIONREAD compensation: `not needed`, what it adds, or `needed, unavailable`.
    #[serde(default)]
    pub fionread_compensation: String,
    /// Why `run` would not bypass this node, if it would not: the line it logs.
    #[serde(default)]
    pub refusal: Option<String>,
}
