//! iptables rules inside a pod's network namespace, as a service mesh and kube-proxy
//! write them: the sidecar's REDIRECTs (Istio's `ISTIO_OUTPUT`/`ISTIO_INBOUND` reduced to
//! one rule each) and a ClusterIP Service's chains (`KUBE-SERVICES` → `KUBE-SVC-…` →
//! `KUBE-SEP-…` with `DNAT`, and the `KUBE-MARK-MASQ` / `KUBE-POSTROUTING` masquerade
//! machinery). The rules are built by pure functions and applied with
//! `ip netns exec NS iptables`; they live in the namespace's own tables and vanish with
//! it, so no guard is needed.
//!
//! Either iptables backend works (`iptables-nft` translates these matches and targets);
//! only the `nat` table is used.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context as _, Result};
use xtask_lib::cmd;

use crate::netns::Netns;

/// Which of `iptables` / `ip6tables`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// The command.
    pub fn program(self) -> &'static str {
        match self {
            Self::V4 => "iptables",
            Self::V6 => "ip6tables",
        }
    }

    /// The host prefix length (`/32`, `/128`).
    fn host_len(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }
}

/// One `iptables` invocation's arguments (after the program name).
pub type Rule = Vec<String>;

fn rule(args: &[&str]) -> Rule {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// A rule of the `nat` table being written: `-t nat`, then words added in order.
struct Nat(Rule);

/// `-t nat` and `spec` split at spaces (no argument of a spec holds one; a comment,
/// which may, goes through [`Nat::comment`]).
fn nat(spec: &str) -> Nat {
    Nat(rule(&["-t", "nat"])).then(spec)
}

impl Nat {
    /// `spec`, split at spaces, appended.
    fn then(mut self, spec: &str) -> Self {
        self.0.extend(spec.split_whitespace().map(str::to_owned));
        self
    }

    /// `-m comment --comment TEXT`, the text one argument.
    fn comment(mut self, text: &str) -> Self {
        self.0.extend(rule(&["-m", "comment", "--comment", text]));
        self
    }
}

/// What is missing to run iptables in a namespace, if anything: both programs must
/// start and list the `nat` table.
pub fn missing() -> Option<String> {
    for f in [Family::V4, Family::V6] {
        match cmd::run_program(f.program(), &["-w", "-t", "nat", "-L", "-n"]) {
            Ok(_) => {}
            Err(e) => {
                return Some(format!(
                    "{} cannot list the nat table ({e:#}); install iptables (cargo xtask setup)",
                    f.program()
                ));
            }
        }
    }
    None
}

/// Runs `ip netns exec NS iptables -w ARGS` (or ip6tables).
pub fn run(ns: &Netns, family: Family, args: &[String]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns.name(), family.program(), "-w"];
    full.extend(args.iter().map(String::as_str));
    cmd::ip(&full)
}

/// Applies `rules` in order in `ns`.
pub fn apply(ns: &Netns, family: Family, rules: &[Rule]) -> Result<()> {
    for r in rules {
        run(ns, family, r).with_context(|| format!("in netns {}", ns.name()))?;
    }
    Ok(())
}

/// The `nat` table of `ns`, as `iptables -S` prints it (for failure messages).
pub fn dump(ns: &Netns, family: Family) -> String {
    run(ns, family, &nat("-S").0).unwrap_or_else(|e| format!("{e:#}"))
}

/// The sidecar's outbound capture: the application's connections to `app_port` are
/// redirected to the proxy on `proxy_port` (on loopback: REDIRECT in OUTPUT maps the
/// destination to 127.0.0.1 or ::1), except the proxy's own, whose sockets carry `mark`.
pub fn sidecar_outbound(app_port: u16, mark: u32, proxy_port: u16) -> Vec<Rule> {
    vec![nat(&format!(
        "-A OUTPUT -p tcp --dport {app_port} -m mark ! --mark {mark:#x} -j REDIRECT --to-ports {proxy_port}"
    ))
    .0]
}

/// A source NAT onto `source`: connections from the pod to `dst` port `dport` leave
/// from `source` (an address and port of the pod), as a SNAT or a masquerade that
/// collides with a live connection's end would make them.
pub fn snat_onto(dst: std::net::IpAddr, dport: u16, source: std::net::SocketAddr) -> Vec<Rule> {
    vec![
        nat(&format!(
            "-A POSTROUTING -p tcp -d {dst} --dport {dport} -j SNAT --to-source {source}"
        ))
        .0,
    ]
}

/// The sidecar's inbound capture: connections arriving for `app_port` are redirected to
/// the proxy on `proxy_port` (REDIRECT in PREROUTING keeps the pod address, changes the
/// port).
pub fn sidecar_inbound(app_port: u16, proxy_port: u16) -> Vec<Rule> {
    vec![
        nat(&format!(
            "-A PREROUTING -p tcp --dport {app_port} -j REDIRECT --to-ports {proxy_port}"
        ))
        .0,
    ]
}

