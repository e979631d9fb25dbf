//! Network-mode copies: objects of nodes whose memory cannot be mapped
//! here, pulled and kept under the same id, announced to their homes so a
//! delete at the owner drops them everywhere.

use std::rc::Rc;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{CachedRequest, Ids};
use shoal_core::store::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::peers::{by_node, join_all, pairs_by_node, Reach};
use crate::cluster::state::{to_proto, Cluster};

impl Cluster {
    /// Ids this node holds as network-mode copies (not owned: never registered).
    pub fn is_copy(&self, id: &ObjectId) -> bool {
        self.copies.borrow().contains(id)
    }

    /// Stops counting ids as copies; returns those that were.
    pub fn forget_copies(&self, ids: &[ObjectId]) -> Vec<ObjectId> {
        let mut copies = self.copies.borrow_mut();
        ids.iter().filter(|id| copies.remove(id)).copied().collect()
    }

    /// Announces copies of `owner`'s objects (sealed there at `locations`)
    /// to their homes; call it while still holding the references at the
    /// owner. Per id whether the home recorded the copy: one it refused (the
    /// object was deleted or replaced meanwhile) or could not be told of (a
    /// later delete would not drop it) must not be kept.
    pub async fn announce_copies(
        &self,
        ids: &[ObjectId],
        owner: u32,
        locations: &[ObjectLocation],
    ) -> Vec<bool> {
        self.copies.borrow_mut().extend(ids.iter().copied());
        let mut accepted = vec![false; ids.len()];
        let groups = by_node(ids, |id| self.home(id));
        let calls = groups.into_iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            let at: Vec<ObjectLocation> = positions.iter().map(|&i| locations[i]).collect();
            async move {
                if home == self.me {
                    let recorded = self.directory_add_checked_copies(&group, owner, &at, self.me);
                    return (positions, recorded);
                }
                let request = CachedRequest {
                    ids: pack(&group),
                    owner,
                    locations: at.iter().map(to_proto).collect(),
                };
                let answered = self
                    .peers
                    .call(home, Reach::FailFast, "cached", |mut p| async move {
                        p.cached(request).await
                    })
                    .await;
                let recorded = match answered {
                    Ok(reply) => reply.codes.iter().map(|&c| c == 0).collect(),
                    Err(err) => {
                        tracing::debug!(%err, "copy announcement failed");
                        vec![false; group.len()]
                    }
                };
                (positions, recorded)
            }
        });
        for (positions, recorded) in join_all(calls).await {
            for (i, ok) in positions.into_iter().zip(recorded) {
                accepted[i] = ok;
            }
        }
        let refused: Vec<ObjectId> = (0..ids.len())
            .filter(|&i| !accepted[i])
            .map(|i| ids[i])
            .collect();
        self.forget_copies(&refused);
        accepted
    }

    /// As a home: tells the nodes holding network-mode copies of deleted
    /// ids (node, id) to drop them (this node's own, directly).
    pub async fn send_drops(&self, stale: Vec<(u32, ObjectId)>) {
        let calls = pairs_by_node(stale)
            .into_iter()
            .map(|(node, ids)| async move {
                if node == self.me {
                    self.drop_copies(&ids).await;
                    return;
                }
                let request = Ids { ids: pack(&ids) };
                let outcome = self
                    .peers
                    .call(node, Reach::Try, "drop", |mut p| async move {
                        p.drop(request).await
                    })
                    .await;
                if let Err(err) = outcome {
                    tracing::debug!(node, %err, "drop of copies failed");
                }
            });
        join_all(calls).await;
    }

    /// [`send_drops`](Self::send_drops) in the background.
    pub fn send_drops_later(self: &Rc<Self>, stale: Vec<(u32, ObjectId)>) {
        if stale.is_empty() {
            return;
        }
        let cluster = self.clone();
        self.supervisor.spawn_local(
            "drop copies",
            async move { cluster.send_drops(stale).await },
        );
    }

    /// The home says these copies' objects are gone: delete the copies here
    /// (deferred while referenced, like any delete) and revoke what peers
    /// hold of them (a peer whose home was down may have found a copy here).
    pub async fn drop_copies(&self, ids: &[ObjectId]) {
        let copies = self.forget_copies(ids);
        if copies.is_empty() {
            return;
        }
        let dropped: Vec<ObjectId> = self.node.mutate(|store| {
            copies
                .into_iter()
                .filter(|id| store.delete(id).is_ok())
                .collect()
        });
        self.revoke(self.holders(&dropped)).await;
    }
}
