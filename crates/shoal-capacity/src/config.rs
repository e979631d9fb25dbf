//! Every parameter of the capacity controller, with the paper's defaults
//! (DynIMS Table I: M = 125 GB, r_0 = 0.95, λ = 0.5, U_min = 0 GB,
//! U_max = 60 GB, T = 100 ms).

use std::time::Duration;

use shoal_core::error::{Result, ShoalError};

use super::guard::PsiGuardConfig;

/// The share of M by which the node must be over r_0, or the memory outside
/// the store must have risen since the last step, for the next step to come
/// after the urgent interval: 0.1 % (24 MiB of 24 GiB). Smaller than any
/// burst worth meeting early; a node at its threshold moves by about as
/// much between steps (a restore landing, pages freed), so a quiet node
/// at r_0 takes an urgent step now and then, at ~100 µs each. At 0.25 % a
/// node 40 MiB over (a restore had just landed) waited a whole T while a
/// burst began, which met it 390 MiB over (the run at a 0.25 % margin,
/// bench/results/elastic.md/.json of 2026-11-25, in git history: d38310e).
pub const URGENT_MARGIN: f64 = 0.001;

#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// T: time between control steps. Default 100 ms. The controller itself
    /// has no clock; the daemon's loop uses this.
    pub interval: Duration,
    /// T while the node is over its threshold (by more than
    /// [`URGENT_MARGIN`] of M) or the memory outside the store rose by
    /// that much since the last step: a burst is met every few tens of ms
    /// instead of every T, while a quiet node is sampled every T. Each step
    /// applies its shrink before the next sample (evictions and page
    /// release are synchronous), so the law's convergence per step, and its
    /// stability for λ in (0, 2), do not depend on the interval. `None`:
    /// every step is T apart (the paper). Default 20 ms.
    pub urgent_interval: Option<Duration>,
    /// r_0 in (0, 1): the node utilisation to hold. Default 0.95.
    pub threshold: f64,
    /// λ in (0, 2): the law's gain. Default 0.5 (monotone convergence, see law.rs).
    pub gain: f64,
    /// λ for shrinks only, in (0, 2); `None`: λ (the paper's one gain).
    /// At 1 a shrink removes the measured excess in one step (the excess
    /// factor 1 − λ·v/(r_0·M) is ≈ 0: a few % overshoot, no ringing), while
    /// growth keeps λ's slow, monotone approach. Shrinking too far costs
    /// cache for a few steps; shrinking too slowly costs the node swap or
    /// the OOM killer, hence the asymmetry (bench/results/elastic.md of
    /// 2026-11-24, in git history: b8a8e7e).
    pub shrink_gain: Option<f64>,
    /// Apply the law to the use expected at the next step: v_i plus the
    /// rise of the memory outside the store since the last step (a rise
    /// over [`URGENT_MARGIN`] of M only: smaller ones are a node's noise at
    /// its threshold; a fall is never anticipated). A burst that grows for several
    /// steps then meets a shrink of its own size each step instead of one
    /// that trails it by a step; with a shrink gain of 1 the node stays at
    /// the threshold while the burst grows. Default off (the paper's law).
    pub feed_forward: bool,
    /// U_min in bytes: the capacity never goes below it. Default 0.
    pub min_capacity: u64,
    /// α in (0, 1]: U_max = α·M. Default 0.48, the paper's 60 GB of 125 GB
    /// (its RAM disk). Machine specific: set it to what the node can spare.
    pub max_fraction: f64,
    /// A ceiling on U_max in bytes, whatever α·M says; the daemon sets it to
    /// the region's length (the capacity cannot exceed the mapped memory).
    /// Default none.
    pub max_capacity: Option<u64>,
    /// Start a shrink from the store's resident bytes when they are below
    /// the capacity: capacity above what the store holds frees nothing when
    /// cut, so the paper's law (which assumes a full store) would spend steps
    /// cutting air while the node stays over the threshold. Identical to the
    /// paper's law whenever the store is full. Default true.
    pub shrink_from_resident: bool,
    /// The pressure-stall guard (guard.rs).
    pub psi: PsiGuardConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            urgent_interval: Some(Duration::from_millis(20)),
            threshold: 0.95,
            gain: 0.5,
            shrink_gain: None,
            feed_forward: false,
            min_capacity: 0,
            max_fraction: 60.0 / 125.0,
            max_capacity: None,
            shrink_from_resident: true,
            psi: PsiGuardConfig::default(),
        }
    }
}

