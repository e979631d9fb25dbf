//! As an owner: which numbered reference calls (Acquire, Release) each peer
//! has had applied here, so a call its sender retries or undoes after a lost
//! answer counts exactly once (docs/cluster.md "Numbered reference calls").
//!
//! A holder numbers its Acquire and Release calls to each owner (`seq`, from
//! 1; 0 = unnumbered, always applied) and says with every call up to which
//! number all of them are settled at its end (`settled`): answered, or undone
//! and the undo answered. It never sends a settled call again, so the owner
//! forgets everything at or below it. Above it, the owner keeps per call:
//! - a Release applied: sent again (its answer was lost), it is not applied again;
//! - an Acquire applied, with the ids it took references on: its answer was
//!   lost, so the holder never used them and *undoes* the call, which drops
//!   exactly those references;
//! - an Acquire undone (or undone before it arrived, overtaken by its undo):
//!   arriving now, it takes nothing.
//!
//! A fence (the references moved to quarantine) or a restart of the peer
//! (they were dropped) ends what undoing could drop: those calls stay
//! recorded only so that a late copy is not applied.

use std::collections::{BTreeMap, HashMap};

use shoal_core::ObjectId;

/// Calls kept per peer above its settled mark. A holder keeps a call
/// unsettled only while the owner cannot answer it; this bounds what a
/// peer that never settles can make us keep (the oldest go first, logged).
pub(super) const MAX_UNSETTLED: usize = 1 << 16;

/// What this node applied of one numbered call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    Released,
    /// The ids it took references on (those found).
    Acquired(Vec<ObjectId>),
    /// Undone, fenced or from a previous incarnation: nothing left to drop.
    Closed,
}

#[derive(Debug, Default)]
struct Ledger {
    settled: u64,
    calls: BTreeMap<u64, Applied>,
}

impl Ledger {
    fn settle(&mut self, settled: u64) {
        if settled > self.settled {
            self.settled = settled;
            self.calls = self.calls.split_off(&(settled + 1));
        }
    }

    /// Whether call `seq` is new (not applied, not settled, not undone).
    fn is_new(&self, seq: u64) -> bool {
        seq > self.settled && !self.calls.contains_key(&seq)
    }

    fn record(&mut self, peer: u32, seq: u64, applied: Applied) {
        self.calls.insert(seq, applied);
        if self.calls.len() > MAX_UNSETTLED {
            if let Some((oldest, _)) = self.calls.pop_first() {
                tracing::warn!(
                    peer,
                    oldest,
                    "a peer left {MAX_UNSETTLED} reference calls unsettled; forgot the oldest"
                );
            }
        }
    }
}

/// The ledgers of every peer.
#[derive(Debug, Default)]
pub(crate) struct RefLedger {
    peers: HashMap<u32, Ledger>,
}

impl RefLedger {
    /// An Acquire `seq` from `peer` (whose calls up to `settled` are settled):
    /// whether to apply it. Unnumbered calls are always applied.
    pub(crate) fn admit_acquire(&mut self, peer: u32, seq: u64, settled: u64) -> bool {
        if seq == 0 {
            return true;
        }
        let ledger = self.peers.entry(peer).or_default();
        ledger.settle(settled);
        ledger.is_new(seq)
    }

    /// Acquire `seq` from `peer` was applied and took references on `taken`.
    pub(crate) fn acquired(&mut self, peer: u32, seq: u64, taken: Vec<ObjectId>) {
        if seq == 0 {
            return;
        }
        let ledger = self.peers.entry(peer).or_default();
        if seq > ledger.settled {
            ledger.record(peer, seq, Applied::Acquired(taken));
        }
    }

    /// A Release `seq` from `peer` that undoes the Acquires `undo`: whether
    /// to apply its ids, and the ids whose references the undone Acquires
    /// took (one reference each, to drop).
    pub(crate) fn release(
        &mut self,
        peer: u32,
        seq: u64,
        settled: u64,
        undo: &[u64],
    ) -> (bool, Vec<ObjectId>) {
        let ledger = self.peers.entry(peer).or_default();
        ledger.settle(settled);
        let apply = seq == 0 || ledger.is_new(seq);
        if apply && seq != 0 {
            ledger.record(peer, seq, Applied::Released);
        }
        let mut dropped = Vec::new();
        for &acquire in undo {
            if acquire == 0 || acquire <= ledger.settled {
                continue;
            }
            match ledger.calls.get_mut(&acquire) {
                Some(applied @ Applied::Acquired(_)) => {
                    if let Applied::Acquired(ids) = std::mem::replace(applied, Applied::Closed) {
                        dropped.extend(ids);
                    }
                }
                Some(_) => {}
                // Not here yet: it takes nothing when it comes.
                None => ledger.record(peer, acquire, Applied::Closed),
            }
        }
        (apply, dropped)
    }

