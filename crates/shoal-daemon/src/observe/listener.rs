//! Counts what the node does, as it happens (seals, aborts, deletes).

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::node::{NodeEvent, NodeListener};

pub struct MetricsListener {
    metrics: Arc<Metrics>,
}

impl MetricsListener {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl NodeListener for MetricsListener {
    fn on_event(&self, event: &NodeEvent) {
        let events = &self.metrics.events;
        match *event {
            NodeEvent::Sealed {
                data_size,
                meta_size,
                ..
            } => {
                events.sealed.inc();
                events.sealed_bytes.inc_by(data_size + u64::from(meta_size));
            }
            NodeEvent::Aborted { .. } => {
                events.aborted.inc();
            }
            NodeEvent::Removed { deleted: true, .. } => {
                events.deleted.inc();
            }
            // Evictions are counted from the store's own totals (with their
            // bytes) by the snapshot.
            NodeEvent::Removed { deleted: false, .. }
            | NodeEvent::ClientGone { .. }
            | NodeEvent::CapacityChanged { .. } => {}
        }
    }
}
