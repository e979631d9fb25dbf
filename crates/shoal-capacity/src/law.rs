//! The DynIMS control law (Xuan et al., "DynIMS: a dynamic memory controller
//! for in-memory storage on HPC systems", eq. 1):
//!
//! u_{i+1} = u_i − λ · v_i · (r_i − r_0) / r_0,  r_i = v_i / M,
//!
//! clamped to [U_min, U_max]. u is the store's capacity, v the node's memory
//! use (the store's resident bytes included), M the node's memory, r_0 the
//! utilisation to hold (0.95) and λ the gain (0.5).
//!
//! # Why λ = 0.5 does not oscillate
//! Write e_i = v_i − r_0·M for the excess over the threshold. The step is
//! −λ · (v_i / (r_0·M)) · e_i, which is ≈ −λ·e_i near the threshold. When the
//! store is full (shrinking its capacity frees that much memory, growing it
//! fills it) the excess evolves as e_{i+1} = e_i · (1 − λ·v_i/(r_0·M)). With
//! λ = 0.5 and v_i ≤ M the factor lies in [1 − 0.5/0.95, 1) ⊂ (0, 1): the
//! excess halves each step and never changes sign, so the capacity converges
//! monotonically. For 1 < λ·v/(r_0·M) < 2 it still converges but overshoots
//! (alternating signs); at 2 and beyond it oscillates for ever or diverges,
//! which is why the paper searched 0 < λ ≤ 2 and why the config refuses λ ≥ 2.
//! When the store is not full, shrinking capacity above its resident bytes
//! frees nothing; `ControllerConfig::shrink_from_resident` starts a shrink
//! from the resident bytes so the first step already frees memory.

/// The law's signed step in bytes, −λ · v · (r − r_0) / r_0: negative when
/// the node is above the threshold (shrink), positive below it (grow).
/// `total` must be positive (see `MemoryUsage`).
pub fn dynims_step(used: u64, total: u64, threshold: f64, gain: f64) -> f64 {
    let v = used as f64;
    let r = v / total as f64;
    -gain * v * (r - threshold) / threshold
}

/// u_{i+1} = clamp(base + step, U_min, U_max), rounded to whole bytes.
/// `min <= max` is the caller's promise.
pub fn next_capacity(base: u64, step: f64, min: u64, max: u64) -> u64 {
    let next = base as f64 + step;
    // NaN cannot come out of dynims_step with total > 0; clamp it to U_min anyway.
    if next.is_nan() || next <= min as f64 {
        return min;
    }
    if next >= max as f64 {
        return max;
    }
    (next.round() as u64).clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_step_is_zero_at_the_threshold_and_has_the_papers_size_elsewhere() {
        assert_eq!(dynims_step(95, 100, 0.95, 0.5), 0.0);
        // v = 120 GB of M = 125 GB (Table I): r = 0.96, step = −0.5·120·0.01/0.95 GB.
        let step = dynims_step(120, 125, 0.95, 0.5);
        assert!((step - (-0.5 * 120.0 * (0.96 - 0.95) / 0.95)).abs() < 1e-12);
        assert!(dynims_step(50, 100, 0.95, 0.5) > 0.0);
        assert!(dynims_step(100, 100, 0.95, 0.5) < 0.0);
    }

    #[test]
    fn next_capacity_clamps_at_both_ends() {
        assert_eq!(next_capacity(10 * GIB, -20.0 * GIB as f64, 0, 40 * GIB), 0);
        assert_eq!(
            next_capacity(10 * GIB, -20.0 * GIB as f64, GIB, 40 * GIB),
            GIB
        );
        assert_eq!(
            next_capacity(10 * GIB, 50.0 * GIB as f64, 0, 40 * GIB),
            40 * GIB
        );
        assert_eq!(next_capacity(10, 2.4, 0, 100), 12);
        assert_eq!(next_capacity(10, f64::NAN, 3, 100), 3);
    }
}
