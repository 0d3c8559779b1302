//! Pinned BPF maps read (and a control slot written) straight from the kernel through
//! aya, typed by the shared `bypass_common` layouts, so a test can see what the maps
//! hold without trusting the agent's own report. SockHash values are not read: from
//! user space a lookup answers with a socket cookie only for 8-byte values.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData, SockHash},
};
use bypass_common::SockKey;

/// At most this many keys are read (a map changing under the walk could go on).
pub const MAX_KEYS: usize = 1 << 20;

fn open(pin: &Path) -> Result<Map> {
    let data = MapData::from_pin(pin)
        .with_context(|| format!("open the map pinned at {}", pin.display()))?;
    Map::from_map_data(data).with_context(|| format!("read the map pinned at {}", pin.display()))
}

/// Collects keys from a walk, each once: a key deleted under the walk restarts it from
/// the first key, so a repeat ends it.
fn collect<K: Eq + std::hash::Hash + Clone>(
    pin: &Path,
    keys: impl Iterator<Item = Result<K, aya::maps::MapError>>,
) -> Result<Vec<K>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for k in keys {
        let k = k.with_context(|| format!("walk the keys of {}", pin.display()))?;
        if !seen.insert(k.clone()) {
            break;
        }
        out.push(k);
        if out.len() >= MAX_KEYS {
            bail!("{} has more than {MAX_KEYS} keys", pin.display());
        }
    }
    Ok(out)
}

/// The keys of the hash (or LRU hash) map pinned at `pin`, whose keys are `K` and
/// values `V`; a key added or removed during the walk may be missed.
pub fn pinned_hash_keys<K: Pod + Eq + std::hash::Hash, V: Pod>(pin: &Path) -> Result<Vec<K>> {
    collect(pin, hash::<K, V>(pin)?.keys())
}

/// The hash (or LRU hash) map pinned at `pin`, keys `K`, values `V`.
fn hash<K: Pod, V: Pod>(pin: &Path) -> Result<HashMap<MapData, K, V>> {
    open(pin)?
        .try_into()
        .with_context(|| format!("{} is not a hash map of this layout", pin.display()))
}

/// Removes every entry of the hash (or LRU hash) map pinned at `pin` (as an LRU's
/// eviction would); returns how many it removed.
pub fn clear_pinned_hash<K: Pod + Eq + std::hash::Hash, V: Pod>(pin: &Path) -> Result<usize> {
    let mut map = hash::<K, V>(pin)?;
    let keys = collect(pin, map.keys())?;
    for k in &keys {
        map.remove(k)
            .with_context(|| format!("remove an entry of {}", pin.display()))?;
    }
    Ok(keys.len())
}

/// The keys of the SockHash pinned at `pin`.
pub fn pinned_sockhash_keys(pin: &Path) -> Result<Vec<SockKey>> {
    let map: SockHash<MapData, SockKey> = open(pin)?
        .try_into()
        .with_context(|| format!("{} is not a SockHash of SockKey", pin.display()))?;
    collect(pin, map.keys())
}

fn array(pin: &Path) -> Result<Array<MapData, u32>> {
    open(pin)?
        .try_into()
        .with_context(|| format!("{} is not an Array<u32>", pin.display()))
}

/// Reads slot `key` of a pinned `Array<u32>`.
pub fn pinned_u32(pin: &Path, key: u32) -> Result<u32> {
    array(pin)?
        .get(&key, 0)
        .with_context(|| format!("read slot {key} of {}", pin.display()))
}

/// Writes slot `key` of a pinned `Array<u32>`.
pub fn set_pinned_u32(pin: &Path, key: u32, value: u32) -> Result<()> {
    array(pin)?
        .set(key, value, 0)
        .with_context(|| format!("write slot {key} of {}", pin.display()))
}
