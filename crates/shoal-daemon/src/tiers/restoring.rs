//! Restore: an object held only below memory comes back into it, as one
//! call ([`Tiers::restore`]) that returns what it came to (`restore.rs`).
//!
//! A block allocated as for a create (evicting others down a tier if
//! needed), filled from the nearest intact copy, sealed. One restore per
//! object at a time: concurrent callers wait for the same one, which runs
//! as a task of its own, so a caller that gives up (a get timing out) does
//! not cancel it halfway. The restored object stays referenced by the tiers
//! principal until its waiters let go of the outcome's hold (`restore.rs`),
//! so none of them finds it evicted again. The lower copies stay (inclusive
//! tiers: evicting it again writes nothing).

use std::rc::Rc;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_tiers::DestRange;
use tokio::sync::watch;
use tokio::time::Instant;

use super::restore::{RestoreOutcome, RestoreTarget, RestoredHold};
use super::Tiers;
use crate::principals;

impl Tiers {
    /// Brings `id` into memory if a tier holds it and memory does not,
    /// waiting for others to leave memory until `deadline` at most. A
    /// restore in flight that another caller started with an earlier
    /// deadline, and that found no room, is started again.
    pub async fn restore(
        self: &Rc<Self>,
        id: ObjectId,
        target: Rc<dyn RestoreTarget>,
        deadline: Instant,
    ) -> Result<RestoreOutcome> {
        loop {
            let in_flight = self.restoring.borrow().get(&id).cloned();
            if let Some(mut outcome) = in_flight {
                let done = outcome.wait_for(Option::is_some).await;
                return match done.as_deref() {
                    Ok(Some(Ok(hold))) => Ok(RestoreOutcome::Restored(hold.clone())),
                    Ok(Some(Err(err)))
                        if err.kind() == ErrorKind::StoreFull && Instant::now() < deadline =>
                    {
                        continue
                    }
                    Ok(Some(Err(err))) => Err(err.clone()),
                    // The restore's task ended without an outcome (the
                    // daemon is stopping): look again.
                    _ => continue,
                };
            }
            if !self.tracks(&id) || self.node.read(|s| s.contains(&id) || s.is_unsealed(&id)) {
                return Ok(RestoreOutcome::NotBelow);
            }
            let (tx, rx) = watch::channel(None);
            self.restoring.borrow_mut().insert(id, rx);
            let (tiers, target) = (self.clone(), target.clone());
            let wait = deadline.saturating_duration_since(Instant::now());
            self.supervisor.spawn_local("restore", async move {
                let result = tiers.restore_now(id, &*target, wait).await;
                tiers.restoring.borrow_mut().remove(&id);
                // No one waits any more: the hold goes at once.
                let _ = tx.send(Some(result));
            });
        }
    }

    async fn restore_now(
        &self,
        id: ObjectId,
        target: &dyn RestoreTarget,
        wait: Duration,
    ) -> Result<Rc<RestoredHold>> {
        let sizes = self.sizes(&id).ok_or_else(|| ShoalError::not_found(&id))?;
        let _running = self.restore_budget.permit(sizes.payload_len()).await;
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let location = target.allocate(id, sizes, wait_ms).await?;
        match self.fill(id, location).await {
            // Deleted while restoring: the delete took it off the tiers.
            Ok(()) if !self.tracks(&id) => {
                let _ = self.node.mutate(|s| s.abort(principals::TIERS, &id));
                Err(ShoalError::not_found(&id))
            }
            Ok(()) => {
                // Sealed keeping the tiers' reference: the hold's.
                self.node
                    .mutate(|s| s.seal(principals::TIERS, &[id], false))?;
                let hold = Rc::new(RestoredHold::new(self.node.clone(), id));
                target.restored(id).await;
                Ok(hold)
            }
            Err(err) => {
                if matches!(
                    err.kind(),
                    ErrorKind::ObjectCorrupt | ErrorKind::ObjectNotFound
                ) {
                    // No intact copy is left: the object is gone.
                    self.index.borrow_mut().remove(&id);
                    self.changed.notify_waiters();
                }
                let _ = self.node.mutate(|s| s.abort(principals::TIERS, &id));
                Err(err)
            }
        }
    }

    /// Fills `location` (allocated for `id` by the tiers principal) from the
    /// nearest intact copy.
    async fn fill(&self, id: ObjectId, location: ObjectLocation) -> Result<()> {
        let region = self.node.region().clone();
        let len = location.size() as usize;
        // SAFETY: the block at `location` was just allocated in the region
        // for an unsealed object of the tiers principal: no client may write
        // or read it before it is sealed, and the store keeps it allocated
        // until then (an abort is the only other way out, after this returns
        // or is cancelled; the region outlives the handle through the Arc).
        let dst = unsafe {
            DestRange::new(
                region.base().add(location.offset as usize),
                len,
                region.clone(),
            )
        };
        let restored = self.engine_of(&id).restore(id, dst).await?;
        let mut index = self.index.borrow_mut();
        index.set_tiers(&id, restored.record.tiers);
        index.touch(&id);
        let mut counters = self.counters.borrow_mut();
        counters.restores += 1;
        counters.restored_bytes += len as u64;
        Ok(())
    }
}