/// A ClusterIP Service as kube-proxy (iptables mode) programs it.
#[derive(Clone, Debug)]
pub struct ClusterIp {
    /// `namespace/name:port-name`, for comments and chain names.
    pub name: String,
    /// The Service address and port.
    pub vip: SocketAddr,
    /// Endpoints (pod address and target port).
    pub backends: Vec<SocketAddr>,
    /// The cluster's pod CIDR (kube-proxy's `--cluster-cidr`): connections from outside
    /// it are masqueraded.
    pub cluster_cidr: String,
}

/// kube-proxy's chain-name hash: 16 base32 characters of a hash of `parts`
/// (kube-proxy uses SHA-256; any stable hash gives the same shape).
pub fn chain_hash(parts: &[&str]) -> String {
    const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    let mut out = String::with_capacity(16);
    for round in 0u64..2 {
        for p in parts {
            for b in p.bytes().chain([0u8]) {
                h = (h ^ u64::from(b) ^ round).wrapping_mul(0x100_0000_01b3);
            }
        }
        for i in 0..8 {
            out.push(char::from(B32[((h >> (i * 5)) & 31) as usize]));
        }
    }
    out
}

/// The `nat` rules kube-proxy writes for `svc`, in an order `iptables -A` accepts
/// (chains created first). Entry points: `OUTPUT` and `PREROUTING` jump to
/// `KUBE-SERVICES`, `POSTROUTING` to `KUBE-POSTROUTING`, which masquerades what
/// `KUBE-MARK-MASQ` marked (0x4000): connections from outside the cluster CIDR, and an
/// endpoint reaching itself through the Service (hairpin). A pod of the cluster
/// reaching another pod is only DNATed.
pub fn kube_proxy_rules(svc: &ClusterIp) -> Vec<Rule> {
    let family = Family::of(svc.vip.ip());
    let host = |ip: IpAddr| format!("{ip}/{}", family.host_len());
    let (vip, port) = (host(svc.vip.ip()), svc.vip.port());
    let svc_chain = format!("KUBE-SVC-{}", chain_hash(&[&svc.name, "tcp"]));
    let comment_ip = format!("{} cluster IP", svc.name);
    // The Service's own match: its address and port, commented as kube-proxy does.
    let to_vip = |n: Nat| {
        n.then(&format!("-d {vip} -p tcp"))
            .comment(&comment_ip)
            .then(&format!("-m tcp --dport {port}"))
    };
    let mut r: Vec<Rule> = [
        nat("-N KUBE-SERVICES"),
        nat("-N KUBE-POSTROUTING"),
        nat("-N KUBE-MARK-MASQ"),
        nat(&format!("-N {svc_chain}")),
        nat("-A OUTPUT")
            .comment("kubernetes service portals")
            .then("-j KUBE-SERVICES"),
        nat("-A PREROUTING")
            .comment("kubernetes service portals")
            .then("-j KUBE-SERVICES"),
        nat("-A POSTROUTING")
            .comment("kubernetes postrouting rules")
            .then("-j KUBE-POSTROUTING"),
        nat("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"),
        nat("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN"),
        nat("-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0"),
        nat("-A KUBE-POSTROUTING")
            .comment("kubernetes service traffic requiring SNAT")
            .then("-j MASQUERADE --random-fully"),
        to_vip(nat("-A KUBE-SERVICES")).then(&format!("-j {svc_chain}")),
        to_vip(nat(&format!("-A {svc_chain} ! -s {}", svc.cluster_cidr))).then("-j KUBE-MARK-MASQ"),
    ]
    .into_iter()
    .map(|n| n.0)
    .collect();
    let n = svc.backends.len();
    for (i, be) in svc.backends.iter().enumerate() {
        let sep = format!(
            "KUBE-SEP-{}",
            chain_hash(&[&svc.name, "tcp", &be.to_string()])
        );
        r.push(nat(&format!("-N {sep}")).0);
        r.push(
            nat(&format!("-A {sep} -s {}", host(be.ip())))
                .comment(&svc.name)
                .then("-j KUBE-MARK-MASQ")
                .0,
        );
        r.push(
            nat(&format!("-A {sep} -p tcp"))
                .comment(&svc.name)
                .then(&format!("-m tcp -j DNAT --to-destination {be}"))
                .0,
        );
        // Endpoint i of n is taken with probability 1/(n-i), the last always.
        let mut jump = nat(&format!("-A {svc_chain}")).comment(&format!("{} -> {be}", svc.name));
        if i + 1 < n {
            let prob = 1.0 / (n - i) as f64;
            jump = jump.then(&format!(
                "-m statistic --mode random --probability {prob:.10}"
            ));
        }
        r.push(jump.then(&format!("-j {sep}")).0);
    }
    r
}

