//! Get: take a reference on each id and describe where it lives, here or
//! on another node, waiting up to a timeout for ids not sealed yet.

use std::future::{pending, Future};
use std::time::Duration;

use shoal_core::coherence::CoherenceMode;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::protocol::Located;
use shoal_core::ObjectId;
use shoal_store::store::Store;
use tokio::time::Instant;

use crate::ops::restore::RESTORE_WAIT;
use crate::ops::Ops;
use crate::principals;

/// How often a get waiting for objects on other nodes asks again.
const REMOTE_POLL_MIN: Duration = Duration::from_millis(2);
const REMOTE_POLL_MAX: Duration = Duration::from_millis(50);

impl Ops {
    /// A get of an object in this node's region: takes the client's
    /// reference and describes the object for it.
    ///
    /// On a non-coherent cluster, an object a client of another node wrote
    /// here (remote allocation: created by that node's peer principal)
    /// may meet stale lines of its range in this node's caches, left by
    /// whatever this node read or wrote there before; the reader is told to
    /// invalidate it first. Objects written on this node need nothing: a
    /// node's caches see its own writes.
    fn get_here(&self, store: &mut Store, client: ClientId, id: &ObjectId) -> Option<Located> {
        let (location, creator) = store.get_with_creator(client, id)?;
        let Some(cluster) = &self.cluster else {
            return Some(Located::local(0, location));
        };
        Some(Located {
            invalidate: principals::is_peer(creator)
                && cluster.topology().coherence == CoherenceMode::Noncoherent,
            ..Located::local(cluster.me, location)
        })
    }

