//! The fast path's housekeeping on the daemon's side, every [`SWEEP_EVERY`]
//! while the node is busy:
//! - objects the store kept because a client held them through the shared
//!   index (it found that out when it wanted their memory) are given back
//!   once their readers let go: clients release fast-path references
//!   without telling the daemon, so the daemon looks while it keeps any;
//! - the reads clients made through the index since the last tick are
//!   recorded as gets (`Store::record_fast_reads`), so the eviction policy
//!   sees when objects were read, to within a tick.
//!
//! A node where nothing happens needs neither: a tick that finds nothing
//! kept and no read since the last doubles the wait before the next, up to
//! [`SWEEP_IDLE`], so an idle daemon is not woken 50 times a second. Any
//! change to the store (a request, a write record: [`SweepPace::changed`](super::sweep_pace::SweepPace::changed),
//! called by `Node::mutate`) brings the pace back to [`SWEEP_EVERY`] at
//! once; only reads through the index, which the daemon does not see,
//! wait for the next tick to be noticed (then the pace is back too).

use std::rc::Rc;
use std::time::Duration;

use super::Node;
use crate::supervisor::Supervisor;

/// How often kept objects are looked at again while the node is busy: a
/// deleted object's memory comes back at most this long after its last
/// reader dropped it (a create waiting for room sweeps at once, through
/// eviction).
pub const SWEEP_EVERY: Duration = Duration::from_millis(20);

/// The longest the sweeper waits between two ticks on an idle node.
pub const SWEEP_IDLE: Duration = Duration::from_secs(1);

pub fn spawn_sweeper(node: &Rc<Node>, supervisor: &Supervisor) {
    if node.read(|s| s.fast_reads().is_none()) {
        return;
    }
    let pace = node.sweep_pace().clone();
    let node = Rc::downgrade(node);
    supervisor.spawn_local("fast-read sweeper", async move {
        let mut wait = SWEEP_EVERY;
        let mut gets_seen = None;
        loop {
            pace.rest(wait > SWEEP_EVERY);
            let woken = tokio::select! {
                () = tokio::time::sleep(wait) => false,
                () = pace.bell() => true,
            };
            // Awake: this tick's own changes ring no bell.
            pace.rest(false);
            let Some(node) = node.upgrade() else {
                return;
            };
            if woken {
                // The store changed during a rest: tick at the busy pace.
                wait = SWEEP_EVERY;
                continue;
            }
            let kept = node.read(|s| s.kept_for_fast_readers());
            if kept > 0 {
                node.mutate(|s| s.sweep_fast_readers());
            }
            node.mutate(|s| s.record_fast_reads());
            let gets = node.read(|s| s.fast_gets());
            let busy = kept > 0 || gets_seen != Some(gets);
            gets_seen = Some(gets);
            wait = if busy {
                SWEEP_EVERY
            } else {
                (wait * 2).min(SWEEP_IDLE)
            };
        }
    });
}
