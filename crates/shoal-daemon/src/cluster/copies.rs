//! Network-mode copies: objects of nodes whose memory cannot be mapped
//! here, pulled and kept under the same id, announced to their homes so a
//! delete at the owner drops them everywhere.
//!
//! A copy must never outlive the object it copies (docs/cluster.md,
//! "Network copies after faults"):
//! - the holder keeps each copy's identity (the owner and the owner's
//!   incarnation it was pulled from) and drops its copies of a node that
//!   restarted, and every copy whose home restarted (the new home knows
//!   nothing of the copy; re-announcing it could attach it to another
//!   object created under the id since);
//! - a home owes each `Drop` it could not deliver (the holder was down or
//!   cut off) and sends it again before it counts the holder alive again;
//!   while a drop is owed the id cannot be registered again (the home
//!   answers `ObjectInUse`, the creator reports `ObjectExists` saying why),
//!   so no new object can share an id with an old copy still held somewhere.

use std::rc::Rc;

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{CachedRequest, Ids};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::copy_records::CopyOf;
use crate::cluster::peers::{by_node, join_all, pairs_by_node, Reach};
use crate::cluster::state::{to_proto, Cluster};

impl Cluster {
    /// Ids this node holds as network-mode copies (not owned: never registered).
    pub fn is_copy(&self, id: &ObjectId) -> bool {
        self.copies.borrow().contains_key(id)
    }

    /// Stops counting ids as copies; returns those that were.
    pub fn forget_copies(&self, ids: &[ObjectId]) -> Vec<ObjectId> {
        let mut copies = self.copies.borrow_mut();
        ids.iter()
            .filter(|id| copies.remove(id).is_some())
            .copied()
            .collect()
    }

    /// Announces copies of `owner`'s objects (sealed there at `locations`)
    /// to their homes; call it while still holding the references at the
    /// owner. Per id whether the home recorded the copy: one it refused (the
    /// object was deleted or replaced meanwhile) or could not be told of (a
    /// later delete would not drop it) must not be kept.
    pub async fn announce_copies(
        &self,
        ids: &[ObjectId],
        of: CopyOf,
        locations: &[ObjectLocation],
    ) -> Vec<bool> {
        let owner = of.owner;
        self.copies
            .borrow_mut()
            .extend(ids.iter().map(|id| (*id, of)));
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
    /// ids (node, id) to drop them (this node's own, directly). A drop owed
    /// until answered: one that fails is sent again when the holder next
    /// answers a heartbeat, and the ids stay unregistrable until then.
    pub async fn send_drops(&self, stale: Vec<(u32, ObjectId)>) {
        self.owed_drops.borrow_mut().owe(&stale);
        let calls = pairs_by_node(stale)
            .into_iter()
            .map(|(node, ids)| async move {
                if node == self.me {
                    self.drop_copies(&ids).await;
                    self.owed_drops.borrow_mut().settle(node, &ids);
                    return;
                }
                self.deliver_drops(node, ids).await;
            });
        join_all(calls).await;
    }

    /// One `Drop` call to `node`; settled if answered, else still owed.
    async fn deliver_drops(&self, node: u32, ids: Vec<ObjectId>) -> bool {
        let request = Ids { ids: pack(&ids) };
        let outcome = self
            .peers
            .call(node, Reach::Try, "drop", |mut p| async move {
                p.drop(request).await
            })
            .await;
        match outcome {
            Ok(_) => {
                self.owed_drops.borrow_mut().settle(node, &ids);
                true
            }
            Err(err) => {
                tracing::debug!(node, %err, "drop of copies failed; sent again when it answers");
                false
            }
        }
    }

    /// Sends `node` the drops it missed; call it before `node` counts as
    /// alive again after a heartbeat it answered.
    pub async fn drops_missed(&self, node: u32) {
        let ids = self.owed_drops.borrow().to(node);
        if ids.is_empty() {
            return;
        }
        let count = ids.len();
        if self.deliver_drops(node, ids).await {
            tracing::info!(
                node,
                ids = count,
                "delivered the drops of copies node {node} missed"
            );
        }
    }

    /// Whether a drop of `id`'s copies is still owed to some node (as a
    /// home): the id may not be claimed again until it is delivered.
    pub fn drop_owed(&self, id: &ObjectId) -> bool {
        self.owed_drops.borrow().owes(id)
    }

    /// Ids whose copies `node` must still be told to drop (a metric).
    pub fn drops_owed_to(&self, node: u32) -> usize {
        self.owed_drops.borrow().count_to(node)
    }

    /// [`send_drops`](Self::send_drops) in the background (owed at once).
    pub fn send_drops_later(self: &Rc<Self>, stale: Vec<(u32, ObjectId)>) {
        if stale.is_empty() {
            return;
        }
        self.owed_drops.borrow_mut().owe(&stale);
        let cluster = self.clone();
        self.supervisor.spawn_local(
            "drop copies",
            async move { cluster.send_drops(stale).await },
        );
    }

    /// `node` restarted: the copies this node keeps of its objects, and the
    /// copies whose home it is (its directory no longer lists them), are
    /// dropped here at once, before anything restores at it; the drops owed
    /// to it are void (it holds no copy of before).
    pub fn drop_copies_of_restarted(self: &Rc<Self>, node: u32) {
        self.owed_drops.borrow_mut().forget_node(node);
        let stale: Vec<ObjectId> = self
            .copies
            .borrow()
            .iter()
            .filter(|(id, of)| of.owner == node || self.home(id) == node)
            .map(|(id, _)| *id)
            .collect();
        if stale.is_empty() {
            return;
        }
        let dropped = self.delete_copies(&stale);
        tracing::info!(
            node,
            copies = dropped.len(),
            "node {node} restarted: dropped the copies of its objects and those it was home for"
        );
        let cluster = self.clone();
        self.supervisor
            .spawn_local("revoke dropped copies", async move {
                cluster.revoke(cluster.holders(&dropped)).await;
            });
    }

    /// Stops counting `ids` as copies and deletes them from the store
    /// (deferred while referenced, like any delete: hidden from new gets at
    /// once); returns those deleted.
    fn delete_copies(&self, ids: &[ObjectId]) -> Vec<ObjectId> {
        let copies = self.forget_copies(ids);
        if copies.is_empty() {
            return copies;
        }
        self.node.mutate(|store| {
            copies
                .into_iter()
                .filter(|id| store.delete(id).is_ok())
                .collect()
        })
    }

    /// The home says these copies' objects are gone: delete the copies here
    /// (deferred while referenced, like any delete) and revoke what peers
    /// hold of them (a peer whose home was down may have found a copy here).
    pub async fn drop_copies(&self, ids: &[ObjectId]) {
        let dropped = self.delete_copies(ids);
        if !dropped.is_empty() {
            self.revoke(self.holders(&dropped)).await;
        }
    }
}
