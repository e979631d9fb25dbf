//! The tiers as a listener of the node: sealed objects start draining, and
//! eviction goes down a tier instead of into the void.

use std::rc::Weak;

use shoal_store::store::{Verdict, Victim};
use shoal_tiers::ObjectSizes;

use shoal_core::event::ObjectEvent;

use crate::node::{NodeEvent, NodeListener};
use crate::principals;
use crate::tiers::Tiers;

/// Weak: the node holds its listeners, and the tiers hold the node.
pub(super) struct TierListener {
    tiers: Weak<Tiers>,
}

impl TierListener {
    pub(super) fn new(tiers: Weak<Tiers>) -> Self {
        Self { tiers }
    }
}

impl NodeListener for TierListener {
    fn on_event(&self, event: &NodeEvent) {
        let Some(tiers) = self.tiers.upgrade() else {
            return;
        };
        if let NodeEvent::Object(ObjectEvent::Sealed {
            id,
            data_size,
            meta_size,
        }) = *event
        {
            // A network copy of another node's object: its owner keeps it.
            if tiers.node.read(|s| s.creator(&id)) == Some(principals::COPY) {
                return;
            }
            {
                let mut index = tiers.index.borrow_mut();
                index.sealed(
                    id,
                    ObjectSizes {
                        data_size,
                        meta_size,
                    },
                    tiers.engine.next_generation(),
                );
                index.touch(&id);
            }
            tiers.last_seal.set(std::time::Instant::now());
            tiers.queue(id, false);
        }
        // Deletes reach the tiers through `ops::delete`, which waits for
        // them to be committed; aborted objects never reached a tier.
    }

    fn on_evicting(&self, victim: &Victim) -> Verdict {
        let Some(tiers) = self.tiers.upgrade() else {
            return Verdict::Free;
        };
        match tiers.is_clean(&victim.id) {
            // Untracked (a network copy): not ours to keep.
            None | Some(true) => Verdict::Free,
            Some(false) => {
                tiers.spill_later(*victim);
                Verdict::Hold
            }
        }
    }
}
