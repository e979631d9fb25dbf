//! As a holder: the numbers of the reference calls (Acquire, Release) this
//! node sends each owner, and what to send again until each is settled
//! (the owner's side, and why, is `ref_ledger.rs`).
//!
//! A Release whose call failed is sent again under its number: the owner
//! applies it once whether the first copy was lost or only its answer. An
//! Acquire whose call failed may have taken references the caller never
//! learnt of; it is undone by number (the owner drops exactly what it took,
//! or refuses it if it arrives later). Both are sent when the owner answers
//! a heartbeat again, until answered; a call stays unsettled meanwhile, so
//! the owner keeps its record.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shoal_core::ObjectId;

/// Calls kept to send again per owner; past it the oldest are given up
/// (logged): an owner that never answers cannot make us keep more.
pub(super) const MAX_PENDING: usize = 1 << 16;

/// A call's number and the caller's settled mark to send with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Numbered {
    pub seq: u64,
    pub settled: u64,
}

/// A Release to send again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingRelease {
    pub seq: u64,
    pub ids: Vec<ObjectId>,
    /// The owner's fence epoch for us it was sent under.
    pub fence_epoch: u64,
}

/// What to send an owner again now.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Resend {
    pub releases: Vec<PendingRelease>,
    /// Acquires to undo.
    pub undo: Vec<u64>,
    pub settled: u64,
}

impl Resend {
    pub(crate) fn is_empty(&self) -> bool {
        self.releases.is_empty() && self.undo.is_empty()
    }
}

#[derive(Debug, Default)]
struct Owner {
    /// The last number given.
    last: u64,
    /// Numbered and not settled.
    open: BTreeSet<u64>,
    releases: BTreeMap<u64, PendingRelease>,
    /// Acquires to undo, with the fence epoch they were sent under.
    undo: BTreeMap<u64, u64>,
}

impl Owner {
    fn settled(&self) -> u64 {
        self.open.first().map_or(self.last, |&first| first - 1)
    }

    fn bound(&mut self, owner: u32) {
        while self.releases.len() + self.undo.len() > MAX_PENDING {
            let oldest_release = self.releases.keys().next().copied();
            let oldest_undo = self.undo.keys().next().copied();
            let seq = match (oldest_release, oldest_undo) {
                (Some(r), Some(u)) => r.min(u),
                (Some(r), None) => r,
                (None, Some(u)) => u,
                (None, None) => return,
            };
            self.releases.remove(&seq);
            self.undo.remove(&seq);
            self.open.remove(&seq);
            tracing::warn!(
                owner,
                seq,
                "gave up a reference call the owner never answered"
            );
        }
    }
}

/// The journals of every owner.
#[derive(Debug, Default)]
pub(crate) struct RefJournal {
    owners: HashMap<u32, Owner>,
}

impl RefJournal {
    /// Numbers a new call to `owner`.
    pub(crate) fn begin(&mut self, owner: u32) -> Numbered {
        let o = self.owners.entry(owner).or_default();
        o.last += 1;
        let seq = o.last;
        o.open.insert(seq);
        Numbered {
            seq,
            settled: o.settled(),
        }
    }

    /// Call `seq` to `owner` was answered (or undone, and the undo answered).
    pub(crate) fn answered(&mut self, owner: u32, seq: u64) {
        if let Some(o) = self.owners.get_mut(&owner) {
            o.open.remove(&seq);
        }
    }

    /// A Release failed: sent again later under its number.
    pub(crate) fn release_failed(&mut self, owner: u32, release: PendingRelease) {
        let Some(o) = self.owners.get_mut(&owner) else {
            return;
        };
        if o.open.contains(&release.seq) {
            o.releases.insert(release.seq, release);
            o.bound(owner);
        }
    }

    /// An Acquire failed: its references (if it was applied) are undone later.
    pub(crate) fn acquire_failed(&mut self, owner: u32, seq: u64, fence_epoch: u64) {
        let Some(o) = self.owners.get_mut(&owner) else {
            return;
        };
        if o.open.contains(&seq) {
            o.undo.insert(seq, fence_epoch);
            o.bound(owner);
        }
    }

    /// Takes what to send `owner` again. Calls from before a fence it has
    /// told us of since are settled instead: it ignores such releases, and
    /// the fence moved what such acquires took to quarantine.
    pub(crate) fn take_resend(&mut self, owner: u32, fence_epoch: u64) -> Resend {
        let Some(o) = self.owners.get_mut(&owner) else {
            return Resend::default();
        };
        let mut resend = Resend::default();
        for (seq, release) in std::mem::take(&mut o.releases) {
            if release.fence_epoch < fence_epoch {
                o.open.remove(&seq);
            } else {
                resend.releases.push(release);
            }
        }
        for (seq, epoch) in std::mem::take(&mut o.undo) {
            if epoch < fence_epoch {
                o.open.remove(&seq);
            } else {
                resend.undo.push(seq);
            }
        }
        resend.settled = o.settled();
        resend
    }

