//! Counts what the node does, as it happens (seals, aborts, deletes), in
//! plain cells on the store thread: an event costs no atomic operation.
//! The snapshot moves the counts into the shared counters once a second.

use std::cell::Cell;

use shoal_core::event::ObjectEvent;

use crate::metrics::EventCounters;
use crate::node::{NodeEvent, NodeListener};

#[derive(Default)]
pub(super) struct MetricsListener {
    sealed: Cell<u64>,
    sealed_bytes: Cell<u64>,
    aborted: Cell<u64>,
    deleted: Cell<u64>,
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get() + n);
}

impl MetricsListener {
    /// Adds what was counted since the last call to `counters`.
    pub(super) fn publish(&self, counters: &EventCounters) {
        counters.sealed.inc_by(self.sealed.take());
        counters.sealed_bytes.inc_by(self.sealed_bytes.take());
        counters.aborted.inc_by(self.aborted.take());
        counters.deleted.inc_by(self.deleted.take());
    }
}

impl NodeListener for MetricsListener {
    fn on_event(&self, event: &NodeEvent) {
        match *event {
            NodeEvent::Object(ObjectEvent::Sealed {
                data_size,
                meta_size,
                ..
            }) => {
                add(&self.sealed, 1);
                add(&self.sealed_bytes, data_size + u64::from(meta_size));
            }
            NodeEvent::Object(ObjectEvent::Aborted { .. }) => add(&self.aborted, 1),
            NodeEvent::Object(ObjectEvent::Removed { deleted: true, .. }) => add(&self.deleted, 1),
            // Evictions are counted from the store's own totals (with their
            // bytes) by the snapshot.
            NodeEvent::Object(ObjectEvent::Removed { deleted: false, .. })
            | NodeEvent::ClientGone { .. }
            | NodeEvent::CapacityChanged { .. } => {}
        }
    }
}
