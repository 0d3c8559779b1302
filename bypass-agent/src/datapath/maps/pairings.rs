//! The pairing maps: connecting sockets, links of paired connections, cut links.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use aya::maps::{HashMap, Map, MapData, SockHash};
use bypass_common::{Connector, Endpoint, IpKey, Link, SockKey, ip_key, names};

use crate::error::AgentError;

/// The pairing maps: connecting sockets not yet paired, and the links of paired
/// connections. Their entries are removed when the connecting socket closes, by the
/// sock_ops state callback, which only runs while sock_ops is attached.
pub struct Pairings {
    connectors: HashMap<MapData, Endpoint, Connector>,
    links: HashMap<MapData, SockKey, Link>,
    cut: HashMap<MapData, SockKey, u8>,
}

impl Pairings {
    /// Wraps the three maps.
    pub fn new(connectors: Map, links: Map, cut: Map) -> Result<Self, AgentError> {
        Ok(Self {
            connectors: super::typed(connectors, names::MAP_CONNECTORS)?,
            links: super::typed(links, names::MAP_LINKS)?,
            cut: super::typed(cut, names::MAP_CUT)?,
        })
    }

    /// Entries in the two maps.
    pub fn len(&self) -> (usize, usize) {
        (
            self.connectors.keys().filter(Result::is_ok).count(),
            self.links.keys().filter(Result::is_ok).count(),
        )
    }

    /// Every link, by its client's key.
    pub fn links(&self) -> Vec<(SockKey, Link)> {
        // Each key once: a walk whose current key is deleted starts again from the first
        // (the kernel's get-next-key), and would hand the links before it twice.
        let once: std::collections::HashMap<SockKey, Link> =
            self.links.iter().filter_map(Result::ok).collect();
        once.into_iter().collect()
    }

    /// Cuts the connections that touch `excluded` addresses — at either end, or as the
    /// pod a loopback end's namespace belongs to (`pod_netns`: namespace cookie → the
    /// pod address learned there): their link keys go into the cut map. The caller
    /// then bumps the cut generation; each socket of such a connection sees the cut at
    /// its next send or read, and the connection leaves the SockHash (so an opt-out
    /// also moves established connections to plain TCP). Returns how many were cut.
    ///
    /// A namespace is a pod's when the datapath learned it there (`pod_netns`, an LRU
    /// that pod churn evicts from) or the agent's scan saw it own the address
    /// (`owners`: every pod namespace of the node, whatever the LRU kept, and those
    /// that owned an address before).
    pub fn cut(
        &mut self,
        excluded: &BTreeSet<IpAddr>,
        pod_netns: &HashMap<MapData, u64, IpKey>,
        owners: &[(IpAddr, u64)],
        generations: (u32, u32),
    ) -> Result<CutMap, AgentError> {
        if excluded.is_empty() {
            return Ok(CutMap::Held(0));
        }
        let keys: std::collections::HashSet<IpKey> =
            excluded.iter().map(|ip| ip_key(*ip)).collect();
        let namespaces = excluded_namespaces(
            pod_netns
                .iter()
                .filter_map(Result::ok)
                .chain(owners.iter().map(|(ip, netns)| (*netns, ip_key(*ip)))),
            &keys,
        );
        let entries = self.links_not_cut(generations);
        self.cut_keys(links_to_cut(&entries, &keys, &namespaces), generations)
    }

    /// Every link not cut already ([`Link::already_cut`] at `generations`, the cut
    /// generation and the last cut of everything's): cutting one again would only take
    /// another entry of the cut map, which a pod's own cut connections could fill
    /// however often their links are cut.
    fn links_not_cut(&self, (generation, all): (u32, u32)) -> Vec<(SockKey, Link)> {
        self.links()
            .into_iter()
            .filter(|(_, link)| !link.already_cut(generation, all))
            .collect()
    }

