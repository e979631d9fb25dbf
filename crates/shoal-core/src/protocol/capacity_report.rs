//! What `Request::Capacity` answers: the elastic capacity controller's
//! state (`shoal stat`) and, when asked, its capacity-over-time trace.

use std::time::Duration;

use crate::error::{Result, ShoalError};

use super::{Reader, Writer};

/// What the guard decided for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PsiAction {
    /// No pressure signal, a calm one, or the guard is disabled.
    #[default]
    None,
    /// Growth forbidden.
    HoldGrowth,
    /// Growth forbidden and shrinking at `boost_gain`.
    Boost,
}

/// One control step as the trace keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TracePoint {
    /// When the step was taken, since the daemon started (µs on the wire).
    pub time: Duration,
    /// The controller's target for the store.
    pub target: u64,
    /// The store's capacity after the daemon applied the target (higher than
    /// the target while objects in use keep it from shrinking).
    pub capacity: u64,
    /// Bytes the store held in memory at the sample.
    pub store_used: u64,
    /// v_i and M at the sample.
    pub node_used: u64,
    /// M: the node's memory in bytes (the host's, or the cgroup's limit).
    pub node_total: u64,
    /// r_i.
    pub utilisation: f64,
}

/// The controller of one node. With `enabled` false the store is static
/// and every field but `capacity`, `used` and `pinned` is zero.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CapacityReport {
    /// Whether the store is elastic (`false`: a static store, whose report sets only
    /// `target` = `capacity`, `used`, `pinned` and `resident`).
    pub enabled: bool,
    /// Where v_i and M are read: "host", "cgroup PATH" or "meminfo PATH".
    pub source: String,
    /// T, r_0, λ, U_min and the last step's U_max.
    pub interval: Duration,
    /// r_0: the share of the node's memory the law steers its use to (the paper's 0.95).
    pub threshold: f64,
    /// λ: how much of the measured excess one step takes (the paper's 0.5).
    pub gain: f64,
    /// U_min: the target never goes below this many bytes.
    pub min_capacity: u64,
    /// The last step's U_max: α·M capped by `--capacity`, in bytes.
    pub max_capacity: u64,
    /// u_i: the controller's target.
    pub target: u64,
    /// The store's capacity now (the target, applied).
    pub capacity: u64,
    /// Bytes allocated to objects, and of them the ones no eviction can free.
    pub used: u64,
    /// Bytes of objects no eviction can free now (referenced or unsealed): a shrink stops
    /// there.
    pub pinned: u64,
    /// Bytes of memory the region holds now (its allocated pages).
    pub resident: u64,
    /// Objects in use alone exceed the target: creates are refused.
    pub over_target: bool,
    /// r_i, v_i and M of the last sample.
    pub utilisation: f64,
    /// v_i: the node's memory in use, in bytes.
    pub node_used: u64,
    /// M: the node's memory, in bytes.
    pub node_total: u64,
    /// The last step's change of the target (negative: shrink).
    pub last_step: i64,
    /// Share of the last interval some task stalled on memory (PSI).
    pub stall_share: Option<f64>,
    /// What the PSI guard decided at the last step.
    pub psi_action: PsiAction,
    /// Steps taken, bytes given back to the kernel, since the daemon started.
    pub steps: u64,
    /// Bytes of the region given back to the kernel since the daemon started.
    pub released_bytes: u64,
    /// CPU time the controller spent, in seconds, and of it the part spent
    /// carrying shrinks out: evicting (down a tier) and giving pages back.
    pub cpu_seconds: f64,
    /// Of `cpu_seconds`, the part spent carrying shrinks out.
    pub release_cpu_seconds: f64,
    /// Steps after which the next came at the urgent interval.
    pub urgent_steps: u64,
    /// Trace points after the time asked for, oldest first (empty unless asked).
    pub trace: Vec<TracePoint>,
}

/// No stall share (no PSI): NaN on the wire.
fn stall_to_wire(share: Option<f64>) -> u64 {
    share.unwrap_or(f64::NAN).to_bits()
}

fn psi_to_wire(action: PsiAction) -> u8 {
    match action {
        PsiAction::None => 0,
        PsiAction::HoldGrowth => 1,
        PsiAction::Boost => 2,
    }
}

fn psi_from_wire(byte: u8) -> Result<PsiAction> {
    Ok(match byte {
        0 => PsiAction::None,
        1 => PsiAction::HoldGrowth,
        2 => PsiAction::Boost,
        other => return Err(ShoalError::protocol(format!("unknown PSI action {other}"))),
    })
}

const POINT_LEN: usize = 7 * 8;

impl CapacityReport {
    pub(super) fn encode(&self, w: &mut Writer<'_>) {
        w.u8(self.enabled as u8)
            .str(&self.source)
            .u64(self.interval.as_micros() as u64)
            .u64(self.threshold.to_bits())
            .u64(self.gain.to_bits());
        for v in [
            self.min_capacity,
            self.max_capacity,
            self.target,
            self.capacity,
            self.used,
            self.pinned,
            self.resident,
        ] {
            w.u64(v);
        }
        w.u8(self.over_target as u8)
            .u64(self.utilisation.to_bits())
            .u64(self.node_used)
            .u64(self.node_total)
            .i64(self.last_step)
            .u64(stall_to_wire(self.stall_share))
            .u8(psi_to_wire(self.psi_action))
            .u64(self.steps)
            .u64(self.released_bytes)
            .u64(self.cpu_seconds.to_bits())
            .u64(self.release_cpu_seconds.to_bits())
            .u64(self.urgent_steps);
        w.u32(self.trace.len() as u32);
        for p in &self.trace {
            w.u64(p.time.as_micros() as u64)
                .u64(p.target)
                .u64(p.capacity)
                .u64(p.store_used)
                .u64(p.node_used)
                .u64(p.node_total)
                .u64(p.utilisation.to_bits());
        }
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let f64 = |r: &mut Reader<'_>| r.u64().map(f64::from_bits);
        let mut report = CapacityReport {
            enabled: r.bool()?,
            source: r.str()?,
            interval: Duration::from_micros(r.u64()?),
            threshold: f64(r)?,
            gain: f64(r)?,
            min_capacity: r.u64()?,
            max_capacity: r.u64()?,
            target: r.u64()?,
            capacity: r.u64()?,
            used: r.u64()?,
            pinned: r.u64()?,
            resident: r.u64()?,
            over_target: r.bool()?,
            utilisation: f64(r)?,
            node_used: r.u64()?,
            node_total: r.u64()?,
            last_step: r.i64()?,
            stall_share: Some(f64(r)?).filter(|s| !s.is_nan()),
            psi_action: psi_from_wire(r.u8()?)?,
            steps: r.u64()?,
            released_bytes: r.u64()?,
            cpu_seconds: f64(r)?,
            release_cpu_seconds: f64(r)?,
            urgent_steps: r.u64()?,
            trace: Vec::new(),
        };
        let n = r.count(POINT_LEN)?;
        report.trace.reserve(n);
        for _ in 0..n {
            report.trace.push(TracePoint {
                time: Duration::from_micros(r.u64()?),
                target: r.u64()?,
                capacity: r.u64()?,
                store_used: r.u64()?,
                node_used: r.u64()?,
                node_total: r.u64()?,
                utilisation: f64(r)?,
            });
        }
        Ok(report)
    }
}
