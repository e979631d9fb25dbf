//! Restores through the tiers ([`Tiers::restore`](crate::tiers::Tiers::restore)):
//! the operations give it memory (an allocation as for a create, which may
//! wait for room, evict down a tier or borrow idle loans) and tell the
//! cluster where a restored object lives now.

use std::future::{pending, Future};
use std::pin::Pin;
use std::time::Duration;

use shoal_core::error::Result;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_store::store::Placement;
use shoal_tiers::ObjectSizes;
use tokio::time::Instant;

use crate::elastic::Restorer;
use crate::ops::Ops;
use crate::principals;
use crate::tiers::restore::{RestoreOutcome, RestoreTarget};

/// How long a restore waits for memory (others leaving it) before failing,
/// unless its caller waits less (a get's timeout).
pub(super) const RESTORE_WAIT: Duration = Duration::from_secs(30);

impl RestoreTarget for Ops {
    fn allocate(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        wait_ms: u32,
    ) -> Pin<Box<dyn Future<Output = Result<ObjectLocation>> + '_>> {
        Box::pin(async move {
            let spec = [(id, sizes.data_size, sizes.meta_size)];
            let located = self
                .allocate(
                    principals::TIERS,
                    &spec,
                    Placement::Packed,
                    wait_ms,
                    pending(),
                )
                .await?;
            Ok(located[0])
        })
    }

    fn restored(&self, id: ObjectId) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(async move {
            if let Some(cluster) = &self.cluster {
                // Its home learns where it lives now.
                cluster.announce_sealed(&[id]).await;
            }
        })
    }
}

impl Restorer for Ops {
    fn restore_object(
        &self,
        id: ObjectId,
    ) -> Pin<Box<dyn Future<Output = Result<RestoreOutcome>> + '_>> {
        Box::pin(self.restore(id))
    }
}

impl Ops {
    /// Brings `id` into memory if a tier holds it and memory does not,
    /// waiting for room up to `RESTORE_WAIT`.
    pub(crate) async fn restore(&self, id: ObjectId) -> Result<RestoreOutcome> {
        self.restore_within(id, RESTORE_WAIT).await
    }

    /// [`restore`](Self::restore), waiting for others to leave memory for
    /// `wait` at most (0: fails `StoreFull` at once when nothing in memory
    /// can be evicted, nor is on its way out).
    pub(crate) async fn restore_within(
        &self,
        id: ObjectId,
        wait: Duration,
    ) -> Result<RestoreOutcome> {
        match &self.tiers {
            Some(tiers) => tiers.restore(id, self.rc(), Instant::now() + wait).await,
            None => Ok(RestoreOutcome::NotBelow),
        }
    }

    /// Starts restores of `ids` without waiting (a peer's Acquire: the peer
    /// asks again shortly).
    pub(crate) fn restore_in_background(&self, ids: Vec<ObjectId>) {
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
}
