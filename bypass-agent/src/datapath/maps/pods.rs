//! Per-pod accounting: what each pod's connections carried through the bypass, by the
//! network namespace that owns the pod's addresses. Closed connections are in the
//! pod counts map ([`names::MAP_POD_COUNTS`], added to by sock_ops at close), open
//! ones in their links (`Link::tx_redir`); a reading is both, in that order.

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::{HashMap, Map, MapData};
use bypass_common::{Link, PodCounts, SockKey, names, state::link_state, state::side};

use crate::error::AgentError;

/// Network namespace cookie → its pod's closed connections' counts.
pub struct PodCountsMap(HashMap<MapData, u64, PodCounts>);

impl PodCountsMap {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(super::typed(map, names::MAP_POD_COUNTS)?))
    }

    /// Its entries now.
    pub fn list(&self) -> BTreeMap<u64, PodCounts> {
        self.0.iter().filter_map(Result::ok).collect()
    }

    /// Removes the entries of namespaces not in `keep` (those gone, with their pods).
    /// Returns how many went.
    pub fn prune(&mut self, keep: &BTreeSet<u64>) -> Result<usize, AgentError> {
        let gone: Vec<u64> = self
            .0
            .keys()
            .filter_map(Result::ok)
            .filter(|n| !keep.contains(n))
            .collect();
        let mut removed = 0;
        for netns in gone {
            match self.0.remove(&netns) {
                Ok(()) => removed += 1,
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => {
                    let what = "remove a gone pod's entry";
                    return Err(AgentError::map(names::MAP_POD_COUNTS, what, e));
                }
            }
        }
        Ok(removed)
    }

    /// Adds `counts` to namespace `netns`'s entry from user space. A read-modify-write:
    /// only while sock_ops, the map's other writer, is detached (the sweep of links
    /// whose sockets closed unseen).
    pub fn credit_detached(&mut self, netns: u64, counts: PodCounts) -> Result<(), AgentError> {
        let have = self.0.get(&netns, 0).unwrap_or_default();
        let sum = PodCounts {
            bytes: have.bytes.wrapping_add(counts.bytes),
            connections: have.connections.wrapping_add(counts.connections),
        };
        self.0
            .insert(netns, sum, 0)
            .map_err(|e| AgentError::map(names::MAP_POD_COUNTS, "add counts", e))
    }
}

/// What the open sides of `links` (by client key) carry, by network namespace (pure):
/// each side whose socket has not closed (no closed bit: a closed side's counts are in
/// the pod counts map) its `tx_redir`, and its connection as
/// [`PodCounts::counts_connection`] says.
pub fn live_counts(links: &[(SockKey, Link)]) -> BTreeMap<u64, PodCounts> {
    let mut out: BTreeMap<u64, PodCounts> = BTreeMap::new();
    for (client, link) in links {
        for (s, netns) in [
            (side::CLIENT, client.netns),
            (side::SERVER, link.server.netns),
        ] {
            if link.state & link_state::closed(s) != 0 {
                continue;
            }
            let e = out.entry(netns).or_default();
            e.bytes = e.bytes.wrapping_add(link.tx_redir[side::index(s)]);
            e.connections += u64::from(PodCounts::counts_connection(s, netns, client.netns));
        }
    }
    out
}

/// `closed` and `live` summed by namespace (pure).
pub fn add_counts(
    mut closed: BTreeMap<u64, PodCounts>,
    live: BTreeMap<u64, PodCounts>,
) -> BTreeMap<u64, PodCounts> {
    for (netns, c) in live {
        let e = closed.entry(netns).or_default();
        e.bytes = e.bytes.wrapping_add(c.bytes);
        e.connections = e.connections.wrapping_add(c.connections);
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(netns: u64, port: u32) -> SockKey {
        SockKey {
            netns,
            local_port: port,
            ..SockKey::default()
        }
    }

    fn link(client_netns: u64, server_netns: u64, tx: [u64; 2], state: u64) -> (SockKey, Link) {
        (
            key(client_netns, 1),
            Link {
                server: key(server_netns, 2),
                tx_redir: tx,
                state,
                ..Link::default()
            },
        )
    }

    #[test]
    fn open_sides_count_closed_sides_are_the_maps() {
        let links = [
            // Pod 10 to pod 20, both open.
            link(10, 20, [100, 7], 0),
            // Pod 10 to pod 20, the client closed: its side is in the map already.
            link(10, 20, [50, 5], link_state::CLOSED_CLIENT),
            // Loopback (or a sidecar's redirect) inside pod 30: one connection, both
            // sides' bytes.
            link(30, 30, [3, 4], 0),
        ];
        let live = live_counts(&links);
        assert_eq!(
            live,
            BTreeMap::from([
                (
                    10,
                    PodCounts {
                        bytes: 100,
                        connections: 1
                    }
                ),
                (
                    20,
                    PodCounts {
                        bytes: 12,
                        connections: 2
                    }
                ),
                (
                    30,
                    PodCounts {
                        bytes: 7,
                        connections: 1
                    }
                ),
            ])
        );
        let closed = BTreeMap::from([
            (
                10,
                PodCounts {
                    bytes: 50,
                    connections: 1,
                },
            ),
            (
                40,
                PodCounts {
                    bytes: 1,
                    connections: 1,
                },
            ),
        ]);
        let all = add_counts(closed, live);
        assert_eq!(
            all[&10],
            PodCounts {
                bytes: 150,
                connections: 2
            }
        );
        assert_eq!(
            all[&40],
            PodCounts {
                bytes: 1,
                connections: 1
            }
        );
        assert_eq!(all.len(), 4);
    }

    #[test]
    fn one_connection_per_pod_whichever_side_closes_first() {
        // The sum over the connection's life is the same before and after each close.
        let open = live_counts(&[link(1, 2, [9, 8], 0)]);
        for closed_side in [side::CLIENT, side::SERVER] {
            let netns = if closed_side == side::CLIENT { 1 } else { 2 };
            let own = if closed_side == side::CLIENT { 9 } else { 8 };
            let map = BTreeMap::from([(
                netns,
                PodCounts {
                    bytes: own,
                    connections: u64::from(PodCounts::counts_connection(closed_side, netns, 1)),
                },
            )]);
            let after = add_counts(
                map,
                live_counts(&[link(1, 2, [9, 8], link_state::closed(closed_side))]),
            );
            assert_eq!(after, open);
        }
    }
}
