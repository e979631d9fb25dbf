//! As a holder: the references this node's clients hold on other nodes'
//! objects, and the loans among them (`loans.rs` has the logic).

use shoal_core::ids::ClientId;
use shoal_core::ObjectId;

use crate::cluster::ref_journal::{PendingRelease, Resend};
use crate::cluster::state::Cluster;

impl Cluster {
    /// Drops one of `client`'s remote references per id; returns the
    /// (owner, id) references to release at the owners now (a loan's
    /// reference stays while it lingers).
    pub fn unhold(&self, client: ClientId, ids: &[ObjectId]) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().release(client, ids)
    }

    /// As [`unhold`](Self::unhold); ids `client` holds no remote reference
    /// to go to `local` (objects of this node).
    pub fn unhold_remote(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        local: impl FnMut(&ObjectId),
    ) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().release_held(client, ids, local)
    }

    /// Every remote reference of a client that disconnected, to release now.
    pub fn drop_client(&self, client: ClientId) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().drop_client(client)
    }

    /// Reference calls to `owner` waiting to be sent again or undone.
    pub fn unsettled_calls_to(&self, owner: u32) -> usize {
        self.journal.borrow().pending(owner)
    }

    /// Loans this node holds (in use or lingering), for `cluster status`.
    pub fn loans_held(&self) -> usize {
        self.loans.borrow().len()
    }

    /// Forgets the loans on owners that have not answered a heartbeat for
    /// three quarters of a lease: our lease there may run out before we
    /// hear from them again (`Loans::owner_lost`). Every heartbeat tick.
    pub fn forget_loans_of_silent_owners(&self) {
        let mut loans = self.loans.borrow_mut();
        if loans.len() == 0 {
            return;
        }
        let limit = self.topology().lease * 3 / 4;
        for (node, answered) in self.peers.last_answers().iter().enumerate() {
            if answered.is_some_and(|t| t.elapsed() > limit) {
                let lost = loans.owner_lost(node as u32);
                if lost > 0 {
                    tracing::warn!(
                        node,
                        lost,
                        "forgot the loans on a node that stopped answering"
                    );
                }
            }
        }
    }

    /// Loans idle past the linger, to release now (every heartbeat tick).
    pub fn expired_loans(&self) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().expired()
    }

    /// The owner `from` deleted `ids` (its revoke `number`); returns the ids
    /// whose idle loans were given up.
    pub fn revoked(&self, from: u32, number: u64, ids: &[ObjectId]) -> Vec<ObjectId> {
        self.loans.borrow_mut().revoke(from, number, ids)
    }

    /// The owner `from` is short of space.
    pub fn give_back_idle(&self, from: u32) -> Vec<ObjectId> {
        self.loans.borrow_mut().give_back_idle(from)
    }
}

impl Cluster {
    /// Sends releases to owners (one call per owner). A release that fails
    /// is sent again under its number when the owner answers a heartbeat
    /// (`ref_journal`); one from before a fence is dropped there.
    pub async fn release(&self, refs: Vec<(u32, ObjectId)>) {
        use crate::cluster::peers::{join_all, pairs_by_node};
        let calls = pairs_by_node(refs).into_iter().map(|(owner, ids)| {
            let numbered = self.journal.borrow_mut().begin(owner);
            let release = PendingRelease {
                seq: numbered.seq,
                ids,
                // Under the epoch this node knows: one the owner fenced
                // since is ignored there (`fencing.rs`).
                fence_epoch: self.fence_heard_from(owner),
            };
            self.send_release(owner, release, numbered.settled, Vec::new())
        });
        join_all(calls).await;
    }

    /// One Release to `owner`, undoing the Acquires `undo`; on failure kept
    /// to send again (the undos too).
    async fn send_release(
        &self,
        owner: u32,
        release: PendingRelease,
        settled: u64,
        undo: Vec<u64>,
    ) {
        use crate::cluster::peers::Reach;
        let request = shoal_cluster::proto::ReleaseRequest {
            ids: shoal_cluster::ids::pack(&release.ids),
            fence_epoch: release.fence_epoch,
            seq: release.seq,
            settled,
            undo: undo.clone(),
            callee_incarnation: self.peers.incarnation_of(owner).unwrap_or(0),
        };
        let outcome = self
            .peers
            .call(owner, Reach::Try, "release", |mut p| async move {
                p.release(request).await
            })
            .await;
        // (An unnumbered carrier of undos, seq 0, is never open in the
        // journal: answering or failing it is a no-op there.)
        let mut journal = self.journal.borrow_mut();
        match outcome {
            Ok(_) => {
                journal.answered(owner, release.seq);
                for acquire in undo {
                    journal.answered(owner, acquire);
                }
            }
            Err(err) => {
                tracing::debug!(owner, %err, "release failed; sent again when the owner answers");
                let epoch = release.fence_epoch;
                journal.release_failed(owner, release);
                for acquire in undo {
                    journal.acquire_failed(owner, acquire, epoch);
                }
            }
        }
    }

    /// Sends `owner` again the releases whose calls failed and the undos of
    /// acquires whose answers were lost (it just answered a heartbeat).
    pub async fn resend_reference_calls(&self, owner: u32) {
        let epoch = self.fence_heard_from(owner);
        let resend = self.journal.borrow_mut().take_resend(owner, epoch);
        if resend.is_empty() {
            return;
        }
        let Resend {
            releases,
            undo,
            settled,
        } = resend;
        tracing::info!(
            owner,
            releases = releases.len(),
            undone = undo.len(),
            "sending again reference calls whose answers were lost"
        );
        let mut calls: Vec<_> = releases
            .into_iter()
            .map(|release| self.send_release(owner, release, settled, Vec::new()))
            .collect();
        if !undo.is_empty() {
            // The undos ride on an unnumbered release of nothing: undoing is
            // idempotent by itself (`ref_ledger`).
            let undos = PendingRelease {
                seq: 0,
                ids: Vec::new(),
                fence_epoch: epoch,
            };
            calls.push(self.send_release(owner, undos, settled, undo));
        }
        crate::cluster::peers::join_all(calls).await;
    }

    /// [`release`](Self::release) in the background (a client's release is
    /// answered without waiting for the owners).
    pub fn release_later(self: &std::rc::Rc<Self>, refs: Vec<(u32, ObjectId)>) {
        if refs.is_empty() {
            return;
        }
        let cluster = self.clone();
        self.supervisor
            .spawn_local("release", async move { cluster.release(refs).await });
    }
}
