//! Restore: an object held only below memory comes back into it — a block
//! allocated as for a create (evicting others down a tier if needed),
//! filled from the nearest intact copy, sealed. One restore per object at a
//! time: concurrent gets of it wait for the same one. The lower copies stay
//! (inclusive tiers: evicting it again writes nothing).

use std::future::pending;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ObjectId;
use shoal_store::store::Placement;

use crate::elastic::Restorer;
use crate::ops::Ops;
use crate::principals;

/// How long a restore waits for memory (others leaving it) before failing.
const RESTORE_WAIT_MS: u32 = 30_000;

impl Restorer for Ops {
    fn restore_object(
        &self,
        id: ObjectId,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool>> + '_>> {
        Box::pin(self.restore(id))
    }
}

impl Ops {
    /// Brings `id` into memory if a tier holds it and memory does not.
    /// `Ok(false)`: no tier holds it (unknown, or in memory already).
    pub async fn restore(&self, id: ObjectId) -> Result<bool> {
        let Some(tiers) = &self.tiers else {
            return Ok(false);
        };
        loop {
            if let Some(mut outcome) = tiers.restore_in_flight(&id) {
                let done = outcome.wait_for(Option::is_some).await;
                return match done.as_deref() {
                    Ok(Some(Ok(()))) => Ok(true),
                    Ok(Some(Err(err))) => Err(err.clone()),
                    // The restore's task ended without an outcome (the
                    // daemon is stopping): look again.
                    _ => continue,
                };
            }
            if !tiers.tracks(&id) || self.node.read(|s| s.contains(&id) || s.is_unsealed(&id)) {
                return Ok(false);
            }
            let tx = tiers.restore_started(id);
            let ops = self.rc();
            self.supervisor.spawn_local("restore", async move {
                let result = ops.restore_now(id).await;
                if let Some(tiers) = &ops.tiers {
                    tiers.restore_done(&id);
                }
                let _ = tx.send(Some(result));
            });
        }
    }

    /// Starts restores of `ids` without waiting (a peer's Acquire: the peer
    /// asks again shortly).
    pub fn restore_in_background(&self, ids: Vec<ObjectId>) {
        let ops = self.rc();
        self.supervisor.spawn_local("restore for peer", async move {
            let restores = ids.iter().map(|id| ops.restore(*id));
            for (id, result) in ids
                .iter()
                .zip(futures_util::future::join_all(restores).await)
            {
                if let Err(err) = result {
                    tracing::warn!(%id, %err, "restore for a peer");
                }
            }
        });
    }

    async fn restore_now(&self, id: ObjectId) -> Result<()> {
        let tiers = self.tiers.as_ref().expect("restores need tiers");
        let sizes = tiers.sizes(&id).ok_or_else(|| ShoalError::not_found(&id))?;
        let _in_flight = tiers.restore_permit(sizes.payload_len()).await;
        let location = self
            .allocate(
                principals::TIERS,
                &[(id, sizes.data_size, sizes.meta_size)],
                Placement::Packed,
                RESTORE_WAIT_MS,
                pending(),
            )
            .await?[0];
        match tiers.fill(id, location).await {
            // Deleted while restoring: the delete took it off the tiers.
            Ok(_) if !tiers.tracks(&id) => {
                let _ = self.node.mutate(|s| s.abort(principals::TIERS, &id));
                Err(ShoalError::not_found(&id))
            }
            Ok(_) => {
                self.node
                    .mutate(|s| s.seal(principals::TIERS, &[id], true))?;
                if let Some(cluster) = &self.cluster {
                    // Its home learns where it lives now.
                    cluster.announce_sealed(&[id]).await;
                }
                Ok(())
            }
            Err(err) => {
                if matches!(
                    err.kind(),
                    ErrorKind::ObjectCorrupt | ErrorKind::ObjectNotFound
                ) {
                    // No intact copy is left: the object is gone.
                    tiers.forget(&id);
                }
                let _ = self.node.mutate(|s| s.abort(principals::TIERS, &id));
                Err(err)
            }
        }
    }
}