    /// Cuts the links one of whose sides no longer `stands` where sock_ops paired it
    /// ([`links_astray`]).
    pub fn cut_astray(
        &mut self,
        stands: impl Fn(&SockKey) -> bool,
        generations: (u32, u32),
    ) -> Result<CutMap, AgentError> {
        let astray = links_astray(&self.links_not_cut(generations), stands);
        self.cut_keys(astray, generations)
    }

    /// Puts the link keys `keys` into the cut map; counts those already there too: an
    /// entry can outlive its connection, and a new connection under the same key checks
    /// only generations after its insert, so every cut that matches a link must move the
    /// generation. An insert the map refuses first makes room ([`Pairings::free_cut`]) and
    /// is tried once more; refused again, the cut is [`CutMap::Full`].
    fn cut_keys(
        &mut self,
        keys: impl IntoIterator<Item = SockKey>,
        generations: (u32, u32),
    ) -> Result<CutMap, AgentError> {
        let mut cut = 0;
        let mut freed = false;
        for key in keys {
            cut += 1;
            if self.cut.get(&key, 0).is_ok() {
                continue;
            }
            let mut inserted = self.cut.insert(key, 0, 0);
            if inserted.is_err() && !freed {
                freed = true;
                let needless = self.free_cut(generations);
                tracing::info!(
                    freed = needless,
                    "the cut map was full: freed the entries of connections cut already or gone"
                );
                inserted = self.cut.insert(key, 0, 0);
            }
            if let Err(e) = inserted {
                return Ok(CutMap::Full(AgentError::map(
                    names::MAP_CUT,
                    "add a cut",
                    e,
                )));
            }
        }
        Ok(CutMap::Held(cut))
    }

    /// Removes the cut map's entries no socket needs: those whose link is gone, and
    /// those whose link is cut already at `generations` ([`Link::already_cut`]: a socket
    /// saw the cut, or a cut of everything after the pairing cuts both sockets whatever
    /// the map holds). Idle connections that a cut of everything cut never check their
    /// cut, so without this their entries would keep the map full, and every later cut
    /// that needs one would cut everything again, for as long as they stay open.
    /// Returns how many went; a delete that fails leaves its entry (the retry then
    /// ends in a cut of everything, never in no cut).
    fn free_cut(&mut self, (generation, all): (u32, u32)) -> usize {
        let links: std::collections::HashMap<SockKey, Link> = self.links().into_iter().collect();
        let needless: Vec<SockKey> = self
            .cut
            .keys()
            .filter_map(Result::ok)
            .filter(|key| {
                links
                    .get(key)
                    .is_none_or(|link| link.already_cut(generation, all))
            })
            .collect();
        needless
            .iter()
            .filter(|key| self.cut.remove(key).is_ok())
            .count()
    }

    /// Removes the entries of connecting sockets that are no longer in the SockHash:
    /// they closed while sock_ops was detached, so no state callback removed them. Only
    /// safe while sock_ops is detached (an insert adds the socket before its entries).
    /// Returns how many went.
    /// The open sides' counts of the links it removes go to their pods' entries in
    /// `pods` (their sockets' closes were not seen, so sock_ops added nothing).
    pub fn sweep(
        &mut self,
        sockets: &SockHash<MapData, SockKey>,
        pods: &mut super::PodCountsMap,
    ) -> Result<usize, AgentError> {
        // A user-space lookup in a SockHash with 4-byte values fails (net/core/sock_map.c,
        // sock_map_lookup_sys wants 8): compare against its keys instead.
        let alive: std::collections::HashSet<SockKey> =
            sockets.keys().filter_map(Result::ok).collect();
        let connectors: Vec<(Endpoint, SockKey)> = self
            .connectors
            .iter()
            .filter_map(Result::ok)
            .map(|(end, c)| (end, c.key))
            .collect();
        let links: Vec<SockKey> = self.links.keys().filter_map(Result::ok).collect();
        let mut swept = 0;
        for (end, key) in connectors {
            if !alive.contains(&key) {
                swept += gone(self.connectors.remove(&end), names::MAP_CONNECTORS)?;
            }
        }
        for key in stale_keys(&links, |k| alive.contains(k)) {
            if let Ok(link) = self.links.get(&key, 0) {
                for (netns, counts) in super::live_counts(&[(key, link)]) {
                    pods.credit_detached(netns, counts)?;
                }
            }
            swept += gone(self.links.remove(&key), names::MAP_LINKS)?;
        }
        Ok(swept)
    }
}

