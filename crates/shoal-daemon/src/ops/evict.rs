//! Evict: free memory on request by evicting unreferenced objects (as the
//! eviction gate decides); objects other nodes keep on loan are asked back
//! when that is not enough. Cool: objects their readers are done with go
//! first when memory is needed.

use shoal_core::error::ShoalError;
use shoal_core::ids::ObjectId;

use crate::ops::Ops;

impl Ops {
    /// Returns the bytes evicted (freed, or held for freeing by a tier).
    pub(crate) async fn evict(&self, bytes: u64) -> u64 {
        let _timed = self.node.metrics().time(crate::metrics::Op::Evict);
        let mut freed = self.node.mutate(|store| store.evict(bytes));
        if freed < bytes {
            if let Some(cluster) = &self.cluster {
                if cluster.take_back_idle().await {
                    freed += self.node.mutate(|store| store.evict(bytes - freed));
                }
            }
        }
        freed
    }

    /// Marks each of `ids` cold in this node's store (`Store::cool`): its
    /// error, if any, in the order of `ids`.
    pub(crate) fn cool(&self, ids: &[ObjectId]) -> Vec<Option<ShoalError>> {
        self.node
            .mutate(|store| ids.iter().map(|id| store.cool(id).err()).collect())
    }
}
