//! Which node knows about an id, and what it knows.
//!
//! Every id has a *home* node, the member of the cluster's view that wins it
//! (`view::View::home`, rendezvous hashing). The home keeps a [`Directory`] entry for each of its ids: the owner (the node
//! whose region holds the object) and, once sealed, where in that region it
//! lives. Creating an id registers it at its home first, so an id that exists
//! anywhere fails with `ObjectExists`; a get of an id held elsewhere asks the
//! home (one RPC, or none when the location is cached), then the owner.

use std::collections::HashMap;

use shoal_core::error::ErrorKind;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

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

    /// `node` made copies of `owner`'s objects sealed at `locations`
    /// (network mode) while holding references at the owner. Recorded only
    /// where the id is still that object: a copy of one deleted (or deleted
    /// and created again) meanwhile is refused, and its holder drops it. The
    /// owner's reference pins the location, so an equal location is the same
    /// object. Per id whether the copy was recorded.
    pub fn add_checked_copies(
        &mut self,
        ids: &[ObjectId],
        owner: u32,
        locations: &[ObjectLocation],
        node: u32,
    ) -> Vec<bool> {
        ids.iter()
            .zip(locations)
            .map(|(id, location)| {
                let current = self
                    .entries
                    .get(id)
                    .is_some_and(|e| e.owner == owner && e.sealed == Some(*location));
                if current {
                    self.add_copies(std::slice::from_ref(id), node);
                }
                current
            })
            .collect()
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

    /// Re-registration after this home (re)started with an empty directory:
    /// `owner` still holds these ids, sealed ones at `locations[i]`, the others
    /// being written. Per id `None`, or `ObjectExists` when another owner
    /// holds it here (that registration stays: first come, first kept). Not
    /// all or nothing, and idempotent: restoring an id again, or one the
    /// owner registered itself meanwhile, only adds a location it lacked.
    pub fn restore(
        &mut self,
        ids: &[ObjectId],
        locations: &[Option<ObjectLocation>],
        owner: u32,
    ) -> Vec<Option<ErrorKind>> {
        ids.iter()
            .zip(locations)
            .map(|(id, location)| {
                let entry = self.entries.entry(*id).or_insert(DirectoryEntry {
                    owner,
                    sealed: None,
                });
                if entry.owner != owner {
                    return Some(ErrorKind::ObjectExists);
                }
                if location.is_some() {
                    entry.sealed = *location;
                }
                None
            })
            .collect()
    }

    /// Copies `node` keeps, re-announced while this home rebuilds: recorded
    /// even for ids whose owner has not restored them yet (owners restore
    /// concurrently); [`orphan_copies`](Self::orphan_copies) ends the rest.
    pub fn restore_copies(&mut self, ids: &[ObjectId], node: u32) {
        for id in ids {
            let holders = self.copies.entry(*id).or_default();
            if !holders.contains(&node) {
                holders.push(node);
            }
        }
    }

    /// Copies of ids no owner holds (none restored them by the end of the
    /// rebuild: their primary went with a node's previous incarnation, or
    /// was deleted): forgotten here, returned as (holder, id) to drop.
    pub fn orphan_copies(&mut self) -> Vec<(u32, ObjectId)> {
        let entries = &self.entries;
        let mut stale = Vec::new();
        self.copies.retain(|id, holders| {
            if entries.contains_key(id) {
                return true;
            }
            stale.extend(holders.iter().map(|&node| (node, *id)));
            false
        });
        stale
    }

    /// `owner` restarted: its store is new, so every id it registered here
    /// is gone. Forgets them; returns how many, and the copies (holder, id)
    /// to drop (a copy follows its primary, as on a delete).
    pub fn forget_owner(&mut self, owner: u32) -> (usize, Vec<(u32, ObjectId)>) {
        let gone: Vec<ObjectId> = self
            .entries
            .iter()
            .filter(|(_, e)| e.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        (gone.len(), self.unregister(&gone, owner))
    }

    /// The sealed objects `owner` registered here.
    pub fn sealed_of(&self, owner: u32) -> Vec<ObjectId> {
        self.entries
            .iter()
            .filter(|(_, e)| e.owner == owner && e.sealed.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// A new view moved some of this home's ids to other members: their
    /// entries (and the copies recorded with them) go, since the new homes
    /// get them from the owners and a later view that brings an id back
    /// must not find an entry its delete never reached. Returns how many
    /// entries went.
    pub fn keep_homed(&mut self, homed_here: impl Fn(&ObjectId) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|id, _| homed_here(id));
        self.copies.retain(|id, _| homed_here(id));
        before - self.entries.len()
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
    fn a_view_change_keeps_only_the_ids_still_homed_here() {
        let mut d = Directory::default();
        d.register(&[id(1), id(2), id(3)], 0);
        d.add_copies(&[id(2)], 4);
        assert_eq!(d.keep_homed(|i| *i != id(2)), 1);
        assert!(d.lookup(&id(2)).is_none());
        assert!(d.lookup(&id(1)).is_some() && d.lookup(&id(3)).is_some());
        // The id comes back by a later view: no stale entry, no stale copy.
        assert_eq!(d.register(&[id(2)], 1), vec![None]);
        assert_eq!(d.unregister(&[id(2)], 1), vec![]);
    }

    fn at(offset: u64) -> ObjectLocation {
        ObjectLocation {
            offset,
            data_size: 8,
            meta_size: 0,
        }
    }

    #[test]
    fn a_copy_of_a_deleted_or_replaced_object_is_refused() {
        let mut d = Directory::default();
        d.register(&[id(1), id(2), id(3)], 0);
        d.publish(&[id(1), id(2), id(3)], &[at(0), at(64), at(128)], 0);
        d.unregister(&[id(2)], 0); // deleted before the copy was announced
        d.unregister(&[id(3)], 0);
        d.register(&[id(3)], 1); // ...and created again elsewhere
        d.publish(&[id(3)], &[at(128)], 1);
        let accepted = d.add_checked_copies(
            &[id(1), id(2), id(3), id(9)],
            0,
            &[at(0), at(64), at(128), at(0)],
            5,
        );
        assert_eq!(accepted, vec![true, false, false, false]);
        // Only the recorded copy is dropped with its primary.
        assert_eq!(d.unregister(&[id(1)], 0), vec![(5, id(1))]);
        assert!(d.unregister(&[id(3)], 1).is_empty());
        // A location that moved (deleted, created again by the same owner) is refused too.
        d.register(&[id(4)], 0);
        d.publish(&[id(4)], &[at(256)], 0);
        assert_eq!(
            d.add_checked_copies(&[id(4)], 0, &[at(512)], 5),
            vec![false]
        );
    }

    #[test]
    fn restore_keeps_the_first_owner_and_is_idempotent() {
        let mut d = Directory::default();
        // Node 2 restores a sealed id and one it is still writing.
        assert_eq!(
            d.restore(&[id(1), id(2)], &[Some(at(64)), None], 2),
            vec![None, None]
        );
        assert_eq!(d.lookup(&id(1)).unwrap().sealed, Some(at(64)));
        assert_eq!(d.lookup(&id(2)).unwrap().sealed, None);
        // Another owner claiming either is refused; the first stays.
        assert_eq!(
            d.restore(&[id(1), id(3)], &[Some(at(128)), None], 0),
            vec![Some(ErrorKind::ObjectExists), None]
        );
        assert_eq!(d.lookup(&id(1)).unwrap().owner, 2);
        assert_eq!(d.register(&[id(2)], 1), vec![Some(ErrorKind::ObjectExists)]);
        // Restoring again (a correction) adds the location, never removes one.
        assert_eq!(
            d.restore(&[id(2), id(1)], &[Some(at(256)), None], 2),
            vec![None, None]
        );
        assert_eq!(d.lookup(&id(2)).unwrap().sealed, Some(at(256)));
        assert_eq!(d.lookup(&id(1)).unwrap().sealed, Some(at(64)));
        assert_eq!(d.len(), 3);
    }

    #[test]
    fn copies_restored_before_their_owner_wait_for_it_then_orphans_are_dropped() {
        let mut d = Directory::default();
        d.restore_copies(&[id(1), id(2)], 3);
        d.restore_copies(&[id(1)], 3);
        d.restore(&[id(1)], &[Some(at(0))], 0);
        // id 2's owner never restored it: its copy is an orphan.
        assert_eq!(d.orphan_copies(), vec![(3, id(2))]);
        assert!(d.orphan_copies().is_empty());
        // id 1's copy is still known: the owner's delete drops it.
        assert_eq!(d.unregister(&[id(1)], 0), vec![(3, id(1))]);
    }

    #[test]
    fn an_owners_sealed_objects_are_listed_without_its_pending_ones() {
        let mut d = Directory::default();
        d.register(&[id(1), id(2), id(3)], 1);
        d.register(&[id(4)], 2);
        d.publish(&[id(2), id(4)], &[at(2), at(4)], 1);
        assert_eq!(
            d.sealed_of(1),
            vec![id(2)],
            "1 and 3 are not sealed; 4 is node 2's"
        );
        assert!(d.sealed_of(0).is_empty());
    }

    #[test]
    fn a_restarted_owner_is_forgotten_with_its_copies() {
        let mut d = Directory::default();
        d.register(&[id(1), id(2)], 1);
        d.register(&[id(3)], 2);
        d.add_copies(&[id(2), id(3)], 0);
        let (gone, mut stale) = d.forget_owner(1);
        stale.sort();
        assert_eq!((gone, stale), (2, vec![(0, id(2))]));
        assert!(d.lookup(&id(1)).is_none() && d.lookup(&id(2)).is_none());
        assert_eq!(d.lookup(&id(3)).unwrap().owner, 2);
        assert_eq!(d.forget_owner(1), (0, Vec::new()));
        // The ids are free again.
        assert_eq!(d.register(&[id(1)], 0), vec![None]);
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
