//! Burst-buffer pressure: when the burst buffer fills, copies the backing
//! store also holds leave it, least recently used first (the burst buffer's
//! own eviction: nothing is written, nothing is lost).

use std::rc::Rc;

use shoal_tiers::TierLevel;

use crate::tiers::Tiers;

/// Start making room above this share of the burst buffer...
const HIGH: f64 = 0.90;
/// ...and stop below this one.
const LOW: f64 = 0.80;

impl Tiers {
    /// Drops drained copies from the burst buffer until `need` bytes are
    /// free and usage is under the low mark (or nothing more may go).
    /// Returns the bytes freed. One at a time: a second caller returns 0.
    pub(super) async fn relieve_burst(&self, need: u64) -> u64 {
        let Some(burst) = self.engine.tier(TierLevel::Burst).cloned() else {
            return 0;
        };
        if self.relieving.replace(true) {
            return 0;
        }
        let usage = burst.usage();
        let target_used =
            ((usage.capacity as f64 * LOW) as u64).min(usage.capacity.saturating_sub(need));
        let mut to_free = usage.used.saturating_sub(target_used);
        let mut freed = 0;
        let candidates = self.index.borrow().burst_evictable();
        for (id, len) in candidates {
            if to_free == 0 {
                break;
            }
            match self.engine.evict(id, TierLevel::Burst).await {
                Ok(record) => {
                    self.index.borrow_mut().set_tiers(&id, record.tiers);
                    freed += len;
                    to_free = to_free.saturating_sub(len);
                }
                Err(err) => tracing::debug!(%id, %err, "burst buffer eviction"),
            }
        }
        self.relieving.set(false);
        if freed > 0 {
            tracing::debug!(freed, "burst buffer made room");
        }
        freed
    }

    /// Starts making room in the background when the burst buffer is above
    /// its high mark.
    pub(super) fn relieve_burst_if_high(self: &Rc<Self>) {
        let Some(burst) = self.engine.tier(TierLevel::Burst) else {
            return;
        };
        let usage = burst.usage();
        if self.relieving.get() || (usage.used as f64) < usage.capacity as f64 * HIGH {
            return;
        }
        let tiers = self.clone();
        self.supervisor.spawn_local("burst pressure", async move {
            tiers.relieve_burst(0).await;
        });
    }
}