/// What the cut map did with a cut.
#[derive(Debug)]
pub enum CutMap {
    /// It holds every connection cut: this many matched.
    Held(usize),
    /// It refused one (full, or another failure): the cut needs a cut of everything
    /// ([`bypass_common::control::SLOT_CUT_ALL`]).
    Full(AgentError),
}

/// 1 if an entry was removed, 0 if it was already gone.
fn gone(r: Result<(), aya::maps::MapError>, map: &str) -> Result<usize, AgentError> {
    match r {
        Ok(()) => Ok(1),
        Err(aya::maps::MapError::KeyNotFound) => Ok(0),
        Err(e) => Err(AgentError::map(map, "sweep an entry", e)),
    }
}

/// The namespaces (cookies) of the pods whose address is in `excluded`, from
/// `(namespace, pod address)` pairs.
pub fn excluded_namespaces(
    pods: impl Iterator<Item = (u64, IpKey)>,
    excluded: &std::collections::HashSet<IpKey>,
) -> std::collections::HashSet<u64> {
    pods.filter(|(_, ip)| excluded.contains(ip))
        .map(|(netns, _)| netns)
        .collect()
}

/// The links (by their client key) whose connection touches an address in `excluded`:
/// an end of either socket, or either socket's namespace is in `namespaces` (the
/// excluded pods' own).
pub fn links_to_cut(
    entries: &[(SockKey, Link)],
    excluded: &std::collections::HashSet<IpKey>,
    namespaces: &std::collections::HashSet<u64>,
) -> Vec<SockKey> {
    let touches = |k: &SockKey| {
        excluded.contains(&k.local_ip)
            || excluded.contains(&k.remote_ip)
            || namespaces.contains(&k.netns)
    };
    entries
        .iter()
        .filter(|(client, link)| touches(client) || touches(&link.server))
        .map(|(client, _)| *client)
        .collect()
}

/// The links (by their client key) one of whose sides does not `stand` (pure).
pub fn links_astray(
    entries: &[(SockKey, Link)],
    stands: impl Fn(&SockKey) -> bool,
) -> Vec<SockKey> {
    entries
        .iter()
        .filter(|(client, link)| !stands(client) || !stands(&link.server))
        .map(|(client, _)| *client)
        .collect()
}

/// Whether a socket of a link (`side`) still stands where sock_ops paired it (pure),
/// with the ownership check on: on a pod address that is a pod's now (`is_pod`: the
/// pod maps less the excluded) and its namespace's own in the owners map (`owners`); on
/// loopback, in a namespace whose pod address as the datapath learned it (`learned`,
/// namespace → address, an LRU) is a pod's and still its own, or, where the datapath
/// forgot the namespace, that owns some pod address (`owning`: the namespaces that do).
pub fn side_stands(
    side: &SockKey,
    is_pod: &dyn Fn(IpAddr) -> bool,
    owners: &BTreeMap<IpAddr, u64>,
    learned: &std::collections::HashMap<u64, IpAddr>,
    owning: &std::collections::HashSet<u64>,
) -> bool {
    let own = |ip: IpAddr| is_pod(ip) && owners.get(&ip) == Some(&side.netns);
    if bypass_common::addr::is_loopback(&side.local_ip) {
        return match learned.get(&side.netns) {
            Some(ip) => own(*ip),
            None => owning.contains(&side.netns),
        };
    }
    own(bypass_common::addr::ip_from_key(side.local_ip).to_canonical())
}

