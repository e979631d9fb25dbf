//! Seal: the object becomes immutable and visible. In a cluster its home
//! hears where it lives before the seal is answered, so a get on any node
//! afterwards finds it. Objects a client allocated on other nodes are
//! sealed there.

use shoal_core::durability::Durability;
use shoal_core::error::{Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::ObjectId;

use crate::ops::Ops;
use crate::tiers::check_level;

impl Ops {
    /// Seals `ids`; answers once each reached `durability` (`None`: the
    /// node's default). A durability this node cannot give is refused
    /// before anything is sealed. Objects a client allocated on other nodes
    /// get their owner's default.
    pub(crate) async fn seal(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        release: bool,
        durability: Option<Durability>,
    ) -> Result<()> {
        let level = durability.unwrap_or_else(|| {
            self.tiers
                .as_ref()
                .map_or(Durability::Memory, |t| t.default_durability())
        });
        check_level(self.tiers.as_deref(), level)?;
        let _timed = self.node.metrics().time(crate::metrics::Op::Seal);
        let (remote, here): (Vec<ObjectId>, Vec<ObjectId>) = ids
            .iter()
            .partition(|id| self.remote_creation(client, id).is_some());
        if !remote.is_empty() {
            let cluster = self.cluster.as_ref().expect("remote creations");
            cluster
                .finish_remote(client, &remote, true, release)
                .await?;
            if here.is_empty() {
                return Ok(());
            }
        }
        self.node
            .mutate(|store| store.seal(client, &here, release))?;
        self.bind_sealed(&here).await;
        if let Some(tiers) = &self.tiers {
            tiers.sealed_with(&here, level);
        }
        if let Some(cluster) = &self.cluster {
            cluster.announce_sealed(&here).await;
        }
        if level > Durability::Memory {
            let tiers = self.tiers.as_ref().expect("checked above");
            let failures = tiers.wait_durable(&here, level, None).await;
            if let Some((id, err)) = here
                .iter()
                .zip(failures)
                .find_map(|(id, e)| e.map(|e| (id, e)))
            {
                return Err(ShoalError::new(
                    err.kind(),
                    format!(
                        "sealed in memory, but object {id} did not reach durability {level}: {}",
                        err.message()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The node on which `client` is writing `id`, if it allocated it there.
    pub(crate) fn remote_creation(&self, client: ClientId, id: &ObjectId) -> Option<u32> {
        self.cluster.as_ref()?.creation(client, id)
    }
}
