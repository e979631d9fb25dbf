//! Fencing: a peer cut off past its lease never reads or writes memory that
//! was given to something else (docs/cluster.md "Fencing").
//!
//! As an **owner**, when a peer's lease runs out this node takes back every
//! reference and unsealed allocation the peer held here, but moves them to
//! the peer's quarantine principal instead of dropping them: the memory stays
//! as it is (the peer's clients may still have it mapped, and read it or
//! write it), nothing is freed or reused, and the peer can no longer act on
//! it (no release, no seal). Each such fence counts up the peer's *fence
//! epoch*, which every heartbeat, Acquire and Allocate answer to the peer
//! carries. The quarantine is freed when the peer confirms that epoch, when
//! it restarts (a new incarnation holds nothing), or — only if the cluster
//! file sets `quarantine_ms` — when that long passed unconfirmed (a node
//! that is gone for good; one still running past it may read reused memory).
//!
//! As a **holder**, when an owner's epoch for this node goes up, every
//! reference this node holds there is fenced: its loans serve no new get
//! and nothing fenced is ever released there (the owner holds them in
//! quarantine; a late release could drop a reference taken since). Once the
//! clients have let go of every fenced reference, the next heartbeat to the
//! owner confirms the epoch. Releases carry the epoch they were sent under,
//! so one already in flight when the owner fenced is ignored there.

use tokio::time::Instant;

use crate::cluster::state::Cluster;
use crate::principals;

impl Cluster {
    /// `node`'s lease here ran out: fence it (its holdings quarantined).
    pub(crate) fn fence(&self, node: u32) {
        let epoch = {
            let mut fences = self.fences.borrow_mut();
            fences.given[node as usize] += 1;
            let since = &mut fences.quarantined_since[node as usize];
            since.get_or_insert_with(Instant::now);
            fences.given[node as usize]
        };
        let (objects, unsealed) = self.node.mutate(|store| {
            store.transfer_client(principals::peer(node), principals::fenced(node))
        });
        // An undo of an Acquire from before must not drop references taken since.
        self.ledger.borrow_mut().fenced(node);
        tracing::warn!(
            node,
            epoch,
            objects,
            unsealed,
            "fenced node {node} (its lease expired): what it held is quarantined until it confirms"
        );
    }

    /// This node's fence epoch for `node` (carried to it in heartbeats and
    /// Acquire / Allocate answers).
    pub(crate) fn fence_epoch_for(&self, node: u32) -> u64 {
        epoch_of(&self.fences.borrow().given, node)
    }

    /// The epoch this node confirms to `owner` in its heartbeats.
    pub(crate) fn fence_confirmed_to(&self, owner: u32) -> u64 {
        epoch_of(&self.fences.borrow().confirmed, owner)
    }

    /// The epoch this node heard from `owner` (its releases carry it).
    pub(crate) fn fence_heard_from(&self, owner: u32) -> u64 {
        epoch_of(&self.fences.borrow().heard, owner)
    }

    /// `owner` says its fence epoch for this node is `epoch`. A higher one
    /// than heard before fences every reference held there now.
    pub(crate) fn heard_fence(&self, owner: u32, epoch: u64) {
        {
            let mut fences = self.fences.borrow_mut();
            let Some(heard) = fences.heard.get_mut(owner as usize) else {
                return;
            };
            if epoch <= *heard {
                return;
            }
            *heard = epoch;
        }
        let fenced = self.loans.borrow_mut().fence(owner);
        self.stop_peer_reads_at(owner);
        tracing::warn!(
            owner,
            epoch,
            fenced,
            "node {owner} fenced this node (our lease there ran out): its references there serve no new get"
        );
    }

    /// `owner` granted references under its fence `epoch` (an Acquire or
    /// Allocate answer): hears the epoch, and tells whether the grant was
    /// fenced already (it crossed a fence on its way).
    pub(crate) fn heard_grant(&self, owner: u32, epoch: u64) -> bool {
        self.heard_fence(owner, epoch);
        epoch < self.fence_heard_from(owner)
    }

    /// Every heartbeat tick: owners whose fence this node heard and whose
    /// fenced references its clients have all let go are confirmed (by the
    /// next heartbeat to them).
    pub(crate) fn confirm_fences(&self) {
        let mut fences = self.fences.borrow_mut();
        for owner in 0..fences.heard.len() {
            let heard = fences.heard[owner];
            if heard > fences.confirmed[owner]
                && self.loans.borrow().fenced_held(owner as u32) == 0
                && self.peer_reads_held(owner as u32) == 0
            {
                fences.confirmed[owner] = heard;
                tracing::info!(
                    owner,
                    epoch = heard,
                    "every reference node {owner} fenced is let go"
                );
            }
        }
    }

    /// `node` confirms this node's fences of it up to `epoch`: what it held
    /// in quarantine here is freed once that is the latest.
    pub(crate) fn fence_confirmed(&self, node: u32, epoch: u64) {
        let given = self.fence_epoch_for(node);
        if given == 0 || epoch < given {
            return;
        }
        self.release_quarantine(node, "it confirmed its fence");
    }

    /// Every heartbeat tick, with `quarantine_ms` set: quarantines older
    /// than that are freed unconfirmed.
    pub(crate) fn expire_quarantines(&self) {
        let Some(limit) = self.topology().quarantine else {
            return;
        };
        let expired: Vec<u32> = self
            .fences
            .borrow()
            .quarantined_since
            .iter()
            .enumerate()
            .filter(|(_, since)| since.is_some_and(|t| t.elapsed() >= limit))
            .map(|(node, _)| node as u32)
            .collect();
        for node in expired {
            self.release_quarantine(node, "not confirmed within quarantine_ms");
        }
    }

    /// Frees what `node` held in quarantine here (it confirmed, it
    /// restarted: a new incarnation holds nothing, or its time ran out).
    pub(crate) fn release_quarantine(&self, node: u32, why: &str) {
        if let Some(since) = self
            .fences
            .borrow_mut()
            .quarantined_since
            .get_mut(node as usize)
        {
            *since = None;
        }
        let fenced = principals::fenced(node);
        let freed = self.node.mutate(|store| {
            if store.client_holds_nothing(fenced) && !store.has_peer_tables(fenced) {
                return false;
            }
            store.disconnect(fenced);
            true
        });
        if freed {
            tracing::warn!(node, "freed what node {node} held in quarantine: {why}");
        }
    }

    /// Whether what `node` held here is quarantined now.
    pub fn quarantines(&self, node: u32) -> bool {
        self.fences
            .borrow()
            .quarantined_since
            .get(node as usize)
            .is_some_and(Option::is_some)
    }

    /// Whether a release `node` sent under `epoch` still counts here (not
    /// one sent before this node fenced it).
    pub(crate) fn release_counts(&self, node: u32, epoch: u64) -> bool {
        epoch >= self.fence_epoch_for(node)
    }

    /// `owner` restarted: its epochs start again from zero.
    pub(crate) fn forget_fences_of(&self, owner: u32) {
        let mut fences = self.fences.borrow_mut();
        let i = owner as usize;
        if i < fences.heard.len() {
            fences.heard[i] = 0;
            fences.confirmed[i] = 0;
        }
    }
}

/// `node`'s entry of a per-node epoch list (0 for a node not in the cluster).
fn epoch_of(epochs: &[u64], node: u32) -> u64 {
    epochs.get(node as usize).copied().unwrap_or(0)
}
