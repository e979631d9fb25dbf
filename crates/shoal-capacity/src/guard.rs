//! The pressure-stall guard: the kernel's own measure of memory trouble,
//! checked beside the law's utilisation.
//!
//! # Why the law needs a guard
//! The law sees only utilisation, and utilisation can look fine while tasks
//! already wait for memory: MemAvailable counts page cache as available, and
//! a job that streams through files (or a cgroup neighbour near its limit)
//! makes the kernel reclaim and refault that cache in the allocation path. A
//! node with spare memory shows next to no memory stall, so a stall of a
//! percent or more means memory is short whatever r_i says.
//!
//! # The rule
//! The stall share s is the fraction of the last control interval in which
//! at least one task was stalled on memory: Δ(`some total`) / Δt between two
//! samples. `avg10` / 100 stands in only when there is no previous sample:
//! a 10 s average reacts seconds late and keeps the guard on for seconds
//! after the stall ends.
//! - s ≥ `hold_growth_at` (default 1 %): the capacity may not grow. Growing
//!   would hand the store memory the kernel is fighting to reclaim.
//! - s ≥ `boost_at` (default 10 %): also, a shrink the law asks for is taken
//!   with gain `boost_gain` instead of λ (default 1.0: the whole measured
//!   excess in one step, the fastest gain that still does not overshoot a full
//!   store; see law.rs). At a tenth of the time stalled the compute job is
//!   losing real throughput, and halving the excess per step is too slow.
//!   The guard never shrinks on its own when r_i ≤ r_0: PSI says memory is
//!   short, not by how much, and a shrink needs an amount.

use std::time::Duration;

use shoal_core::error::{Result, ShoalError};
use shoal_core::protocol::PsiAction;

use super::pressure::Pressure;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PsiGuardConfig {
    /// Whether the guard acts at all (the stall share is reported either way).
    pub enabled: bool,
    /// Stall share at and above which growth is forbidden. Default 0.01.
    pub hold_growth_at: f64,
    /// Stall share at and above which shrinking uses `boost_gain`. Default 0.10.
    pub boost_at: f64,
    /// The gain of a boosted shrink, in (0, 2). Default 1.0.
    pub boost_gain: f64,
}

impl Default for PsiGuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            hold_growth_at: 0.01,
            boost_at: 0.10,
            boost_gain: 1.0,
        }
    }
}

impl PsiGuardConfig {
    pub(super) fn validate(&self) -> Result<()> {
        let share = 0.0..=1.0;
        if !share.contains(&self.hold_growth_at) || !share.contains(&self.boost_at) {
            return Err(ShoalError::invalid(format!(
                "PSI guard thresholds are shares of time in [0, 1], not {} and {}",
                self.hold_growth_at, self.boost_at
            )));
        }
        if self.boost_at < self.hold_growth_at {
            return Err(ShoalError::invalid(format!(
                "PSI boost threshold {} is below the hold threshold {}",
                self.boost_at, self.hold_growth_at
            )));
        }
        if !(self.boost_gain > 0.0 && self.boost_gain < 2.0) {
            return Err(ShoalError::invalid(format!(
                "PSI boost gain must be in (0, 2) to stay stable, not {}",
                self.boost_gain
            )));
        }
        Ok(())
    }

    /// The guard's verdict for a stall share.
    pub fn action(&self, stall_share: Option<f64>) -> PsiAction {
        match stall_share {
            Some(s) if self.enabled && s >= self.boost_at => PsiAction::Boost,
            Some(s) if self.enabled && s >= self.hold_growth_at => PsiAction::HoldGrowth,
            _ => PsiAction::None,
        }
    }
}

/// The earlier reading a stall share is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PressureMark {
    pub time: Duration,
    pub some_total_us: u64,
}

/// The share of time in [0, 1] at least one task stalled on memory since
/// `previous`, or over the last 10 s when there is no usable previous mark
/// (first sample, clock not advanced, counter reset).
pub(super) fn stall_share(
    previous: Option<PressureMark>,
    now: Duration,
    current: &Pressure,
) -> f64 {
    if let Some(mark) = previous {
        let elapsed = now.saturating_sub(mark.time).as_micros();
        if elapsed > 0 && current.some.total_us >= mark.some_total_us {
            let stalled = (current.some.total_us - mark.some_total_us) as f64;
            return (stalled / elapsed as f64).min(1.0);
        }
    }
    (current.some.avg10 / 100.0).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pressure::PressureLine;

    fn pressure(avg10: f64, total_us: u64) -> Pressure {
        Pressure {
            some: PressureLine {
                avg10,
                avg60: 0.0,
                avg300: 0.0,
                total_us,
            },
            full: None,
        }
    }

    #[test]
    fn stall_share_is_the_delta_over_the_interval() {
        let mark = PressureMark {
            time: Duration::from_millis(1000),
            some_total_us: 50_000,
        };
        // 20 ms stalled in a 100 ms step; avg10 (still 0) is ignored.
        let s = stall_share(
            Some(mark),
            Duration::from_millis(1100),
            &pressure(0.0, 70_000),
        );
        assert!((s - 0.2).abs() < 1e-12);
        // More stall than elapsed time (several stalled CPUs): capped at 1.
        assert_eq!(
            stall_share(
                Some(mark),
                Duration::from_millis(1100),
                &pressure(0.0, 900_000)
            ),
            1.0
        );
    }

    #[test]
    fn without_a_usable_mark_the_share_is_avg10() {
        let p = pressure(12.5, 10);
        assert_eq!(stall_share(None, Duration::ZERO, &p), 0.125);
        let later = PressureMark {
            time: Duration::from_secs(5),
            some_total_us: 0,
        };
        assert_eq!(stall_share(Some(later), Duration::from_secs(5), &p), 0.125);
        let reset = PressureMark {
            time: Duration::ZERO,
            some_total_us: 1_000,
        };
        assert_eq!(stall_share(Some(reset), Duration::from_secs(1), &p), 0.125);
    }

    #[test]
    fn verdicts_follow_the_thresholds() {
        let guard = PsiGuardConfig::default();
        assert_eq!(guard.action(None), PsiAction::None);
        assert_eq!(guard.action(Some(0.0)), PsiAction::None);
        assert_eq!(guard.action(Some(0.01)), PsiAction::HoldGrowth);
        assert_eq!(guard.action(Some(0.5)), PsiAction::Boost);
        let off = PsiGuardConfig {
            enabled: false,
            ..guard
        };
        assert_eq!(off.action(Some(1.0)), PsiAction::None);
    }

    #[test]
    fn invalid_settings_are_refused() {
        let ok = PsiGuardConfig::default();
        assert!(ok.validate().is_ok());
        for bad in [
            PsiGuardConfig {
                hold_growth_at: -0.1,
                ..ok
            },
            PsiGuardConfig {
                boost_at: 1.5,
                ..ok
            },
            PsiGuardConfig {
                hold_growth_at: 0.5,
                boost_at: 0.2,
                ..ok
            },
            PsiGuardConfig {
                boost_gain: 2.0,
                ..ok
            },
            PsiGuardConfig {
                boost_gain: f64::NAN,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
