//! The fast path's housekeeping on the daemon's side, every [`SWEEP_EVERY`]:
//! - objects the store kept because a client held them through the shared
//!   index (it found that out when it wanted their memory) are given back
//!   once their readers let go: clients release fast-path references
//!   without telling the daemon, so the daemon looks while it keeps any;
//! - the reads clients made through the index since the last tick are
//!   recorded as gets (`Store::record_fast_reads`), so the eviction policy
//!   sees when objects were read, to within a tick.

use std::rc::Rc;
use std::time::Duration;

use super::Node;
use crate::supervisor::Supervisor;

/// How often kept objects are looked at again: a deleted object's memory
/// comes back at most this long after its last reader dropped it (a create
/// waiting for room sweeps at once, through eviction).
pub const SWEEP_EVERY: Duration = Duration::from_millis(20);

pub fn spawn_sweeper(node: &Rc<Node>, supervisor: &Supervisor) {
    if node.read(|s| s.fast_reads().is_none()) {
        return;
    }
    let node = Rc::downgrade(node);
    supervisor.spawn_local("fast-read sweeper", async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else {
                return;
            };
            if node.read(|s| s.kept_for_fast_readers()) > 0 {
                node.mutate(|s| s.sweep_fast_readers());
            }
            node.mutate(|s| s.record_fast_reads());
        }
    });
}
