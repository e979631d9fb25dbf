//! Remote allocation on a node reached over the network only. Its region
//! cannot be mapped here, so the client writes into a *staging buffer* in
//! this node's region (an unsealed object of `principals::STAGE` under an
//! id of its own, random and never registered anywhere; `staging`), while
//! the object itself is allocated on that node as in mapped mode
//! (`remote_alloc`: the id registered with that node as its owner, its
//! allocator run there). The seal pushes the buffer's bytes over that
//! node's data channel into its object — sendfile from the region here,
//! `read` straight into the object there (`bulk`), no copy in user space on
//! either side — then seals it there.

use shoal_cluster::bulk::{push_range, Encryption, Kind, Request};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::peers::{join_all, RPC_TIMEOUT};
use crate::cluster::state::Cluster;
use crate::principals;

/// Objects at least this large are pushed in parallel ranges, as pulls are.
const PARALLEL_PUSH: u64 = 8 << 20;

impl Cluster {
    /// Records the staging buffers (`stages`, at `locations`) a client
    /// writes `objects` into.
    pub fn add_stages(
        &self,
        client: ClientId,
        objects: &[ObjectId],
        stages: &[ObjectId],
        locations: &[ObjectLocation],
    ) {
        self.staging
            .borrow_mut()
            .add(client, objects, stages, locations);
    }

    /// Whether `id` is a staging buffer's own id.
    pub fn is_stage(&self, id: &ObjectId) -> bool {
        self.staging.borrow().is_stage(id)
    }

    /// Pushes the staging buffers of `ids` (objects `client` allocated on
    /// `node`) into their objects there. Every one must still have its
    /// buffer: one aborted here while the abort at `node` failed is not
    /// sealed with whatever bytes the object holds there.
    pub(super) async fn push_stages(
        &self,
        client: ClientId,
        node: u32,
        ids: &[ObjectId],
    ) -> Result<()> {
        for id in ids {
            let stage = self.staging.borrow().get(client, id);
            match stage {
                Some(stage) if !stage.sealed => self.push(node, *id, stage.location).await?,
                _ => {
                    return Err(ShoalError::new(
                        ErrorKind::ObjectNotFound,
                        format!("object {id} on node {node} was aborted here"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Keeps the buffers of objects sealed without release until the
    /// client releases them ([`release_stages`](Self::release_stages)).
    pub(super) fn keep_sealed_stages(&self, client: ClientId, ids: &[ObjectId]) {
        self.staging.borrow_mut().sealed(client, ids);
    }

    /// The client released these ids: the buffers of those sealed go.
    /// (A release before the seal keeps the buffer: the seal needs it.)
    pub fn release_stages(&self, client: ClientId, ids: &[ObjectId]) {
        self.free_stages(client, Some(ids), true);
    }

    /// Frees the buffers of `ids` (pushed and sealed with release, aborted,
    /// or failed).
    pub(super) fn drop_stages(&self, client: ClientId, ids: &[ObjectId]) {
        self.free_stages(client, Some(ids), false);
    }

    /// The client went: every buffer it had goes.
    pub(super) fn drop_all_stages(&self, client: ClientId) {
        self.free_stages(client, None, false);
    }

    fn free_stages(&self, client: ClientId, ids: Option<&[ObjectId]>, sealed_only: bool) {
        let gone = self.staging.borrow_mut().take(client, ids, sealed_only);
        if gone.is_empty() {
            return;
        }
        // (Not borrowed across the store's events: the listener asks `is_stage`.)
        self.node.mutate(|store| {
            for stage in &gone {
                if let Err(err) = store.abort(principals::STAGE, &stage.id) {
                    tracing::error!(id = %stage.id, %err, "staging buffer lost");
                }
            }
        });
        self.staging.borrow_mut().forget(&gone);
    }

    /// Pushes the bytes at `src` in this node's region into object `id`,
    /// which this node allocated on `node`, in parallel ranges for large
    /// objects. A node that cannot be reached or stalls for the RPC timeout
    /// is `NodeUnavailable`; a refusal keeps its kind.
    async fn push(&self, node: u32, id: ObjectId, src: ObjectLocation) -> Result<()> {
        self.peers.reachable(node)?; // a peer known to be down fails at once
                                     // Resolved by each range's connection: a host name is looked up again.
        let address = self.topology().node(node)?.data.clone();
        let token = self.identity.token_for(node)?;
        let len = src.size();
        let parts = if len >= PARALLEL_PUSH { 4 } else { 1 };
        let step = len.div_ceil(parts);
        let ranges = (0..parts)
            .map(|p| (p * step, ((p + 1) * step).min(len)))
            .filter(|(start, end)| start < end);
        let calls = ranges.map(|(start, end)| {
            let request = Request {
                kind: Kind::Push,
                from: self.me,
                token: token.to_vec(),
                id,
                offset: start,
                len: end - start,
            };
            let region = self.node.region().clone();
            let address = address.clone();
            let tls = self.tls.clone();
            let metrics = self.node.metrics().clone();
            let worker = tokio::task::spawn_blocking(move || {
                metrics.peer_calls.transfer_sent(if tls.is_some() {
                    Encryption::UserSpace.as_str()
                } else {
                    Encryption::None.as_str()
                });
                // SAFETY: the staging buffer lies inside our region (the
                // allocator hands out in-range blocks), which `region`
                // keeps mapped; only this push reads it while its seal runs.
                unsafe {
                    push_range(
                        node,
                        address,
                        &request,
                        region.fd(),
                        region.base(),
                        src.offset + start,
                        RPC_TIMEOUT,
                        tls.as_deref(),
                    )
                }
            });
            async move {
                worker
                    .await
                    .unwrap_or_else(|e| Err(ShoalError::io("data channel worker", e)))
            }
        });
        join_all(calls).await.into_iter().collect()
    }
}