    /// Gets every id, waiting up to `timeout_ms` (-1: forever) for ones not
    /// sealed yet. Each object found holds one reference for this client.
    /// `gone` resolving (the client hung up) ends the wait.
    pub(crate) async fn get(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        timeout_ms: i64,
        gone: impl Future<Output = ()>,
    ) -> Result<Vec<Option<Located>>> {
        let _timed = self.node.metrics().time(crate::metrics::Op::Get);
        let deadline = u64::try_from(timeout_ms)
            .ok()
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut found: Vec<Option<Located>> = vec![None; ids.len()];
        // Per id, the node that could not be reached to find it (last poll).
        let mut unreachable: Vec<Option<u32>> = vec![None; ids.len()];
        // Per id, why its owner's bytes could not be pulled (last poll).
        let mut refused: Vec<Option<ShoalError>> = vec![None; ids.len()];
        let mut missing = ids.len();
        // Objects on other nodes are polled (their seals are not announced
        // here), backing off to REMOTE_POLL_MAX.
        let mut poll = REMOTE_POLL_MIN;
        tokio::pin!(gone);
        loop {
            let sealed = self.node.sealed().notified();
            tokio::pin!(sealed);
            sealed.as_mut().enable();
            if let Err(err) = self
                .restore_missing(client, ids, &mut found, &mut missing, deadline)
                .await
            {
                // Nothing half-done: the references taken so far go back.
                let taken: Vec<ObjectId> = ids
                    .iter()
                    .zip(&found)
                    .filter(|(_, f)| f.is_some())
                    .map(|(id, _)| *id)
                    .collect();
                self.release(client, &taken);
                return Err(err);
            }
            self.node.mutate(|store| {
                for (slot, id) in found.iter_mut().zip(ids) {
                    if slot.is_none() {
                        *slot = self.get_here(store, client, id);
                        missing -= slot.is_some() as usize;
                    }
                }
            });
            if missing > 0 && self.cluster.is_some() {
                missing -= self
                    .get_remote(client, ids, &mut found, &mut unreachable, &mut refused)
                    .await;
            }
            if missing == 0 {
                return Ok(found);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // One object that a node it depends on kept from being
                // found: say which (a batch answers `None` per id, as ever).
                if let ([id], [Some(err)]) = (ids, refused.as_slice()) {
                    return Err(ShoalError::new(
                        err.kind(),
                        format!(
                            "object {id} not found within {timeout_ms} ms: its bytes could not \
                             be pulled: {}",
                            err.message()
                        ),
                    ));
                }
                if let ([id], [Some(node)]) = (ids, unreachable.as_slice()) {
                    return Err(ShoalError::new(
                        ErrorKind::NodeUnavailable,
                        format!(
                            "object {id} not found within {timeout_ms} ms: node {node}, which \
                             owns it or keeps its directory entry, is unreachable"
                        ),
                    ));
                }
                return Ok(found);
            }
            let wake = match (&self.cluster, deadline) {
                (Some(_), Some(d)) => Some(d.min(Instant::now() + poll)),
                (Some(_), None) => Some(Instant::now() + poll),
                (None, d) => d,
            };
            poll = (poll * 2).min(REMOTE_POLL_MAX);
            tokio::select! {
                _ = sealed => {}
                _ = sleep_until(wake) => {}
                _ = &mut gone => return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "client left while waiting in get",
                )),
            }
        }
    }

    /// Restores the ids still missing that a tier below holds, taking the
    /// client's reference on each as soon as it is in memory (so a batch
    /// larger than memory cannot evict its own first objects). A restore
    /// that fails (no intact copy: `ObjectCorrupt`; no memory) fails the get.
    /// A restore waits for memory until the get's `deadline` (at most
    /// `RESTORE_WAIT`): a get that does not wait (`timeout_ms = 0`) fails
    /// `StoreFull` at once when everything in memory is referenced, instead
    /// of waiting for others' releases.
    async fn restore_missing(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        found: &mut [Option<Located>],
        missing: &mut usize,
        deadline: Option<Instant>,
    ) -> Result<()> {
        if self.tiers.is_none() {
            return Ok(());
        }
        let below: Vec<usize> = (0..ids.len())
            .filter(|&i| {
                found[i].is_none()
                    && self.node.held_below(&ids[i])
                    && !self.node.read(|s| s.contains(&ids[i]))
            })
            .collect();
        if below.is_empty() {
            return Ok(());
        }
        let wait = deadline.map_or(RESTORE_WAIT, |d| {
            d.saturating_duration_since(Instant::now())
                .min(RESTORE_WAIT)
        });
        let restores = below.iter().map(|&i| async move {
            // The restore's hold keeps the object in memory until the
            // reference is taken (dropped after the mutate, which it uses).
            let restored = self.restore_within(ids[i], wait).await;
            let located = match &restored {
                Ok(_) => self
                    .node
                    .mutate(|store| self.get_here(store, client, &ids[i])),
                Err(err) => return (i, Err(err.clone())),
            };
            drop(restored);
            (i, Ok(located))
        });
        let mut first_error = None;
        for (i, result) in futures_util::future::join_all(restores).await {
            match result {
                Ok(Some(located)) => {
                    found[i] = Some(located);
                    *missing -= 1;
                }
                // Evicted again before we got to it, or deleted: next round.
                Ok(None) => {}
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Looks for the ids still missing on other nodes; returns how many it
    /// found, and notes per id the node that could not be reached to find it.
    async fn get_remote(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        found: &mut [Option<Located>],
        unreachable: &mut [Option<u32>],
        refused: &mut [Option<ShoalError>],
    ) -> usize {
        let cluster = self.cluster.as_ref().expect("cluster mode");
        let positions: Vec<usize> = (0..ids.len()).filter(|&i| found[i].is_none()).collect();
        let wanted: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
        let remote = match cluster.get(client, &wanted).await {
            Ok(remote) => {
                for (&i, node) in positions.iter().zip(&remote.unreachable) {
                    unreachable[i] = *node;
                }
                remote.found
            }
            // A down home or owner, a peer that misbehaves: the ids stay
            // missing; the client's connection is not at fault.
            Err(err) => {
                if err.kind() == ErrorKind::NodeUnavailable {
                    tracing::debug!(%err, "remote get");
                } else {
                    tracing::warn!(%err, "remote get");
                }
                return 0;
            }
        };
        let mut got = 0;
        for (&i, r) in positions.iter().zip(remote) {
            let Some(r) = r else { continue };
            if r.network {
                // Unmappable owner: pull a copy into our region.
                match self.pull(client, ids[i], r).await {
                    Ok(Some(located)) => found[i] = Some(located),
                    Ok(None) => continue,
                    // No room for the copy, owner gone: missing for now.
                    Err(err) => {
                        if err.kind() == ErrorKind::PermissionDenied && refused[i].is_none() {
                            // A TLS refusal, or bytes changed on the way: said
                            // once per get, not at each of its polls.
                            tracing::warn!(%err, id = %ids[i], "network pull refused");
                        } else {
                            tracing::debug!(%err, id = %ids[i], "network pull");
                        }
                        unreachable[i] = Some(r.owner);
                        refused[i] = Some(err);
                        continue;
                    }
                }
            } else {
                found[i] = Some(Located {
                    node: r.owner,
                    generation: r.generation,
                    location: r.location,
                    invalidate: false,
                });
            }
            got += 1;
        }
        got
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => pending().await,
    }
}
