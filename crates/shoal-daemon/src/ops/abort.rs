//! Abort: an unsealed object goes, its memory free at once (on the node
//! that allocated it, for a remote creation).

use shoal_core::error::Result;
use shoal_core::ids::ClientId;
use shoal_core::ObjectId;

use crate::ops::Ops;

impl Ops {
    /// Aborts each id; every id is tried, and the last failure is returned.
    pub(crate) async fn abort(&self, client: ClientId, ids: &[ObjectId]) -> Result<()> {
        let _timed = self.node.metrics().time(crate::metrics::Op::Abort);
        let (remote, here): (Vec<ObjectId>, Vec<ObjectId>) = ids
            .iter()
            .partition(|id| self.remote_creation(client, id).is_some());
        let mut result = Ok(());
        if !remote.is_empty() {
            let cluster = self.cluster.as_ref().expect("remote creations");
            result = cluster.finish_remote(client, &remote, false, false).await;
        }
        self.node.mutate(|store| {
            for id in &here {
                match store.abort(client, id) {
                    Ok(()) => self.node.names().borrow_mut().forget(id),
                    Err(err) => result = Err(err),
                }
            }
        });
        result
    }
}
