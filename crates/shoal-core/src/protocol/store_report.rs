//! What a store says of itself: one row of `list` and its `stats`. The
//! wire's vocabulary; the engine (`shoal-store`) fills them in.

use crate::ids::ObjectId;
use crate::location::ObjectLocation;

/// The eviction policies a daemon may run, by the names `stats` carries
/// (`StoreStats::policy` is one of them, or "other" from a newer daemon).
pub const POLICY_NAMES: [&str; 4] = ["lru", "lfu", "lrfu", "forecast"];

/// One row of `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub id: ObjectId,
    pub location: ObjectLocation,
    pub sealed: bool,
    pub refs: u32,
    /// The bytes are in memory (`false`: only on tiers below; the daemon
    /// adds such rows, the store itself lists only what it holds).
    pub resident: bool,
    /// Tiers holding a durable copy (bit 0 burst buffer, bit 1 backing
    /// store), as the daemon's tiers know it; 0 from the store itself.
    pub tiers: u8,
}

/// A store's `stats`: its sizes and counts at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub capacity: u64,
    pub region_size: u64,
    pub used: u64,
    pub objects: u64,
    pub sealed: u64,
    pub referenced: u64,
    pub evictable: u64,
    pub clients: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub line_size: u64,
    pub policy: &'static str,
    /// Bytes lent to clients for creates and not sealed yet: allocated, but
    /// not in `used` (which counts objects).
    pub lent: u64,
}