/// Whether a link's `side` still has a pod address (`is_pod`), for the ownership check
/// off (`--netns-owners=any`, where [`side_stands`] does not apply) (pure): its own
/// address, or, on loopback, the pod address the datapath learned in its namespace
/// (`learned`; a namespace it forgot cannot be judged, and stands).
pub fn side_is_pod(
    side: &SockKey,
    is_pod: &dyn Fn(IpAddr) -> bool,
    learned: &std::collections::HashMap<u64, IpAddr>,
) -> bool {
    if bypass_common::addr::is_loopback(&side.local_ip) {
        return learned.get(&side.netns).is_none_or(|ip| is_pod(*ip));
    }
    is_pod(bypass_common::addr::ip_from_key(side.local_ip).to_canonical())
}

/// The namespaces that own a pod address (`is_pod`) in `owners` (pure), for
/// [`side_stands`].
pub fn owning_namespaces(
    owners: &BTreeMap<IpAddr, u64>,
    is_pod: &dyn Fn(IpAddr) -> bool,
) -> std::collections::HashSet<u64> {
    owners
        .iter()
        .filter(|(ip, _)| is_pod(**ip))
        .map(|(_, netns)| *netns)
        .collect()
}

/// The keys whose socket is gone, in the order given.
pub fn stale_keys(keys: &[SockKey], alive: impl Fn(&SockKey) -> bool) -> Vec<SockKey> {
    keys.iter().copied().filter(|k| !alive(k)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_are_those_gone() {
        let k = |p| SockKey {
            local_port: p,
            ..SockKey::default()
        };
        let keys = [k(1), k(2), k(3)];
        assert_eq!(
            stale_keys(&keys, |key| key.local_port == 2),
            vec![k(1), k(3)]
        );
        assert!(stale_keys(&keys, |_| true).is_empty());
    }

    #[test]
    fn a_side_stands_only_where_it_was_paired() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let side = |local: &str, netns| {
            SockKey::new(ip_key(ip(local)), ip_key(ip("10.0.0.9")), 1, 2, netns)
        };
        // 10.0.0.3 opted out: no pod's, though its namespace holds it.
        let pods = |a: IpAddr| a != ip("10.0.0.3");
        let owners = BTreeMap::from([
            (ip("10.0.0.1"), 7),
            (ip("10.0.0.3"), 9),
            (ip("fd00::1"), 7),
            (ip("10.0.0.4"), 4),
        ]);
        let owning = owning_namespaces(&owners, &pods);
        assert_eq!(owning, [7, 4].into());
        // Namespace 7 learned 10.0.0.1, 4 learned 10.0.0.2 (which it lost); 9 is forgotten.
        let learned = std::collections::HashMap::from([(7, ip("10.0.0.1")), (4, ip("10.0.0.2"))]);
        let stands =
            |local, netns| side_stands(&side(local, netns), &pods, &owners, &learned, &owning);
        assert!(stands("10.0.0.1", 7) && stands("fd00::1", 7));
        // Another namespace's, nobody's, no pod's.
        assert!(!stands("10.0.0.1", 8));
        assert!(!stands("10.0.0.2", 7));
        assert!(!stands("10.0.0.3", 9));
        // Loopback: the address the namespace was learned from, still its own...
        assert!(stands("127.0.0.1", 7) && stands("::1", 7));
        // ...not another it owns (it lost the learned one)...
        assert!(!stands("127.0.0.1", 4));
        // ...and, forgotten, a namespace that owns a pod address (an opted-out one is not).
        assert!(!stands("127.0.0.1", 9));
        assert!(!stands("127.0.0.1", 8));
        let forgot = std::collections::HashMap::new();
        assert!(side_stands(
            &side("127.0.0.1", 4),
            &pods,
            &owners,
            &forgot,
            &owning
        ));
        // A link goes when either side does not stand.
        let link = |client: SockKey, server: SockKey| {
            (
                client,
                Link {
                    server,
                    ..Link::default()
                },
            )
        };
        let entries = [
            link(side("10.0.0.1", 7), side("10.0.0.5", 5)),
            link(side("10.0.0.5", 5), side("10.0.0.1", 7)),
            link(side("10.0.0.5", 5), side("10.0.0.6", 6)),
        ];
        assert_eq!(
            links_astray(&entries, |k| k.netns != 7),
            vec![entries[0].0, entries[1].0]
        );
        assert!(links_astray(&entries, |_| true).is_empty());
    }

    #[test]
    fn without_owners_a_side_stands_while_its_address_is_a_pod_s() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let side = |local: &str, netns| {
            SockKey::new(ip_key(ip(local)), ip_key(ip("10.0.0.9")), 1, 2, netns)
        };
        // 10.0.0.3 opted out, 10.0.0.4 no longer given as a pod's.
        let pods = |a: IpAddr| a == ip("10.0.0.1") || a == ip("fd00::1");
        // Namespace 7 learned 10.0.0.1, 9 learned 10.0.0.3; 4 is forgotten.
        let learned = std::collections::HashMap::from([(7, ip("10.0.0.1")), (9, ip("10.0.0.3"))]);
        let is_pod = |local, netns| side_is_pod(&side(local, netns), &pods, &learned);
        // Any namespace may use a pod address; not one that is no pod's.
        assert!(is_pod("10.0.0.1", 7) && is_pod("10.0.0.1", 8) && is_pod("fd00::1", 9));
        assert!(!is_pod("10.0.0.3", 9) && !is_pod("10.0.0.4", 4));
        // Loopback: by the address its namespace was learned from; a forgotten one stands.
        assert!(is_pod("127.0.0.1", 7) && is_pod("::1", 7));
        assert!(!is_pod("127.0.0.1", 9));
        assert!(is_pod("127.0.0.1", 4));
    }

    #[test]
    fn links_touching_excluded_addresses_are_cut() {
        let ip = |s: &str| ip_key(s.parse().unwrap());
        let lo = ip("127.0.0.1");
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let key = |l, r, netns| SockKey::new(l, r, 1, 2, netns);
        let link = |server: SockKey| Link {
            server,
            ..Link::default()
        };
        let entries = [
            (key(a, b, 10), link(key(b, a, 20))),
            (key(a, c, 10), link(key(c, a, 30))),
            (key(lo, lo, 20), link(key(lo, lo, 20))),
            (key(lo, lo, 30), link(key(lo, lo, 30))),
        ];
        let excluded: std::collections::HashSet<IpKey> = [b].into();
        let namespaces = excluded_namespaces([(10, a), (20, b), (30, c)].into_iter(), &excluded);
        assert_eq!(
            links_to_cut(&entries, &excluded, &namespaces),
            vec![key(a, b, 10), key(lo, lo, 20)],
            "pod to pod with b, and b's own loopback; not a to c, nor c's loopback"
        );
        assert!(links_to_cut(&entries, &Default::default(), &Default::default()).is_empty());
    }

    #[test]
    fn a_namespace_is_excluded_from_either_record() {
        let ip = |s: &str| ip_key(s.parse().unwrap());
        let (b4, b6, c) = (ip("10.0.0.2"), ip("fd00::2"), ip("10.0.0.3"));
        let excluded: std::collections::HashSet<IpKey> = [b4, b6].into();
        // The datapath's record lost b's namespace (20); the scan's has it, under its
        // IPv6 address; a namespace holding both addresses is one namespace.
        let pairs = [(30, c), (20, b6), (21, b4), (21, b6)];
        assert_eq!(
            excluded_namespaces(pairs.into_iter(), &excluded),
            [20, 21].into()
        );
    }
}
