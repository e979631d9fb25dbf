//! Remote allocation, as the node of the writing client: objects created in
//! another node's region (only that node's allocator runs), written by the
//! client through its own mapping, sealed or aborted there. On a node
//! reached over the network the client writes a staging buffer here
//! instead, which the seal pushes there first (`staging`).

use std::time::Duration;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{AllocateRequest, Ids, Outcome, SealRequest};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::peers::{pairs_by_node, Reach, RPC_TIMEOUT};
use crate::cluster::state::Cluster;

pub(super) fn outcome_error(node: u32, outcome: Outcome) -> Result<()> {
    if outcome.code == 0 {
        return Ok(());
    }
    let kind = ErrorKind::from_code(outcome.code as u16).unwrap_or(ErrorKind::Protocol);
    Err(ShoalError::new(
        kind,
        format!("node {node}: {}", outcome.message),
    ))
}

impl Cluster {
    /// Asks `node` to create objects in its region for `client`, which
    /// holds the creator's reference there. Returns the node's incarnation
    /// (its region's generation) and the locations.
    pub async fn allocate(
        &self,
        client: ClientId,
        node: u32,
        specs: &[(ObjectId, u64, u32)],
        timeout_ms: u32,
    ) -> Result<(u64, Vec<ObjectLocation>)> {
        self.peers.reachable(node)?; // a peer known to be down fails at once
        let ids: Vec<ObjectId> = specs.iter().map(|s| s.0).collect();
        let mut request = tonic::Request::new(AllocateRequest {
            ids: pack(&ids),
            data_sizes: specs.iter().map(|s| s.1).collect(),
            meta_sizes: specs.iter().map(|s| s.2).collect(),
            timeout_ms,
            incarnation: self.incarnation,
        });
        // The node may wait `timeout_ms` for space: the call may take that long.
        request.set_timeout(RPC_TIMEOUT + Duration::from_millis(u64::from(timeout_ms)));
        let answer = self
            .peers
            .call(node, Reach::FailFast, "allocate", |mut p| async move {
                p.allocate(request).await
            })
            .await;
        let reply = match answer {
            Ok(reply) => reply,
            Err(err) => {
                // It may have allocated after all: abort whatever it made.
                let _ = self.abort_at(node, &ids).await;
                return Err(err);
            }
        };
        if reply.code != 0 {
            let kind = ErrorKind::from_code(reply.code as u16).unwrap_or(ErrorKind::Protocol);
            return Err(ShoalError::new(
                kind,
                format!("node {node}: {}", reply.message),
            ));
        }
        if reply.offsets.len() != specs.len() {
            return Err(ShoalError::protocol(format!(
                "node {node} answered a short allocation"
            )));
        }
        let locations: Vec<ObjectLocation> = reply
            .offsets
            .iter()
            .zip(specs)
            .map(|(&offset, s)| ObjectLocation {
                offset,
                data_size: s.1,
                meta_size: s.2,
            })
            .collect();
        for l in &locations {
            self.check_location(node, l)?;
        }
        let fenced = self.heard_grant(node, reply.fence_epoch);
        let mut creations = self.creations.borrow_mut();
        let mine = creations.entry(client).or_default();
        for id in &ids {
            mine.insert(*id, node);
            // The creator's reference at the node, returned on release
            // (unless the node fenced this one already: it holds it).
            self.loans.borrow_mut().direct(client, *id, node, fenced);
        }
        Ok((reply.incarnation, locations))
    }

    async fn abort_at(&self, node: u32, ids: &[ObjectId]) -> Result<()> {
        let request = Ids { ids: pack(ids) };
        let outcome = self
            .peers
            .call(node, Reach::Try, "abort", |mut p| async move {
                p.abort(request).await
            })
            .await?;
        outcome_error(node, outcome)
    }

    /// The node on which `client` is writing `id`, if it allocated it remotely.
    pub fn creation(&self, client: ClientId, id: &ObjectId) -> Option<u32> {
        self.creations.borrow().get(&client)?.get(id).copied()
    }

    /// Seals (or aborts) remotely allocated objects at their node.
    pub async fn finish_remote(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        seal: bool,
        release: bool,
    ) -> Result<()> {
        let mine: Vec<(u32, ObjectId)> = ids
            .iter()
            .filter_map(|id| self.creation(client, id).map(|node| (node, *id)))
            .collect();
        for (node, group) in pairs_by_node(mine) {
            let staged = self.is_network(node);
            if seal && staged {
                if let Err(err) = self.push_stages(client, node, &group).await {
                    // Nothing of them stays: not the objects there, not the
                    // buffers here.
                    self.forget_creations(client, &group);
                    self.unhold(client, &group);
                    self.drop_stages(client, &group);
                    if let Err(abort) = self.abort_at(node, &group).await {
                        tracing::debug!(node, %abort, "abort after a failed push");
                    }
                    return Err(err);
                }
            }
            if seal {
                let request = SealRequest {
                    ids: pack(&group),
                    release,
                };
                let outcome = self
                    .peers
                    .call(node, Reach::Try, "seal", |mut p| async move {
                        p.seal(request).await
                    })
                    .await?;
                outcome_error(node, outcome)?;
            } else {
                if staged {
                    self.drop_stages(client, &group);
                }
                self.abort_at(node, &group).await?;
            }
            self.forget_creations(client, &group);
            // Seal-and-release and abort drop the creator's reference at the node.
            if release || !seal {
                self.unhold(client, &group);
            }
            if staged && seal {
                if release {
                    self.drop_stages(client, &group);
                } else {
                    self.keep_sealed_stages(client, &group);
                }
            }
        }
        Ok(())
    }

    fn forget_creations(&self, client: ClientId, ids: &[ObjectId]) {
        if let Some(mine) = self.creations.borrow_mut().get_mut(&client) {
            for id in ids {
                mine.remove(id);
            }
        }
    }

    /// A client went: abort what it was still writing on other nodes (and
    /// free its staging buffers here).
    pub async fn abort_creations_of(&self, client: ClientId) {
        self.drop_all_stages(client);
        let Some(mine) = self.creations.borrow_mut().remove(&client) else {
            return;
        };
        let pairs = mine.into_iter().map(|(id, node)| (node, id)).collect();
        for (node, group) in pairs_by_node(pairs) {
            if let Err(err) = self.abort_at(node, &group).await {
                tracing::debug!(node, %err, "abort of a gone client's remote creations");
            }
        }
    }
}