impl ControllerConfig {
    /// Refuses settings the law cannot work with, saying which and why.
    pub fn validate(&self) -> Result<()> {
        if self.interval.is_zero() {
            return Err(ShoalError::invalid("controller interval must be positive"));
        }
        if let Some(urgent) = self.urgent_interval {
            if urgent.is_zero() || urgent > self.interval {
                return Err(ShoalError::invalid(format!(
                    "controller urgent interval must be positive and at most the interval T ({:?}), not {urgent:?}",
                    self.interval
                )));
            }
        }
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return Err(ShoalError::invalid(format!(
                "controller threshold r_0 must be in (0, 1), not {}",
                self.threshold
            )));
        }
        if !(self.gain > 0.0 && self.gain < 2.0) {
            return Err(ShoalError::invalid(format!(
                "controller gain λ must be in (0, 2) (at 2 and above the capacity oscillates), not {}",
                self.gain
            )));
        }
        if let Some(gain) = self.shrink_gain {
            if !(gain > 0.0 && gain < 2.0) {
                return Err(ShoalError::invalid(format!(
                    "controller shrink gain must be in (0, 2), not {gain}"
                )));
            }
        }
        if !(self.max_fraction > 0.0 && self.max_fraction <= 1.0) {
            return Err(ShoalError::invalid(format!(
                "controller max fraction α must be in (0, 1], not {}",
                self.max_fraction
            )));
        }
        if let Some(max) = self.max_capacity {
            if max < self.min_capacity {
                return Err(ShoalError::invalid(format!(
                    "controller max capacity {max} is below its min capacity {}",
                    self.min_capacity
                )));
            }
        }
        self.psi.validate()
    }

    /// U_max for a node of `total` bytes: min(α·M, max_capacity), but never
    /// below U_min (an operator's floor wins over a small node).
    pub fn max_capacity_for(&self, total: u64) -> u64 {
        let alpha_m = (self.max_fraction * total as f64).round() as u64;
        let max = self.max_capacity.map_or(alpha_m, |cap| cap.min(alpha_m));
        max.max(self.min_capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers_and_valid() {
        let c = ControllerConfig::default();
        c.validate().unwrap();
        assert_eq!(c.interval, Duration::from_millis(100));
        assert_eq!((c.threshold, c.gain, c.min_capacity), (0.95, 0.5, 0));
        // Table I: U_max = 60 GB on a 125 GB node.
        assert_eq!(c.max_capacity_for(125_000_000_000), 60_000_000_000);
    }

    #[test]
    fn u_max_is_the_lower_of_alpha_m_and_the_ceiling_but_not_below_u_min() {
        let c = ControllerConfig {
            max_fraction: 0.5,
            max_capacity: Some(300),
            min_capacity: 100,
            ..Default::default()
        };
        assert_eq!(c.max_capacity_for(1000), 300);
        assert_eq!(c.max_capacity_for(400), 200);
        assert_eq!(c.max_capacity_for(100), 100);
    }

    #[test]
    fn invalid_settings_are_refused() {
        let ok = ControllerConfig::default();
        for bad in [
            ControllerConfig {
                interval: Duration::ZERO,
                ..ok.clone()
            },
            ControllerConfig {
                urgent_interval: Some(Duration::ZERO),
                ..ok.clone()
            },
            ControllerConfig {
                urgent_interval: Some(Duration::from_millis(200)),
                ..ok.clone()
            },
            ControllerConfig {
                threshold: 1.0,
                ..ok.clone()
            },
            ControllerConfig {
                threshold: f64::NAN,
                ..ok.clone()
            },
            ControllerConfig {
                gain: 0.0,
                ..ok.clone()
            },
            ControllerConfig {
                shrink_gain: Some(2.0),
                ..ok.clone()
            },
            ControllerConfig {
                gain: 2.0,
                ..ok.clone()
            },
            ControllerConfig {
                max_fraction: 0.0,
                ..ok.clone()
            },
            ControllerConfig {
                max_fraction: 1.5,
                ..ok.clone()
            },
            ControllerConfig {
                min_capacity: 10,
                max_capacity: Some(5),
                ..ok.clone()
            },
            ControllerConfig {
                psi: PsiGuardConfig {
                    boost_gain: 0.0,
                    ..ok.psi
                },
                ..ok.clone()
            },
        ] {
            let err = bad.validate().unwrap_err();
            assert_eq!(
                err.kind(),
                shoal_core::ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
    }
}
