//! Create: claim the ids cluster-wide, then allocate, waiting for space on
//! a full store (other nodes' idle loans are asked back first). The one
//! place a create waits for space, for local clients and peers alike.

use std::future::Future;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_store::store::Placement;
use tokio::time::Instant;

use crate::ops::Ops;
use crate::principals;

/// How long a create waits for evictions in flight (a tier copying victims
/// out) however short its own timeout: the space is coming, not maybe.
const EVICTION_WAIT: Duration = Duration::from_secs(30);

pub(super) type Spec = (ObjectId, u64, u32);

impl Ops {
    /// Creates all objects or none for `client`, their blocks placed as
    /// `placement` says. On a full store, waits up to `timeout_ms` for
    /// memory to come free before failing `StoreFull`; `gone` resolving (the
    /// client hung up) ends the wait with `Disconnected`.
    pub(crate) async fn create(
        &self,
        client: ClientId,
        specs: &[Spec],
        placement: Placement,
        timeout_ms: u32,
        gone: impl Future<Output = ()>,
    ) -> Result<Vec<ObjectLocation>> {
        let _timed = self.node.metrics().time(crate::metrics::Op::Create);
        let ids: Vec<ObjectId> = specs.iter().map(|s| s.0).collect();
        // An object that left memory for a tier still exists.
        if let Some(id) = ids.iter().find(|id| self.node.held_below(id)) {
            return Err(ShoalError::exists(id));
        }
        if let Some(cluster) = &self.cluster {
            // Ids are unique cluster-wide: claim them at their homes first.
            cluster.register(&ids).await?;
        }
        let result = self
            .allocate(client, specs, placement, timeout_ms, gone)
            .await;
        if let (Some(cluster), Err(_)) = (&self.cluster, &result) {
            cluster.unregister(&ids).await;
        }
        result
    }

    /// Remote allocation: creates on `node` (this one, or another whose
    /// allocator runs there). Returns the node's region generation (0 here).
    /// `placement` applies here; another node packs.
    pub(crate) async fn create_on(
        &self,
        client: ClientId,
        node: u32,
        specs: &[Spec],
        placement: Placement,
        timeout_ms: u32,
        gone: impl Future<Output = ()>,
    ) -> Result<(u64, Vec<ObjectLocation>)> {
        match &self.cluster {
            _ if node == self.me() => Ok((
                0,
                self.create(client, specs, placement, timeout_ms, gone)
                    .await?,
            )),
            None => Err(ShoalError::invalid(format!(
                "create on node {node}: this daemon is not part of a cluster"
            ))),
            Some(cluster) => cluster.allocate(client, node, specs, timeout_ms).await,
        }
    }

    pub(super) async fn allocate(
        &self,
        client: ClientId,
        specs: &[Spec],
        placement: Placement,
        timeout_ms: u32,
        gone: impl Future<Output = ()>,
    ) -> Result<Vec<ObjectLocation>> {
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        let mut loans_asked = false;
        tokio::pin!(gone);
        loop {
            let space = self.node.space().notified();
            tokio::pin!(space);
            space.as_mut().enable();
            let (result, evicting, drain_pins) = self.node.mutate(|store| {
                (
                    store.create_batch_placed(client, specs, placement),
                    store.evicting_bytes(),
                    store.bytes_only_referenced_by(principals::TIERS),
                )
            });
            let err = match result {
                Err(err) if err.kind() == ErrorKind::StoreFull => err,
                other => return other,
            };
            // Other nodes' idle loans pin objects here: ask for them first.
            if !loans_asked {
                loans_asked = true;
                if let Some(cluster) = &self.cluster {
                    cluster.take_back_idle().await;
                    continue;
                }
            }
            // Drain jobs pin memory for a moment: it comes free as they end,
            // unless clients hold those objects too (then waiting for the
            // drains would wait for nothing, up to EVICTION_WAIT).
            let draining =
                drain_pins > 0 && self.tiers.as_ref().is_some_and(|t| t.pinned_bytes() > 0);
            let wait_until = if evicting > 0 || draining {
                deadline.max(Instant::now() + EVICTION_WAIT)
            } else {
                deadline
            };
            if Instant::now() >= wait_until {
                return Err(self.explain_full(err));
            }
            tokio::select! {
                _ = space => {}
                _ = tokio::time::sleep_until(wait_until) => {}
                _ = &mut gone => return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "client left while waiting for space",
                )),
            }
        }
    }

    /// A `StoreFull` says so when the capacity controller is the reason.
    fn explain_full(&self, err: ShoalError) -> ShoalError {
        match self.elastic.as_ref().and_then(|e| e.refusal()) {
            Some(reason) => {
                ShoalError::new(ErrorKind::StoreFull, format!("{}; {reason}", err.message()))
            }
            None => err,
        }
    }
}
