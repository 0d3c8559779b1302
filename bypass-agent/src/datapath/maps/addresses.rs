//! The address maps: pod CIDRs, exact pod addresses, excluded addresses, Service
//! CIDRs and Service backends, as one view the sync plan is applied to.

use std::{collections::BTreeSet, net::IpAddr};

use aya::maps::{
    HashMap, Map, MapData,
    lpm_trie::{Key, LpmTrie},
};
use bypass_common::{IpKey, addr::ip_from_key, ip_key, key::ServiceBackend, names};

use crate::{backend::Backend, cidr::Cidr, error::AgentError};

/// The address maps: pod CIDRs, exact pod addresses, excluded addresses, Service
/// (ClusterIP) CIDRs, Service backends.
pub struct PodMaps {
    cidrs: Trie,
    addrs: AddrSet,
    excluded: AddrSet,
    services: Trie,
    backends: HashMap<MapData, ServiceBackend, u8>,
}

impl PodMaps {
    /// Wraps the five maps.
    pub fn new(
        cidrs: Map,
        addrs: Map,
        excluded: Map,
        services: Map,
        backends: Map,
    ) -> Result<Self, AgentError> {
        Ok(Self {
            backends: super::typed(backends, names::MAP_SERVICE_BACKENDS)?,
            cidrs: super::typed(cidrs, names::MAP_POD_CIDRS)?,
            addrs: AddrSet::new(addrs, names::MAP_POD_ADDRS, "pod")?,
            excluded: AddrSet::new(excluded, names::MAP_EXCLUDED_ADDRS, "excluded")?,
            services: super::typed(services, names::MAP_SERVICE_CIDRS)?,
        })
    }

    /// Adds an address that is never a pod address (an opted-out pod's).
    pub fn insert_excluded(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.excluded.insert(ip)
    }

    /// Removes an excluded address.
    pub fn remove_excluded(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.excluded.remove(ip)
    }

    /// The excluded addresses in the map now.
    pub fn excluded(&self) -> BTreeSet<IpAddr> {
        self.excluded.list()
    }

    /// Adds a Service (ClusterIP) CIDR.
    pub fn insert_service_cidr(&mut self, cidr: &Cidr) -> Result<(), AgentError> {
        trie_insert(
            &mut self.services,
            cidr,
            "Service",
            names::MAP_SERVICE_CIDRS,
        )
    }

    /// Removes a Service CIDR.
    pub fn remove_service_cidr(&mut self, cidr: &Cidr) -> Result<(), AgentError> {
        trie_remove(
            &mut self.services,
            cidr,
            "Service",
            names::MAP_SERVICE_CIDRS,
        )
    }

    /// The Service CIDRs in the trie now.
    pub fn service_cidrs(&self) -> BTreeSet<Cidr> {
        trie_cidrs(&self.services)
    }

    /// Adds a Service backend.
    pub fn insert_service_backend(&mut self, b: &Backend) -> Result<(), AgentError> {
        self.backends.insert(b.key(), 1, 0).map_err(|e| {
            AgentError::map(
                names::MAP_SERVICE_BACKENDS,
                format_args!(
                    "insert Service backend {b} (full at {} entries? keep fewer Service ports on this node's pods)",
                    names::MAX_SERVICE_BACKENDS
                ),
                e,
            )
        })
    }

    /// Removes a Service backend.
    pub fn remove_service_backend(&mut self, b: &Backend) -> Result<(), AgentError> {
        match self.backends.remove(&b.key()) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(AgentError::map(
                names::MAP_SERVICE_BACKENDS,
                format_args!("remove Service backend {b}"),
                e,
            )),
        }
    }

    /// The Service backends in the map now.
    pub fn service_backends(&self) -> BTreeSet<Backend> {
        self.backends
            .keys()
            .filter_map(Result::ok)
            .filter_map(|k| Backend::from_key(&k))
            .collect()
    }

    /// Adds a pod CIDR.
    pub fn insert_cidr(&mut self, cidr: &Cidr) -> Result<(), AgentError> {
        trie_insert(&mut self.cidrs, cidr, "pod", names::MAP_POD_CIDRS)
    }

    /// Removes a pod CIDR.
    pub fn remove_cidr(&mut self, cidr: &Cidr) -> Result<(), AgentError> {
        trie_remove(&mut self.cidrs, cidr, "pod", names::MAP_POD_CIDRS)
    }

    /// Adds a pod address.
    pub fn insert_addr(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.addrs.insert(ip)
    }

    /// Removes a pod address.
    pub fn remove_addr(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.addrs.remove(ip)
    }

    /// The CIDRs in the trie now.
    pub fn cidrs(&self) -> BTreeSet<Cidr> {
        trie_cidrs(&self.cidrs)
    }

    /// The exact addresses in the map now.
    pub fn addrs(&self) -> BTreeSet<IpAddr> {
        self.addrs.list()
    }
}

/// A set of addresses (`IpKey` → unused `u8`).
struct AddrSet {
    map: HashMap<MapData, IpKey, u8>,
    name: &'static str,
    what: &'static str,
}

impl AddrSet {
    fn new(map: Map, name: &'static str, what: &'static str) -> Result<Self, AgentError> {
        Ok(Self {
            map: super::typed(map, name)?,
            name,
            what,
        })
    }

    fn insert(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.map.insert(ip_key(ip), 1, 0).map_err(|e| {
            AgentError::map(self.name, format_args!("add {} address {ip}", self.what), e)
        })
    }

    fn remove(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.map.remove(&ip_key(ip)).map_err(|e| {
            AgentError::map(
                self.name,
                format_args!("remove {} address {ip}", self.what),
                e,
            )
        })
    }

    fn list(&self) -> BTreeSet<IpAddr> {
        self.map
            .keys()
            .filter_map(Result::ok)
            .map(ip_from_key)
            .collect()
    }
}

type Trie = LpmTrie<MapData, [u8; 16], u8>;

fn trie_insert(trie: &mut Trie, cidr: &Cidr, what: &str, map: &str) -> Result<(), AgentError> {
    let (len, bytes) = cidr.trie_key();
    trie.insert(&Key::new(len, bytes), 1, 0)
        .map_err(|e| AgentError::map(map, format_args!("add {what} CIDR {cidr}"), e))
}

fn trie_remove(trie: &mut Trie, cidr: &Cidr, what: &str, map: &str) -> Result<(), AgentError> {
    let (len, bytes) = cidr.trie_key();
    trie.remove(&Key::new(len, bytes))
        .map_err(|e| AgentError::map(map, format_args!("remove {what} CIDR {cidr}"), e))
}

fn trie_cidrs(trie: &Trie) -> BTreeSet<Cidr> {
    trie.keys()
        .filter_map(Result::ok)
        .filter_map(|k| Cidr::from_trie_key(k.prefix_len(), k.data()))
        .collect()
}
