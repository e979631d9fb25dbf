//! Network mode: a get of an object on a node whose memory cannot be mapped
//! here copies it into this node's region (pulled over the owner's data
//! channel, in parallel ranges), seals the copy under the same id, tells the
//! id's home (so a delete drops the copy) and answers it as a local object.

use shoal_core::error::{ErrorKind, Result};
use shoal_core::ids::ClientId;
use shoal_core::protocol::Located;
use shoal_core::ObjectId;

use crate::cluster::{CopyOf, Remote};
use crate::ops::Ops;
use crate::principals;

/// Objects at least this large are pulled in parallel ranges.
const PARALLEL_PULL: u64 = 8 << 20;

impl Ops {
    /// The reference taken at the owner covers the transfer and the
    /// announcement, and is released after them. `None` if another client
    /// of this node is pulling the same object right now.
    pub(super) async fn pull(
        &self,
        client: ClientId,
        id: ObjectId,
        remote: Remote,
    ) -> Result<Option<Located>> {
        let cluster = self.cluster.as_ref().expect("cluster mode");
        let l = remote.location;
        let created = self.node.mutate(|store| {
            store.create_batch(principals::COPY, &[(id, l.data_size, l.meta_size)])
        });
        let release_remote = || cluster.release_later(cluster.unhold(client, &[id]));
        let local = match created {
            Ok(locations) => locations[0],
            Err(err) => {
                release_remote();
                return if err.kind() == ErrorKind::ObjectExists {
                    Ok(None)
                } else {
                    Err(err)
                };
            }
        };
        let size = l.size();
        let parts = if size >= PARALLEL_PULL { 4 } else { 1 };
        // SAFETY: the copy's block lies inside our region (the allocator
        // hands out in-range blocks) and is ours until sealed.
        let dst = unsafe { self.node.region().base().add(local.offset as usize) };
        let fetched = cluster.fetch(remote.owner, id, size, dst, parts).await;
        let sealed = self.node.mutate(|store| match fetched {
            Err(err) => {
                let _ = store.abort(principals::COPY, &id);
                Err(err)
            }
            Ok(()) => store
                .seal(principals::COPY, &[id], true)
                .map(|()| store.get(client, &id)),
        });
        let location = match sealed {
            Ok(location) => location,
            Err(err) => {
                release_remote();
                return Err(err);
            }
        };
        // Announced while the owner's reference still pins the original, so
        // the home can tell a copy of the current object from one of an
        // object deleted (or replaced) meanwhile.
        let of = CopyOf {
            owner: remote.owner,
            incarnation: remote.generation,
        };
        let kept = cluster.announce_copies(&[id], of, &[l]).await[0];
        release_remote();
        if !kept {
            // This get still answers (it overlapped the delete), but the copy
            // goes: hidden now, freed when the client releases it.
            let _ = self.node.mutate(|store| store.delete(&id));
        }
        Ok(location.map(|location| Located::local(cluster.me, location)))
    }
}
