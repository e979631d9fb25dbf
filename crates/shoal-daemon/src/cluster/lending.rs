//! As an owner: taking back the loans other nodes hold on this node's
//! objects (`loans.rs` is the holder's side).
//!
//! - A delete revokes the loans of the deleted ids before it is answered
//!   and before the ids leave their homes' directories, so no get anywhere
//!   sees the old object once the delete returned, nor once the id was
//!   created anew.
//! - A create short of space asks the holders for their idle loans once
//!   before it waits (or fails): a loan is a reference, and referenced
//!   objects cannot be evicted.

use shoal_cluster::ids::pack;
use shoal_cluster::proto::{Empty, Ids, RevokeRequest};
use shoal_core::error::{Result, ShoalError};
use shoal_core::ObjectId;

use crate::cluster::peers::{join_all, Reach};
use crate::cluster::state::Cluster;
use crate::principals;

/// The references a node gave up in answer to Revoke or GiveBack.
fn given_up(node: u32, answer: Result<Ids>) -> Vec<(u32, ObjectId)> {
    let ids = answer.and_then(|reply| {
        shoal_cluster::ids::unpack(&reply.ids)
            .map_err(|s| ShoalError::protocol(format!("node {node}: {}", s.message())))
    });
    match ids {
        Ok(ids) => ids.into_iter().map(|id| (node, id)).collect(),
        Err(err) => {
            tracing::debug!(node, %err, "loans not given back");
            Vec::new()
        }
    }
}

impl Cluster {
    /// Nodes holding references here on `ids`, just deleted (node → ids).
    pub fn holders(&self, ids: &[ObjectId]) -> Vec<(u32, Vec<ObjectId>)> {
        self.node.read(|store| {
            self.others()
                .filter_map(|node| {
                    let client = principals::peer(node);
                    if !store.has_references(client) {
                        return None;
                    }
                    let held: Vec<ObjectId> = ids
                        .iter()
                        .filter(|id| store.holds(client, id))
                        .copied()
                        .collect();
                    (!held.is_empty()).then_some((node, held))
                })
                .collect()
        })
    }

    /// Revokes the loans of deleted ids at the nodes holding references on
    /// them ([`holders`](Self::holders)), and drops the references of the
    /// idle loans they gave up. A node that does not answer keeps lending
    /// until its lease here runs out (docs/cluster.md, "Loans").
    pub async fn revoke(&self, holders: Vec<(u32, Vec<ObjectId>)>) {
        if holders.is_empty() {
            return;
        }
        let number = self.revokes_sent.get() + 1;
        self.revokes_sent.set(number);
        let calls = holders.into_iter().map(|(node, ids)| async move {
            let request = RevokeRequest {
                ids: pack(&ids),
                number,
            };
            let answer = self
                .peers
                .call(node, Reach::FailFast, "revoke", |mut p| async move {
                    p.revoke(request).await
                })
                .await;
            given_up(node, answer)
        });
        let given_up: Vec<_> = join_all(calls).await.into_iter().flatten().collect();
        self.drop_given_up(&given_up);
    }

    /// Asks the nodes holding references here to give up their idle loans;
    /// returns whether any did (memory may be free now).
    pub async fn take_back_idle(&self) -> bool {
        let nodes: Vec<u32> = self.node.read(|store| {
            self.others()
                .filter(|&n| store.has_references(principals::peer(n)))
                .collect()
        });
        if nodes.is_empty() {
            return false;
        }
        let calls = nodes.into_iter().map(|node| async move {
            let answer = self
                .peers
                .call(node, Reach::FailFast, "give_back", |mut p| async move {
                    p.give_back(Empty {}).await
                })
                .await;
            given_up(node, answer)
        });
        let given_up: Vec<_> = join_all(calls).await.into_iter().flatten().collect();
        self.drop_given_up(&given_up);
        !given_up.is_empty()
    }

    /// How many Revoke calls this node sent (in Acquire answers: `loans`).
    pub fn revokes_sent(&self) -> u64 {
        self.revokes_sent.get()
    }

    /// The holders gave these loans up: their references here go.
    fn drop_given_up(&self, given_up: &[(u32, ObjectId)]) {
        if given_up.is_empty() {
            return;
        }
        self.node.mutate(|store| {
            for (node, id) in given_up {
                if let Err(err) = store.release(principals::peer(*node), id) {
                    tracing::debug!(node, %err, "loan given up, reference already gone");
                }
            }
        });
    }
}

impl Cluster {
    /// Whether to apply Acquire `seq` from `peer` (`ref_ledger`).
    pub fn admit_acquire(&self, peer: u32, seq: u64, settled: u64) -> bool {
        self.ledger.borrow_mut().admit_acquire(peer, seq, settled)
    }

    /// Acquire `seq` from `peer` took references on `taken`.
    pub fn acquired(&self, peer: u32, seq: u64, taken: Vec<ObjectId>) {
        self.ledger.borrow_mut().acquired(peer, seq, taken);
    }

    /// A Release from `peer` (`ref_ledger::RefLedger::release`): whether to
    /// apply its ids, and the references of the Acquires it undoes.
    pub fn ledger_release(
        &self,
        peer: u32,
        seq: u64,
        settled: u64,
        undo: &[u64],
    ) -> (bool, Vec<ObjectId>) {
        self.ledger.borrow_mut().release(peer, seq, settled, undo)
    }
}