    /// The settled mark for `owner`.
    #[cfg(test)]
    pub(crate) fn settled(&self, owner: u32) -> u64 {
        self.owners.get(&owner).map_or(0, Owner::settled)
    }

    /// Calls to `owner` kept to send again.
    pub(crate) fn pending(&self, owner: u32) -> usize {
        self.owners
            .get(&owner)
            .map_or(0, |o| o.releases.len() + o.undo.len())
    }

    /// `owner` restarted: what its previous incarnation held is gone, so
    /// nothing is sent again; numbers go on rising.
    pub(crate) fn forget(&mut self, owner: u32) {
        if let Some(o) = self.owners.get_mut(&owner) {
            o.open.clear();
            o.releases.clear();
            o.undo.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    fn release(seq: u64, epoch: u64) -> PendingRelease {
        PendingRelease {
            seq,
            ids: vec![id(seq as u8)],
            fence_epoch: epoch,
        }
    }

    #[test]
    fn the_settled_mark_stays_below_the_oldest_open_call() {
        let mut j = RefJournal::default();
        assert_eq!(j.begin(2), Numbered { seq: 1, settled: 0 });
        assert_eq!(j.begin(2), Numbered { seq: 2, settled: 0 });
        j.answered(2, 2);
        assert_eq!(j.begin(2), Numbered { seq: 3, settled: 0 });
        j.answered(2, 1);
        assert_eq!(j.settled(2), 2);
        j.answered(2, 3);
        assert_eq!(j.settled(2), 3);
        // Owners are numbered apart.
        assert_eq!(j.begin(5).seq, 1);
    }

    #[test]
    fn a_failed_release_is_sent_again_under_its_number_until_answered() {
        let mut j = RefJournal::default();
        let n = j.begin(1);
        j.release_failed(1, release(n.seq, 0));
        let later = j.begin(1);
        j.answered(1, later.seq);
        let resend = j.take_resend(1, 0);
        assert_eq!(resend.releases, vec![release(1, 0)]);
        assert_eq!(resend.settled, 0, "call 1 is still open");
        // It failed again: kept.
        j.release_failed(1, resend.releases[0].clone());
        assert_eq!(j.pending(1), 1);
        let resend = j.take_resend(1, 0);
        j.answered(1, resend.releases[0].seq);
        assert_eq!(j.pending(1), 0);
        assert_eq!(j.settled(1), 2);
        assert!(j.take_resend(1, 0).is_empty());
    }

    #[test]
    fn a_failed_acquire_is_undone_by_number() {
        let mut j = RefJournal::default();
        let n = j.begin(1);
        j.acquire_failed(1, n.seq, 0);
        let resend = j.take_resend(1, 0);
        assert_eq!(resend.undo, vec![1]);
        assert_eq!(resend.settled, 0);
        j.answered(1, 1);
        assert_eq!(j.settled(1), 1);
    }

    #[test]
    fn calls_from_before_a_fence_are_settled_not_sent() {
        let mut j = RefJournal::default();
        let a = j.begin(1);
        j.acquire_failed(1, a.seq, 0);
        let r = j.begin(1);
        j.release_failed(1, release(r.seq, 0));
        let r2 = j.begin(1);
        j.release_failed(1, release(r2.seq, 1));
        let resend = j.take_resend(1, 1);
        assert_eq!(resend.releases, vec![release(3, 1)]);
        assert!(resend.undo.is_empty());
        assert_eq!(resend.settled, 2);
    }

    #[test]
    fn a_restarted_owner_gets_nothing_again() {
        let mut j = RefJournal::default();
        let n = j.begin(1);
        j.release_failed(1, release(n.seq, 0));
        j.forget(1);
        assert!(j.take_resend(1, 0).is_empty());
        let next = j.begin(1);
        assert_eq!(next, Numbered { seq: 2, settled: 1 });
        // A failure reported after the forget is not kept.
        j.release_failed(1, release(n.seq, 0));
        assert_eq!(j.pending(1), 0);
    }

    #[test]
    fn an_owner_that_never_answers_is_bounded() {
        let mut j = RefJournal::default();
        for _ in 0..MAX_PENDING + 5 {
            let n = j.begin(1);
            j.acquire_failed(1, n.seq, 0);
        }
        assert_eq!(j.pending(1), MAX_PENDING);
        assert_eq!(j.settled(1), 5, "the given-up calls count as settled");
    }
}
