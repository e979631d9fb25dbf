//! What a node holds, in memory and below: `contains`, `list`, `tiers`.

use shoal_core::protocol::{CapacityReport, TierReport};
use shoal_core::protocol::{ObjectInfo, StoreStats};
use shoal_core::ObjectId;

use crate::ops::Ops;

impl Ops {
    /// Whether the object exists here, in memory or on a tier below. One
    /// deleted in memory and still referenced is gone, though its delete
    /// may not have reached the tiers yet (a rewrite's seal through the
    /// write channel answers before the tiers commit the old version's
    /// delete): that tier copy does not count.
    pub(crate) fn contains(&self, id: &ObjectId) -> bool {
        let (visible, deleted) = self.node.read(|s| (s.contains(id), s.is_deleted(id)));
        visible || (!deleted && self.node.held_below(id))
    }

    /// Every object here: those in memory (with the tiers that also hold
    /// them), then those only on tiers.
    pub(crate) fn list(&self) -> Vec<ObjectInfo> {
        let mut objects = self.node.read(|s| s.list());
        if let Some(tiers) = &self.tiers {
            for o in &mut objects {
                o.tiers = tiers.tier_bits(&o.id);
            }
            for (id, location) in self.node.held_only_below() {
                objects.push(ObjectInfo {
                    id,
                    location,
                    sealed: true,
                    refs: 0,
                    resident: false,
                    tiers: tiers.tier_bits(&id),
                });
            }
        }
        objects
    }

    pub(crate) fn stats(&self) -> StoreStats {
        self.node.read(|s| s.stats())
    }

    /// The tiers below memory (an empty report when there are none).
    /// The capacity controller's state (a static store: its capacity and use).
    pub(crate) fn capacity_report(
        &self,
        trace_since: Option<std::time::Duration>,
    ) -> CapacityReport {
        match &self.elastic {
            Some(elastic) => elastic.report(trace_since),
            None => self.node.read(|s| CapacityReport {
                target: s.capacity(),
                capacity: s.capacity(),
                used: s.used(),
                pinned: s.pinned(),
                resident: self.node.region().resident_bytes().unwrap_or(0),
                ..Default::default()
            }),
        }
    }

    pub(crate) fn tier_report(&self) -> TierReport {
        self.tiers
            .as_ref()
            .map_or_else(TierReport::default, |t| t.report())
    }
}