/// A rule inserted at the head of its chain in a namespace, deleted again by
/// [`Inserted::remove`] or, failing that, on drop.
pub struct Inserted<'a> {
    ns: &'a Netns,
    family: Family,
    rule: Rule,
    live: bool,
}

/// Inserts `rule` (`CHAIN match... -j TARGET`) at the head of its chain in `ns`.
pub fn insert<'a>(ns: &'a Netns, family: Family, rule: &[&str]) -> Result<Inserted<'a>> {
    let rule = self::rule(rule);
    let mut args = vec!["-I".to_owned()];
    args.extend(rule.iter().cloned());
    run(ns, family, &args).with_context(|| format!("in netns {}", ns.name()))?;
    Ok(Inserted {
        ns,
        family,
        rule,
        live: true,
    })
}

impl Inserted<'_> {
    /// Deletes the rule.
    pub fn remove(mut self) -> Result<()> {
        self.live = false;
        let mut args = vec!["-D".to_owned()];
        args.extend(self.rule.iter().cloned());
        run(self.ns, self.family, &args).map(drop)
    }
}

impl Drop for Inserted<'_> {
    fn drop(&mut self) {
        if self.live {
            let mut args = vec!["-D".to_owned()];
            args.extend(self.rule.iter().cloned());
            let _ = run(self.ns, self.family, &args);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_rules() {
        assert_eq!(
            sidecar_outbound(5801, 0x539, 15001)[0].join(" "),
            "-t nat -A OUTPUT -p tcp --dport 5801 -m mark ! --mark 0x539 -j REDIRECT --to-ports 15001"
        );
        assert_eq!(
            sidecar_inbound(5801, 15006)[0].join(" "),
            "-t nat -A PREROUTING -p tcp --dport 5801 -j REDIRECT --to-ports 15006"
        );
    }

    #[test]
    fn chain_hashes_are_stable_and_distinct() {
        let a = chain_hash(&["default/web:http", "tcp"]);
        assert_eq!(a.len(), 16);
        assert_eq!(a, chain_hash(&["default/web:http", "tcp"]));
        assert_ne!(a, chain_hash(&["default/web:https", "tcp"]));
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        );
    }

    #[test]
    fn kube_proxy_chains() {
        let svc = ClusterIp {
            name: "default/web:http".into(),
            vip: "10.96.1.10:8080".parse().unwrap(),
            backends: vec![
                "10.88.1.2:5701".parse().unwrap(),
                "10.88.1.3:5701".parse().unwrap(),
            ],
            cluster_cidr: "10.88.1.0/24".into(),
        };
        let rules: Vec<String> = kube_proxy_rules(&svc).iter().map(|r| r.join(" ")).collect();
        // Every chain is created before a rule jumps to it.
        let mut created = vec![
            "OUTPUT".to_owned(),
            "PREROUTING".to_owned(),
            "POSTROUTING".to_owned(),
        ];
        for r in &rules {
            let w: Vec<&str> = r.split(' ').collect();
            if w[2] == "-N" {
                created.push(w[3].to_owned());
                continue;
            }
            assert!(created.iter().any(|c| c == w[3]), "{r}");
            if let Some(j) = w.iter().position(|x| *x == "-j")
                && w[j + 1].starts_with("KUBE-")
            {
                assert!(created.iter().any(|c| c == w[j + 1]), "{r}");
            }
        }
        let dnat: Vec<&String> = rules.iter().filter(|r| r.contains("DNAT")).collect();
        assert_eq!(dnat.len(), 2);
        assert!(dnat[0].ends_with("--to-destination 10.88.1.2:5701"));
        assert!(
            rules
                .iter()
                .any(|r| r.contains("-d 10.96.1.10/32 -p tcp") && r.contains("--dport 8080"))
        );
        assert!(rules.iter().any(|r| r.contains("! -s 10.88.1.0/24")));
        // The first endpoint by chance, the last always.
        let jumps: Vec<&String> = rules
            .iter()
            .filter(|r| r.contains("-j KUBE-SEP-") && r.contains("-A KUBE-SVC-"))
            .collect();
        assert_eq!(jumps.len(), 2);
        assert!(jumps[0].contains("--probability 0.5000000000"));
        assert!(!jumps[1].contains("statistic"));
    }

    #[test]
    fn ipv6_service_uses_128() {
        let svc = ClusterIp {
            name: "default/web:http".into(),
            vip: "[fd96::10]:80".parse().unwrap(),
            backends: vec!["[fd88::2]:5701".parse().unwrap()],
            cluster_cidr: "fd88::/64".into(),
        };
        let rules: Vec<String> = kube_proxy_rules(&svc).iter().map(|r| r.join(" ")).collect();
        assert!(rules.iter().any(|r| r.contains("-d fd96::10/128")));
        assert!(
            rules
                .iter()
                .any(|r| r.contains("--to-destination [fd88::2]:5701"))
        );
    }
}
