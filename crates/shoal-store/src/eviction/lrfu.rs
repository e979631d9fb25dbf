//! LRFU (Lee et al., "LRFU: a spectrum of policies that subsumes the least
//! recently used and least frequently used policies", IEEE TC 2001), with
//! Alluxio's parameters.
//!
//! Every reference adds 1 to an object's *combined recency and frequency*
//! (CRF), and older references weigh less: at logical time t,
//! CRF(t) = Σ over past references at t_k of F(t − t_k), F(x) = (1/A)^(S·x),
//! where A is the attenuation factor and S the step factor (Alluxio's names and
//! defaults: A = 2, S = 0.25; in Lee et al.'s notation F(x) = (1/2)^(λx) with
//! λ = S·log2 A = 0.25). S → 0 is LFU (every reference weighs 1); S = 1 with
//! A = 2 is LRU (the newest reference outweighs all older ones together). The
//! clock ticks once per reference, as in both.
//!
//! The CRF is updated only when an object is referenced:
//! CRF = CRF_last · F(t − t_last) + 1. Candidates are ordered without
//! re-scoring them as time passes (Alluxio re-sorts every block instead): all
//! CRFs decay by the same factor, so log_A CRF(t) + S·t is the same for every
//! t, and log_A CRF_last + S·t_last is a time-free key with the order of the
//! CRFs at any common time. Smallest CRF leaves first. O(log n) per
//! operation, 28 bytes per slot, no allocation per object.

use shoal_core::error::{Result, ShoalError};

use super::frequency::{FrequencyTracker, Scoring};
use super::policy::EvictionPolicy;
use crate::object_table::Slot;

/// LRFU's two knobs (Alluxio's `lrfu.step.factor` / `lrfu.attenuation.factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrfuParams {
    /// S in [0, 1]: towards 0 LRFU behaves like LFU, towards 1 like LRU. Default 0.25.
    pub step_factor: f64,
    /// A ≥ 2: the base of the decay. Default 2.
    pub attenuation_factor: f64,
}

impl Default for LrfuParams {
    fn default() -> Self {
        Self {
            step_factor: 0.25,
            attenuation_factor: 2.0,
        }
    }
}

impl LrfuParams {
    /// Lee et al.'s λ for these parameters: F(x) = (1/2)^(λx).
    pub fn lee_lambda(&self) -> f64 {
        self.step_factor * self.attenuation_factor.log2()
    }

