//! Remote allocation on a node reached over the network only: the objects
//! are allocated there as in mapped mode (ids registered with that node as
//! their owner, its allocator run there), and staging buffers of the same
//! sizes here take the client's writes; the seal pushes them
//! (`cluster/staging.rs`).

use std::future::Future;

use shoal_core::error::{Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use shoal_store::store::Placement;

use crate::ops::create::Spec;
use crate::ops::Ops;
use crate::principals;

impl Ops {
    /// Whether objects created on `node` are written here and pushed there
    /// (its memory cannot be mapped here).
    pub(crate) fn pushes_to(&self, node: u32) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.is_network(node))
    }

    /// Creates `specs` on `node` (one [`pushes_to`](Self::pushes_to)) for
    /// `client`, all or none. Answers where the client writes them: their
    /// staging buffers in this node's region. The wait for space, up to
    /// `timeout_ms`, is `node`'s and then this node's for the buffers;
    /// `gone` (the client hung up) ends the latter.
    pub(crate) async fn create_staged(
        &self,
        client: ClientId,
        node: u32,
        specs: &[Spec],
        timeout_ms: u32,
        gone: impl Future<Output = ()>,
    ) -> Result<Vec<ObjectLocation>> {
        let cluster = self.cluster.as_ref().expect("only a cluster pushes");
        cluster.allocate(client, node, specs, timeout_ms).await?;
        let ids: Vec<ObjectId> = specs.iter().map(|s| s.0).collect();
        let stages: Vec<Spec> = specs
            .iter()
            .map(|&(_, data, meta)| (ObjectId::random(), data, meta))
            .collect();
        let staged = self
            .allocate(
                principals::STAGE,
                &stages,
                Placement::Packed,
                timeout_ms,
                gone,
            )
            .await;
        match staged {
            Ok(locations) => {
                let stage_ids: Vec<ObjectId> = stages.iter().map(|s| s.0).collect();
                cluster.add_stages(client, &ids, &stage_ids, &locations);
                Ok(locations)
            }
            Err(err) => {
                if let Err(abort) = cluster.finish_remote(client, &ids, false, false).await {
                    tracing::debug!(node, %abort, "abort after a failed staging create");
                }
                Err(ShoalError::new(
                    err.kind(),
                    format!(
                        "staging buffers on node {} for objects on node {node}: {}",
                        cluster.me,
                        err.message()
                    ),
                ))
            }
        }
    }
}
