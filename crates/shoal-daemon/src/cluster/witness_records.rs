//! What the witnessing of self-homed ids keeps (`witness.rs`): as an owner,
//! the changes not sent yet; as a witness, each owner's ids.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use shoal_core::ObjectId;

/// Both sides of the witnessing on one node.
#[derive(Default)]
pub(crate) struct Witness {
    /// As an owner: ids sealed here since the last batch, and ids gone (an
    /// id is in at most one of the two: the later change wins).
    pub(crate) sealed: HashSet<ObjectId>,
    pub(crate) gone: HashSet<ObjectId>,
    /// Send everything again, from then on.
    pub(crate) reset_due: Option<Instant>,
    /// A batch is on its way.
    pub(crate) sending: bool,
    /// As a witness: per owner, the epoch of its latest reset and its ids.
    pub(crate) held: HashMap<u32, (u64, HashSet<ObjectId>)>,
}

impl Witness {
    pub(crate) fn seal(&mut self, ids: impl IntoIterator<Item = ObjectId>) {
        for id in ids {
            self.gone.remove(&id);
            self.sealed.insert(id);
        }
    }

    pub(crate) fn forget(&mut self, ids: impl IntoIterator<Item = ObjectId>) {
        for id in ids {
            self.sealed.remove(&id);
            self.gone.insert(id);
        }
    }

    /// A witness's side: `owner`'s batch (or, with `reset`, all its ids)
    /// sent at `epoch`. One older than its latest reset is stale: that
    /// reset was taken after it.
    pub(crate) fn receive(
        &mut self,
        owner: u32,
        epoch: u64,
        reset: bool,
        sealed: Vec<ObjectId>,
        gone: Vec<ObjectId>,
    ) {
        let (since, ids) = self.held.entry(owner).or_default();
        if epoch < *since {
            return;
        }
        if reset {
            *since = epoch;
            *ids = sealed.into_iter().collect();
            return;
        }
        for id in gone {
            ids.remove(&id);
        }
        ids.extend(sealed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u8) -> ObjectId {
        ObjectId([i; 20])
    }

    #[test]
    fn the_later_change_of_an_id_wins_at_the_owner() {
        let mut w = Witness::default();
        w.seal([id(1), id(2)]);
        w.forget([id(2), id(3)]);
        w.seal([id(3)]);
        assert_eq!(w.sealed, HashSet::from([id(1), id(3)]));
        assert_eq!(w.gone, HashSet::from([id(2)]));
    }

    #[test]
    fn a_witness_takes_resets_whole_and_drops_batches_older_than_its_reset() {
        let mut w = Witness::default();
        w.receive(4, 2, false, vec![id(1), id(2)], vec![]);
        w.receive(4, 2, false, vec![], vec![id(1)]);
        assert_eq!(w.held[&4].1, HashSet::from([id(2)]));
        w.receive(4, 3, true, vec![id(7)], vec![]);
        // A batch of the old view arriving after the reset of the new one.
        w.receive(4, 2, false, vec![id(8)], vec![id(7)]);
        assert_eq!(w.held[&4], (3, HashSet::from([id(7)])));
        w.receive(4, 3, false, vec![id(9)], vec![]);
        assert_eq!(w.held[&4].1, HashSet::from([id(7), id(9)]));
    }
}
