//! Seal: the object becomes immutable and visible. In a cluster its home
//! hears where it lives before the seal is answered, so a get on any node
//! afterwards finds it. Objects a client allocated on other nodes are
//! sealed there.

use shoal_core::error::Result;
use shoal_core::object_table::ClientId;
use shoal_core::ObjectId;

use crate::ops::Ops;

impl Ops {
    pub async fn seal(&self, client: ClientId, ids: &[ObjectId], release: bool) -> Result<()> {
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
        if let Some(cluster) = &self.cluster {
            cluster.announce_sealed(&here).await;
        }
        Ok(())
    }

    /// The node on which `client` is writing `id`, if it allocated it there.
    pub fn remote_creation(&self, client: ClientId, id: &ObjectId) -> Option<u32> {
        self.cluster.as_ref()?.creation(client, id)
    }
}
