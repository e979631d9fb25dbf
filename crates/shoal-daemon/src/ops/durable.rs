//! Durability waits and explicit staging (IME's terms): `wait_durable`
//! for objects sealed at a lower level, `stage_in` brings objects into
//! memory from the tiers, `stage_out` writes them down to the lowest tier
//! and frees their memory.

use std::time::Duration;

use futures_util::future::join_all;
use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, ShoalError};
use shoal_core::ObjectId;
use tokio::time::Instant;

use crate::ops::Ops;
use crate::tiers::check_level;

impl Ops {
    /// Per id: `None` once it has a copy at `level`, else why not (within
    /// `timeout_ms`; -1 waits as long as it takes).
    pub(crate) async fn wait_durable(
        &self,
        ids: &[ObjectId],
        level: Durability,
        timeout_ms: i64,
    ) -> Vec<Option<ShoalError>> {
        let deadline = u64::try_from(timeout_ms)
            .ok()
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        match &self.tiers {
            Some(tiers) => tiers.wait_durable(ids, level, deadline).await,
            None => ids
                .iter()
                .map(|id| {
                    if let Err(err) = check_level(None, level) {
                        return Some(err);
                    }
                    (!self.node.read(|s| s.contains(id))).then(|| ShoalError::not_found(id))
                })
                .collect(),
        }
    }

    /// Brings each object into memory (no reference is taken: a get that
    /// follows finds it there). Per id `None`, or why not.
    pub(crate) async fn stage_in(&self, ids: &[ObjectId]) -> Vec<Option<ShoalError>> {
        let restores = ids.iter().map(|id| async move {
            match self.restore(*id).await {
                Ok(_) if self.node.read(|s| s.contains(id)) => None,
                Ok(_) => Some(ShoalError::not_found(id)),
                Err(err) => Some(err),
            }
        });
        join_all(restores).await
    }

    /// Writes each object down to the lowest tier (backing store, else burst
    /// buffer) and frees its memory unless a client holds it. Per id `None`,
    /// or why not (`ObjectInUse`: durable below, but referenced in memory).
    pub(crate) async fn stage_out(&self, ids: &[ObjectId]) -> Vec<Option<ShoalError>> {
        let Some(tiers) = &self.tiers else {
            return ids
                .iter()
                .map(|_| {
                    Some(ShoalError::invalid(
                        "this node has no tier below memory to stage out to",
                    ))
                })
                .collect();
        };
        let level = if tiers.check_level(Durability::Backing).is_ok() {
            Durability::Backing
        } else {
            Durability::Local
        };
        tiers.sealed_with(ids, level);
        let mut out = tiers.wait_durable(ids, level, None).await;
        self.node.mutate(|store| {
            for (slot, id) in out.iter_mut().zip(ids) {
                if slot.is_some() || !store.contains(id) {
                    continue;
                }
                if let Err(err) = store.evict_object(id) {
                    if err.kind() == ErrorKind::ObjectInUse {
                        *slot = Some(err);
                    }
                }
            }
        });
        out
    }
}
