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
    /// The object.
    pub id: ObjectId,
    /// Where it is in the region and its sizes; the offset is 0 for an object only on a tier.
    pub location: ObjectLocation,
    /// Sealed (`false`: still being written by its creator).
    pub sealed: bool,
    /// References held on it by all clients together.
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
    /// Bytes the store may use now (an elastic store's target moves it).
    pub capacity: u64,
    /// Bytes of the region, the largest capacity.
    pub region_size: u64,
    /// Bytes in objects' blocks, padding included; space lent and not sealed yet is in `lent`.
    pub used: u64,
    /// Objects in the table, unsealed and delete-pending ones included.
    pub objects: u64,
    /// Objects sealed (delete-pending ones included).
    pub sealed: u64,
    /// Objects with at least one reference.
    pub referenced: u64,
    /// Eviction candidates: sealed, unreferenced, resident objects the policy orders.
    pub evictable: u64,
    /// Clients the store keeps state for: local connections and the daemon's other principals
    /// (`FAST_READERS` not counted).
    pub clients: u64,
    /// Objects evicted since the daemon started.
    pub evictions: u64,
    /// Block bytes evicted since the daemon started.
    pub evicted_bytes: u64,
    /// The unit objects are aligned and padded to, in bytes.
    pub line_size: u64,
    /// The eviction policy's name: one of [`POLICY_NAMES`], or `other` when decoded from a
    /// daemon that runs one this build does not know.
    pub policy: &'static str,
    /// Bytes lent to clients for creates and not sealed yet: allocated, but
    /// not in `used` (which counts objects).
    pub lent: u64,
}
