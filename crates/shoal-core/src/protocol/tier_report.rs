//! What `Request::Tiers` answers: the tiers below memory of one node, with
//! their use and the write-behind drain's progress (`shoal stat`).

use crate::durability::Durability;
use crate::error::{Result, ShoalError};

use super::{Reader, Writer};

/// One tier below memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierInfo {
    /// 0: burst buffer, 1: backing store.
    pub level: u8,
    /// A path or URL.
    pub describe: String,
    /// Bytes the tier may hold; `u64::MAX` for an unbounded one (an S3 prefix).
    pub capacity: u64,
    /// Bytes it holds now.
    pub used: u64,
    /// Objects it holds a copy of.
    pub objects: u64,
}

impl TierInfo {
    /// The level as `shoal stat` shows it: `burst` for 0, `backing` for anything else.
    pub fn level_name(&self) -> &'static str {
        match self.level {
            0 => "burst",
            _ => "backing",
        }
    }
}

/// The node's tiers and drain. Counters are since the daemon started.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierReport {
    /// The durability a seal gets when it names none.
    pub default_durability: Durability,
    /// Drain jobs queued or running.
    pub queue_depth: u64,
    /// Objects the drain copied down.
    pub drained_objects: u64,
    /// Bytes the drain copied down.
    pub drained_bytes: u64,
    /// Bytes per second drained over the last few seconds.
    pub drain_rate: u64,
    /// Dirty objects written out because they were evicted.
    pub spilled_bytes: u64,
    /// Objects brought back into memory from a tier.
    pub restores: u64,
    /// Bytes brought back into memory from a tier.
    pub restored_bytes: u64,
    /// Objects with at least one durable copy below memory.
    pub durable_objects: u64,
    /// Drain or spill failures (each retried, or reported to waiters).
    pub failures: u64,
    /// Empty when the node has no tier below memory.
    pub tiers: Vec<TierInfo>,
}

impl TierReport {
    pub(super) fn encode(&self, w: &mut Writer<'_>) {
        w.u8(self.default_durability as u8);
        for v in [
            self.queue_depth,
            self.drained_objects,
            self.drained_bytes,
            self.drain_rate,
            self.spilled_bytes,
            self.restores,
            self.restored_bytes,
            self.durable_objects,
            self.failures,
        ] {
            w.u64(v);
        }
        w.u32(self.tiers.len() as u32);
        for t in &self.tiers {
            w.u8(t.level)
                .str(&t.describe)
                .u64(t.capacity)
                .u64(t.used)
                .u64(t.objects);
        }
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let durability = r.u8()?;
        let mut report = TierReport {
            default_durability: Durability::from_u8(durability)
                .ok_or_else(|| ShoalError::protocol(format!("unknown durability {durability}")))?,
            queue_depth: r.u64()?,
            drained_objects: r.u64()?,
            drained_bytes: r.u64()?,
            drain_rate: r.u64()?,
            spilled_bytes: r.u64()?,
            restores: r.u64()?,
            restored_bytes: r.u64()?,
            durable_objects: r.u64()?,
            failures: r.u64()?,
            tiers: Vec::new(),
        };
        let n = r.count(1 + 4 + 8 + 8 + 8)?;
        for _ in 0..n {
            report.tiers.push(TierInfo {
                level: r.u8()?,
                describe: r.str()?,
                capacity: r.u64()?,
                used: r.u64()?,
                objects: r.u64()?,
            });
        }
        Ok(report)
    }
}
