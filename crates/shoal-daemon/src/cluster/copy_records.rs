//! What a node records of network-mode copies, apart from the cluster that
//! acts on it (`copies.rs`): each copy's identity on its holder, and the
//! drops a home still owes. A leaf: it imports nothing of the cluster.

use std::collections::HashMap;

use shoal_core::ObjectId;

/// What a network-mode copy was pulled from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOf {
    pub owner: u32,
    /// The owner's incarnation that sealed the primary.
    pub incarnation: u64,
}

/// As a home: drops not yet delivered, per id the holders still to tell.
#[derive(Default)]
pub(crate) struct OwedDrops {
    by_id: HashMap<ObjectId, Vec<u32>>,
}

impl OwedDrops {
    pub(crate) fn owe(&mut self, pairs: &[(u32, ObjectId)]) {
        for &(node, id) in pairs {
            let holders = self.by_id.entry(id).or_default();
            if !holders.contains(&node) {
                holders.push(node);
            }
        }
    }

    /// `node` dropped (or no longer holds) its copies of `ids`.
    pub(crate) fn settle(&mut self, node: u32, ids: &[ObjectId]) {
        for id in ids {
            if let Some(holders) = self.by_id.get_mut(id) {
                holders.retain(|&n| n != node);
                if holders.is_empty() {
                    self.by_id.remove(id);
                }
            }
        }
    }

    /// Ids whose drop `node` is still owed.
    pub(crate) fn to(&self, node: u32) -> Vec<ObjectId> {
        self.by_id
            .iter()
            .filter(|(_, holders)| holders.contains(&node))
            .map(|(id, _)| *id)
            .collect()
    }

    /// `node` restarted: it holds no copy of before.
    pub(crate) fn forget_node(&mut self, node: u32) {
        self.by_id.retain(|_, holders| {
            holders.retain(|&n| n != node);
            !holders.is_empty()
        });
    }

    pub(crate) fn owes(&self, id: &ObjectId) -> bool {
        !self.by_id.is_empty() && self.by_id.contains_key(id)
    }

    /// How many ids' drops `node` is owed.
    pub(crate) fn count_to(&self, node: u32) -> usize {
        self.by_id
            .values()
            .filter(|holders| holders.contains(&node))
            .count()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    #[test]
    fn a_drop_stays_owed_until_every_holder_settles_it() {
        let mut owed = OwedDrops::default();
        assert!(!owed.owes(&id(1)));
        owed.owe(&[(1, id(1)), (2, id(1)), (2, id(2)), (2, id(2))]);
        assert!(owed.owes(&id(1)) && owed.owes(&id(2)));
        let mut to_2 = owed.to(2);
        to_2.sort();
        assert_eq!(to_2, vec![id(1), id(2)], "owed once per holder and id");
        owed.settle(2, &[id(1), id(2)]);
        assert!(owed.owes(&id(1)), "node 1 still has its copy of id 1");
        assert!(!owed.owes(&id(2)));
        assert_eq!(owed.to(2), Vec::<ObjectId>::new());
        owed.settle(1, &[id(1)]);
        assert_eq!(owed.len(), 0);
    }

    #[test]
    fn a_restarted_holder_is_owed_nothing() {
        let mut owed = OwedDrops::default();
        owed.owe(&[(1, id(1)), (2, id(1)), (1, id(3))]);
        owed.forget_node(1);
        assert_eq!(owed.to(1), Vec::<ObjectId>::new());
        assert!(owed.owes(&id(1)) && !owed.owes(&id(3)));
    }
}
