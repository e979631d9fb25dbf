//! Which node knows about an id, and what it knows.
//!
//! Every id has a *home* node, `home_of(id)`: a fixed hash of the id's bytes
//! modulo the node count (membership is static, so homes never move). The
//! home keeps a [`Directory`] entry for each of its ids: the owner (the node
//! whose region holds the object) and, once sealed, where in that region it
//! lives. Creating an id registers it at its home first, so an id that exists
//! anywhere fails with `ObjectExists`; a get of an id held elsewhere asks the
//! home (one RPC, or none when the location is cached), then the owner.

use std::collections::HashMap;

use shoal_core::error::ErrorKind;
use shoal_core::store::ObjectLocation;
use shoal_core::ObjectId;

/// The home node of `id` among `nodes` nodes. Stable across processes and
/// builds (callers on every node must agree): SplitMix64 over the id's bytes.
pub fn home_of(id: &ObjectId, nodes: usize) -> u32 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in id.0.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h ^= u64::from_le_bytes(word);
        h = mix(h);
    }
    (h % nodes.max(1) as u64) as u32
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryEntry {
    pub owner: u32,
    /// Where the object lives in its owner's region, once sealed.
    pub sealed: Option<ObjectLocation>,
}

/// The home node's table of its ids.
#[derive(Default)]
pub struct Directory {
    entries: HashMap<ObjectId, DirectoryEntry>,
    /// Nodes holding a network-mode copy of an id (told to drop it when the
    /// owner unregisters the id).
    copies: HashMap<ObjectId, Vec<u32>>,
}

impl Directory {
    /// Claims `ids` for `owner`, all or none: per id `None` or the reason it
    /// could not be claimed; if any fails, none is registered.
    pub fn register(&mut self, ids: &[ObjectId], owner: u32) -> Vec<Option<ErrorKind>> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        let statuses: Vec<_> = ids
            .iter()
            .map(|id| {
                (self.entries.contains_key(id) || !seen.insert(*id))
                    .then_some(ErrorKind::ObjectExists)
            })
            .collect();
        if statuses.iter().all(Option::is_none) {
            for id in ids {
                self.entries.insert(
                    *id,
                    DirectoryEntry {
                        owner,
                        sealed: None,
                    },
                );
            }
        }
        statuses
    }

    /// Forgets ids `owner` no longer holds; ids of other owners stay.
    /// Returns the nodes that held copies of the forgotten ids, with the ids.
    pub fn unregister(&mut self, ids: &[ObjectId], owner: u32) -> Vec<(u32, ObjectId)> {
        let mut stale = Vec::new();
        for id in ids {
            if self.entries.get(id).is_some_and(|e| e.owner == owner) {
                self.entries.remove(id);
                for node in self.copies.remove(id).unwrap_or_default() {
                    stale.push((node, *id));
                }
            }
        }
        stale
    }

    /// `node` keeps a copy of these (registered) ids.
    pub fn add_copies(&mut self, ids: &[ObjectId], node: u32) {
        for id in ids {
            if self.entries.contains_key(id) {
                let holders = self.copies.entry(*id).or_default();
                if !holders.contains(&node) {
                    holders.push(node);
                }
            }
        }
    }

    /// Records where `owner` sealed its ids. Ids it does not own are ignored.
    pub fn publish(&mut self, ids: &[ObjectId], locations: &[ObjectLocation], owner: u32) {
        for (id, location) in ids.iter().zip(locations) {
            if let Some(entry) = self.entries.get_mut(id) {
                if entry.owner == owner {
                    entry.sealed = Some(*location);
                }
            }
        }
    }

    pub fn lookup(&self, id: &ObjectId) -> Option<DirectoryEntry> {
        self.entries.get(id).copied()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    #[test]
    fn homes_are_stable_and_spread() {
        assert_eq!(home_of(&id(7), 4), home_of(&id(7), 4));
        let mut counts = [0usize; 4];
        for a in 0..=255u8 {
            for b in 0..16u8 {
                let mut raw = [a; 20];
                raw[19] = b;
                counts[home_of(&ObjectId(raw), 4) as usize] += 1;
            }
        }
        assert!(counts.iter().all(|&c| c > 4096 / 4 * 8 / 10), "{counts:?}");
        assert_eq!(home_of(&id(1), 1), 0);
    }

    #[test]
    fn register_is_all_or_nothing_and_ids_are_unique() {
        let mut d = Directory::default();
        assert_eq!(d.register(&[id(1), id(2)], 0), vec![None, None]);
        assert_eq!(
            d.register(&[id(3), id(2)], 1),
            vec![None, Some(ErrorKind::ObjectExists)]
        );
        assert!(
            d.lookup(&id(3)).is_none(),
            "nothing registered on a conflict"
        );
        assert_eq!(
            d.register(&[id(4), id(4)], 1),
            vec![None, Some(ErrorKind::ObjectExists)]
        );
        assert_eq!(d.len(), 2);
    }

    #[test]
    fn publish_and_unregister_only_by_the_owner() {
        let mut d = Directory::default();
        d.register(&[id(1)], 2);
        let loc = ObjectLocation {
            offset: 128,
            data_size: 10,
            meta_size: 0,
        };
        d.publish(&[id(1)], &[loc], 1);
        assert_eq!(d.lookup(&id(1)).unwrap().sealed, None);
        d.publish(&[id(1)], &[loc], 2);
        assert_eq!(d.lookup(&id(1)).unwrap().sealed, Some(loc));
        d.add_copies(&[id(1), id(9)], 3);
        assert!(d.unregister(&[id(1)], 0).is_empty());
        assert!(d.lookup(&id(1)).is_some());
        assert_eq!(d.unregister(&[id(1)], 2), vec![(3, id(1))]);
        assert!(d.lookup(&id(1)).is_none());
    }
}
