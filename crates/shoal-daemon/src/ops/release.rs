//! Release: a client drops references. References on other nodes' objects
//! go back to their owners (or linger as loans); no answer is awaited.

use shoal_core::ids::ClientId;
use shoal_core::ObjectId;

use crate::ops::Ops;

impl Ops {
    pub(crate) fn release(&self, client: ClientId, ids: &[ObjectId]) {
        let _timed = self.node.metrics().time(crate::metrics::Op::Release);
        let remote = self.node.mutate(|store| {
            let release_here = |id: &ObjectId| {
                if let Err(err) = store.release(client, id) {
                    tracing::debug!(client, %err, "release ignored");
                }
            };
            match &self.cluster {
                Some(cluster) => cluster.unhold_remote(client, ids, release_here),
                None => {
                    ids.iter().for_each(release_here);
                    Vec::new()
                }
            }
        });
        if let Some(cluster) = &self.cluster {
            cluster.release_later(remote);
            cluster.release_stages(client, ids);
        }
    }
}