    /// `peer`'s references moved to quarantine (fenced): undoing an Acquire
    /// from before must not drop references taken since.
    pub(crate) fn fenced(&mut self, peer: u32) {
        if let Some(ledger) = self.peers.get_mut(&peer) {
            for applied in ledger.calls.values_mut() {
                if matches!(applied, Applied::Acquired(_)) {
                    *applied = Applied::Closed;
                }
            }
        }
    }

    /// `peer` restarted: its references were dropped and it numbers its
    /// calls afresh.
    pub(crate) fn forget(&mut self, peer: u32) {
        self.peers.remove(&peer);
    }

    /// Calls kept for `peer`.
    #[cfg(test)]
    pub(crate) fn unsettled(&self, peer: u32) -> usize {
        self.peers.get(&peer).map_or(0, |l| l.calls.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    #[test]
    fn a_release_sent_again_is_applied_once() {
        let mut l = RefLedger::default();
        assert_eq!(l.release(1, 3, 0, &[]), (true, vec![]));
        assert_eq!(l.release(1, 3, 0, &[]), (false, vec![]));
        // Another peer numbers its own calls.
        assert_eq!(l.release(2, 3, 0, &[]), (true, vec![]));
    }

    #[test]
    fn unnumbered_calls_are_always_applied() {
        let mut l = RefLedger::default();
        assert!(l.admit_acquire(1, 0, 0));
        assert!(l.admit_acquire(1, 0, 0));
        assert_eq!(l.release(1, 0, 0, &[]), (true, vec![]));
        assert_eq!(l.release(1, 0, 0, &[]), (true, vec![]));
        assert_eq!(l.unsettled(1), 0);
    }

    #[test]
    fn an_undone_acquire_drops_exactly_what_it_took_once() {
        let mut l = RefLedger::default();
        assert!(l.admit_acquire(1, 1, 0));
        l.acquired(1, 1, vec![id(1), id(2)]);
        assert!(l.admit_acquire(1, 2, 0));
        l.acquired(1, 2, vec![id(1)]);
        let (apply, dropped) = l.release(1, 0, 0, &[1]);
        assert!(apply);
        assert_eq!(dropped, vec![id(1), id(2)]);
        // The undo sent again (its answer lost) drops nothing more.
        assert_eq!(l.release(1, 0, 0, &[1]), (true, vec![]));
        // Call 2 is untouched.
        assert_eq!(l.release(1, 0, 0, &[2]), (true, vec![id(1)]));
    }

    #[test]
    fn an_acquire_overtaken_by_its_undo_takes_nothing() {
        let mut l = RefLedger::default();
        assert_eq!(l.release(1, 0, 0, &[7]), (true, vec![]));
        assert!(!l.admit_acquire(1, 7, 0));
        assert!(l.admit_acquire(1, 8, 0));
    }

    #[test]
    fn settled_calls_are_forgotten_and_never_applied_again() {
        let mut l = RefLedger::default();
        for seq in 1..=5 {
            assert!(l.admit_acquire(1, seq, 0));
            l.acquired(1, seq, vec![id(seq as u8)]);
        }
        assert_eq!(l.unsettled(1), 5);
        assert!(l.admit_acquire(1, 6, 4));
        assert_eq!(l.unsettled(1), 1, "only call 5 is above the mark");
        // A copy of a settled call is stale: not applied, nothing undone.
        assert_eq!(l.release(1, 2, 4, &[3]), (false, vec![]));
        assert!(!l.admit_acquire(1, 4, 4));
    }

    #[test]
    fn a_fence_or_a_restart_leaves_nothing_to_undo() {
        let mut l = RefLedger::default();
        assert!(l.admit_acquire(1, 1, 0));
        l.acquired(1, 1, vec![id(1)]);
        l.fenced(1);
        assert_eq!(l.release(1, 0, 0, &[1]), (true, vec![]));
        assert!(!l.admit_acquire(1, 1, 0), "still not applied twice");
        l.forget(1);
        assert!(l.admit_acquire(1, 1, 0), "a restarted peer numbers afresh");
    }

    #[test]
    fn a_peer_that_never_settles_is_bounded() {
        let mut l = RefLedger::default();
        for seq in 1..=(MAX_UNSETTLED as u64 + 10) {
            l.release(1, seq, 0, &[]);
        }
        assert_eq!(l.unsettled(1), MAX_UNSETTLED);
    }
}
