//! What a home keeps of nodes removed for good (`departed.rs` acts on it):
//! their objects until their adoption, and those reported lost.

use std::collections::HashMap;

use shoal_core::ObjectId;

/// Lost ids kept for `shoal cluster status` (the count goes on).
pub(crate) const LOST_SAMPLE: usize = 1000;

#[derive(Default)]
pub(crate) struct Departed {
    /// Per removed node: its sealed objects this home forgot at its removal,
    /// until its adopter says `Adopted`.
    waiting: HashMap<u32, Vec<ObjectId>>,
    /// Objects of removed nodes reported lost here.
    lost: u64,
    /// The first [`LOST_SAMPLE`] of them.
    sample: Vec<ObjectId>,
}

impl Departed {
    /// `node` was removed owning `ids` here: they wait for its adoption.
    pub(crate) fn wait_for_adoption(&mut self, node: u32, ids: Vec<ObjectId>) {
        self.waiting.entry(node).or_default().extend(ids);
    }

    /// `node`'s store was adopted (or it came back): the ids that waited.
    pub(crate) fn adopted(&mut self, node: u32) -> Option<Vec<ObjectId>> {
        self.waiting.remove(&node)
    }

    /// `ids` are lost: counted, and the first [`LOST_SAMPLE`] kept.
    pub(crate) fn lost(&mut self, ids: Vec<ObjectId>) {
        self.lost += ids.len() as u64;
        let room = LOST_SAMPLE.saturating_sub(self.sample.len());
        self.sample.extend(ids.into_iter().take(room));
    }

    /// How many were lost.
    pub(crate) fn lost_count(&self) -> u64 {
        self.lost
    }

    /// How many were lost, and the first [`LOST_SAMPLE`].
    pub(crate) fn lost_objects(&self) -> (u64, Vec<ObjectId>) {
        (self.lost, self.sample.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_ids_are_counted_and_the_first_kept() {
        let mut departed = Departed::default();
        let ids: Vec<ObjectId> = (0..LOST_SAMPLE + 5).map(|_| ObjectId::random()).collect();
        departed.wait_for_adoption(3, ids[..10].to_vec());
        departed.wait_for_adoption(3, ids[10..12].to_vec());
        assert_eq!(departed.adopted(3).map(|w| w.len()), Some(12));
        assert_eq!(departed.adopted(3), None, "once");
        departed.lost(ids[..3].to_vec());
        departed.lost(ids[3..].to_vec());
        let (count, sample) = departed.lost_objects();
        assert_eq!(count, ids.len() as u64);
        assert_eq!(sample, ids[..LOST_SAMPLE].to_vec());
    }
}