    fn validate(&self) -> Result<()> {
        let LrfuParams {
            step_factor: s,
            attenuation_factor: a,
        } = *self;
        if !(0.0..=1.0).contains(&s) {
            return Err(ShoalError::invalid(format!(
                "LRFU step factor must be in [0, 1], not {s}"
            )));
        }
        // Alluxio's range; A < 2 with S = 1 would no longer reach LRU.
        if !(a.is_finite() && a >= 2.0) {
            return Err(ShoalError::invalid(format!(
                "LRFU attenuation factor must be a finite number >= 2, not {a}"
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
pub(super) struct LrfuHistory {
    crf: f64,
    last: u64,
}

/// An f64 ordered by `total_cmp` (scores are finite: CRF ≥ 1).
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

pub(super) struct LrfuScoring {
    params: LrfuParams,
    /// ln A, so F(x) = exp(−S · ln A · x) and log_A y = ln y / ln A.
    ln_attenuation: f64,
}

impl Scoring for LrfuScoring {
    type History = LrfuHistory;
    /// (time-free CRF score, last reference): ties (S = 0) go oldest first.
    type Key = (Score, u64);

    fn first(&self, now: u64) -> LrfuHistory {
        LrfuHistory {
            crf: 1.0,
            last: now,
        }
    }

    fn again(&self, history: LrfuHistory, now: u64) -> LrfuHistory {
        let elapsed = now.saturating_sub(history.last) as f64;
        let weight = (-self.params.step_factor * self.ln_attenuation * elapsed).exp();
        LrfuHistory {
            crf: history.crf * weight + 1.0,
            last: now,
        }
    }

    fn key(&self, history: LrfuHistory) -> (Score, u64) {
        let score =
            history.crf.ln() / self.ln_attenuation + self.params.step_factor * history.last as f64;
        (Score(score), history.last)
    }
}

pub struct Lrfu {
    tracker: FrequencyTracker<LrfuScoring>,
}

impl Default for Lrfu {
    fn default() -> Self {
        Self::new(LrfuParams::default()).expect("default LRFU parameters are valid")
    }
}

impl Lrfu {
    pub fn new(params: LrfuParams) -> Result<Self> {
        params.validate()?;
        Ok(Self {
            tracker: FrequencyTracker::new(LrfuScoring {
                params,
                ln_attenuation: params.attenuation_factor.ln(),
            }),
        })
    }

    pub fn params(&self) -> LrfuParams {
        self.tracker.scoring().params
    }
}

impl EvictionPolicy for Lrfu {
    fn insert(&mut self, slot: Slot) {
        self.tracker.insert(slot);
    }

    fn remove(&mut self, slot: Slot) {
        self.tracker.remove(slot);
    }

    fn touch(&mut self, slot: Slot) {
        self.tracker.touch(slot);
    }

    fn victim(&self) -> Option<Slot> {
        self.tracker.victim()
    }

    fn len(&self) -> usize {
        self.tracker.len()
    }

    fn name(&self) -> &'static str {
        "lrfu"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(policy: &mut Lrfu, slot: Slot) {
        policy.remove(slot);
        policy.touch(slot);
        policy.insert(slot);
    }

    fn drain(policy: &mut Lrfu) -> Vec<Slot> {
        let mut order = Vec::new();
        while let Some(v) = policy.victim() {
            order.push(v);
            policy.remove(v);
        }
        order
    }

    #[test]
    fn recent_frequency_outweighs_one_newer_reference() {
        let mut lrfu = Lrfu::default();
        lrfu.insert(1);
        for _ in 0..4 {
            get(&mut lrfu, 1); // 5 references at t = 1..5
        }
        lrfu.insert(2); // 1 reference at t = 6
                        // CRF(6): slot 1 ≈ 2^-1.25 + 2^-1 + 2^-0.75 + 2^-0.5 + 2^-0.25 ≈ 3.06; slot 2 = 1.
        assert_eq!(drain(&mut lrfu), vec![2, 1]);
    }

    #[test]
    fn old_frequency_decays_below_a_recent_reference() {
        let mut lrfu = Lrfu::default();
        lrfu.insert(1);
        for _ in 0..4 {
            get(&mut lrfu, 1); // t = 1..5
        }
        lrfu.insert(2); // t = 6
        for _ in 0..20 {
            get(&mut lrfu, 3); // t = 7..26
        }
        get(&mut lrfu, 2); // t = 27: slot 2's CRF ≈ 1 + 2^-5.25
                           // Slot 1's five references are 22..26 ticks old: CRF ≈ 3.06 · 2^-5.5 ≈ 0.07 < 1.
        assert_eq!(lrfu.victim(), Some(1));
        // Slot 3 (21 recent references) is the most valuable.
        assert_eq!(drain(&mut lrfu), vec![1, 2, 3]);
    }

    #[test]
    fn the_ends_of_the_spectrum_are_lfu_and_lru() {
        // Slot 1: three references long ago; slot 2: one, the newest.
        let run = |params| {
            let mut lrfu = Lrfu::new(params).unwrap();
            lrfu.insert(1);
            get(&mut lrfu, 1);
            get(&mut lrfu, 1);
            lrfu.insert(2);
            drain(&mut lrfu)
        };
        let lfu = LrfuParams {
            step_factor: 0.0,
            attenuation_factor: 2.0,
        };
        let lru = LrfuParams {
            step_factor: 1.0,
            attenuation_factor: 2.0,
        };
        assert_eq!(run(lfu), vec![2, 1]);
        assert_eq!(run(lru), vec![1, 2]);
        assert_eq!(lru.lee_lambda(), 1.0);
        assert_eq!(LrfuParams::default().lee_lambda(), 0.25);
    }

    #[test]
    fn rejects_parameters_out_of_range() {
        for (s, a) in [
            (-0.1, 2.0),
            (1.5, 2.0),
            (0.5, 1.5),
            (0.5, f64::NAN),
            (f64::NAN, 2.0),
        ] {
            let err = Lrfu::new(LrfuParams {
                step_factor: s,
                attenuation_factor: a,
            })
            .err()
            .expect("invalid parameters are refused");
            assert_eq!(err.kind(), shoal_core::ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn scores_stay_finite_over_a_long_clock() {
        let mut lrfu = Lrfu::default();
        lrfu.insert(1);
        lrfu.insert(2);
        // Jump the clock far ahead with many references to other slots.
        for i in 0..10_000u32 {
            lrfu.touch(100 + (i % 50));
        }
        get(&mut lrfu, 2);
        assert_eq!(lrfu.victim(), Some(1));
        get(&mut lrfu, 1);
        assert_eq!(lrfu.victim(), Some(2));
    }
}
