//! The fast-path sweeper's pace (`node::fast_reads`), kept by the node so
//! that every change to the store can end the sweeper's rest: a leaf, so
//! the node names it without naming the sweeper.

use std::cell::Cell;

use tokio::sync::Notify;

/// The sweeper's pace, kept by the node: whether it rests (waits longer
/// than its busy pace), and the bell that ends the rest.
#[derive(Default)]
pub struct SweepPace {
    resting: Cell<bool>,
    bell: Notify,
}

impl SweepPace {
    /// The store changed: a resting sweeper goes back to its busy pace.
    /// (A `Cell` read per change; the bell rings once per rest.)
    pub fn changed(&self) {
        if self.resting.replace(false) {
            self.bell.notify_one();
        }
    }

    /// The sweeper says whether it rests (waits longer than its busy pace)
    /// until its next tick.
    pub fn rest(&self, resting: bool) {
        self.resting.set(resting);
    }

    /// Resolves when a change ends the rest.
    pub async fn bell(&self) {
        self.bell.notified().await;
    }
}
